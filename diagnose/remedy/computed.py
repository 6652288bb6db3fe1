"""The computed fixes: a signature's ``compute: NAME`` is completed here, from the config, the
world size and the memory model.

Each function registered under NAME in ``COMPUTED`` takes the config, the planner's Context and
the fix's static edits, and returns the full edits and a one-line account of how it chose them,
or raises NoFix with why nothing works (the planner then tries the signature's next fix). The
layout searches are remedy/search.py's; what fits is config/fit.py's.
"""
from __future__ import annotations

from collections.abc import Callable

from ..config.fit import (
    FRACTIONS,
    Estimate,
    NoFix,
    _est,
    _get,
    _int,
    _lowest_fraction,
    _offload_on,
    gb,
    without_offload,
)
from ..config.runconfig import RunConfig
from . import resume as RS
from .cost import slowdown
from .search import (
    Context,
    companions,
    divisors,
    layout,
    prove,
    search,
    uniq,
    valid_layout,
    with_changes,
    world_of,
)

Computed = Callable[[RunConfig, Context, list], tuple[list, str]]
COMPUTED: dict[str, Computed] = {}


def computed(name: str):
    def deco(fn):
        COMPUTED[name] = fn
        return fn
    return deco


def _fraction_reason(f: float, e: Estimate, cfg: RunConfig) -> str:
    overlap = bool(cfg.get("optimizer.overlap_cpu_optimizer_d2h_h2d"))
    return (f"lowest fraction that fits with the memory model's margin: {int(f * 100)}% ({gb(e.peak_gb)} of "
            f"{gb(e.capacity_gb)}; x{slowdown(f, overlap):.1f} iteration time)")


def _without_offload(cfg, ctx, base) -> tuple[list, str] | None:
    """``base`` with optimizer offload off, where the run fits without it (the minimal fix: no
    CPU Adam at all); None where it does not fit, or where the next run may load an optimizer
    state saved with offload on (that the state loads into a run with offload off is not
    proved here: such a run keeps offload on, at the lowest fraction that fits)."""
    r = getattr(ctx, "resume", None) or RS.read(cfg)
    if r.loads is not False and r.optimizer_state and not r.weights_only and \
            cfg.get("optimizer.optimizer_cpu_offload") is True:
        return None
    off = without_offload(cfg, ctx, base)
    if off is None:
        return None
    out, e = off
    return out, (f"optimizer offload off: it fits without it with the memory model's margin ({gb(e.peak_gb)} of "
                 f"{gb(e.capacity_gb)}; no CPU optimizer step, x1.0 iteration time)")


@computed("lowest_fitting_offload_fraction")
def lowest_fitting_offload_fraction(cfg, ctx, base):
    off = _without_offload(cfg, ctx, base)
    if off is not None:
        return off
    base = _offload_on(base, cfg)
    f, e = _lowest_fraction(cfg, ctx, base)
    return base + [("optimizer.optimizer_offload_fraction", f)], _fraction_reason(f, e, cfg)


@computed("raise_offload_fraction")
def raise_offload_fraction(cfg, ctx, base):
    cur = float(_get(cfg, "optimizer.optimizer_offload_fraction", 0.0))
    base = _offload_on(base, cfg)
    f, e = _lowest_fraction(cfg, ctx, base, above=cur)
    return base + [("optimizer.optimizer_offload_fraction", f)], \
        f"raised from {int(cur * 100)}%: " + _fraction_reason(f, e, cfg)


@computed("switch_to_optimizer_offload")
def switch_to_optimizer_offload(cfg, ctx, base):
    base = list(base)
    if _int(cfg, "model.cpu_offloading_num_layers", 0):
        base.append(("model.cpu_offloading_num_layers", 0))
    off = _without_offload(cfg, ctx, base)
    if off is not None:
        return off[0], "activation offload off, and " + off[1]
    base = _offload_on(base, cfg)
    f, e = _lowest_fraction(cfg, ctx, base)
    return base + [("optimizer.optimizer_offload_fraction", f)], \
        "activation offload off, optimizer offload on; " + _fraction_reason(f, e, cfg)


@computed("offload_layers_in_range")
def offload_layers_in_range(cfg, ctx, base):
    layers = _get(cfg, "model.num_layers")
    cur = _get(cfg, "model.cpu_offloading_num_layers")
    if not layers:
        raise NoFix("model.num_layers is unknown")
    layers = int(layers)
    if layers < 2:
        raise NoFix(f"with {layers} layer(s) no layer can be offloaded (the last one never is)")
    new = 0 if cur is None or int(cur) < 0 else min(int(cur), layers - 1)
    return base + [("model.cpu_offloading_num_layers", new)], \
        f"at most num_layers - 1 = {layers - 1} layers can be offloaded"


@computed("add_pp")
def add_pp(cfg, ctx, base):
    """A larger PP that divides the layers, the batch and the world and fits; with optimizer
    offload on, at the current fraction or a higher one; the cheapest by predicted time."""
    world = world_of(ctx)
    if cfg.get("model.cpu_offloading") is True and not any(k == "model.cpu_offloading" for k, _ in base):
        raise NoFix("activation offload (model.cpu_offloading) needs PP=1; switch to optimizer offload first")
    lay = layout(cfg, world)
    if cfg.get("optimizer.optimizer_cpu_offload") is True:
        cur = float(_get(cfg, "optimizer.optimizer_offload_fraction", 0.0))
        fractions: list[float | None] = [f for f in FRACTIONS if f >= cur - 1e-9]
    else:
        fractions = [None]
    best, text = search(cfg, ctx, base, list(range(lay["pp"] + 1, world + 1)), fractions)
    return best.changes, text


@computed("pp_and_optimizer_offload")
def pp_and_optimizer_offload(cfg, ctx, base):
    """Activation offload off; then the cheapest of: any PP that divides the layout (the current
    one included), without optimizer offload first, then at the lowest fraction that fits."""
    world = world_of(ctx)
    base = list(base)
    if not any(k == "model.cpu_offloading" for k, _ in base):
        base.append(("model.cpu_offloading", False))
    if _int(cfg, "model.cpu_offloading_num_layers", 0):
        base.append(("model.cpu_offloading_num_layers", 0))
    base = [(k, v) for k, v in base if not k.startswith("optimizer.")]
    lay = layout(cfg, world)
    best, text = search(cfg, ctx, base, list(range(max(1, lay["pp"]), world + 1)), [None, *FRACTIONS])
    return best.changes, text


def _nearest(cands: list[int], cur: int) -> list[int]:
    """Candidates in order of preference: the largest below the current value first (same or
    lower parallel degree keeps the layout closest), then the smallest above."""
    below = sorted((c for c in cands if c < cur), reverse=True)
    above = sorted(c for c in cands if c > cur)
    return below + above


def _try_parallel(cfg, ctx, base, key: str, cands: list[int], cur: int, what: str):
    world = world_of(ctx)
    why = []
    for c in _nearest(cands, cur):
        ch = base + companions(cfg, key, c)
        after = with_changes(cfg, ch)
        bad = prove(cfg, after, ctx, world)
        if bad:
            why.append(f"{what}{c}: {bad}")
            continue
        try:
            e = _est(after, ctx)
        except NoFix:
            e = None
        if e is not None and not e.fits_with_margin:
            why.append(f"{what}{c}: {gb(e.peak_gb)}")
            continue
        mem = f" ({gb(e.peak_gb)} of {gb(e.capacity_gb)})" if e else ""
        return ch, f"nearest {what} to {cur} that divides the layout: {what}{c}{mem}"
    raise NoFix(f"no {what} divides the layout and fits" + (f" ({'; '.join(uniq(why)[:3])})" if why else ""))


def _layout_candidates(cfg, world: int, what: str, check) -> tuple[list, list]:
    """The divisors of the world size that pass the layout arithmetic, and why the others do not."""
    ok, why = [], []
    for c in divisors(world):
        bad = check(c)
        if bad:
            why.append(f"{what}{c}: {bad}")
        else:
            ok.append(c)
    return ok, why


def _divisor_fix(cfg, ctx, base, key: str, what: str, cur: int, check):
    world = world_of(ctx)
    cands, why = _layout_candidates(cfg, world, what, check)
    cands = [c for c in cands if c != cur]
    if not cands:
        raise NoFix(f"no {what} divides the layout of {world} GPUs: " + "; ".join(uniq(why)[:4]))
    return _try_parallel(cfg, ctx, base, key, cands, cur, what)


@computed("divisor_pp")
def divisor_pp(cfg, ctx, base):
    world = world_of(ctx)
    lay = layout(cfg, world)
    return _divisor_fix(cfg, ctx, base, "model.pipeline_model_parallel_size", "PP", lay["pp"],
                        lambda pp: valid_layout(cfg, world, lay["tp"], pp))


@computed("divisor_tp")
def divisor_tp(cfg, ctx, base):
    world = world_of(ctx)
    lay = layout(cfg, world)
    return _divisor_fix(cfg, ctx, base, "model.tensor_model_parallel_size", "TP", lay["tp"],
                        lambda tp: valid_layout(cfg, world, tp, lay["pp"]))


@computed("divisor_ep")
def divisor_ep(cfg, ctx, base):
    world = world_of(ctx)
    lay = layout(cfg, world)
    return _divisor_fix(cfg, ctx, base, "model.expert_model_parallel_size", "EP", lay["ep"],
                        lambda ep: valid_layout(cfg, world, lay["tp"], lay["pp"], ep=ep))

