"""One error model: every error the user can cause is a ``DiagnoseError``.

Each module raises its own subclass (ConfigError, DatabaseError, EditError, LaunchError, ...),
with a one-line message that names the file, key or signature. The CLI translates them once
(cli.main): the message on stderr, ``exit_code`` as the exit status (2, a usage or input error,
unless the class says otherwise). Anything else that escapes is a bug (exit 3).
"""
from __future__ import annotations

from . import exitcodes


class DiagnoseError(Exception):
    """A failure the user can act on (bad input, an unreadable file, a refused edit)."""

    exit_code = exitcodes.USAGE
