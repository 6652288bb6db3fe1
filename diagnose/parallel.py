"""Many files on many cores: one worker process scans whole files, the parent merges in file order.

One file per rank is common (512 ranks, 512 files). ``scan_parallel`` expands the inputs like a
serial scan, gives each file to a process pool (largest first, for balance), and merges the
per-file results in the order a serial scan would have read the files, so the merged
``ScanResult`` (findings, counts per rank, first hits, samples, structure, notes) is the one a
serial scan gives, and so is the root cause. Each worker holds one file's state at a time, so
memory stays bounded per process. Standard input and a single file are scanned serially.
"""
from __future__ import annotations

import dataclasses
import gc
import multiprocessing as mp
import os
import time
from collections import Counter
from typing import Callable, Optional

from .analyze.findings import MAX_LINES, MAX_SAMPLES, Findings, _earlier
from .logs import read as R
from .logs import structure as S
from .scan import Scanner, ScanResult

AUTO_MIN_BYTES = 16 << 20  # below this, starting processes costs more than it saves (auto mode)


def cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# ----------------------------------------------------------------------------- worker side

_SCANNER: Optional[Scanner] = None
_COUNTER = None


def _init(db, engine, versions, sample, counter):
    global _SCANNER, _COUNTER
    gc.disable()  # as in Scanner.scan_paths: nothing the scan allocates forms cycles
    _SCANNER = Scanner(db, engine, versions, sample)
    _COUNTER = counter


def _progress(n: int):
    with _COUNTER.get_lock():
        _COUNTER.value += n


def _scan_one(task):
    idx, src = task
    res = ScanResult(Findings(), S.Structure(), [], engine=_SCANNER.engine.name)
    _SCANNER.scan_source(src, idx, res, _progress if _COUNTER is not None else None)
    return idx, _slim(res)


def _slim(res: ScanResult) -> ScanResult:
    """What goes back through the pipe: signatures by id (the parent has the database)."""
    for f in res.findings.by_id.values():
        f.signature = f.signature.id
    res.open_blocks, res.file_ranks = [], {}  # scan state (closed by scan_source): not sent back
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


def merge_structure(dst: S.Structure, src: S.Structure):
    """Fold ``src`` (a later file's structure) into ``dst`` as one serial scan would have built it."""
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
        elif name == "torchrun":
            for c in b:  # TorchrunBlock._close: bounded, without duplicates
                if len(a) < S.MAX_RECORDS and not any(
                        (t.section, t.rank, t.exitcode, t.time, t.file) == (c.section, c.rank, c.exitcode, c.time, c.file)
                        for t in a):
                    a.append(c)
        elif name == "timers":
            a.update(b)
        elif name in ("tally", "skipped"):
            for k, v in b.items():
                a[k] = a.get(k, 0) + v
        elif name == "peaks":
            for k, v in b.items():
                dst.peak(k, v)
        elif name == "evidence":
            _merge_evidence(a, b)
        elif name == "first_time":
            if b is not None and (a is None or b < a):
                dst.first_time = b
        elif name == "last_time":
            if b is not None and (a is None or b > a):
                dst.last_time = b
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
            setattr(dst, name, b)  # single values set by the last line seen (theoretical_mb)


def _merge_evidence(a: dict, b: dict):
    for k, v in b.items():
        if k in ("_max_elapsed", "slowest_iteration"):
            continue
        if k in _LATEST_EVIDENCE or k not in a:
            a[k] = v
    mb = b.get("_max_elapsed")
    if mb is not None:
        ma = a.get("_max_elapsed")
        if ma is None or mb[0] > ma[0]:  # strictly: the earliest of equal maxima stays
            a["_max_elapsed"] = mb
            if "slowest_iteration" in b:
                a["slowest_iteration"] = b["slowest_iteration"]


def merge(dst: ScanResult, src: ScanResult, sigs: dict):
    merge_findings(dst.findings, src.findings, sigs)
    merge_structure(dst.structure, src.structure)
    dst.notes.extend(src.notes)
    dst.sources.extend(src.sources)
    dst.bytes_read += src.bytes_read
    dst.lines_read += src.lines_read


# ----------------------------------------------------------------------------- parent side

def plan_jobs(sources: list, jobs: Optional[int]) -> int:
    """How many processes: ``jobs`` when given; else all cores for several large-enough files."""
    files = [s for s in sources if s.path is not None]
    if jobs is not None:
        return max(1, min(jobs, len(files))) if len(files) > 1 else 1
    if len(files) < 2:
        return 1
    total = 0
    for s in files:
        try:
            total += s.path.stat().st_size
        except OSError:
            pass
    return min(cpu_count(), len(files)) if total >= AUTO_MIN_BYTES else 1


def scan_parallel(scanner: Scanner, paths: list, jobs: Optional[int] = None,
                  progress: Optional[Callable[[int], None]] = None) -> ScanResult:
    """Scan ``paths`` like ``scanner.scan_paths`` does, with up to ``jobs`` processes."""
    t0 = time.perf_counter()
    notes: list = []
    order = []  # (source, the expansion notes written just before it)
    for src in R.iter_sources(paths, notes):
        order.append((src, notes[:]))
        notes.clear()
    trailing = notes[:]
    sources = [s for s, _ in order]
    n = plan_jobs(sources, jobs)
    if n <= 1 or any(s.path is None for s in sources):
        return scanner.scan_paths(paths, progress=progress)

    def size(s):
        try:
            return s.path.stat().st_size
        except OSError:
            return 0

    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    counter = ctx.Value("q", 0)
    tasks = sorted(enumerate(sources), key=lambda t: -size(t[1]))  # largest first
    out = ScanResult(Findings(), S.Structure(), [], engine=scanner.engine.name)
    waiting: dict = {}  # results that came before an earlier file's: merged in file order, then dropped
    nxt = 0
    with ctx.Pool(n, initializer=_init, initargs=(scanner.db, scanner.engine_name, scanner.versions, scanner.sample, counter)) as pool:
        it = pool.imap_unordered(_scan_one, tasks)
        seen = 0
        while nxt < len(sources):
            try:
                idx, res = it.next(timeout=0.2)
                waiting[idx] = res
            except mp.TimeoutError:
                pass
            while nxt in waiting:
                out.notes.extend(order[nxt][1])
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
