"""Growth: for each family of input, time and peak memory at N and 4N (issue 16).

Not benchmarks (bench/ has those): ratios. Time is CPU time of the scan in this process (load on
the machine does not move it much); memory is tracemalloc's peak (exact, no allocator noise).

* Long lines: one line of 250 kB and of 1 MB per family. Linear work grows 4x; a quadratic
  parser or regex 16x (a 40 kB line once took 15 s, a 1 MB one hours).
* Many lines: N and 4N lines per family, read in 256 kB chunks so that what a chunk holds
  reaches its plateau at N. What the scan keeps must not grow with the log: distinct timer
  names, ranks, exception types, frames and activity lines are all capped.
"""
from __future__ import annotations

import gc
import time
import tracemalloc

import pytest

from diagnose.db import load
from diagnose.diagnosis import diagnose_paths
from diagnose.logs import read as R

DB = load()


def _long(kind: str, size: int) -> str:
    """One line of about ``size`` characters of each family a parser or a regex reads."""
    if kind == "iteration":
        return (" iteration       10/     100 | consumed samples: 10 | elapsed time per iteration (ms): 1.0 | "
                + "lm loss: 1.0 | " * (size // 15))
    if kind == "timer line":
        return "time (ms) | " + "".join(f"t{i}: 1.0 | " for i in range(size // 12))
    if kind == "memory":
        return "[Rank 0] (after 10 iterations) memory (GB) | " + "mem-allocated-gigabytes: 1.0 | " * (size // 31)
    if kind == "frame":
        return '  File "' + "a/" * (size // 2) + '", line 1, in f'
    if kind == "exception":
        return "RuntimeError: " + "CUDA error " * (size // 11)
    if kind == "anchors":
        return "CUDA out of memory. " * (size // 20)
    if kind == "rank prefixes":
        return "[rank1]: " * (size // 9) + "RuntimeError: boom"
    if kind == "nccl watchdog":
        return ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, "
                + "NumelIn=1, " * (size // 11) + ") ran for 600000 milliseconds before timing out.")
    raise KeyError(kind)


def _many(kind: str, n: int) -> str:
    """``n`` lines of a family whose every line is new to the scan (a name, a rank, a type)."""
    if kind == "timer names":
        return "".join(f"time (ms) | fwd{i}: 1.0 | opt{i}: 2.0\n" for i in range(n))
    if kind == "timer blocks":
        return "".join(f"(min, max) time across ranks (ms):\n    t{i} ....: (1.0, 2.0)\n" for i in range(n // 2))
    if kind == "ranks":
        return "".join(f"[rank{i}]: RuntimeError: NCCL error {i}\n" for i in range(n))
    if kind == "exception types":
        return "".join(f"Value{i}Error: message {i}\n" for i in range(n))
    if kind == "iterations":
        return "".join(f" iteration {i:>8}/ 9999999 | elapsed time per iteration (ms): {1000 + i % 7}.0 | "
                       f"lm loss: 2.0 |\n" for i in range(n))
    if kind == "memory reports":
        return "".join(f"[Rank {i}] (after {i} iterations) memory (GB) | mem-allocated-gigabytes: 1.0 | "
                       f"mem-max-allocated-gigabytes: 2.0\n" for i in range(n))
    if kind == "activity":
        return "".join(f"saving checkpoint at iteration {i} to /ckpt/{i}\n" for i in range(n))
    if kind == "frames":
        return "Traceback (most recent call last):\n" + "".join(
            f'  File "/a/b{i}.py", line {i}, in f{i}\n    x{i}()\n' for i in range(n // 2))
    if kind == "config blocks":
        return "".join(f"------------------------ arguments ------------------------\n  num_layers ......... {i}\n"
                       "-------------------- end of arguments ---------------------\n" for i in range(n // 3))
    raise KeyError(kind)


def _cpu(path) -> float:
    gc.collect()
    gc.disable()  # a collection of earlier garbage landing in one run is noise, not growth
    try:
        t = time.process_time()
        diagnose_paths([str(path)], db=DB, jobs=1)
        return time.process_time() - t
    finally:
        gc.enable()


def _peak(path) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        diagnose_paths([str(path)], db=DB, jobs=1)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


LONG = ["iteration", "timer line", "memory", "frame", "exception", "anchors", "rank prefixes", "nccl watchdog"]


@pytest.mark.parametrize("kind", LONG)
def test_a_long_line_costs_linear_time(tmp_path, kind):
    times = []
    for size in (250_000, 1_000_000):
        p = tmp_path / f"{size}.log"
        p.write_text("start\n" + _long(kind, size) + "\nend\n")
        times.append(min(_cpu(p) for _ in range(2)))
    small, big = times
    assert big < 5.0, f"{kind}: {big:.2f} s for a 1 MB line"
    assert big < max(0.15, 7 * small), f"{kind}: {small:.3f} s at 250 kB, {big:.3f} s at 1 MB (super-linear)"


MANY = ["timer names", "timer blocks", "ranks", "exception types", "iterations", "memory reports", "activity",
        "frames", "config blocks"]
N = 20_000


@pytest.mark.parametrize("kind", MANY)
def test_many_lines_cost_linear_time_and_bounded_memory(tmp_path, monkeypatch, kind):
    monkeypatch.setattr(R, "CHUNK", 256 << 10)
    paths = []
    for n in (N, 4 * N):
        p = tmp_path / f"{n}.log"
        p.write_text(_many(kind, n))
        paths.append(p)
    assert paths[0].stat().st_size > 2 * R.CHUNK  # N already fills several chunks
    small, big = (min(_cpu(p) for _ in range(3)) for p in paths)  # the fastest of three: load is noise
    assert big < max(0.3, 6 * small), f"{kind}: {small:.2f} s at N, {big:.2f} s at 4N (super-linear)"
    m_small, m_big = (_peak(p) for p in paths)
    assert m_big < 1.3 * m_small + (2 << 20), (
        f"{kind}: peak {m_small / 1e6:.1f} MB at N lines, {m_big / 1e6:.1f} MB at 4N (grows with the log)")
