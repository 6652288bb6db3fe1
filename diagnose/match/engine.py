"""Matching: literal anchors over large buffers first, regexes only on lines an anchor hit.

One interface, several engines. An engine is compiled once from the database's line-scope
signatures (plus the structure parsers' anchors) and then scans byte buffers that hold whole
lines. It returns, per matching line, the line's byte span and the keys whose anchors occur in it
(an occurrence belongs to the line its first byte is on); ``verify`` then runs each signature's
regex on that one decoded line.

Engines (``available_engines()``; ``make_engine(name=None)`` picks the fastest one installed):

* ``regex``: pure Python. Sweeping the buffer once per anchor with ``bytes.find`` costs about
  1.3 GB/s per anchor, i.e. ~10 MB/s for 140 anchors, so on large buffers the engine plans its
  sweeps from a sample of the data: each anchor is reached through its rarest byte, found with
  ``memchr`` (``bytes.find`` of one byte, many GB/s) and confirmed with ``startswith`` at that
  offset; anchors whose rarest byte is common in this log keep their own ``bytes.find`` sweep.
  The plan changes speed only, never results.
* ``hyperscan`` (optional extra ``diagnose[fast]``): all anchors compiled as literals into one
  Hyperscan database, one pass per buffer (``hyperscan_engine.py``).

Both give identical results (tests/test_engines.py).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_left
from collections import Counter, defaultdict
from typing import Iterable, Optional

import regex

from ..model import Signature


class Engine(ABC):
    name = "abstract"

    # dense keys (scan_sampled): a key with at most EXACT occurrences in a buffer keeps them all;
    # above that, the first occurrence in each of BUCKETS equal slices of the buffer, and the last
    EXACT = 256
    BUCKETS = 64

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
    def find(self, buf: bytes) -> Iterable[tuple[int, bytes]]:
        """Yield (offset, literal) for every occurrence of every anchor literal in ``buf``."""

    def find_split(self, buf: bytes) -> tuple[list, dict]:
        """(occurrences of the other literals as (offset, literal), {dense literal: [offsets]})."""
        occ, dense = [], {}
        dense_of = self.dense_of
        for off, lit in self.find(buf):
            if lit in dense_of:
                dense.setdefault(lit, []).append(off)
            else:
                occ.append((off, lit))
        return occ, dense

    def scan(self, buf: bytes) -> list[tuple[int, int, set]]:
        """Lines of ``buf`` containing an anchor: sorted [(line_start, line_end, {keys})].

        An occurrence belongs to the line its first byte is on (``line_end`` is the offset of
        that line's newline, or ``len(buf)``).
        """
        occ = self.find(buf)
        if not isinstance(occ, list):
            occ = list(occ)
        return self._lines(buf, occ)

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
        by_key: dict[str, list] = {}
        for lit, offs in dense.items():
            key = self.dense_of[lit]
            counts[key] = counts.get(key, 0) + len(offs)
            by_key.setdefault(key, []).extend((off, lit) for off in offs)
        for key, pairs in by_key.items():
            pairs.sort()
            if len(pairs) <= self.EXACT:
                occ.extend(pairs)
                continue
            offs = [off for off, _ in pairs]
            keep = {bisect_left(offs, -(-b * n // k)) for b in range(k)}  # first at or after each slice start
            keep.add(len(pairs) - 1)
            occ.extend(pairs[i] for i in keep if i < len(pairs))
        lines = self._lines(buf, occ)
        # lines in the result for another key keep their dense keys (a dense occurrence skipped)
        for key, pairs in by_key.items():
            if len(pairs) <= self.EXACT:
                continue
            offs = [off for off, _ in pairs]
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


class RegexEngine(Engine):
    """Pure-Python engine: C-level ``bytes.find`` sweeps, planned from the data (module docstring)."""

    name = "regex"
    PLAN_MIN = 1 << 20  # buffers smaller than this are swept literal by literal (planning costs more)
    SAMPLE = 8 << 10  # bytes per sample window
    WINDOWS = 4
    # cost model (seconds; measured on one core of the benchmark machine): a bytes.find sweep per
    # byte of buffer for a needle of 1 byte (memchr), 2-4 bytes, 5+ bytes; one candidate offset
    # visited in Python; one startswith check
    C_MEMCHR, C_SHORT, C_FIND = 1 / 9e9, 1 / 0.35e9, 1 / 1.2e9
    C_CAND, C_CHECK = 0.9e-6, 0.6e-6
    RARE = 1e-3  # a byte rarer than this (per byte of sample) is a memchr pivot candidate

    def __init__(self, anchors: dict[str, tuple[str, ...]], dense: Iterable[str] = ()):
        super().__init__(anchors, dense)
        self.plan: Optional[tuple[list, list]] = None

    def make_plan(self, sample: bytes, n: int) -> tuple[list, list]:
        """([(pivot, width, {pivot..+width: [(literal, offset)]})], [literals swept alone]).

        A greedy weighted set cover: every literal is reached through one pivot, one of its rare
        bytes (found with memchr) or one of its 6-byte substrings or itself (found with
        ``bytes.find``). A pivot costs one sweep plus a Python visit of each of its occurrences
        (counted in ``sample``, scaled to ``n``); at each occurrence a dict of the bytes that
        follow it picks the literals worth a ``startswith``.
        """
        m = max(1, len(sample))
        freq = [0] * 256
        for b, c in Counter(sample).items():
            freq[b] = c
        scale = n / m
        counts: dict[bytes, float] = {}

        def occurrences(g: bytes) -> float:
            c = counts.get(g)
            if c is None:
                c = counts[g] = ((freq[g[0]] if len(g) == 1 else sample.count(g)) + 0.5) * scale
            return c

        def sweep(g: bytes) -> float:
            return n * (self.C_MEMCHR if len(g) == 1 else self.C_SHORT if len(g) < 5 else self.C_FIND)

        lits = list(self.by_literal)
        cover: dict[bytes, set] = {}
        for lit in lits:
            cover.setdefault(lit, set()).add(lit)
            for b in set(lit):
                if freq[b] < self.RARE * m:
                    cover.setdefault(bytes([b]), set()).add(lit)
        for lit in lits:
            for k in range(0, len(lit) - 5):
                cover.setdefault(lit[k:k + 6], set()).add(lit)
        # substrings that serve one literal only are never better than the literal itself
        cover = {g: v for g, v in cover.items() if len(v) > 1 or g in v or len(g) == 1}
        left = set(lits)
        groups = []
        while left:
            best = None
            for g, members in cover.items():
                serve = members & left
                if not serve:
                    continue
                cost = (sweep(g) + occurrences(g) * (self.C_CAND + self.C_CHECK)) / len(serve)
                if best is None or (cost, g) < best[:2]:
                    best = (cost, g, serve)
            left -= best[2]
            groups.append((best[1], sorted(best[2])))
        planned, alone = [], []
        for g, members in sorted(groups):
            if members == [g]:
                alone.append(g)
                continue
            pairs = [(lit, lit.find(g)) for lit in members]
            width = min(4, min(len(lit) - k for lit, k in pairs))
            table: dict[bytes, list] = defaultdict(list)
            for lit, k in pairs:
                table[lit[k:k + width]].append((lit, k))
            planned.append((g, width, dict(table)))
        return planned, alone

    def _sample(self, buf: bytes) -> bytes:
        n, w = len(buf), self.SAMPLE
        if n <= w * self.WINDOWS:
            return buf
        step = (n - w) // (self.WINDOWS - 1)
        return b"".join(buf[i * step:i * step + w] for i in range(self.WINDOWS))

    def find(self, buf: bytes):
        find = buf.find
        if len(buf) < self.PLAN_MIN:
            plan, alone = [], list(self.by_literal)
        else:
            if self.plan is None:  # planned once, from the first large buffer
                self.plan = self.make_plan(self._sample(buf), len(buf))
            plan, alone = self.plan
        for lit in alone:
            i = find(lit)
            while i >= 0:
                yield i, lit
                i = find(lit, i + 1)
        startswith = buf.startswith
        for pivot, width, table in plan:
            get = table.get
            i = find(pivot)
            while i >= 0:
                members = get(buf[i:i + width])
                if members:
                    for lit, k in members:
                        if i >= k and startswith(lit, i - k):
                            yield i - k, lit
                i = find(pivot, i + 1)


_ERE_SPECIAL = set("\\.[()*+?{|^$")


def line_pattern(literal: str) -> str:
    """One anchor as a line pattern for ``grep -E`` and ``rg`` (POSIX ERE and Rust regex alike).

    Only the characters special to both dialects are escaped (``\\ . [ ( ) * + ? { | ^ $``;
    escaping others makes GNU grep warn of stray backslashes). Line tools cannot see across a
    newline: an anchor that ends with one becomes ``...$``; one that spans lines keeps its first
    line, anchored at the line end (a slightly wider pattern, never a narrower one).
    """
    head, nl, _rest = literal.partition("\n")
    out = "".join("\\" + c if c in _ERE_SPECIAL else c for c in head)
    return out + "$" if nl else out


def scan_anchors(db, versions: Optional[dict] = None, structure: bool = True) -> dict[str, tuple[str, ...]]:
    """key -> anchors, exactly what a Scanner compiles: line-scope signatures (+ structure parsers)."""
    from ..db import applies_to
    from ..logs.structure import ANCHORS

    out = {s.id: s.anchors for s in db.line_signatures() if applies_to(s, versions or {})}
    if structure:
        out.update(ANCHORS)
    return out


def available_engines() -> dict[str, type]:
    engines = {"regex": RegexEngine}
    try:
        from .hyperscan_engine import HyperscanEngine  # noqa: F401

        if HyperscanEngine.available():
            engines["hyperscan"] = HyperscanEngine
    except ImportError:
        pass
    return engines


def make_engine(anchors: dict[str, tuple[str, ...]], name: Optional[str] = None, dense: Iterable[str] = ()) -> Engine:
    engines = available_engines()
    if name is None or name == "auto":
        name = "hyperscan" if "hyperscan" in engines else "regex"
    if name not in engines:
        raise ValueError(f"engine {name!r} is not available (have: {', '.join(sorted(engines))})")
    return engines[name](anchors, dense)


_compiled: dict[str, "regex.Pattern"] = {}


def compiled(pattern: str):
    pat = _compiled.get(pattern)
    if pat is None:
        pat = _compiled[pattern] = regex.compile(pattern)
    return pat


def verify(sig: Signature, line: str) -> Optional[dict]:
    """Does ``line`` match ``sig``? Returns its captures ({} without a regex) or None."""
    if not any(a in line for a in sig.anchors):
        return None
    if not sig.regex:
        return {}
    m = compiled(sig.regex).search(line, timeout=0.25)
    if m is None:
        return None
    return {k: v for k, v in m.groupdict().items() if v is not None}


def line_matches(sig: Signature, line: str) -> bool:
    try:
        return verify(sig, line) is not None
    except TimeoutError:
        return False
