"""Many files, or one big file, on many cores; the parent merges the results in scan order.

One file per rank is common (512 ranks, 512 files); so is one multi-GB ``run.out``.
``scan_parallel`` expands the inputs like a serial scan and makes tasks:
* a whole file;
* or, for a regular file of ``SPLIT_MIN`` or more, a piece of it. Pieces are cut at
  ``read.split_points``, where a serial read ends a chunk at a newline. A piece's reader
  therefore reads the very chunks a serial scan reads, with the same sampling of dense lines.
  A piece's first line number comes from the newlines of the pieces before it; those are
  counted side by side first, together with the year that dates glog timestamps. A block that
  is still open at a piece's end (a traceback, a timer block, torchrun's summary) is read on
  past it, as a serial scan feeds it at the next chunk.

A process pool runs the tasks, largest first for balance. The parent merges the results in the
order a serial scan would have read them. The merged ``ScanResult`` is therefore the one a serial
scan gives: findings, counts per rank, first hits, samples, structure, notes, and so the root
cause (tests/scan/test_parallel.py). Each worker holds one task's state at a time, so memory stays
bounded per process. Standard input and small inputs are scanned serially.
"""
from __future__ import annotations

import dataclasses
import gc
import itertools
import multiprocessing as mp
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

from .analyze.findings import MAX_LINES, MAX_SAMPLES, Findings, _earlier
from .errors import DiagnoseError
from .logs import read as R
from .logs import structure as S
from .logs.lines import clean
from .scan import Scanner, ScanResult


class Task(NamedTuple):
    """A whole file (``start`` 0, ``end`` None) or a piece of one, as a worker scans it."""

    tid: int  # position in scan order: results are merged in this order
    idx: int  # the file's index among the inputs
    src: R.Source
    start: int
    end: int | None
    first_line: int = 1
    year: int | None = None  # the glog year a serial scan knows on reaching the piece


AUTO_MIN_BYTES = 16 << 20  # below this, starting processes costs more than it saves (auto mode)
SPLIT_MIN = 64 << 20  # a file this large is cut into pieces that processes scan side by side


def cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# ----------------------------------------------------------------------------- worker side

_SCANNER: Any = None  # the worker's Scanner (_init)
_COUNTER: Any = None  # a shared multiprocessing.Value of bytes scanned


def _init(db, engine, versions, sample, counter):
    global _SCANNER, _COUNTER
    gc.disable()  # as in Scanner.scan_paths: nothing the scan allocates forms cycles
    _SCANNER = Scanner(db, engine, versions, sample)
    _COUNTER = counter


def _progress(n: int):
    with _COUNTER.get_lock():
        _COUNTER.value += n


def _scan_one(t: Task):
    """One file, or one piece of a file: (task id, its result)."""
    return scan_task(_SCANNER, t, _progress if _COUNTER is not None else None)


def scan_task(scanner: Scanner, t: Task, progress: Callable[[int], None] | None = None):
    """(task id, the slim result of scanning one task) with ``scanner``."""
    res = ScanResult(Findings(), S.Structure(), [], engine=scanner.engine.name)
    res.structure.year = t.year
    scanner.scan_source(t.src, t.idx, res, progress, t.start, t.end, t.first_line)
    return t.tid, _slim(res)


def _measure_piece(t: Task):
    """Before a piece is scanned: its newlines (the next piece's first line) and the year of its
    first dated iteration line (glog timestamps after it take that year, as in a serial scan)."""
    assert t.src.path is not None and t.end is not None  # pieces are cut from files only
    return R.count_newlines(t.src.path, t.start, t.end), _first_year(t.src.path, t.start, t.end)


def _first_year(path, start: int, end: int, tries: int = 1000):
    anchor = S.ANCHORS["@iteration"][0].encode()
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = start
        while pos < end and tries > 0:
            data = os.pread(fd, min(R.CHUNK, end - pos), pos)
            if not data:
                break
            cut = data.rfind(b"\n") + 1 or len(data)
            i = data.find(anchor, 0, cut)
            while i >= 0 and tries > 0:
                tries -= 1
                a, b = data.rfind(b"\n", 0, i) + 1, data.find(b"\n", i)
                year = S.iteration_year(S.parse_iteration(clean(data[a:b if b >= 0 else len(data)]), "", 0))
                if year is not None:
                    return year
                i = data.find(anchor, i + 1, cut)
            pos += cut
    finally:
        os.close(fd)
    return None


def _slim(res: ScanResult) -> ScanResult:
    """What goes back through the pipe: signatures by id (the parent has the database)."""
    for f in res.findings.by_id.values():
        f.signature = f.signature.id  # type: ignore[assignment]  # the parent puts the Signature back
    res.open_blocks = []  # scan state (closed by scan_source): not sent back; file_ranks is small
    return res


# ----------------------------------------------------------------------------- merging

def merge_findings(dst: Findings, src: Findings, sigs: dict):
    """Fold ``src`` (a later file's findings) into ``dst`` as Findings.add would have, hit by hit."""
    for sid, f in src.by_id.items():
        if isinstance(f.signature, str):
            f.signature = sigs[f.signature]
        d = dst.by_id.get(sid)
        if d is None:
            f.ranks = Counter(f.ranks)
            dst.by_id[sid] = f
            continue
        d.count += f.count
        d.ranks.update(f.ranks)
        room = MAX_SAMPLES - len(d.samples)
        if room > 0:
            d.samples.extend(f.samples[:room])
        if _earlier(f.first, d.first):
            d.first = f.first
    room = MAX_LINES - len(dst.lines)
    if room > 0:
        dst.lines.update(sorted(src.lines, key=lambda x: x[1])[:room])
    dst._order += src._order


_CAPS = {"memory": 4 * S.MAX_RECORDS, "tracebacks": S.MAX_RECORDS, "exceptions": S.MAX_RECORDS,
         "step_times": S.MAX_SERIES}
_LATEST_EVIDENCE = {"timers", "last_iteration"}  # notes written with replace=True: the later file wins


def _peak_winners(dst: S.Structure, src: S.Structure) -> set:
    """Evidence that follows a peak, as the serial scan notes it: the smallest loss scale
    (records.scale_seen: strictly smaller), DeepSpeed's latest skipped-step report (the largest
    step count, ``>=``). Its peaks move with it (ds_skipped is the count of that report, not a
    maximum of its own)."""
    won = set()
    a, b = dst.peaks, src.peaks
    if "loss_scale_min" in b and ("loss_scale_min" not in a or b["loss_scale_min"] > a["loss_scale_min"]):
        won.add("loss_scale_min")
    if "ds_steps" in b and b["ds_steps"] >= a.get("ds_steps", -1):
        won.add("ds_skipped")
    return won


def merge_structure(dst: S.Structure, src: S.Structure):
    """Fold ``src`` (a later file's structure) into ``dst`` as one serial scan would have built it."""
    dropped = 0
    won = _peak_winners(dst, src)
    dst_ds_skipped = dst.peaks.get("ds_skipped")
    for fld in dataclasses.fields(S.Structure):
        name = fld.name
        a, b = getattr(dst, name), getattr(src, name)
        if name == "iterations":
            dst.iterations = a + b
            dst.decimation = max(dst.decimation, src.decimation)
            while len(dst.iterations) > S.MAX_SERIES:
                dst.iterations = dst.iterations[::2]
                dst.decimation *= 2
        elif name == "decimation":
            continue
        elif name == "last_loss":  # the later piece's first loss follows the earlier one's last
            for file, (loss, line, text) in src.first_loss.items():
                dst.loss_rise(a.get(file), loss, file, line, text)
            a.update(b)
        elif name == "first_loss":
            for k, v in b.items():
                a.setdefault(k, v)
        elif name == "torchrun":
            for c in b:
                S.add_torchrun(dst, c)
        elif name == "timers":
            a.update(b)
        elif name in ("tally", "skipped"):
            for k, v in b.items():
                a[k] = a.get(k, 0) + v
        elif name == "peaks":
            for k, v in b.items():
                dst.peak(k, v)
            if "ds_skipped" in won:  # the report with the most steps gives both its counts
                a["ds_steps"], a["ds_skipped"] = b["ds_steps"], b["ds_skipped"]
            elif "ds_steps" in b:
                a["ds_skipped"] = dst_ds_skipped
        elif name == "evidence":
            _merge_evidence(a, b, won)
        elif name == "tracebacks":
            # a piece that starts inside a traceback sees its frames without the header: the
            # piece before read that traceback on (tb_until), so the headless copy goes
            until = dst.tb_until
            keep = [tb for tb in b if tb.headless is None
                    or until.get((tb.file, tb.headless[0]), 0) < tb.headless[1]]
            dropped = len(b) - len(keep)
            a.extend(keep[:max(0, S.MAX_RECORDS - len(a))])
        elif name == "traceback_count":
            dst.traceback_count = a + b - dropped
        elif name == "config_blocks":  # the last few of each kind, kept as structure.add_config_block keeps them
            for item in b:
                S.add_config_block(dst, item)
        elif name == "timer_records":  # the latest few, as structure.add_timer_record keeps them
            for item in b:
                S.add_timer_record(dst, *item)
        elif name == "activity":  # the latest few, trimmed as structure.on_line trims them
            for item in b:
                a.append(item)
                if len(a) > 2 * S.MAX_ACTIVITY:
                    del a[:-S.MAX_ACTIVITY]
        elif name == "tails":  # a file's last piece has its end
            a.update(b)
        elif name == "grad_norm_runs":  # a file's runs continue into its next piece
            for file, runs in b.items():
                a[file] = S.merge_grad_norm_runs(a[file], runs) if file in a else runs
        elif name == "scale_runs":  # a file's loss-scale cuts continue into its next piece
            for file, runs in b.items():
                a[file] = S.merge_scale_runs(a[file], runs) if file in a else runs
        elif name == "paced":  # each series continued, as structure.add_pace grows it
            for key, pts in b.items():
                if key not in a and len(a) >= S.MAX_PACE_SERIES:
                    continue
                series = a.setdefault(key, [])
                series.extend(p for p in pts if not series or p.iteration != series[-1].iteration)
                while len(series) > S.MAX_SERIES:
                    del series[::2]
        elif name == "tb_until":
            for k, v in b.items():
                a[k] = max(a.get(k, 0), v)
        elif name == "year":  # the year of the first dated iteration line (not a counter)
            if a is None:
                dst.year = b
        elif isinstance(a, list):
            cap = _CAPS.get(name)
            a.extend(b if cap is None else b[:max(0, cap - len(a))])
        elif isinstance(a, bool):
            setattr(dst, name, a or b)
        elif isinstance(a, int) and isinstance(b, int):
            setattr(dst, name, a + b)  # counters: timer_blocks, traceback_count
        elif isinstance(a, dict):
            for k, v in b.items():
                a.setdefault(k, v)
        elif b is not None:
            setattr(dst, name, b)  # single values set by the last line seen


def _merge_evidence(a: dict, b: dict, won: frozenset | set = frozenset()):
    for k, v in b.items():
        if k in ("_max_elapsed", "slowest_iteration", "_loss_jump", "loss_jump"):
            continue
        if k in _LATEST_EVIDENCE or k in won or k not in a:
            a[k] = v
    mb = b.get("_max_elapsed")
    if mb is not None:
        ma = a.get("_max_elapsed")
        if ma is None or mb[0] > ma[0]:  # strictly: the earliest of equal maxima stays
            a["_max_elapsed"] = mb
            if "slowest_iteration" in b:
                a["slowest_iteration"] = b["slowest_iteration"]


    jb = b.get("_loss_jump")
    if jb is not None and (a.get("_loss_jump") is None or jb[0] > a["_loss_jump"][0]):
        a["_loss_jump"] = jb
        if "loss_jump" in b:
            a["loss_jump"] = b["loss_jump"]


def merge(dst: ScanResult, src: ScanResult, sigs: dict):
    merge_findings(dst.findings, src.findings, sigs)
    merge_structure(dst.structure, src.structure)
    dst.notes.extend(src.notes)
    dst.sources.extend(src.sources)
    for name, rank in src.file_ranks.items():
        dst.file_ranks.setdefault(name, rank)
    dst.bytes_read += src.bytes_read
    dst.lines_read += src.lines_read


# ----------------------------------------------------------------------------- parent side

def expand_inputs(paths: list) -> tuple:
    """The inputs as a serial scan expands them: [(source, the notes written just before it)],
    and the notes written after the last."""
    notes: list = []
    order = []
    for src in R.iter_sources(paths, notes):
        order.append((src, notes[:]))
        notes.clear()
    return order, notes[:]


def _size(src) -> int:
    try:
        return src.path.stat().st_size
    except OSError:
        return 0


def plan_jobs(sources: list, jobs: int | None) -> int:
    """How many processes: ``jobs`` when given; else all cores for several large-enough files
    or one file large enough to be cut in pieces."""
    files = [s for s in sources if s.path is not None]
    if not files or len(files) < len(sources):  # standard input: serial
        return 1
    big = any(_size(s) >= SPLIT_MIN for s in files)
    if len(files) < 2 and not big:
        return 1
    limit = None if big else len(files)  # pieces of a big file can keep any number busy
    if jobs is not None:
        # never more processes than cores: -j 64 on 2 cores only multiplies the memory
        return max(1, min(jobs, limit or jobs, cpu_count()))
    if sum(_size(s) for s in files) < AUTO_MIN_BYTES:
        return 1
    return min(cpu_count(), limit or cpu_count())


def plan_tasks(sources: list, n: int) -> list:
    """Tasks in scan order: whole files, and files of ``SPLIT_MIN`` or more cut at
    ``R.split_points`` into up to ``n`` pieces of at least SPLIT_MIN / 2 (first lines and years
    not known yet: ``_number_pieces``)."""
    tasks: list = []
    for idx, src in enumerate(sources):
        size = R.splittable(src.path) if n > 1 and src.path is not None else None
        cuts = R.split_points(src.path, min(n, size // (SPLIT_MIN // 2))) if size and size >= SPLIT_MIN else []
        bounds = [0, *cuts, None]
        for a, b in itertools.pairwise(bounds):
            tasks.append(Task(len(tasks), idx, src, a, b))
    return tasks


def scan_parallel(scanner: Scanner, paths: list, jobs: int | None = None,
                  progress: Callable[[int], None] | None = None) -> ScanResult:
    """Scan ``paths`` like ``scanner.scan_paths`` does, with up to ``jobs`` processes."""
    t0 = time.perf_counter()
    order, trailing = expand_inputs(paths)
    sources = [s for s, _ in order]
    n = plan_jobs(sources, jobs)
    tasks = plan_tasks(sources, n) if n > 1 else []
    if len(tasks) <= 1:
        return scanner.scan_paths(paths, progress=progress)

    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    counter = ctx.Value("q", 0)
    out = ScanResult(Findings(), S.Structure(), [], engine=scanner.engine.name)
    waiting: dict = {}  # results that came before an earlier task's: merged in task order, then dropped
    nxt = 0
    with ctx.Pool(
        n, initializer=_init, initargs=(scanner.db, scanner.engine_name, scanner.versions, scanner.sample, counter)
    ) as pool:
        work = _number_pieces(pool, tasks)
        it = pool.imap_unordered(_scan_one, sorted(work, key=lambda t: -_task_size(t)))  # largest first
        seen = 0
        while nxt < len(work):
            try:
                tid, res = it.next(timeout=0.2)
                waiting[tid] = res
            except mp.TimeoutError:
                pass
            while nxt in waiting:
                if work[nxt].start == 0:  # a file's first (or only) task
                    out.notes.extend(order[work[nxt].idx][1])
                merge(out, waiting.pop(nxt), scanner.sigs)
                nxt += 1
            if progress:
                now = counter.value
                if now > seen:
                    progress(now - seen)
                    seen = now
        if progress and counter.value > seen:
            progress(counter.value - seen)
    out.notes.extend(trailing)
    out.seconds = time.perf_counter() - t0
    out.jobs = n  # type: ignore[attr-defined]
    return out


def _task_size(t: Task) -> int:
    return (t.end if t.end is not None else _size(t.src)) - t.start


def _number_pieces(pool, tasks: list) -> list:
    """``tasks`` with their first lines and years: a piece's first line is 1 + the newlines of
    the pieces before it, counted side by side first; so is the year a serial scan would know
    when it reaches the piece."""
    ended = [t for t in tasks if t.end is not None]  # a file's last piece (or whole file) needs no count
    measured = dict(zip((t.tid for t in ended), pool.map(_measure_piece, ended)))
    out, line, year = [], 1, None
    for t in tasks:
        if t.start == 0:
            line, year = 1, None
        out.append(t._replace(first_line=line, year=year))
        if t.end is not None:
            newlines, first_year = measured[t.tid]
            line += newlines
            year = year if year is not None else first_year
    return out


# ----------------------------------------------------------------------------- past one machine

PARTIAL_FORMAT = "diagnose-partial/1"


class ShardError(DiagnoseError):
    """A shard cannot be scanned, or partial results cannot be merged: the message says why."""




class _Serial:
    """The ``map`` of a pool, in this process (a shard measures the pieces before its own)."""

    @staticmethod
    def map(fn, items):
        return [fn(i) for i in items]


def scan_shard(scanner: Scanner, paths: list, k: int, n: int) -> dict:
    """Shard ``k`` of ``n`` (1-based): the tasks of a ``--jobs n`` scan whose position is k - 1
    modulo n, scanned here. Returns the partial result ``merge_partials`` folds with the other
    shards' into the serial scan's result. Every shard cuts the inputs the same way, so the
    shards of one folder (or one big file) split its tasks exactly."""
    if not 1 <= k <= n:
        raise ShardError(f"shard {k}/{n}: K must be between 1 and N")
    order, trailing = expand_inputs(paths)
    if any(src.path is None for src, _ in order):
        raise ShardError("standard input cannot be sharded: give files or folders")
    sources = [src for src, _ in order]
    tasks = plan_tasks(sources, n) if n > 1 else [Task(i, i, src, 0, None) for i, src in enumerate(sources)]
    files_here = {t.idx for t in tasks if t.tid % n == k - 1}
    # first lines and years: the pieces before this shard's, in the files it has a piece of
    numbered = _number_pieces(_Serial, [t for t in tasks if t.idx in files_here])
    results = [scan_task(scanner, t) for t in numbered if t.tid % n == k - 1]
    return {
        "format": PARTIAL_FORMAT, "shard": k, "of": n, "engine": scanner.engine.name,
        "signatures": sorted(scanner.sigs), "versions": scanner.versions,
        "inputs": [(src.name, _size(src)) for src in sources], "tasks": len(tasks),
        "notes": {t.tid: order[t.idx][1] for t in tasks if t.start == 0 and t.tid % n == k - 1},
        "trailing": trailing, "results": results,
    }


def write_partial(part: dict, path: str) -> None:
    import pickle
    from pathlib import Path

    from .atomic import replace

    replace(Path(path), pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL))


def read_partial(path: str) -> dict:
    """A partial result written by ``diagnose --shard``. It is a pickle: merge only partials
    your own jobs wrote (as with any pickle, loading one runs what it was made to run)."""
    import pickle

    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
            if head[:1] != b"\x80":
                raise ShardError(f"{path}: not a partial result of diagnose --shard")
            fh.seek(0)
            part = pickle.load(fh)  # the user's own shard output (documented)
    except OSError as exc:
        raise ShardError(f"{path}: {exc.strerror or exc}") from None
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError, TypeError, ValueError):
        raise ShardError(f"{path}: not a readable partial result (cut short, or of another diagnose)") from None
    if not isinstance(part, dict) or part.get("format") != PARTIAL_FORMAT:
        raise ShardError(f"{path}: not a partial result of this diagnose ({PARTIAL_FORMAT})")
    return part


def merge_partials(parts: list, sigs: dict) -> ScanResult:
    """Fold the shards' partial results in task order, as ``scan_parallel`` folds its workers':
    the serial scan's result. Every shard of one run must be there, once."""
    if not parts:
        raise ShardError("no partial result given")
    first = parts[0]
    n = first["of"]
    for key, what in (("of", "shard counts"), ("inputs", "inputs"), ("tasks", "task plans"),
                      ("signatures", "signature databases"), ("versions", "--mcore-version")):
        if any(p[key] != first[key] for p in parts[1:]):
            raise ShardError(f"the partial results come from different runs (their {what} differ)")
    have = sorted(p["shard"] for p in parts)
    if len(set(have)) != len(have):
        raise ShardError(f"shard {next(k for k in have if have.count(k) > 1)}/{n} is given twice")
    missing = sorted(set(range(1, n + 1)) - set(have))
    if missing:
        raise ShardError(f"shard(s) {', '.join(f'{k}/{n}' for k in missing)} missing (given: "
                         f"{', '.join(map(str, have)) or 'none'})")
    results = {tid: res for p in parts for tid, res in p["results"]}
    notes = {tid: ns for p in parts for tid, ns in p["notes"].items()}
    if sorted(results) != list(range(first["tasks"])):
        raise ShardError("the partial results do not cover every task of the run")
    out = ScanResult(Findings(), S.Structure(), [], engine=first["engine"])
    for tid in range(first["tasks"]):
        out.notes.extend(notes.get(tid, ()))
        merge(out, results[tid], sigs)
    out.notes.extend(first["trailing"])
    return out

