"""Which failed log a config was already fixed from: a comment line ``--fix`` writes at the top.

``--fix`` plans from the config the failed run printed where the log has one, so running it
again with the same log finds the fix already in the file. A log that printed no config leaves
only the file to plan from, and the file already holds the first fix: planned again from the
same old failure, the fix would climb (an offload fraction 0.25 -> 0.5 -> 0.75 ...). So the
file keeps a comment naming the log each fix came from (a digest of its bytes, not its name:
the next run's log may have the same name):

    # diagnose --fix: MB-OFF-101 from run.log (log 3f2a9c1e04b7) on 2026-12-03

and ``--fix`` with that same log again changes nothing. A new log (the job run again) is a new
failure and is planned as usual. At most ``KEEP`` such lines are kept, the newest first.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re

PREFIX = "# diagnose --fix: "
KEEP = 5
_EDGE = 1 << 20  # bytes hashed at each end of a big log (its size is hashed too)
_LOG = re.compile(r"\(log ([0-9a-f]{12})\)")


def log_digest(paths) -> str:
    """12 hex digits naming the logs' bytes: every file's name, size, first and last MiB."""
    h = hashlib.sha256()
    for p in sorted(str(x) for x in paths):
        try:
            size = os.path.getsize(p)
            with open(p, "rb") as fh:
                head = fh.read(_EDGE)
                if size > 2 * _EDGE:
                    fh.seek(size - _EDGE)
                tail = fh.read(_EDGE) if size > _EDGE else b""
        except OSError:
            continue
        h.update(os.path.basename(p).encode() + b"\0" + str(size).encode() + b"\0" + head + tail)
    return h.hexdigest()[:12]


def fixed_from(text: str, digest: str) -> str | None:
    """The stamp line of ``text`` naming the log ``digest``, or None."""
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            break  # the stamps are the file's first lines
        m = _LOG.search(line)
        if m and m.group(1) == digest:
            return line[len(PREFIX):]
    return None


def with_stamp(text: str, signature: str, log_name: str, digest: str, today: _dt.date | None = None) -> str:
    """``text`` with a stamp for this fix on top (older stamps after it, at most KEEP in all)."""
    lines = text.splitlines(keepends=True)
    old = []
    while lines and lines[0].startswith(PREFIX):
        old.append(lines.pop(0))
    day = (today or _dt.date.today()).isoformat()
    name = re.sub(r"[\r\n]", " ", log_name)
    stamp = f"{PREFIX}{signature} from {name} (log {digest}) on {day}\n"
    return "".join([stamp, *old[:KEEP - 1], *lines])
