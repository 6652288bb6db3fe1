"""Search, then prove: the candidate layouts and offload settings of a computed fix.

``search`` enumerates every (PP, optimizer-offload fraction) on top of a fix's base edits, keeps
those that pass ``prove`` and fit by the memory model (config/fit.py), and returns the one with
the lowest predicted iteration time (remedy/cost.py). Where none fits at the run's own TP and EP,
it tries each model-parallel move (``parallel_moves``: TP doubled inside a node, EP doubled) and
full activation recompute, the cheapest of those; then both together. ``prove`` is what every
candidate, and every fix before it is shown, must pass: the layout arithmetic
(``valid_layout``), what the next run resumes (remedy/resume.py), optimizer offload on a
fine-tune, and megatron-core's own checks (``Context.validator``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config.fit import Estimate, NoFix, Sizing, _est, _get, _int, _offload_on, gb, with_changes
from ..config.layout import of as layout_of
from ..config.runconfig import RunConfig
from . import resume as RS
from .cost import FULL_RECOMPUTE, predicted_time

NODE_GPUS = 8  # GPUs of one node's NVLink domain: TP moves stay inside it


@dataclass
class Context(Sizing):
    """What a computed fix may use besides the config: the sizing facts (config/fit.py: world
    size, GPU, the OOM's proven need and the failed run's config), and these."""

    captures: dict = field(default_factory=dict)  # the root-cause hit's regex captures
    world_inferred: bool = False  # world_size read from the ranks a log shows (a lower bound, rounded up)
    resume: RS.Resume | None = None  # what the next run loads (remedy/resume.py); None: not known
    # proves a candidate config before it is shown: megatron-core's own checks (config/mcore.py)
    # where it is installed; returns why MCore refuses it, or None
    validator: Callable[[RunConfig], str | None] | None = None
    oom: bool = False  # the failed run died of a CUDA OOM


def layout(cfg: RunConfig, world: int | None) -> dict:
    """The config's layout (config/layout.py) and its data-parallel size at ``world`` GPUs."""
    lay = layout_of(cfg)
    return {"tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "etp": lay.etp, "dp": lay.dp(world)}


def valid_layout(cfg: RunConfig, world: int, tp: int, pp: int, ep: int | None = None,
                 cp: int | None = None) -> str | None:
    """None when TP x PP x CP x DP = world and the batch and layer splits work; else why not."""
    cp = cp or _int(cfg, "model.context_parallel_size")
    ep = ep or _int(cfg, "model.expert_model_parallel_size")
    etp = _int(cfg, "model.expert_tensor_parallel_size", tp) or tp
    if world % (tp * pp * cp):
        return f"TP{tp} x PP{pp} x CP{cp} does not divide {world} GPUs"
    dp = world // (tp * pp * cp)
    bad = pipeline_split(cfg, pp)
    if bad:
        return bad
    if (world // pp) % (ep * etp):
        return f"EP{ep} x ETP{etp} does not divide the {world // pp} GPUs of a pipeline stage"
    experts = _get(cfg, "model.num_moe_experts")
    if experts and int(experts) % ep:
        return f"EP{ep} does not divide {experts} experts"
    gbs, mbs = _get(cfg, "train.global_batch_size"), _get(cfg, "train.micro_batch_size")
    if gbs and mbs and int(gbs) % (int(mbs) * dp):
        return f"global batch {gbs} is not a multiple of micro batch {mbs} x DP{dp}"
    vpp = _int(cfg, "model.virtual_pipeline_model_parallel_size", 1) or 1
    if pp > 1 and vpp > 1 and gbs and mbs:
        # the interleaved schedule (pipeline_parallel/schedules.py) at run time: the micro-batch
        # group per virtual stage must range in [PP, M], and M's remainder be 0 or >= PP
        m = int(gbs) // (int(mbs) * dp)
        group = _int(cfg, "model.microbatch_group_size_per_vp_stage", pp) or pp
        if not pp <= group <= m:
            return f"microbatch_group_size_per_vp_stage {group} should range in [PP={pp}, M={m}]"
        if 0 < m % group < pp:
            return (f"{m} micro-batches leave a last group of {m % group} < PP{pp} "
                    f"(microbatch_group_size_per_vp_stage {group})")
    heads = _get(cfg, "model.num_attention_heads")
    if heads and int(heads) % tp:
        return f"TP{tp} does not divide {heads} attention heads"
    groups = _get(cfg, "model.num_query_groups")
    if groups and int(groups) % tp and tp % int(groups):
        return f"TP{tp} and {groups} query groups: neither divides the other"
    return None


def pipeline_split(cfg: RunConfig, pp: int) -> str | None:
    """Why the layers do not split into ``pp`` pipeline stages as megatron-core splits them
    (TransformerConfig.__post_init__, 0.16): uneven first / last stages and the middle stages
    between them, the embedding and the loss counted as layers, a layout string written for
    one PP, and the EP all-to-all overlap, which needs a virtual pipeline under PP; None: they do."""
    layers = _int(cfg, "model.num_layers", 0) or 0
    vp = _int(cfg, "model.virtual_pipeline_model_parallel_size", 0) or None
    if pp > 1 and vp is None and cfg.get("model.overlap_moe_expert_parallel_comm") is True:
        return f"PP{pp} with the EP all-to-all overlap needs a virtual pipeline (VPP)"
    lay = cfg.get("model.pipeline_model_parallel_layout")
    if lay:
        # one "|"-separated stage per PP x VPP rank ("Et*24|t*24L": 2); a layout with repeated
        # groups ("(t|)*4") is left to megatron-core
        if isinstance(lay, str) and "(" not in lay and lay.count("|") + 1 != pp * (vp or 1):
            return (f"pipeline_model_parallel_layout has {lay.count('|') + 1} stages, not PP{pp}"
                    + (f" x VPP{vp}" if vp else ""))
        return None
    if not layers or pp <= 1:
        return None
    first = _int(cfg, "model.num_layers_in_first_pipeline_stage", 0) or None
    last = _int(cfg, "model.num_layers_in_last_pipeline_stage", 0) or None
    if first or last:
        middle, stages = layers, pp
        for name, n in (("first", first), ("last", last)):
            if n is not None:
                if vp and n % vp:
                    return f"the {name} stage's {n} layers are not a multiple of VPP{vp}"
                middle, stages = middle - n, stages - 1
        if middle < 0 or bool(middle) != bool(stages):
            return f"PP{pp}: {middle} middle layers for {stages} middle stages"
        if stages and middle % stages:
            return f"PP{pp}: {middle} middle layers do not divide into {stages} middle stages"
        if stages and vp and (middle // stages) % vp:
            return f"PP{pp}: {middle // stages} layers per middle stage are not a multiple of VPP{vp}"
        return None
    extra = int(cfg.get("model.account_for_embedding_in_pipeline_split") is True) + \
        int(cfg.get("model.account_for_loss_in_pipeline_split") is True)
    if extra:
        if (layers + extra) % pp or (vp and ((layers + extra) // pp) % vp):
            return (f"PP{pp}{f' x VPP{vp}' if vp else ''} does not divide {layers} layers + "
                    f"{extra} (the embedding / loss counted as layers)")
        return None
    if layers % (pp * (vp or 1)):
        return f"PP{pp} does not divide {layers} layers"
    return None


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def world_of(ctx: Context) -> int:
    if not ctx.world_size:
        raise NoFix("the world size is unknown (give --world-size, or a log that shows the ranks)")
    return int(ctx.world_size)


@dataclass
class Candidate:
    changes: list
    pp: int
    fraction: float | None  # None: no optimizer offload
    estimate: Estimate
    time: float  # predicted iteration time, as a factor of the failed run's
    why_time: str
    recompute: bool = False  # full activation recompute turned on
    move: str = ""  # a model-parallel move (parallel_moves): "TP4", "EP8"

    def label(self) -> str:
        off = "no optimizer offload" if self.fraction is None else f"{int(self.fraction * 100)}% optimizer offload"
        return (f"{self.move} + " if self.move else "") + f"PP{self.pp} + {off}" + \
            (" + full recompute" if self.recompute else "")


def pp_changes(cfg: RunConfig, pp: int) -> list:
    """PP set to ``pp``, with the virtual pipeline kept only where it still divides the layers."""
    out: list[tuple[str, Any]] = [("model.pipeline_model_parallel_size", pp)]
    vp, layers = _get(cfg, "model.virtual_pipeline_model_parallel_size"), _get(cfg, "model.num_layers")
    if vp and (pp == 1 or (layers and int(layers) % (pp * int(vp)))):
        out.append(("model.virtual_pipeline_model_parallel_size", None))
    if pp > 1 and not vp and cfg.get("model.overlap_moe_expert_parallel_comm") is True and layers \
            and int(layers) % (pp * 2) == 0 and not cfg.get("model.num_layers_in_first_pipeline_stage") \
            and not cfg.get("model.num_layers_in_last_pipeline_stage"):
        # MCore runs the EP all-to-all overlap under PP only with a virtual pipeline: the move
        # brings the smallest one
        out.append(("model.virtual_pipeline_model_parallel_size", 2))
    group = _get(cfg, "model.microbatch_group_size_per_vp_stage")
    if group is not None and int(group) == _int(cfg, "model.pipeline_model_parallel_size") and pp != int(group):
        out.append(("model.microbatch_group_size_per_vp_stage", None))  # it was the default (= PP): follow PP
    return out


def companions(cfg: RunConfig, key: str, value: int) -> list:
    """The settings a parallel size drags along: PP=1 has no virtual pipeline (and a VPP that no
    longer divides the layers goes), TP=1 has no sequence parallelism (MCore raises
    "Cannot use sequence parallelism without tensor parallelism")."""
    if key == "model.pipeline_model_parallel_size":
        return pp_changes(cfg, value)
    out = [(key, value)]
    if key == "model.tensor_model_parallel_size" and value == 1 and cfg.get("model.sequence_parallel") is True:
        out.append(("model.sequence_parallel", False))
    return out


def prove(cfg: RunConfig, after: RunConfig, ctx: Context, world: int | None, mcore: bool = True) -> str | None:
    """Why ``after`` must not be written (None: it may): the layout arithmetic, what the next run
    resumes, optimizer offload on a fine-tune, and (``mcore``) megatron-core's own checks."""
    if world:
        bad = valid_layout(after, world, _int(after, "model.tensor_model_parallel_size"),
                           _int(after, "model.pipeline_model_parallel_size"))
        if bad and bad != valid_layout(cfg, world, _int(cfg, "model.tensor_model_parallel_size"),
                                       _int(cfg, "model.pipeline_model_parallel_size")):
            return bad  # only what the change brings: the run's own layout problem is another finding
    if ctx.resume is not None:
        why = RS.blocks(ctx.resume, cfg, after) or RS.blocks_offload(ctx.resume, after)
        if why:
            return why
    if mcore and ctx.validator is not None:
        why = ctx.validator(after)
        if why:
            return f"megatron-core refuses it: {why}"
    return None


def recompute_possible(cfg: RunConfig, base: list) -> bool:
    """Full recompute may be tried: the run does not recompute fully already, and activation
    offload and the EP all-to-all overlap are off after ``base`` (MCore refuses recompute
    together with either)."""
    after = dict(base)
    offload = after.get("model.cpu_offloading", cfg.get("model.cpu_offloading"))
    overlap = after.get("model.overlap_moe_expert_parallel_comm", cfg.get("model.overlap_moe_expert_parallel_comm"))
    # MCore: "disable full recomputation when enabling overlap_moe_expert_parallel_comm"
    return cfg.get("model.recompute_granularity") != "full" and offload is not True and overlap is not True


def parallel_moves(cfg: RunConfig, world: int) -> list[tuple[str, list]]:
    """The model-parallel moves the search may add: TP doubled up to one node (with sequence
    parallelism, which MCore requires for MoE under TP and EP), EP doubled while it divides
    the experts. The layout arithmetic and megatron-core decide which of them pass."""
    lay = layout(cfg, world)
    moves = []
    tp = lay["tp"] * 2
    while tp <= min(NODE_GPUS, world):
        ch: list[tuple[str, Any]] = [("model.tensor_model_parallel_size", tp)]
        if _get(cfg, "model.num_moe_experts") and lay["ep"] > 1 and cfg.get("model.sequence_parallel") is not True:
            ch.append(("model.sequence_parallel", True))
        moves.append((f"TP{tp}", ch))
        tp *= 2
    experts = _get(cfg, "model.num_moe_experts")
    ep = lay["ep"] * 2
    while experts and ep <= world and int(experts) % ep == 0:
        moves.append((f"EP{ep}", [("model.expert_model_parallel_size", ep)]))
        ep *= 2
    return moves


def search(cfg: RunConfig, ctx: Context, base: list, pps: list, fractions: list) -> tuple[Candidate, str]:
    """Every (PP, optimizer-offload fraction) of ``pps`` x ``fractions`` (None: no offload) on
    top of ``base``: keep those that pass ``prove`` and fit by the memory model, return the one
    with the lowest predicted iteration time (then the smallest PP), and the search's account.
    Where none fits at the run's own TP and EP, the same search after each model-parallel move
    (parallel_moves) and with full activation recompute on (FULL_RECOMPUTE), the cheapest of
    those by predicted time; where none of those fits either, moves and recompute together."""
    try:
        return _search(cfg, ctx, base, pps, fractions)
    except NoFix as first:
        world = world_of(ctx)
        moves = [m for m in parallel_moves(cfg, world)
                 if not any(k == m[1][0][0] for k, _ in base)]  # a move the fix itself does not set
        recompute = recompute_possible(cfg, base)
        found, why = [], []
        for name, move in moves:
            try:
                found.append(_search(cfg, ctx, list(base) + move, pps, fractions, move=name))
            except NoFix as exc:
                why.append(f"with {name}, {exc}")
        if recompute:
            try:
                found.append(_search(cfg, ctx, list(base) + list(FULL_RECOMPUTE), pps, fractions, recompute=True))
            except NoFix as exc:
                why.append(f"with full recompute, {exc}")
            if not found:
                for name, move in moves:
                    try:
                        found.append(_search(cfg, ctx, list(base) + move + list(FULL_RECOMPUTE), pps,
                                             fractions, recompute=True, move=name))
                    except NoFix as exc:
                        why.append(f"with {name} and full recompute, {exc}")
        if not found:
            raise NoFix("; ".join([str(first)] + why)) from None
        best, text = min(found, key=lambda bt: (round(bt[0].time, 3), bt[0].recompute, bt[0].pp))
        others = [f"{c.label()} x{c.time:.2f}" for c, _ in found if c is not best]
        if others:
            text += "; also fit: " + ", ".join(others[:3])
        own = "without recompute" if best.recompute and not best.move else "at the run's own TP and EP"
        return best, f"{text}; {own}: {first}"


def _search(cfg: RunConfig, ctx: Context, base: list, pps: list, fractions: list,
            recompute: bool = False, move: str = "") -> tuple[Candidate, str]:
    world = world_of(ctx)
    found, rejected = [], []
    # the failed run died of an OOM that the (uncalibrated) memory model says fits: then only a
    # setting predicted to need less than the failed one can be trusted to fit
    ceiling = None
    if ctx.oom:
        e0 = _est(cfg, ctx)
        if e0.fits_with_margin and not e0.calibrated:
            ceiling = e0.peak_gb
    for pp in pps:
        for f in fractions:
            ch = list(base) + pp_changes(cfg, pp)
            if f is None:
                if any(k == "optimizer.optimizer_cpu_offload" and v is True for k, v in ch) or \
                        (cfg.get("optimizer.optimizer_cpu_offload") is True and
                         not any(k == "optimizer.optimizer_cpu_offload" for k, _ in ch)):
                    ch = [(k, v) for k, v in ch if not k.startswith("optimizer.optimizer_")]
                    ch.append(("optimizer.optimizer_cpu_offload", False))
            else:
                ch = _offload_on(ch, cfg) + [("optimizer.optimizer_offload_fraction", f)]
            after = with_changes(cfg, ch)
            name = (f"{move} + " if move else "") + f"PP{pp}" + ("" if f is None else f" + {int(f * 100)}%")
            why = prove(cfg, after, ctx, world, mcore=False)  # the cheap checks first
            if why is None:
                e = _est(after, ctx)
                if not e.fits_with_margin:
                    rejected.append(f"{name}: {gb(e.peak_gb)} does not fit {gb(e.capacity_gb - e.margin_gb)}")
                    continue
                if ceiling is not None and e.peak_gb >= ceiling:
                    rejected.append(f"{name}: {gb(e.peak_gb)}, not less than the run that died of the OOM "
                                    f"({gb(ceiling)} by the same model)")
                    continue
                why = ctx.validator(after) if ctx.validator is not None else None
                why = why and f"megatron-core refuses it: {why}"
            if why is not None:
                rejected.append(f"{name}: {why}")
                continue
            t, why_t = predicted_time(cfg, after, world)
            found.append(Candidate(ch, pp, f, e, t, why_t, recompute, move))
            break  # a higher fraction at this PP is only slower
    if not found:
        raise NoFix("no layout or offload setting passes: " + "; ".join(uniq(rejected)[:6]))
    found.sort(key=lambda c: (round(c.time, 3), c.pp, c.fraction or 0.0))
    best = found[0]
    text = (f"searched {len(found) + len(rejected)} settings, {len(found)} fit and pass: {best.label()} "
            f"({gb(best.estimate.peak_gb)} of {gb(best.estimate.capacity_gb)}; predicted iteration time "
            f"x{best.time:.2f}: {best.why_time})")
    if len(found) > 1:
        text += "; next: " + ", ".join(f"{c.label()} x{c.time:.2f}" for c in found[1:3])
    if rejected:
        text += "; rejected: " + "; ".join(uniq(rejected)[:3])
    return best, text


def uniq(items: list) -> list:
    seen, out = set(), []
    for i in items:
        key = i.split(": ", 1)[-1]
        if key not in seen:
            seen.add(key)
            out.append(i)
    return out

