"""Does a config fit its GPUs: the memory model's verdict, calibrated, and the lowest
optimizer-offload fraction that fits.

One place for "fits" (the planner's search, the expected-vs-observed offload cost of
analyze/expected.py): config/memory.py sizes a config; this module turns its estimate into a
verdict with the model's margin, scales it by what an OOM in the log proved was needed, and
tries the offload fractions lowest first. ``ctx`` is any object with ``world_size``, ``gpu``,
``gpu_memory_gb``, ``gpus_per_node``, ``observed_need_gb`` and ``failed_cfg`` (remedy/search.py's
Context).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..edits import DELETE
from . import memory as mm
from .runconfig import MISSING, RunConfig

FRACTIONS = (0.25, 0.5, 0.75, 1.0)  # optimizer-offload fractions tried, lowest first


@dataclass
class Sizing:
    """What sizing a config needs besides it (remedy/search.py's Context extends it)."""

    world_size: int | None = None
    gpu: str | None = None
    gpu_memory_gb: float | None = None
    gpus_per_node: int = 8
    observed_need_gb: float | None = None  # an OOM in the log proved at least this much was needed
    failed_cfg: RunConfig | None = None  # the config of the run that died of it


class NoFix(Exception):
    """A computed fix found nothing that works; the message says why."""


def gb(x: float) -> str:
    """GB (1e9 bytes) for a report: tiny models in MB."""
    return f"{x:.1f} GB" if abs(x) >= 1 else f"{x * 1000:.1f} MB"


@dataclass
class Estimate:
    per_gpu_gb: float
    peak_gb: float
    capacity_gb: float
    fits: bool
    host_gb: float
    margin_gb: float = 0.0  # the memory model's margin (CUDA context, workspaces, fragmentation)
    calibrated: bool = False
    pinned_gb: float = 0.0
    notes: list = field(default_factory=list)

    @property
    def fits_with_margin(self) -> bool:
        """The memory model's verdict: peak + margin <= capacity."""
        return self.fits


def _get(cfg: RunConfig, key: str, default=None):
    v = cfg.get(key, MISSING)
    return default if v is MISSING or v is None else v


def _int(cfg: RunConfig, key: str, default: int = 1) -> int:
    v = _get(cfg, key, default)
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def with_changes(cfg: RunConfig, changes: list) -> RunConfig:
    out = cfg.copy()
    for key, value in changes:
        if value is DELETE:
            out.delete(key)
        else:
            out.set(key, value)
    return out


def estimate(cfg: RunConfig, ctx, calibrate_on: RunConfig | None = None) -> Estimate:
    """The memory model's estimate, calibrated against the OOM when the log showed one.

    When the failed run's config (``calibrate_on``) is predicted to fit although the run died
    of an OOM needing at least ``ctx.observed_need_gb``, every estimate is scaled by
    need / predicted: the model is trusted for ratios, the log for the level.
    """
    cfg = mm.fill_from_preset(cfg)[0]
    if calibrate_on is not None:
        calibrate_on = mm.fill_from_preset(calibrate_on)[0]
    try:
        e = mm.estimate(cfg, world_size=ctx.world_size, gpu=ctx.gpu, gpu_memory_gb=ctx.gpu_memory_gb,
                        gpus_per_node=ctx.gpus_per_node)
    except mm.MemoryModelError as exc:  # a config it cannot size (missing dims, a layout that does not divide)
        raise NoFix(f"the memory model cannot size this config: {exc}") from None
    margin = float(e.margin_gb)
    out = Estimate(float(e.per_gpu_gb), float(e.peak_gb), float(e.capacity_gb), bool(e.fits), float(e.host_gb),
                   margin, notes=list(e.notes), pinned_gb=float(e.pinned_gb))
    need = ctx.observed_need_gb
    if need and calibrate_on is not None:
        try:
            base = mm.estimate(calibrate_on, world_size=ctx.world_size, gpu=ctx.gpu,
                               gpu_memory_gb=ctx.gpu_memory_gb, gpus_per_node=ctx.gpus_per_node)
        except mm.MemoryModelError:
            base = None
        if base is not None and float(base.peak_gb) > 0 and float(base.peak_gb) < need:
            k = need / float(base.peak_gb)
            out = Estimate(out.per_gpu_gb * k, out.peak_gb * k, out.capacity_gb,
                           out.peak_gb * k + margin <= out.capacity_gb, out.host_gb, margin, calibrated=True,
                           notes=out.notes, pinned_gb=out.pinned_gb)
    return out


def _est(cfg: RunConfig, ctx) -> Estimate:
    return estimate(cfg, ctx, calibrate_on=ctx.failed_cfg if ctx.observed_need_gb else None)


def _offload_on(base: list, cfg: RunConfig) -> list:
    """Optimizer offload on (with the distributed optimizer it needs), on top of ``base``."""
    out = [(k, v) for k, v in base if k not in ("optimizer.optimizer_offload_fraction",)]
    keys = {k for k, _ in out}
    if "optimizer.optimizer_cpu_offload" not in keys:
        out.append(("optimizer.optimizer_cpu_offload", True))
    for k in ("optimizer.use_distributed_optimizer", "ddp.use_distributed_optimizer"):
        if k not in keys and cfg.get(k) is not True:
            out.append((k, True))
    return out


def _lowest_fraction(cfg: RunConfig, ctx, base: list, above: float = -1.0) -> tuple[float, Estimate]:
    tried = []
    for f in FRACTIONS:
        if f <= above + 1e-9:
            continue
        e = _est(with_changes(cfg, base + [("optimizer.optimizer_offload_fraction", f)]), ctx)
        tried.append(f"{int(f * 100)}%: {gb(e.peak_gb)}")
        if e.fits_with_margin:
            return f, e
    cap = f" of {e.capacity_gb:.1f} GB" if tried else ""
    raise NoFix(("no optimizer-offload fraction fits (" + ", ".join(tried) + cap + ")")
                if tried else "the fraction is already 100%")


def without_offload(cfg: RunConfig, ctx, base: tuple | list = ()) -> tuple[list, Estimate] | None:
    """``base`` with optimizer offload off (and its fraction 0), and the estimate, where the run
    fits without it with the margin; None where it does not."""
    out = [(k, v) for k, v in base if not k.startswith("optimizer.optimizer_")]
    if cfg.get("optimizer.optimizer_cpu_offload") is True:
        out.append(("optimizer.optimizer_cpu_offload", False))
    if float(_get(cfg, "optimizer.optimizer_offload_fraction", 0.0) or 0.0) != 0.0:
        out.append(("optimizer.optimizer_offload_fraction", 0.0))
    e = _est(with_changes(cfg, out), ctx)
    return (out, e) if e.fits_with_margin else None


def lowest_fitting_fraction(cfg: RunConfig, ctx) -> tuple[float, Estimate]:
    """The lowest optimizer-offload fraction (of FRACTIONS) whose estimate fits with the margin."""
    return _lowest_fraction(cfg, ctx, _offload_on([], cfg))
