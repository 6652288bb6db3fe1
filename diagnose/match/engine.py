"""Matching: literal anchors over large buffers first, regexes only on lines an anchor hit.

One interface, several engines. An engine is compiled once from the database's line-scope
signatures (plus the structure parsers' anchors) and then scans byte buffers that hold whole
lines. It returns, per matching line, the line's byte span and the keys whose anchors occur in it
(an occurrence belongs to the line its first byte is on); ``verify`` (match/verify.py) then runs
each signature's regex on that one decoded line.

Engines (match/engines.py: ``available_engines()``; ``make_engine(name=None)`` picks the fastest one
installed):

* ``regex``: pure Python. Sweeping the buffer once per anchor with ``bytes.find`` costs about
  1.5 GB/s per anchor, i.e. a few MB/s for 400 anchors, so on large buffers the engine plans,
  from a sample of the data, one ``re`` pass over the anchors' bytes that are rare in this log
  (plus ``bytes.find`` sweeps where those are cheaper): ``regex_engine.py``. The plan changes
  speed only, never results.
* ``hyperscan`` (optional extra ``diagnose[fast]``): all anchors compiled as literals into one
  Hyperscan database, one pass per buffer (``hyperscan_engine.py``).

Both give identical results (tests/match/test_engines.py). ``Engine.scan_sampled`` (what the scan
uses) also samples the lines of dense keys (iteration, memory, step-time lines) in big buffers.
Which anchors an engine compiles, and their export for line tools: match/anchors.py.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable


class Engine(ABC):
    name = "abstract"

    # dense keys (scan_sampled): a key with at most EXACT occurrences in a buffer keeps them all;
    # above that, the first occurrence in each of BUCKETS equal slices of the buffer, and the last
    EXACT = 256
    BUCKETS = 32

    def __init__(self, anchors: dict[str, tuple[str, ...]], dense: Iterable[str] = ()):
        """``anchors`` maps a key (signature id or structure name) to its literal anchors;
        ``dense`` names the keys whose lines may be sampled (see ``scan_sampled``)."""
        self.anchors = anchors
        self.by_literal: dict[bytes, list[str]] = defaultdict(list)
        for key, lits in anchors.items():
            for lit in lits:
                b = lit.encode("utf-8")
                if key not in self.by_literal[b]:
                    self.by_literal[b].append(key)
        self.by_literal = dict(self.by_literal)
        self.keys_of = {lit: tuple(keys) for lit, keys in self.by_literal.items()}
        dense = set(dense)
        # a literal is dense when every key it serves is: its occurrences count, most are skipped
        self.dense_of: dict[bytes, str] = {lit: keys[0] for lit, keys in self.by_literal.items()
                                           if len(keys) == 1 and keys[0] in dense}

    @abstractmethod
    def occurrences(self, buf: bytes) -> dict[bytes, list[int]]:
        """{literal: offsets of its occurrences in ``buf``}; literals that do not occur are left out."""

    def find(self, buf: bytes) -> list[tuple[int, bytes]]:
        """(offset, literal) for every occurrence of every anchor literal in ``buf``."""
        return [(off, lit) for lit, offs in self.occurrences(buf).items() for off in offs]

    def find_split(self, buf: bytes) -> tuple[list, dict]:
        """(occurrences of the other literals as (offset, literal), {dense literal: [offsets]}):
        dense literals are the bulk of the matches in a big log, kept as bare offsets."""
        occ: list = []
        dense: dict = {}
        dense_of = self.dense_of
        for lit, offs in self.occurrences(buf).items():
            if lit in dense_of:
                dense[lit] = offs
            else:
                occ.extend((off, lit) for off in offs)
        return occ, dense

    def scan(self, buf: bytes) -> list[tuple[int, int, set]]:
        """Lines of ``buf`` containing an anchor: sorted [(line_start, line_end, {keys})].

        An occurrence belongs to the line its first byte is on (``line_end`` is the offset of
        that line's newline, or ``len(buf)``).
        """
        return self._lines(buf, self.find(buf))

    def scan_sampled(self, buf: bytes) -> tuple[list[tuple[int, int, set]], dict]:
        """``scan`` with the lines of dense keys sampled: (lines, {dense key: occurrences}).

        Iteration, memory and step-time lines come every few hundred bytes in a big log; parsing
        each one costs more than finding it. Per buffer, a dense key with at most ``EXACT``
        occurrences keeps them all; above that, the first occurrence in each of ``BUCKETS``
        equal slices of the buffer and the last one. A line that another key puts in the result
        keeps its dense keys too (an iteration line with a NaN is always read). The choice
        depends on the offsets only, so every engine and job count samples the same lines; the
        counts are exact.
        """
        occ, dense = self.find_split(buf)
        counts: dict[str, int] = {}
        if not dense:
            return self._lines(buf, occ), counts
        n, k = len(buf), self.BUCKETS
        by_key: dict[str, list] = {}  # dense key -> its literals' offset lists (each one sorted)
        for lit, offs in dense.items():
            by_key.setdefault(self.dense_of[lit], []).append((lit, offs))
        sampled: dict[str, list] = {}  # dense key -> every offset, where some were skipped
        for key, parts in by_key.items():
            # any of the key's literals stands for it in the result: lines carry keys, not literals
            lit = parts[0][0]
            if len(parts) == 1:
                offs = parts[0][1]
                offs.sort()  # found in order already (linear in C then): no engine's order is relied on
            else:
                offs = sorted(o for _, offs in parts for o in offs)
            counts[key] = len(offs)
            if len(offs) <= self.EXACT:
                occ.extend((o, lit) for o in offs)
                continue
            keep = {bisect_left(offs, -(-b * n // k)) for b in range(k)}  # first at or after each slice start
            keep.add(len(offs) - 1)
            occ.extend((offs[i], lit) for i in keep if i < len(offs))
            sampled[key] = offs
        lines = self._lines(buf, occ)
        # lines in the result for another key keep their dense keys (a dense occurrence skipped)
        for key, offs in sampled.items():
            for start, end, keys in lines:
                if key not in keys:
                    i = bisect_left(offs, start)
                    if i < len(offs) and offs[i] <= end:
                        keys.add(key)
        return lines, counts

    def _lines(self, buf: bytes, occ: list) -> list[tuple[int, int, set]]:
        if not occ:
            return []
        occ.sort()
        rfind, find, n = buf.rfind, buf.find, len(buf)
        keys_of = self.keys_of
        out = []
        end = -1
        keys: set = set()
        for off, lit in occ:
            if off <= end:  # sorted: the same line as the previous occurrence
                keys.update(keys_of[lit])
                continue
            end = find(b"\n", off)
            if end < 0:
                end = n
            keys = set(keys_of[lit])
            out.append((rfind(b"\n", 0, off) + 1, end, keys))
        return out
