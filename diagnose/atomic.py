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


def _unlink(path: str):
    try:
        os.unlink(path)
    except OSError:
        pass


def durable_temp(path: Path, text, suffix: str = ".tmp", mode: int | None = None,
                 owner: tuple | None = None) -> str:
    """``text`` (str as UTF-8, or bytes) in a new temporary file beside ``path``, fsynced, with
    ``mode`` and (where this process may) ``owner`` = (uid, gid): its name. Nothing is left
    behind if this fails. The file is created 0600, so it is never readable by others before
    its mode is set."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text if isinstance(text, bytes) else text.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        if owner is not None and (os.stat(tmp).st_uid, os.stat(tmp).st_gid) != owner:
            try:
                os.chown(tmp, *owner)
            except PermissionError:
                pass  # not ours to give away: the new file stays ours, with the original's mode
        if mode is not None:
            os.chmod(tmp, mode)
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def replace(path: Path, text, mode: int | None = None, owner: tuple | None = None):
    """Replace ``path`` by ``text`` atomically and durably (with ``mode`` and ``owner``)."""
    tmp = durable_temp(path, text, mode=mode, owner=owner)
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
