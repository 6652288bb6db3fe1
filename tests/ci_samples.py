"""Logs for the CI-gate tests, built from the compare fixtures (real Bridge formats) plus failure
lines in the exact PyTorch / NCCL formats of megatron-facts.md §7. ``variant`` changes everything
a rerun of the same job changes (timestamps, pids, ranks, sizes, job ids) and nothing else."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMPARE = REPO / "fixtures" / "logs" / "compare"
# the official SARIF 2.1.0 schema (OASIS, public data), shipped with the tests so they never skip
SCHEMA = REPO / "tests" / "data" / "sarif-schema-2.1.0.json"


def healthy_lines(n: int = 40) -> list[str]:
    return (COMPARE / "bridge_baseline.log").read_text(encoding="utf-8").splitlines()[:n]


def oom_lines(variant: int = 0) -> list[str]:
    rank = 3 + 2 * variant
    pid = 40211 + 17 * variant
    tried = f"{2.0 + 0.5 * variant:.2f}"
    sec = 14 + variant
    return [
        f"[rank{rank}]: Traceback (most recent call last):",
        f"[rank{rank}]:   File \"/opt/Megatron-Bridge/scripts/training/run_recipe.py\", line 148, in <module>",
        f"[rank{rank}]:     main()",
        f"[rank{rank}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried} GiB. GPU {rank % 8} has a "
        f"total capacity of 79.11 GiB of which 1.{variant}3 GiB is free. Including non-PyTorch memory, this process has "
        f"77.8{variant} GiB memory in use. Of the allocated memory 70.3{variant} GiB is allocated by PyTorch, and 6.12 GiB "
        "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        f"[rank1]:[E1128 02:21:{sec}.061727749 ProcessGroupNCCL.cpp:683] [Rank 1] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum={1184 + variant}, OpType=_ALLGATHER_BASE, NumelIn=16777216, "
        f"NumelOut=67108864, Timeout(ms)=600000) ran for {600079 + variant} milliseconds before timing out.",
        f"E1128 02:21:{sec + 2}.933000 {pid} torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) "
        f"local_rank: {rank % 8} (pid: {pid + 15}) of binary: /opt/venv/bin/python",
    ]


def nccl_error_lines() -> list[str]:
    return [
        "[rank12]: torch.distributed.DistBackendError: NCCL error in: "
        "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled system error (run with "
        "NCCL_DEBUG=INFO for details), NCCL version 2.27.3",
    ]


def nan_count_lines() -> list[str]:
    """A healthy log whose last iteration line counts a NaN iteration (MB-NAN-007, a warning)."""
    lines = healthy_lines(140)
    idx = max(i for i, ln in enumerate(lines) if " iteration " in ln and "| lm loss:" in ln)
    lines[idx] = lines[idx].replace("number of nan iterations:   0", "number of nan iterations:   1")
    return lines


def write(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)
