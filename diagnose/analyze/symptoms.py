"""Metric series -> the numbers metric signatures test (``metrics.*`` in predicates).

Names (a metric that cannot be computed is absent, i.e. UNKNOWN to predicates):
  iterations             iteration lines seen
  last_iteration         highest iteration number; train_iters: the planned total
  iter_ms_median         median elapsed time per iteration (ms)
  iter_ms_first          median of the first iterations after the first (warm-up) one
  iter_ms_last           median of the last three iterations
  iter_time_growth       iter_ms_last / iter_ms_first
  slowdown               iter_ms_median / the baseline run's median (``--baseline-log``)
  loss_missing_iters     iteration lines without any loss field (Megatron drops a NaN loss)
  loss_nan_iters         iteration lines whose loss is nan/inf
  grad_norm_nan_iters    iteration lines whose grad norm is nan/inf
  nan_iters_reported     the largest "number of nan iterations"
  optimizer_share        optimizer / (forward-backward + optimizer) from the last timer block
  mem_max_allocated_gb   largest (max) allocated memory reported, GB = 1e9 bytes
  alloc_retries_growth   growth of Bridge's mem-alloc-retires over the run
  unexplained_exceptions Python exceptions that no signature recognised
  overflow_steps         fp16 steps skipped for a gradient overflow (apex, fairseq, DeepSpeed)
  loss_scale_min         the smallest loss scale those lines set
"""
from __future__ import annotations

import math
from statistics import median
from typing import Optional

from ..logs.structure import Structure


def compute(s: Structure, baseline_ms: Optional[float] = None) -> dict:
    m: dict = {}
    pts = s.iterations
    t, peaks = s.tally, s.peaks
    if pts:
        m["iterations"] = s.iteration_count()
        m["last_iteration"] = peaks["last_iteration"]  # over every line read (add_iteration)
        m["train_iters"] = peaks["train_iters"]
        times = [p.elapsed_ms for p in pts if p.elapsed_ms is not None and math.isfinite(p.elapsed_ms)]
        if times:
            m["iter_ms_median"] = median(times)
            if len(times) >= 6:
                head = times[1:4]
                m["iter_ms_first"] = median(head)
                m["iter_ms_last"] = median(times[-3:])
                if m["iter_ms_first"] > 0:
                    m["iter_time_growth"] = m["iter_ms_last"] / m["iter_ms_first"]
            if baseline_ms:
                m["slowdown"] = m["iter_ms_median"] / baseline_ms
        # counted on every iteration line read (structure.Structure._iteration_evidence)
        m["loss_missing_iters"] = t.get("loss_missing", 0)
        m["loss_nan_iters"] = t.get("loss_nan", 0)
        m["grad_norm_nan_iters"] = t.get("grad_norm_nan", 0)
        m["nan_iters_reported"] = peaks.get("nan_reported", 0)
    elif s.step_times:
        m["iter_ms_median"] = median(s.step_times)
        if baseline_ms:
            m["slowdown"] = m["iter_ms_median"] / baseline_ms
    tm = s.timers
    opt = tm.get("optimizer")
    fb = tm.get("forward-backward")
    if opt and fb and (opt[1] + fb[1]) > 0:
        m["optimizer_share"] = opt[1] / (opt[1] + fb[1])
    if t.get("overflow_steps"):
        m["overflow_steps"] = t["overflow_steps"]
        if peaks.get("loss_scale_min") is not None:
            m["loss_scale_min"] = -peaks["loss_scale_min"]
    if peaks.get("mem_max_gb") is not None:
        m["mem_max_allocated_gb"] = peaks["mem_max_gb"]
    first = next((r["values"]["alloc_retries"] for r in s.memory if r["values"].get("alloc_retries") is not None), None)
    if t.get("memory_retries_reports", 0) >= 2 and first is not None:
        m["alloc_retries_growth"] = peaks["alloc_retries"] - first
    return m


# which evidence line (logs/structure.py Structure.evidence) stands for which metric
EVIDENCE_FOR = {
    "loss_missing_iters": "loss_missing",
    "grad_norm_nan_iters": "grad_norm_nan",
    "loss_nan_iters": "loss_nan",
    "iter_time_growth": "slowest_iteration",
    "slowdown": "slowest_iteration",
    "iter_ms_median": "slowest_iteration",
    "optimizer_share": "timers",
    "nan_iters_reported": "loss_nan",
    "mem_max_allocated_gb": "memory",
    "alloc_retries_growth": "memory_retries",
    "unexplained_exceptions": "exception",
    "loss_scale_min": "loss_scale_min",
    "overflow_steps": "loss_scale_min",
}
