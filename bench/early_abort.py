"""Early abort, measured: seconds from the fatal line appearing in the live log to the job being ended.

    .venv/bin/python bench/early_abort.py [--runs 3] [--target 2.0]

The job is real: torchrun with 2 ranks over gloo. After three all-reduce steps, rank 1 prints a
CUDA OOM traceback (the current torch format; a CPU cannot run out of GPU memory, so the text is
printed) and then hangs, the way a failed rank's peers hang in a collective until the NCCL
watchdog fires ten minutes later; rank 0 blocks in the next all-reduce. The job writes the wall
time right after flushing the fatal line. diagnose follows the log through the same code as
``--relaunch`` (LocalLauncher + launch.loop.watch) and ends the job's process group the moment it
reads the line (and checks that no rank survived). Prints one figure per run and the worst; exits
1 if the worst misses the target.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

JOB = r'''
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
open(os.environ["FATAL_WRITTEN_AT"] + f".rank{rank}.pid", "w").write(str(os.getpid()))
x = torch.ones(4)
for it in range(1, 4):
    dist.all_reduce(x)
    if rank == 1:
        print(f" [2026-08-22 15:22:0{it}] iteration {it:8d}/     100 | consumed samples: {it * 8:12d} | "
              f"elapsed time per iteration (ms): 41.0 | learning rate: 1.000000E-03 | global batch size:     8 | "
              f"lm loss: 5.5{it}0000E+00 | number of skipped iterations:   0 | number of nan iterations:   0 |", flush=True)
    time.sleep(0.3)
if rank == 1:
    sys.stdout.write("[rank1]: Traceback (most recent call last):\n"
                     "[rank1]:   File \"train.py\", line 12, in <module>\n"
                     "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total "
                     "capacity of 79.11 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process has "
                     "77.87 GiB memory in use. Of the allocated memory 70.30 GiB is allocated by PyTorch, and 6.12 GiB "
                     "is reserved by PyTorch but unallocated.\n")
    sys.stdout.flush()
    with open(os.environ["FATAL_WRITTEN_AT"], "w") as fh:
        fh.write(repr(time.time()))
    time.sleep(600)  # hangs, as a rank does until the watchdog fires
else:
    dist.all_reduce(x)  # blocks: rank 1 never joins
'''


def one_run(workdir: Path, n: int) -> tuple[float, float, str]:
    import os

    from diagnose.db import load
    from diagnose.launch.local import LocalLauncher
    from diagnose.launch.loop import watch

    script = workdir / "job.py"
    script.write_text(JOB)
    stamp = workdir / f"written-{n}.at"
    os.environ["FATAL_WRITTEN_AT"] = str(stamp)
    launcher = LocalLauncher(shlex.join([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                                         str(script)]), cwd=str(workdir))
    job = launcher.start([], workdir / f"run-{n}.log")
    w = watch(launcher, job, load(), timeout_s=300)
    if not w.stopped_early or not stamp.exists():
        raise SystemExit(f"run {n}: the job was not stopped early (exit {w.exit_code}); see {job.log_path}")
    gap = job.ended - float(stamp.read_text())
    rc = w.report.root_cause
    for f in workdir.glob(f"written-{n}.at.rank*.pid"):  # torchrun's ranks live in sessions of their own
        if launcher._alive({int(f.read_text())}):
            raise SystemExit(f"run {n}: {f.name.split('.')[-2]} is still running after the stop")
    return gap, w.detect_to_end_s or 0.0, rc.finding.signature.id if rc else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--target", type=float, default=2.0)
    args = ap.parse_args()
    gaps = []
    with tempfile.TemporaryDirectory(prefix="diagnose-early-abort-") as d:
        for n in range(1, args.runs + 1):
            t0 = time.monotonic()
            gap, read_to_end, sig = one_run(Path(d), n)
            gaps.append(gap)
            print(f"run {n}: root cause {sig}; job ended {gap:.3f} s after the fatal line was written "
                  f"({read_to_end:.3f} s after diagnose read it; run took {time.monotonic() - t0:.1f} s)", flush=True)
    worst = max(gaps)
    print(f"early abort: worst {worst:.3f} s, median {sorted(gaps)[len(gaps) // 2]:.3f} s over {len(gaps)} runs "
          f"(target < {args.target:.1f} s): {'OK' if worst < args.target else 'MISSED'}")
    return 0 if worst < args.target else 1


if __name__ == "__main__":
    sys.exit(main())
