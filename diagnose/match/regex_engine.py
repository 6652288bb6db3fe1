"""The pure-Python engine: one ``re`` pass plus a few ``bytes.find`` sweeps, planned from the data
(the interface: match/engine.py)."""
from __future__ import annotations

import heapq
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable

from .engine import Engine


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
