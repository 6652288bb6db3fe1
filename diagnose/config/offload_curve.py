"""The one measured optimizer-offload cost curve, and the scope it was measured in.

Megatron-Bridge ``docs/training/cpu-offloading.md`` (measured results): Qwen3-30B-A3B, TP2 PP2
EP4, 2 nodes of 8 H100, bf16; 996 ms per iteration without offload. The iteration-time factor at
each optimizer-offload fraction; with ``overlap_cpu_optimizer_d2h_h2d`` it was measured at 100 %
only (3877 ms), so the overlap changes that point alone and the factors between 75 % and 100 %
are interpolated towards it; below 75 % no gain is claimed. Other models, layouts and hosts
differ (the CPU optimizer's share grows with the parameters per GPU and shrinks with host
bandwidth): every prediction made from it says so (``SCOPE``).
"""
from __future__ import annotations

import itertools

POINTS = ((0.0, 1.0), (0.25, 1.9), (0.5, 2.5), (0.75, 3.2), (1.0, 4.2))  # 996/1871/2484/3187/4189 ms
OVERLAP_FULL = 3.9  # 100 % with overlap_cpu_optimizer_d2h_h2d (3877 ms)
SCOPE = "measured on Qwen3-30B-A3B TP2 PP2 EP4, 16 x H100; other jobs differ"


def factor(fraction: float, overlap: bool = False) -> float:
    """The iteration-time factor at ``fraction`` against no optimizer offload (interpolated)."""
    f = min(max(float(fraction), 0.0), 1.0)
    pts = list(POINTS)
    if overlap:
        pts[-1] = (1.0, OVERLAP_FULL)
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x0 <= f <= x1:
            return round(y0 + (y1 - y0) * (f - x0) / (x1 - x0), 2)
    return pts[-1][1]
