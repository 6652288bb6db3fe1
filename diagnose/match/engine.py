"""Matching: literal anchors over large buffers first, regexes only on lines an anchor hit.

One interface, several engines. An engine is compiled once from the database's line-scope
signatures (plus the structure parsers' anchors) and then scans byte buffers that hold whole
lines. It returns, per matching line, the line's byte span and the keys whose anchors occur in it
(an occurrence belongs to the line its first byte is on); ``verify`` then runs each signature's
regex on that one decoded line.

Engines (match/engines.py: ``available_engines()``; ``make_engine(name=None)`` picks the fastest one
installed):

* ``regex``: pure Python. Sweeping the buffer once per anchor with ``bytes.find`` costs about
  1.5 GB/s per anchor, i.e. a few MB/s for 400 anchors, so on large buffers the engine plans,
  from a sample of the data, one ``re`` pass over the anchors' bytes that are rare in this log
  (plus ``bytes.find`` sweeps where those are cheaper): see :class:`RegexEngine`. The plan
  changes speed only, never results.
* ``hyperscan`` (optional extra ``diagnose[fast]``): all anchors compiled as literals into one
  Hyperscan database, one pass per buffer (``hyperscan_engine.py``).

Both give identical results (tests/match/test_engines.py). ``Engine.scan_sampled`` (what the scan
uses) also samples the lines of dense keys (iteration, memory, step-time lines) in big buffers.
"""
from __future__ import annotations

import heapq
import re
import time
from abc import ABC, abstractmethod
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterable

import regex

from ..model import Signature


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


class RegexEngine(Engine):
    """Pure-Python engine: one ``re`` pass plus a few ``bytes.find`` sweeps, planned from the data.

    Sweeping the buffer once per anchor costs ~1.5 GB/s per anchor, i.e. a few MB/s for 400
    anchors. So, from a sample of the data, a greedy weighted set cover picks how each anchor is
    reached:

    * through one of its bytes that is rare in this log: all such anchors share one ``re`` pass
      whose first character set is those bytes (``re`` skips other bytes at C speed, ~400 MB/s)
      and whose alternatives are each anchor's rest, from that byte, with a lookbehind for the
      whole anchor: every match is an anchor occurrence;
    * or through a substring it shares with other anchors, found with ``bytes.find``, each hit
      confirmed with ``startswith``.

    The plan changes speed only, never results (tests/match/test_engines.py).
    """

    name = "regex"
    PLAN_MIN = 1 << 20  # buffers smaller than this are swept literal by literal (planning costs more)
    SAMPLE = 8 << 10  # bytes per sample window
    WINDOWS = 4
    # cost model (seconds, one core of the benchmark machine): the re pass per byte of its
    # character set met (it tries its alternatives there); a bytes.find sweep per byte of buffer
    # for a needle of 2-3 bytes and of 4+ bytes; a candidate visited in Python
    C_STOP = 50e-9
    C_SHORT, C_FIND = 1 / 1.1e9, 1 / 1.7e9
    C_CAND = 1.0e-6

    def __init__(self, anchors: dict[str, tuple[str, ...]], dense: Iterable[str] = ()):
        super().__init__(anchors, dense)
        self.plan: tuple | None = None
        self.plan_rate: float | None = None  # seconds per byte the plan took on its own buffer
        self.replans = 0
        self.planned_buffers = 0  # buffers swept by a plan (the rest, small ones, literal by literal)

    WIDTHS = (3, 6)  # substring lengths tried as shared find needles (and whole anchors)

    def make_plan(self, sample: bytes, n: int) -> tuple:
        """(re pattern or None, {group: (literal, pivot offset)}, {group: [(literal that can occur at
        the same pivot, its pivot offset)]}, [(needle, [(literal, offset)], expected hits per byte)])."""
        m = max(1, len(sample))
        freq = Counter(sample)
        scale = n / m
        grams = {w: Counter(sample[i:i + w] for i in range(m - w + 1)) for w in self.WIDTHS}

        def occurrences(g: bytes) -> float:
            c = grams[len(g)].get(g, 0) if len(g) in grams else sample.count(g)
            return (c + 0.5) * scale

        lits = list(self.by_literal)
        serve: dict = defaultdict(set)  # ("re", byte) or ("find", needle) -> literals it reaches
        for lit in lits:
            for c in set(lit):
                serve[("re", c)].add(lit)
            for width in self.WIDTHS:
                for k in range(len(lit) - width + 1):
                    serve[("find", lit[k:k + width])].add(lit)
            serve[("find", lit)].add(lit)

        base: dict = {}  # what each candidate costs on its own
        for cand in serve:
            kind, x = cand
            if kind == "re":
                base[cand] = (freq.get(x, 0) + 0.5) * scale * self.C_STOP
            else:
                base[cand] = n * (self.C_SHORT if len(x) < 4 else self.C_FIND) + occurrences(x) * self.C_CAND

        # greedy weighted set cover (lazy: a candidate's ratio only grows as literals get covered).
        # The re pass's own cost is left out of the ratios: counted there, it makes the first
        # byte picked a common one that reaches many anchors at once
        left = set(lits)
        heap = [(base[c] / len(v), c) for c, v in serve.items()]
        heapq.heapify(heap)
        picked: list = []
        while left and heap:
            _, cand = heapq.heappop(heap)
            got = serve[cand] & left
            if not got:
                continue
            now = base[cand] / len(got)
            if heap and now > heap[0][0] + 1e-15:
                heapq.heappush(heap, (now, cand))
                continue
            left -= got
            picked.append(cand)
        # then drop the costliest picks whose anchors the other picks reach anyway
        for cand in sorted(picked, key=lambda c: -base[c]):
            others = set().union(*(serve[c] for c in picked if c != cand))
            if serve[cand] <= others:
                picked.remove(cand)
        chosen = {c[1] for c in picked if c[0] == "re"}
        re_lits = sorted({lit for c in picked if c[0] == "re" for lit in serve[c]})
        covered = set(re_lits)
        finds = []
        for cand in sorted((c for c in picked if c[0] == "find"), key=lambda c: base[c]):
            group = sorted(serve[cand] - covered)  # what the re pass reaches needs no sweep
            if group:
                finds.append((cand[1], group))
                covered |= set(group)
        pattern, leaves, cos = None, {}, {}
        if re_lits:
            pivots = []

            def rarity(lit: bytes, i: int) -> tuple:  # re stops at the byte, then walks the next ones
                head = grams[3].get(lit[i:i + 3], 0) if len(lit) - i >= 3 else freq.get(lit[i], 0)
                return head, freq.get(lit[i], 0), i

            for lit in re_lits:  # an anchor's alternative starts at the chosen byte of its rarest 3 bytes
                k = min((i for i in range(len(lit)) if lit[i] in chosen), key=lambda i: rarity(lit, i))
                pivots.append((lit, k))
            pattern = re.compile(_trie(pivots))
            # a match names the first alternative that matched (its empty group); the anchors that
            # can occur at the same pivot (rests prefix-related, heads suffix-related) are checked too
            by_byte: dict = defaultdict(list)  # co-occurring anchors share their pivot byte
            for lit, k in pivots:
                by_byte[lit[k]].append((lit, k))
            for name, gi in pattern.groupindex.items():
                lit, k = leaves[gi] = pivots[int(name[1:])]
                rest, head = lit[k:], lit[:k]
                co = tuple((o, j) for o, j in by_byte[lit[k]] if o != lit
                           and (o[j:].startswith(rest) or rest.startswith(o[j:]))
                           and (o[:j].endswith(head) or head.endswith(o[:j])))
                if co:
                    cos[gi] = co
        # a needle's expected hits per byte of buffer: a buffer with many more asks for a new plan
        sweeps = [(g, [(lit, lit.find(g)) for lit in group], occurrences(g) / n) for g, group in finds]
        return pattern, leaves, cos, sweeps

    def _sample(self, buf: bytes) -> bytes:
        n, w = len(buf), self.SAMPLE
        if n <= w * self.WINDOWS:
            return buf
        step = (n - w) // (self.WINDOWS - 1)
        return b"".join(buf[i * step:i * step + w] for i in range(self.WINDOWS))

    def occurrences(self, buf: bytes) -> dict:
        lists: dict = {lit: [] for lit in self.by_literal}
        self._sweep(buf, {lit: offs.append for lit, offs in lists.items()})
        return {lit: offs for lit, offs in lists.items() if offs}

    def _sweep(self, buf: bytes, push: dict):
        find = buf.find
        if len(buf) < self.PLAN_MIN or not buf:
            for lit in self.by_literal:
                i = find(lit)
                while i >= 0:
                    push[lit](i)
                    i = find(lit, i + 1)
            return
        if self.plan is None:  # planned from the first large buffer (and again, see below)
            self.plan, self.plan_rate = self.make_plan(self._sample(buf), len(buf)), None
        t0 = time.perf_counter()
        surprised = self._planned(buf, push)
        self.planned_buffers += 1
        rate = (time.perf_counter() - t0) / len(buf)
        if self.plan_rate is None:
            self.plan_rate = rate
        elif (surprised or rate > self.REPLAN * self.plan_rate) and self.replans < self.MAX_REPLANS:
            # this buffer is unlike the one planned from (the first file of a job held no
            # iteration lines, say): plan again from the next large one
            self.plan = None
            self.replans += 1

    REPLAN = 1.3  # a buffer this many times slower per byte than the plan's own: plan again
    SURPRISE = 4  # ... or a needle with this many times the hits the sample promised (+1000)
    MAX_REPLANS = 8

    def _planned(self, buf: bytes, push: dict):
        find = buf.find
        assert self.plan is not None  # made by scan() before it calls here
        pattern, leaves, cos, sweeps = self.plan
        startswith = buf.startswith
        if pattern is not None:
            search = pattern.search
            fast = {g: (push[lit], k) for g, (lit, k) in leaves.items()}
            m = search(buf)
            while m is not None:
                p = m.start()
                g = m.lastindex
                add, k = fast[g]
                add(p - k)
                if g in cos:
                    for lit, k in cos[g]:
                        if p >= k and startswith(lit, p - k):
                            push[lit](p - k)
                m = search(buf, p + 1)
        surprised = False
        for needle, members, per_byte in sweeps:
            hits = 0
            i = find(needle)
            while i >= 0:
                hits += 1
                for lit, k in members:
                    if i >= k and startswith(lit, i - k):
                        push[lit](i - k)
                i = find(needle, i + 1)
            surprised = surprised or hits > self.SURPRISE * per_byte * len(buf) + 1000
        return surprised


def _trie(pivots: list) -> bytes:
    """One ``re`` alternation over anchors entered at a pivot byte: ``[(literal, k)]`` -> the
    pattern of every ``literal[k:]``, each followed by a lookbehind for the whole literal (so a
    match is an occurrence of the literal, and starts at its byte ``k``) and an empty group named
    ``a<index in pivots>``; alternatives that share a beginning share one branch."""
    root: dict = {}
    for idx, (lit, k) in enumerate(pivots):
        node = root
        for c in lit[k:]:
            node = node.setdefault(c, {})
        node.setdefault(None, []).append((lit, idx))

    def emit(node: dict) -> bytes:
        # each alternative ends in an empty group named after its anchor: m.lastindex tells which
        alts = [b"(?<=" + re.escape(lit) + b")(?P<a%d>)" % idx for lit, idx in sorted(node.get(None, ()))]
        for c in sorted(x for x in node if x is not None):
            child, run = node[c], bytes([c])
            while None not in child and len(child) == 1:  # a chain without branches: one literal run
                (c2, child), = child.items()
                run += bytes([c2])
            alts.append(re.escape(run) + emit(child))
        if len(alts) == 1:
            return alts[0]
        return b"(?:" + b"|".join(alts) + b")"

    return emit(root)


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


def scan_anchors(db, versions: dict | None = None, structure: bool = True) -> dict[str, tuple[str, ...]]:
    """key -> anchors, exactly what a Scanner compiles: line-scope signatures (+ structure parsers)."""
    from ..db import applies_to
    from ..logs.structure import ANCHORS

    out = {s.id: s.anchors for s in db.line_signatures() if applies_to(s, versions or {})}
    if structure:
        out.update(ANCHORS)
    return out


_compiled: dict[str, regex.Pattern] = {}


def compiled(pattern: str):
    pat = _compiled.get(pattern)
    if pat is None:
        pat = _compiled[pattern] = regex.compile(pattern)
    return pat


def verify(sig: Signature, line: str) -> dict | None:
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
