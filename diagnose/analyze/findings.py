"""Hits -> findings: all hits of one signature, counted per rank, bounded in memory."""
from __future__ import annotations

from collections import Counter

from ..logs.lines import starts_cpp_record
from ..model import Finding, Hit, Role, Signature

MAX_SAMPLES = 20
MAX_LINES = 200_000  # (file, line) of root / cascade hits kept to tell explained exceptions from the rest
MAX_RANKS = 65_536  # distinct ranks counted per finding (a larger job's further ranks count in ``count`` only)


class Findings:
    """Aggregates hits as they stream in. Memory is O(signatures x (MAX_SAMPLES + MAX_RANKS)) and
    O(MAX_LINES), whatever the log."""

    def __init__(self):
        self.by_id: dict[str, Finding] = {}
        self.lines: set = set()
        self._order = 0

    def add(self, sig: Signature, hit: Hit) -> Finding:
        self._order += 1
        hit.order = hit.order or self._order
        f = self.by_id.get(sig.id)
        if f is None:
            f = self.by_id[sig.id] = Finding(signature=sig, first=hit, count=0, ranks=Counter(), samples=[])
        f.count += 1
        # lines that explain an exception there, on its line or within two lines of it (a message
        # wrapped over lines): a root, or a consequence, except a consequence that is a record of
        # its own below the exception (a C++ log line, "[E ProcessGroupNCCL.cpp:456] ...", under
        # one rank's unknown error does not explain that error); not advice or a launcher's
        # summary (a confirmation names no cause). (file, line, a consequence's own record)
        if len(self.lines) < MAX_LINES and sig.role in (Role.ROOT, Role.CASCADE):
            record = sig.role == Role.CASCADE and starts_cpp_record(hit.text)
            self.lines.add((hit.file, hit.line, record))
        if hit.rank in f.ranks or len(f.ranks) < MAX_RANKS:
            f.ranks[hit.rank] += 1
        if len(f.samples) < MAX_SAMPLES:
            f.samples.append(hit)
        if _earlier(hit, f.first):
            f.first = hit
        return f

    def all(self) -> list[Finding]:
        return sorted(self.by_id.values(), key=lambda f: f.first.order)

    def get(self, sig_id: str) -> Finding | None:
        return self.by_id.get(sig_id)

    def remove(self, sig_id: str):
        self.by_id.pop(sig_id, None)


def _earlier(a: Hit, b: Hit) -> bool:
    if a.time is not None and b.time is not None and a.time != b.time:
        return a.time < b.time
    return a.order < b.order


def first_hit(hits: list[Hit]) -> Hit:
    """The earliest hit: by timestamp where all have one, else by order of discovery."""
    if all(h.time is not None for h in hits):
        return min(hits, key=lambda h: (h.time, h.order))
    return min(hits, key=lambda h: h.order)
