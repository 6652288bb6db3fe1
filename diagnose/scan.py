"""The scan: read -> lines -> structure + match -> findings.

``Scanner`` is compiled once from the database; ``scan_paths`` streams every input through it.
Per chunk, the engine finds the lines that hold an anchor (a C-speed sweep over the whole
buffer); only those lines are decoded, split from their launcher prefix and checked against
their signatures' regexes; structure anchors start the block readers of logs/structure.py.
"""
from __future__ import annotations

import gc
import re
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .analyze.findings import Findings
from .db import Database
from .logs import lines as L
from .logs import read as R
from .logs import structure as S
from .match.engine import Engine
from .match.engines import make_engine
from .match.verify import compiled, excluded, verify
from .model import Hit, Severity

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d{1,6})(?!\d)", re.I)


def rank_from_name(name: str) -> int | None:
    """One file per rank is common (rank3.log, stdout_rank_12.txt, rank-7/out.log): its rank."""
    path = name.replace("\\", "/")
    for part in (path.rsplit("/", 1)[-1], path):
        found = _RANK_IN_NAME.findall(part)
        if found:
            return int(found[-1])
    return None


TAIL_BYTES = 1 << 16  # the end of each file kept to read its last lines (Structure.tails)
_COUNTER = re.compile(r"\s*\[\d+/\d+\]\s*$")  # a terminal's scroll position at the end of a copied line
_SOURCE_RAISE = re.compile(r"^\s+raise\s+[\w.]+\(")
_SIZE = re.compile(r"([\d.]+)\s*(bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b", re.I)
_UNITS = {"b": 1, "bytes": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}


def size_bytes(text: str) -> float | None:
    m = _SIZE.search(text or "")
    if not m:
        return None
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def enrich_captures(caps: dict) -> dict:
    out = dict(caps)
    for k, v in caps.items():
        if k.endswith("_size"):
            b = size_bytes(v)
            if b is not None:
                out[k + "_bytes"] = b
        elif isinstance(v, str) and re.fullmatch(r"-?\d{1,30}", v):  # longer: kept as text
            out[k] = int(v)
    return out


@dataclass
class ScanResult:
    findings: Findings
    structure: S.Structure
    notes: list
    sources: list = field(default_factory=list)
    bytes_read: int = 0
    lines_read: int = 0
    seconds: float = 0.0
    engine: str = ""
    # scan state: block readers still open at a chunk's end; the rank each file's name gives
    open_blocks: list = field(default_factory=list, repr=False, compare=False)
    file_ranks: dict = field(default_factory=dict, repr=False, compare=False)


class Scanner:
    def __init__(self, db: Database, engine: str | None = None, versions: dict | None = None,
                 sample: bool = True):
        """``sample``: big logs' iteration, memory and step-time lines are sampled (Engine.scan_sampled;
        counts stay exact, anomalous lines are always read); ``compare`` wants every point."""
        from .db import applies_to

        self.db = db
        self.engine_name, self.versions, self.sample = engine, versions, sample  # the same scanner in a worker
        self.sigs = {s.id: s for s in db.line_signatures() if applies_to(s, versions or {})}
        anchors = {sid: s.anchors for sid, s in self.sigs.items()}
        anchors.update(S.ANCHORS)
        self.engine: Engine = make_engine(anchors, engine, S.DENSE if sample else ())
        self._vcache: dict = {}  # (signature id, message) -> captures or None (see _verify)
        self._fed: bytes | None = None  # the chunk whose lines _fed_table holds (see _feed)
        self._fed_table = _LineTable(b"", 0, 1)

    # one scanner state per input file
    def scan_paths(self, paths: Iterable[str], progress: Callable[[int], None] | None = None,
                   result: ScanResult | None = None) -> ScanResult:
        t0 = time.perf_counter()
        res = result or ScanResult(Findings(), S.Structure(), [], engine=self.engine.name)
        # the scan allocates many small objects and frees them at once, never in cycles: the
        # cyclic collector's passes over them cost a third of the scan time, so it waits
        gc_was = gc.isenabled()
        gc.disable()
        try:
            for idx, src in enumerate(R.iter_sources(paths, res.notes)):
                self.scan_source(src, idx, res, progress)
        finally:
            if gc_was:
                gc.enable()
        res.seconds = time.perf_counter() - t0
        return res

    def scan_source(self, src: R.Source, idx: int, res: ScanResult,
                    progress: Callable[[int], None] | None = None,
                    start: int = 0, end: int | None = None, first_line: int = 1):
        """Scan one input (file ``idx`` of the scan) into ``res``; or the piece of it from
        ``start`` to ``end`` (``R.split_points``), whose first line is ``first_line``."""
        got, n_notes = False, len(res.notes)
        line = first_line
        tail = b""  # the last TAIL_BYTES read (Structure.tails keeps its last lines)
        for chunk in R.read_chunks(src, res.notes, start=start, end=end, first_line=first_line):
            got = True
            self.scan_chunk(chunk, src.name, idx, res)
            tail = chunk.data if len(chunk.data) >= TAIL_BYTES else (tail + chunk.data)[-TAIL_BYTES:]
            res.bytes_read += chunk.size if chunk.size is not None else len(chunk.data)
            assert chunk.newlines is not None  # scan_chunk counted them
            line = chunk.first_line + chunk.newlines
            if progress:
                progress(len(chunk.data))
        if got and end is None:  # this read reached the file's end
            S.set_tail(res.structure, src.name, tail, line - 1 if tail.endswith(b"\n") else line)
        if end is not None and res.open_blocks:
            # a block (traceback, timers...) that goes on past the piece: read on for it alone,
            # as a serial scan would feed it at the next chunk's start
            for chunk in R.read_chunks(src, [], start=end, first_line=line):
                res.open_blocks = [b for b in res.open_blocks if self._feed(b, chunk.data, 0, chunk.first_line)]
                if not res.open_blocks:
                    break
        # read = some data came, or an empty file opened without a problem (a note)
        if start == 0 and (got or len(res.notes) == n_notes):
            if not got and src.path is None:
                res.notes.append("-: standard input was empty")
            res.sources.append(src.name)
        self._close_blocks(res)

    def scan_chunk(self, chunk: R.Chunk, name: str, file_idx: int, res: ScanResult):
        data = chunk.data
        # blocks still open from the previous chunk read on from this chunk's first line
        open_blocks = [b for b in res.open_blocks if self._feed(b, data, 0, chunk.first_line)]
        line_no, pos = chunk.first_line, 0
        count = data.count
        if name not in res.file_ranks:
            res.file_ranks[name] = rank_from_name(name)
        file_rank = res.file_ranks[name]
        lines, dense = self.engine.scan_sampled(data)
        for start, end, keys in lines:
            line_no += count(b"\n", pos, start)
            pos = start
            text = L.clean(data[start:end])
            rank, msg, t = None, None, None
            source_raise = False
            missed: list = []
            hits = 0
            for key in sorted(keys):
                if key[0] == "@":
                    if key in dense:
                        dense[key] -= 1  # read: what is left was skipped
                    block = S.BLOCKS.get(key)
                    if block is None:
                        S.on_line(res.structure, key, text, name, line_no)
                    elif block.wanted(res.structure, name, line_no, text):
                        b = block(res.structure, name, line_no, text)
                        if self._feed(b, data, end + 1, line_no + 1):
                            open_blocks.append(b)
                    continue
                sig = self.sigs.get(key)
                if sig is None:
                    continue
                if msg is None:
                    rank, msg = L.split_prefix(text)
                    if rank is None:
                        rank = file_rank
                    # a traceback's source line ``raise ValueError("...")`` is not the failure: the
                    # exception line right below it carries the rendered message (and is the evidence)
                    source_raise = _SOURCE_RAISE.match(msg) is not None
                if source_raise:
                    continue
                caps = self._verify(sig, msg)
                if caps is None:
                    if sig.regex and sig.severity == Severity.ERROR and sig.role in ("root", "cascade"):
                        missed.append(sig)
                    continue
                hits += 1
                if t is None:  # the time only for lines that hit (an anchor alone is often no hit)
                    t = L.timestamp(text, res.structure.year)
                res.findings.add(sig, Hit(sig.id, name, line_no, text.strip(), rank, t, enrich_captures(caps),
                                          order=file_idx * 10**12 + line_no))
            # no signature took the line whole: one whose anchor is there may take it cut or wrapped
            for sig in missed if not hits else ():
                assert msg is not None  # a signature was tried: the prefix was split off
                caps = self._recover(sig, msg, data, end)
                if caps is not None:
                    if t is None:
                        t = L.timestamp(text, res.structure.year)
                    res.findings.add(sig, Hit(sig.id, name, line_no, text.strip(), rank, t, enrich_captures(caps),
                                              order=file_idx * 10**12 + line_no))
        res.open_blocks = open_blocks
        skipped = res.structure.skipped
        for key, n in dense.items():
            if n > 0:
                skipped[key] = skipped.get(key, 0) + n
        # newlines before ``pos`` were counted on the way (line_no); count only the rest, once:
        # the reader takes the number for the next chunk's first line
        chunk.newlines = (line_no - chunk.first_line) + count(b"\n", pos)
        res.lines_read += chunk.newlines + (0 if data.endswith(b"\n") else 1)

    VERIFY_CACHE = 4096  # distinct (signature, message) results remembered
    VERIFY_CACHE_LINE = 2000  # longer messages are not remembered

    def _verify(self, sig, msg: str):
        """``verify`` with a memory: big logs repeat the same message on every rank (warnings, NCCL
        lines), and the prefix is already split off, so one regex run serves them all."""
        key = (sig.id, msg)
        cache = self._vcache
        caps = cache.get(key, cache)
        if caps is not cache:
            return caps
        try:
            caps = verify(sig, msg)
        except TimeoutError:
            caps = None
        if len(msg) <= self.VERIFY_CACHE_LINE:
            if len(cache) >= self.VERIFY_CACHE:
                cache.clear()
            cache[key] = caps
        return caps

    def _recover(self, sig, msg: str, data: bytes, end: int) -> dict | None:
        """The anchor is on the line but the regex does not match: a terminal may have wrapped
        the line (the rest is on the next line) or put a scroll counter ("[451/1919]") at its
        end, or the paste ends inside this line. Returns the captures, marked as the "anchor"
        evidence layer, or None."""
        tries = []
        bare = _COUNTER.sub("", msg)
        if bare != msg:
            tries.append(bare)
        nxt_end = data.find(b"\n", end + 1)
        nxt = L.clean(data[end + 1:nxt_end if nxt_end >= 0 else len(data)]) if end + 1 < len(data) else ""
        if nxt.strip():
            _, cont = L.split_prefix(nxt)
            tries += [bare + cont.strip(), bare + " " + cont.strip()]
        for text in tries:
            caps = self._verify(sig, text)
            if caps is not None:
                return {**caps, "layer": "anchor"}
        if data.find(b"\n", end + 1) < 0 and not data[end + 1:].strip():  # the last line read
            try:
                m = compiled(sig.regex).search(bare, partial=True, timeout=0.25)
            except TimeoutError:
                m = None
            first = min((bare.find(a) for a in sig.anchors if a in bare), default=-1)
            if (m is not None and m.partial and m.end() == len(bare) and 0 <= m.start() <= first
                    and not excluded(sig.regex, bare)):
                return {**{k: v for k, v in m.groupdict().items() if v is not None}, "layer": "anchor"}
        return None

    def _feed(self, block, data: bytes, pos: int, line_no: int) -> bool:
        """Feed ``block`` the lines of ``data`` from ``pos``; True if it wants more (chunk ended).

        Every open block reads ahead from its own first line. A block that follows one launcher
        prefix (a rank's traceback, ``key``) reads only the lines of that prefix: the chunk's
        lines are decoded once into a table indexed by prefix (_LineTable), and the other
        prefixes' lines in between are counted, not read. With hundreds of ranks' tracebacks
        interleaved, the work is then the chunk's lines once plus each block's own lines."""
        if isinstance(block, S.TracebackBlock):
            if self._fed is not data or pos < self._fed_table.start:
                self._fed, self._fed_table = data, _LineTable(data, pos, line_no)
            return self._fed_table.feed(block, pos)
        n = len(data)
        find = data.find
        while pos < n:
            end = find(b"\n", pos)
            if end < 0:
                end = n
            if not block.feed_text(L.clean(data[pos:end]), line_no):
                return False
            pos = end + 1
            line_no += 1
        return True

    @staticmethod
    def _close_blocks(res: ScanResult):
        for b in res.open_blocks:
            b.finish()
        res.open_blocks = []


class _LineTable:
    """The lines of one chunk from ``start`` on, decoded once, in order, as block readers ask
    for them: text, line number and launcher prefix of each, and per prefix the indices of its
    lines (Scanner._feed)."""

    __slots__ = ("by_key", "cuts", "data", "first_line", "pos", "start", "starts", "texts")

    def __init__(self, data: bytes, start: int, first_line: int):
        self.data, self.start, self.first_line = data, start, first_line
        self.pos = start  # where the next line to decode starts
        self.texts: list = []
        self.cuts: list = []  # where each line's message starts (after its launcher prefixes)
        self.starts: list = []  # byte offset of each line
        self.by_key: dict = {}  # prefix -> indices into texts

    def _grow(self, upto: int) -> bool:
        """Decode lines until ``upto`` lines are known; False at the end of the chunk."""
        data, n = self.data, len(self.data)
        while len(self.texts) < upto:
            if self.pos >= n:
                return False
            end = data.find(b"\n", self.pos)
            if end < 0:
                end = n
            text = L.clean(data[self.pos:end])
            key, cut = L.key_and_cut(text)
            self.by_key.setdefault(key, []).append(len(self.texts))
            self.texts.append(text)
            self.cuts.append(cut)
            self.starts.append(self.pos)
            self.pos = end + 1
        return True

    def _index_of(self, pos: int) -> int:
        """The index of the line that starts at byte ``pos`` (decoding up to it); the number of
        lines when ``pos`` is at the end of the chunk."""
        while self.pos <= pos and self._grow(len(self.texts) + 1):
            pass
        i = bisect_left(self.starts, pos)
        return i if i < len(self.starts) and self.starts[i] == pos else len(self.texts)

    def feed(self, block, pos: int) -> bool:
        i = self._index_of(pos)
        own = self.by_key.setdefault(block.key, [])
        while True:
            j = bisect_left(own, i)
            # decode on until a line of this prefix comes, or the block could not read that far
            while j >= len(own):
                limit = i + block.MAX_OTHERS + 1
                if not self._grow(min(limit, len(self.texts) + 4096)) or len(self.texts) >= limit:
                    break
                j = bisect_left(own, i)
            nxt = own[j] if j < len(own) else len(self.texts)
            if not block.other_lines(nxt - i):  # the other prefixes' lines in between: counted only
                return False
            if j >= len(own):
                if self.pos >= len(self.data):
                    return True  # the chunk ended: the block reads on in the next one
                i = nxt
                continue
            if not block.feed_own(self.texts[nxt][self.cuts[nxt]:], self.first_line + nxt):
                return False
            i = nxt + 1

