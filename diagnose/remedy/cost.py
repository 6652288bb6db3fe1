"""What a candidate fix costs in iteration time, against the failed run's.

The pipeline bubble of the 1F1B schedule, (m + (PP - 1) / VPP) / m with m micro-batches per
pipeline; the measured optimizer-offload curve (config/offload_curve.py, which says where it was
measured); full activation recompute, one more forward pass per step; and the model-parallel
moves, each doubling of TP or EP at a rule-of-thumb factor. The work per GPU is the same at any
layout on the same GPUs, so these factors are the whole prediction; where a factor is a rule of
thumb, the text it returns says so.
"""
from __future__ import annotations

import math

from ..config import offload_curve
from ..config.fit import _get, _int
from ..config.layout import of as layout_of
from ..config.runconfig import RunConfig

# full activation recompute, tried only where no layout or offload setting fits: each layer's
# forward runs twice, about one more forward pass per step (forward ~ 1/3 of forward + backward)
FULL_RECOMPUTE = (("model.recompute_granularity", "full"), ("model.recompute_method", "uniform"),
                  ("model.recompute_num_layers", 1))
RECOMPUTE_FACTOR = 4 / 3
# a model-parallel move doubles one degree; what each doubling costs is a rule of thumb, not
# measured: TP adds two all-reduces per layer on the critical path (inside one node's NVLink
# domain); EP sends the all-to-all to more ranks
TP_STEP_FACTOR = 1.10
EP_STEP_FACTOR = 1.05


def slowdown(fraction: float, overlap: bool = False) -> float:
    """Iteration-time factor of optimizer offload at ``fraction``: config/offload_curve.py."""
    return offload_curve.factor(fraction, overlap)


def pipeline_bubble(cfg: RunConfig, world: int) -> float | None:
    """The 1F1B schedule's time over a bubble-free one: (m + (PP - 1) / VPP) / m, m the
    micro-batches per pipeline (global batch / (micro batch x DP)). None when the batch is unknown."""
    lay = layout_of(cfg)
    dp = lay.dp(world)
    gbs, mbs = _get(cfg, "train.global_batch_size"), _get(cfg, "train.micro_batch_size")
    if not (dp and gbs and mbs):
        return None
    m = int(gbs) // (int(mbs) * dp)
    if m < 1:
        return None
    vp = _int(cfg, "model.virtual_pipeline_model_parallel_size", 1) or 1
    return (m + (lay.pp - 1) / vp) / m


def predicted_time(before: RunConfig, after: RunConfig, world: int) -> tuple[float, str]:
    """The iteration time of ``after`` as a factor of ``before``'s: the pipeline bubble (the
    work per GPU is the same at any PP on the same GPUs) times the optimizer-offload curve."""
    def off(c):
        if c.get("optimizer.optimizer_cpu_offload") is not True:
            return 1.0
        return slowdown(float(_get(c, "optimizer.optimizer_offload_fraction", 0.0)),
                        bool(c.get("optimizer.overlap_cpu_optimizer_d2h_h2d")))
    def rec(c):
        return RECOMPUTE_FACTOR if c.get("model.recompute_granularity") == "full" else 1.0
    b0, b1 = pipeline_bubble(before, world), pipeline_bubble(after, world)
    bubble = (b1 / b0) if (b0 and b1) else 1.0
    o0, o1 = off(before), off(after)
    r0, r1 = rec(before), rec(after)
    parts = []
    moves = 1.0
    for key, name, step in (("model.tensor_model_parallel_size", "TP", TP_STEP_FACTOR),
                            ("model.expert_model_parallel_size", "EP", EP_STEP_FACTOR)):
        d0, d1 = _int(before, key, 1) or 1, _int(after, key, 1) or 1
        if d0 != d1:
            factor = step ** math.log2(d1 / d0)
            moves *= factor
            parts.append(f"{name}{d0} -> {name}{d1} x{factor:.2f} (a rule of thumb, not measured)")
    if b0 and b1 and abs(bubble - 1) > 1e-3:
        parts.append(f"pipeline bubble x{bubble:.2f}")
    if o1 != o0:
        parts.append(f"optimizer offload x{o1 / o0:.2f} ({offload_curve.SCOPE})")
    if r1 != r0:
        parts.append(f"full recompute x{r1 / r0:.2f} (one more forward pass per step; a rule of thumb, not measured)")
    return bubble * o1 / o0 * r1 / r0 * moves, ", ".join(parts) or "same schedule"

