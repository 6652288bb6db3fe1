"""Expected vs observed cost: what the run's config says it should cost, against the log.

Optimizer CPU offload trades GPU memory for iteration time, and the trade is measured: the
measured curve (config/offload_curve.py; Qwen3-30B-A3B, TP2 PP2 EP4, 16 x H100) gives the
iteration-time factor at each offloaded fraction. A run that offloads more than it needs to fit
pays for nothing: the memory model finds the lowest fraction that fits, and the difference of
the two factors is the saving. The factors are the measured model's; another model's CPU Adam
costs scale with its parameters per GPU, so the saving is stated as a share of the iteration.
"""
from __future__ import annotations


def offload_cost(cfg, metrics: dict, world_size: int | None, timers: str = "") -> dict | None:
    """``metrics`` entries (offload_fraction, offload_fraction_fits, offload_factor,
    offload_factor_fits, offload_saving) and the evidence text, or None where the run offloads
    no more than it needs (or the memory model cannot size the config). ``timers``: what the
    log's timers say of the iteration (symptoms.timer_shares), added to the evidence."""
    from ..config import fit as PL
    from ..config.offload_curve import SCOPE, factor

    if cfg is None or cfg.get("optimizer.optimizer_cpu_offload") is not True:
        return None
    f = cfg.get("optimizer.optimizer_offload_fraction")
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
        return None
    overlap = bool(cfg.get("optimizer.overlap_cpu_optimizer_d2h_h2d"))
    try:
        best, est = PL.lowest_fitting_fraction(cfg, PL.Sizing(world_size=world_size))
    except PL.NoFix:
        return None
    if best >= f - 1e-9:
        return None
    cur, fit = factor(f, overlap), factor(best, overlap)
    saving = 1 - fit / cur
    # the planner turns offload off where the next run loads no optimizer state saved with it:
    # said first, so that a first screen shows it beside the overrides
    off_text = ""
    try:
        off = PL.without_offload(cfg, PL.Sizing(world_size=world_size))
        if off is not None:
            off_text = f", and offload off too ({PL.gb(off[1].peak_gb)}: x1.0, no CPU optimizer step)"
    except PL.NoFix:
        pass
    text = (f"optimizer_offload_fraction {float(f):.2f} where {best:.2f} fits ({PL.gb(est.peak_gb)} of "
            f"{PL.gb(est.capacity_gb)} per GPU){off_text}: iteration time x{cur:.1f} -> x{fit:.1f} of the run "
            f"without offload at {best:.2f}, {saving:.0%} of each iteration")
    observed = metrics.get("iter_ms_median")
    if observed:
        text += f": about {observed * saving / 1000:.1f} s of every {observed / 1000:.1f} s iteration"
    if timers:  # before the scope, so that a first screen shows them
        text += f"; the timers: {timers}"
    text += f" (offload factors {SCOPE})"
    return {"offload_fraction": float(f), "offload_fraction_fits": best, "offload_factor": cur,
            "offload_factor_fits": fit, "offload_saving": round(saving, 3), "_text": text}
