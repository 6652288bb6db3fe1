"""Files the user keeps, written complete or not at all (configs, backups, baselines).

``durable_temp`` writes the text to a new temporary file beside the target and fsyncs it; the
caller then links or renames it into place. ``replace`` does the usual case: the temporary file
renamed over the target (atomic on POSIX), then the folder fsynced. A kill -9 at any point leaves
the old file or the new one, never a mix. Errors are ``OSError``; callers turn them into their
own one-line messages.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional


def _unlink(path: str):
    try:
        os.unlink(path)
    except OSError:
        pass


def durable_temp(path: Path, text: str, suffix: str = ".tmp", mode: Optional[int] = None) -> str:
    """``text`` in a new temporary file beside ``path``, fsynced (and chmod'ed to ``mode``): its
    name. Nothing is left behind if this fails."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def replace(path: Path, text: str, mode: Optional[int] = None):
    """Replace ``path`` by ``text`` atomically and durably."""
    tmp = durable_temp(path, text, mode=mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    try:  # the rename itself survives a crash once the folder is synced
        dfd = os.open(str(path.parent), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
