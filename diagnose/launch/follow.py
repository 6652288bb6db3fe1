"""Follow a growing log and diagnose its lines as they arrive.

``Follower(path).poll()`` reads what was appended since the last call, hands the new *whole*
lines to the same ``Scanner.scan_chunk`` the batch scan uses (a half-written last line waits
for its newline; blocks such as tracebacks stay open across polls), and returns the findings
that are new. ``fatal()`` names the first finding that is a root cause of severity error: the
moment a launcher can end the job instead of waiting for the NCCL watchdog on every other
rank. ``report()`` closes the scan and runs the usual root-cause analysis on everything read.

A file that shrinks (truncated or replaced by a new run) is read again from the start.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from ..analyze.findings import Findings
from ..db import Database, load
from ..diagnosis import analyze, scanner_for
from ..logs import structure as S
from ..logs.read import MAX_LINE, Chunk, normalize
from ..model import Finding, Report, Role, Severity
from ..scan import ScanResult

POLL_S = 0.05  # how often the file is checked for new bytes
READ_MAX = 8 << 20  # bytes read per poll at most (a burst is scanned over several polls)


def is_fatal(f: Finding) -> bool:
    s = f.signature
    return s.role == Role.ROOT and s.severity == Severity.ERROR and s.scope in ("line", "refine")


HEAD_BYTES = 256  # compared on every poll to tell a rewritten file from a grown one


class Follower:
    def __init__(self, path: str | os.PathLike, db: Database | None = None, config=None,
                 versions: dict | None = None, name: str | None = None):
        self.path = Path(path)
        self.name = name or str(path)
        self.db = db or load()
        self.config = config
        self.scanner = scanner_for(self.db, None, versions)
        self.offset = 0
        self.line = 1
        self.carry = b""
        self._seen: dict[str, int] = {}
        self._ino: int | None = None
        self._head = b""  # the first bytes read: a file rewritten in place shows other bytes there
        self.closed = False
        self.res = self._fresh()
        self.first_fatal_at: float | None = None  # monotonic time the fatal line was read

    def _fresh(self) -> ScanResult:
        return ScanResult(Findings(), S.Structure(), [], engine=self.scanner.engine.name)

    def _restart(self):
        self.offset, self.line, self.carry, self._head = 0, 1, b"", b""
        self._seen.clear()
        self.res = self._fresh()

    def _read_new(self) -> bytes:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return b""
        if self._ino is not None and (st.st_ino != self._ino or st.st_size < self.offset + len(self.carry)):
            self._restart()  # replaced or truncated
        self._ino = st.st_ino
        with open(self.path, "rb") as fh:
            # truncated and grown again past where we were between two polls (a job restarted into
            # the same file, `>` instead of `>>`): the first bytes differ; read it anew
            if self._head and fh.read(len(self._head)) != self._head:
                self._restart()
            start = self.offset + len(self.carry)
            if st.st_size <= start:
                return b""
            fh.seek(start)
            data = fh.read(min(st.st_size - start, READ_MAX))
            if len(self._head) < HEAD_BYTES and start == len(self._head):
                self._head += data[:HEAD_BYTES - len(self._head)]
            return data

    def poll(self) -> list[Finding]:
        """Scan the lines appended since the last poll; the findings that are new or grew."""
        new = self._read_new()
        if not new:
            return []
        data = self.carry + new
        cut = data.rfind(b"\n") + 1
        if len(data) - cut >= MAX_LINE:
            # the unfinished last line is already longer than the reader's bound (a 600 MB line
            # without a newline, alone or after whole lines): scanned in pieces as logs/read.py
            # scans it, so the pending part never grows past MAX_LINE
            cut = len(data)
        elif cut == 0:
            self.carry = data
            return []
        whole, self.carry = data[:cut], data[cut:]
        self._scan(whole)
        return self._changed()

    def _scan(self, whole: bytes):
        data = normalize(whole)  # as the batch reader frames lines (lone CR, ANSI, NUL)
        self.scanner.scan_chunk(Chunk(data, self.line, self.offset), self.name, 0, self.res)
        self.res.bytes_read += len(whole)
        self.offset += len(whole)
        self.line += data.count(b"\n")

    def _changed(self) -> list[Finding]:
        out = []
        for f in self.res.findings.all():
            if self._seen.get(f.id, 0) != f.count:
                self._seen[f.id] = f.count
                out.append(f)
                if self.first_fatal_at is None and is_fatal(f):
                    self.first_fatal_at = time.monotonic()
        return out

    def fatal(self) -> Finding | None:
        """The earliest root-cause finding of severity error seen so far, or None."""
        cands = [f for f in self.res.findings.all() if is_fatal(f)]
        return min(cands, key=lambda f: f.first.order) if cands else None

    def report(self) -> Report:
        """Close the scan (the last line without a newline counts) and analyze everything read."""
        if not self.closed:
            self.poll()
            unfinished = 0
            if self.carry:  # the last line, without its newline: it counts, as in a batch scan
                tail, self.carry = self.carry, b""
                self._scan(tail)
                unfinished = 1
            self.scanner._close_blocks(self.res)
            self.res.sources.append(self.name)
            self.res.lines_read = self.line - 1 + unfinished
            self.closed = True
        return analyze(self.db, self.res, self.config)

