"""From root causes and a config to a Plan: ordered config edits with safety and predicted effect.

The fixes are data (the signature's ``fixes`` in ``signatures/*.yaml``). For each cause the
planner takes the first fix that applies (its ``when`` predicate holds or is unknown), that
has edits (``display-only`` fixes are advice and are reported, never applied) and whose safety
is allowed (``unsafe`` needs ``allow_unsafe``). A fix with ``compute: NAME`` is completed here,
by the function registered under NAME in ``COMPUTED``, from the config, the world size and the
memory model (``diagnose/config/memory.py``): the smallest pipeline size that divides the
layers and the world size and fits, the lowest optimizer-offload fraction that fits with a
margin, ... A computed fix that finds nothing says why, and the planner moves on to the next
fix; a name this module does not know is reported as "no fix known", never guessed.

Every planned fix carries its predicted effect: memory per GPU before and after (the memory
model, calibrated against the OOM the log shows when there is one) and the iteration-time
factor of optimizer offload from the seed's measured curve.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import predicate as P
from ..config import offload_curve
from ..config.fit import (  # noqa: F401 - the planner's names for the fit facts
    FRACTIONS,
    Estimate,
    NoFix,
    Sizing,
    _est,
    _get,
    _int,
    _lowest_fraction,
    _offload_on,
    estimate,
    gb,
    lowest_fitting_fraction,
    with_changes,
)
from ..config.layout import of as layout_of
from ..config.runconfig import MISSING, RunConfig
from ..edits import DELETE, apply_edit, format_value, override
from ..model import Edit, Fix, Safety, Signature
from . import resume as RS

# full activation recompute, tried only where no layout or offload setting fits: each layer's
# forward runs twice, about one more forward pass per step (forward ~ 1/3 of forward + backward)
FULL_RECOMPUTE = (("model.recompute_granularity", "full"), ("model.recompute_method", "uniform"),
                  ("model.recompute_num_layers", 1))
RECOMPUTE_FACTOR = 4 / 3
# model-parallel moves, tried only where the run's own TP and EP fit nothing: one degree doubled
# (TP inside one node's NVLink domain). What each doubling costs is a rule of thumb, not measured:
# TP adds two all-reduces per layer on the critical path; EP sends the all-to-all to more ranks
NODE_GPUS = 8
TP_STEP_FACTOR = 1.10
EP_STEP_FACTOR = 1.05



def slowdown(fraction: float, overlap: bool = False) -> float:
    """Iteration-time factor of optimizer offload at ``fraction``: config/offload_curve.py."""
    return offload_curve.factor(fraction, overlap)


# --- context and results ---------------------------------------------------------------------
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


@dataclass
class PlannedEdit:
    key: str
    old: Any  # MISSING when the config lacks the key
    new: Any  # DELETE to remove the key

    @property
    def changes(self) -> bool:
        if self.new is DELETE:
            return self.old is not MISSING and self.old is not None
        return self.old is MISSING or self.old != self.new or type(self.old) is not type(self.new)

    @property
    def override(self) -> str:
        """Bridge's Hydra grammar: ``key=value``; ``+key=value`` for a key neither the config nor
        Bridge's ConfigContainer has (OmegaConf refuses to set an absent key in a struct
        config); ``~key`` to delete."""
        if self.new is DELETE:
            return f"~{self.key}"
        from ..config import schema

        plus = "+" if self.old is MISSING and not schema.declared(self.key) else ""
        return plus + override(self.key, self.new)

    def mlm_flag(self) -> str | None:
        """The Megatron-LM command-line form (``--pipeline-model-parallel-size 2``), or None where
        Megatron-LM has no argument for the key."""
        arg = mlm_argument(self.key)
        if arg is None or self.new is DELETE:
            return None
        flag = "--" + arg.replace("_", "-")
        if isinstance(self.new, bool):
            return flag if self.new else f"(remove {flag})"
        if self.new is None:
            return f"(remove {flag})"
        return f"{flag} {format_value(self.new)}"

    def describe(self) -> str:
        old = "(absent)" if self.old is MISSING else format_value(self.old)
        new = "(deleted)" if self.new is DELETE else format_value(self.new)
        return f"{self.key}: {old} -> {new}"


@dataclass
class Effect:
    before: Estimate | None = None
    after: Estimate | None = None
    slowdown: float | None = None  # iteration-time factor against no optimizer offload
    time: tuple | None = None  # (factor, why): predicted iteration time against the failed run's
    text: str | None = None  # the signature's qualitative effect
    notes: list = field(default_factory=list)

    def describe(self) -> str:
        parts = []
        if self.before is not None and self.after is not None:
            a = self.after
            verdict = (f"fits with a {a.margin_gb:.1f} GB margin" if a.fits else "does NOT fit")
            parts.append(f"memory per GPU {gb(self.before.peak_gb)} -> {gb(a.peak_gb)} of "
                         f"{gb(a.capacity_gb)} ({verdict})" + (" [calibrated on the OOM]" if a.calibrated else ""))
            if a.host_gb:
                parts.append(f"host memory {gb(a.host_gb)} per node ({gb(a.pinned_gb)} of it pinned)")
        elif self.after is not None:
            parts.append(f"memory per GPU {gb(self.after.peak_gb)} of {gb(self.after.capacity_gb)}")
        if self.time is not None:
            parts.append(f"iteration time x{self.time[0]:.2f} of the failed run's ({self.time[1]})")
        elif self.slowdown is not None:
            parts.append(f"iteration time x{self.slowdown:.1f} from optimizer offload ({offload_curve.SCOPE})")
        if not parts and self.text:
            parts.append(self.text)
        return "; ".join(parts) if parts else "not estimated"


@dataclass
class PlannedFix:
    signature: Signature
    fix: Fix
    edits: list  # PlannedEdit
    reason: str = ""  # how a computed fix chose its values
    effect: Effect = field(default_factory=Effect)
    already_applied: bool = False

    @property
    def safety(self) -> str:
        return self.fix.safety


@dataclass
class Refusal:
    signature: Signature
    fix: Fix
    edits: list
    reason: str
    effect: Effect = field(default_factory=Effect)


@dataclass
class Plan:
    causes: list  # Signatures planned for, in order
    fixes: list = field(default_factory=list)  # PlannedFix
    refused: list = field(default_factory=list)  # Refusal: unsafe fixes not allowed
    no_fix: list = field(default_factory=list)  # (Signature, reason)
    advice: list = field(default_factory=list)  # (Signature, text): display-only fixes
    notes: list = field(default_factory=list)
    effect: Effect = field(default_factory=Effect)  # of all edits together

    @property
    def edits(self) -> list:
        """All edits that change something, in order, one per key (a later fix's value wins)."""
        out: dict[str, PlannedEdit] = {}
        for pf in self.fixes:
            for e in pf.edits:
                if e.changes:
                    out.pop(e.key, None)
                    out[e.key] = e
        return list(out.values())

    @property
    def overrides(self) -> list[str]:
        return [e.override for e in self.edits]

    def mlm_flags(self) -> tuple[list[str], list[str]]:
        """(Megatron-LM flags, keys Megatron-LM has no argument for)."""
        flags, missing = [], []
        for e in self.edits:
            f = e.mlm_flag()
            (flags.append(f) if f else missing.append(e.key))
        return flags, missing

    @property
    def status(self) -> str:
        """ok (edits to apply) | applied (already in the config) | unsafe | no_fix | nothing."""
        if self.edits:
            return "ok"
        if self.fixes:
            return "applied"
        if self.refused:
            return "unsafe"
        if self.no_fix or self.advice:
            return "no_fix"
        return "nothing"


def mlm_argument(key: str) -> str | None:
    """The Megatron-LM argument that writes the Bridge path ``key`` (diagnose/data/mlm_args.yaml,
    read backwards), or None."""
    from ..config.runconfig import mlm_map

    for arg, paths in mlm_map().items():
        for p in (paths if isinstance(paths, list) else [paths]):
            if p == key:
                return arg
    return None


# --- config helpers --------------------------------------------------------------------------
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
    layers = _get(cfg, "model.num_layers")
    if layers and pp > 1:
        vp = _get(cfg, "model.virtual_pipeline_model_parallel_size")
        if int(layers) % (pp * (int(vp) if vp else 1)):
            return f"PP{pp} does not divide {layers} layers"
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


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# --- computed fixes --------------------------------------------------------------------------
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


@computed("lowest_fitting_offload_fraction")
def lowest_fitting_offload_fraction(cfg, ctx, base):
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


def _world(ctx: Context) -> int:
    if not ctx.world_size:
        raise NoFix("the world size is unknown (give --world-size, or a log that shows the ranks)")
    return int(ctx.world_size)


# --- search, then prove: layouts and offload settings ----------------------------------------
@dataclass
class Candidate:
    changes: list
    pp: int
    fraction: float | None  # None: no optimizer offload
    estimate: Estimate
    time: float  # predicted iteration time, as a factor of the failed run's
    why_time: str
    recompute: bool = False  # full activation recompute turned on
    move: str = ""  # a model-parallel move (_parallel_moves): "TP4", "EP8"

    def label(self) -> str:
        off = "no optimizer offload" if self.fraction is None else f"{int(self.fraction * 100)}% optimizer offload"
        return (f"{self.move} + " if self.move else "") + f"PP{self.pp} + {off}" + \
            (" + full recompute" if self.recompute else "")


def pipeline_bubble(cfg: RunConfig, world: int) -> float | None:
    """The 1F1B schedule's time over a bubble-free one: (m + (PP - 1) / VPP) / m, m the
    micro-batches per pipeline (global batch / (micro batch x DP)). None when the batch is unknown."""
    lay = layout(cfg, world)
    gbs, mbs = _get(cfg, "train.global_batch_size"), _get(cfg, "train.micro_batch_size")
    if not (lay["dp"] and gbs and mbs):
        return None
    m = int(gbs) // (int(mbs) * lay["dp"])
    if m < 1:
        return None
    vp = _int(cfg, "model.virtual_pipeline_model_parallel_size", 1) or 1
    return (m + (lay["pp"] - 1) / vp) / m


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


def _pp_changes(cfg: RunConfig, pp: int) -> list:
    """PP set to ``pp``, with the virtual pipeline kept only where it still divides the layers."""
    out: list[tuple[str, Any]] = [("model.pipeline_model_parallel_size", pp)]
    vp, layers = _get(cfg, "model.virtual_pipeline_model_parallel_size"), _get(cfg, "model.num_layers")
    if vp and (pp == 1 or (layers and int(layers) % (pp * int(vp)))):
        out.append(("model.virtual_pipeline_model_parallel_size", None))
    group = _get(cfg, "model.microbatch_group_size_per_vp_stage")
    if group is not None and int(group) == _int(cfg, "model.pipeline_model_parallel_size") and pp != int(group):
        out.append(("model.microbatch_group_size_per_vp_stage", None))  # it was the default (= PP): follow PP
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


def _recompute_possible(cfg: RunConfig, base: list) -> bool:
    """Full recompute may be tried: the run does not recompute fully already, and activation
    offload is off after ``base`` (MCore refuses recompute together with it)."""
    after = dict(base)
    offload = after.get("model.cpu_offloading", cfg.get("model.cpu_offloading"))
    return cfg.get("model.recompute_granularity") != "full" and offload is not True


def _parallel_moves(cfg: RunConfig, world: int) -> list[tuple[str, list]]:
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
    (_parallel_moves) and with full activation recompute on (FULL_RECOMPUTE), the cheapest of
    those by predicted time; where none of those fits either, moves and recompute together."""
    try:
        return _search(cfg, ctx, base, pps, fractions)
    except NoFix as first:
        world = _world(ctx)
        moves = [m for m in _parallel_moves(cfg, world)
                 if not any(k == m[1][0][0] for k, _ in base)]  # a move the fix itself does not set
        recompute = _recompute_possible(cfg, base)
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
    world = _world(ctx)
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
            ch = list(base) + _pp_changes(cfg, pp)
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
        raise NoFix("no layout or offload setting passes: " + "; ".join(_uniq(rejected)[:6]))
    found.sort(key=lambda c: (round(c.time, 3), c.pp, c.fraction or 0.0))
    best = found[0]
    text = (f"searched {len(found) + len(rejected)} settings, {len(found)} fit and pass: {best.label()} "
            f"({gb(best.estimate.peak_gb)} of {gb(best.estimate.capacity_gb)}; predicted iteration time "
            f"x{best.time:.2f}: {best.why_time})")
    if len(found) > 1:
        text += "; next: " + ", ".join(f"{c.label()} x{c.time:.2f}" for c in found[1:3])
    if rejected:
        text += "; rejected: " + "; ".join(_uniq(rejected)[:3])
    return best, text


def _uniq(items: list) -> list:
    seen, out = set(), []
    for i in items:
        key = i.split(": ", 1)[-1]
        if key not in seen:
            seen.add(key)
            out.append(i)
    return out


@computed("add_pp")
def add_pp(cfg, ctx, base):
    """A larger PP that divides the layers, the batch and the world and fits; with optimizer
    offload on, at the current fraction or a higher one; the cheapest by predicted time."""
    world = _world(ctx)
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
    world = _world(ctx)
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


def _companions(cfg: RunConfig, key: str, value: int) -> list:
    """The settings a parallel size drags along: PP=1 has no virtual pipeline (and a VPP that no
    longer divides the layers goes), TP=1 has no sequence parallelism (MCore raises
    "Cannot use sequence parallelism without tensor parallelism")."""
    if key == "model.pipeline_model_parallel_size":
        return _pp_changes(cfg, value)
    out = [(key, value)]
    if key == "model.tensor_model_parallel_size" and value == 1 and cfg.get("model.sequence_parallel") is True:
        out.append(("model.sequence_parallel", False))
    return out


def _try_parallel(cfg, ctx, base, key: str, cands: list[int], cur: int, what: str):
    world = _world(ctx)
    why = []
    for c in _nearest(cands, cur):
        ch = base + _companions(cfg, key, c)
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
    raise NoFix(f"no {what} divides the layout and fits" + (f" ({'; '.join(_uniq(why)[:3])})" if why else ""))


def _layout_candidates(cfg, world: int, what: str, check) -> tuple[list, list]:
    """The divisors of the world size that pass the layout arithmetic, and why the others do not."""
    ok, why = [], []
    for c in _divisors(world):
        bad = check(c)
        if bad:
            why.append(f"{what}{c}: {bad}")
        else:
            ok.append(c)
    return ok, why


def _divisor_fix(cfg, ctx, base, key: str, what: str, cur: int, check):
    world = _world(ctx)
    cands, why = _layout_candidates(cfg, world, what, check)
    cands = [c for c in cands if c != cur]
    if not cands:
        raise NoFix(f"no {what} divides the layout of {world} GPUs: " + "; ".join(_uniq(why)[:4]))
    return _try_parallel(cfg, ctx, base, key, cands, cur, what)


@computed("divisor_pp")
def divisor_pp(cfg, ctx, base):
    world = _world(ctx)
    lay = layout(cfg, world)
    return _divisor_fix(cfg, ctx, base, "model.pipeline_model_parallel_size", "PP", lay["pp"],
                        lambda pp: valid_layout(cfg, world, lay["tp"], pp))


@computed("divisor_tp")
def divisor_tp(cfg, ctx, base):
    world = _world(ctx)
    lay = layout(cfg, world)
    return _divisor_fix(cfg, ctx, base, "model.tensor_model_parallel_size", "TP", lay["tp"],
                        lambda tp: valid_layout(cfg, world, tp, lay["pp"]))


@computed("divisor_ep")
def divisor_ep(cfg, ctx, base):
    world = _world(ctx)
    lay = layout(cfg, world)
    return _divisor_fix(cfg, ctx, base, "model.expert_model_parallel_size", "EP", lay["ep"],
                        lambda ep: valid_layout(cfg, world, lay["tp"], lay["pp"], ep=ep))


# --- planning ----------------------------------------------------------------------------------
def _static(cfg: RunConfig, edits: tuple[Edit, ...]) -> list:
    out = []
    for e in edits:
        cur = cfg.get(e.key)
        if e.op in ("scale", "add") and (not isinstance(cur, (int, float)) or isinstance(cur, bool)):
            raise NoFix(f"{e.key} is not in the config, so '{e.op} {e.value}' cannot be computed")
        _changed, new = apply_edit(cur, e)
        out.append((e.key, DELETE if e.op == "delete" else new))
    return out


def _planned(cfg: RunConfig, changes: list) -> list[PlannedEdit]:
    out, seen = [], {}
    for key, value in changes:
        seen[key] = value  # a later value for the same key wins, kept at its first position
    done = set()
    for key, _ in changes:
        if key in done:
            continue
        done.add(key)
        out.append(PlannedEdit(key, cfg.get(key, MISSING), seen[key]))
    return out


def _effect(cfg: RunConfig, changes: list, ctx: Context, text: str | None) -> Effect:
    eff = Effect(text=text)
    after_cfg = with_changes(cfg, changes)
    if after_cfg.get("optimizer.optimizer_cpu_offload") is True:
        eff.slowdown = slowdown(float(_get(after_cfg, "optimizer.optimizer_offload_fraction", 0.0)),
                                bool(after_cfg.get("optimizer.overlap_cpu_optimizer_d2h_h2d")))
    if ctx.world_size:
        t, why = predicted_time(cfg, after_cfg, int(ctx.world_size))
        if why != "same schedule":
            eff.time = (t, why)
    try:
        eff.before = _est(cfg, ctx)
        eff.after = _est(after_cfg, ctx)
    except NoFix as exc:
        eff.before = eff.after = None
        eff.notes.append(f"memory not estimated: {exc}")
    return eff


def _same_in(failed: RunConfig | None, changes: list) -> bool:
    """True when the failed run already had every value of ``changes`` (the fix was there)."""
    if failed is None:
        return False
    for key, value in changes:
        cur = failed.get(key, MISSING)
        if value is DELETE:
            if cur is not MISSING and cur is not None:
                return False
        elif cur is MISSING or cur != value:
            return False
    return True


def plan(causes: list[Signature], cfg: RunConfig | None, ctx: Context | None = None,
         allow_unsafe: bool = False) -> Plan:
    """Plan fixes for ``causes`` (root cause first) against ``cfg``."""
    ctx = ctx or Context()
    cfg = cfg if cfg is not None else RunConfig()
    out = Plan(causes=list(causes))
    bad = unplannable(cfg)
    if bad:  # the run's printed config can hold what no user file passes (--fix checks those)
        out.no_fix.extend((sig, f"no plan on this config: {bad}") for sig in causes)
        return out
    work = cfg.copy()  # each cause is planned on top of the previous causes' edits
    for sig in causes:
        roots = dict(work.data)
        roots.setdefault("captures", ctx.captures)
        chosen = refused = None
        reasons = []
        for fix in sig.fixes:
            if fix.when and P.evaluate(fix.when, roots) is False:
                continue
            if fix.safety == Safety.DISPLAY_ONLY or (not fix.edits and not fix.compute):
                out.advice.append((sig, fix.text))
                continue
            try:
                changes = _static(work, fix.edits)
                reason = ""
                if fix.compute:
                    fn = COMPUTED.get(fix.compute)
                    if fn is None:
                        raise NoFix(f"no fix known: the computed fix {fix.compute!r} is not implemented "
                                    "by this version of diagnose")
                    changes, reason = fn(work, ctx, changes)
            except NoFix as exc:
                reasons.append(f"{fix.text.split('.')[0]}: {exc}")
                continue
            bad = prove(work, with_changes(work, changes), ctx, ctx.world_size) if changes else None
            if bad:  # every fix is proved before it is shown: refused with the reason
                reasons.append(f"{fix.text.split('.')[0]}: {bad}")
                continue
            edits = _planned(work, changes)
            if not any(e.changes for e in edits) and _same_in(ctx.failed_cfg, changes):
                # the run that failed already had this fix: it did not help; try the next one
                reasons.append(f"{fix.text.split('.')[0]}: the failed run already had it")
                continue
            if fix.safety == Safety.UNSAFE and not allow_unsafe:
                if refused is None:
                    refused = Refusal(sig, fix, edits, reason, _effect(work, changes, ctx, fix.effect))
                continue
            chosen = PlannedFix(sig, fix, edits, reason, already_applied=not any(e.changes for e in edits))
            chosen.effect = _effect(work, changes, ctx, fix.effect)
            work = with_changes(work, changes)
            break
        if chosen is not None:
            out.fixes.append(chosen)
        elif refused is not None:
            out.refused.append(refused)
        else:
            out.no_fix.append((sig, "; ".join(reasons) if reasons else "no fix known for this root cause"))
    if out.edits:
        out.effect = effect_of(cfg, out.edits, ctx)
    return out


def unplannable(cfg: RunConfig) -> str | None:
    """Why no plan can be made on ``cfg`` (a NaN, a size 0, a date or text where a count
    belongs: config/schema.py's checks of types and values), or None. Keys this version does
    not know are the job's business, not a reason."""
    from ..config.schema import impossible_values, validate

    bad = [p for p in validate(cfg.data) if not p.endswith("unknown key") and "unknown section" not in p]
    bad = bad or impossible_values(cfg.data)
    if not bad:
        return None
    return bad[0] + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")


def rebase(p: Plan, target: RunConfig | None) -> Plan:
    """The plan's edits against ``target`` (the file that will be written), where it was planned on
    another config (the one the failed run printed): a value the file already has is no change,
    so running --fix again with the same log changes nothing."""
    if target is None:
        return p
    for pf in p.fixes:
        for e in pf.edits:
            e.old = target.get(e.key, MISSING)
        pf.already_applied = not any(e.changes for e in pf.edits)
    for r in p.refused:
        for e in r.edits:
            e.old = target.get(e.key, MISSING)
    return p


def effect_of(cfg: RunConfig, edits: list, ctx: Context) -> Effect:
    """The predicted effect of ``edits`` (PlannedEdit) applied together to ``cfg``."""
    return _effect(cfg, [(e.key, e.new) for e in edits], ctx, None)


# --- rendering ---------------------------------------------------------------------------------
def describe(p: Plan) -> str:
    lines = []
    for pf in p.fixes:
        s = pf.signature
        lines.append(f"fix for {s.id} {s.slug} [{pf.safety}]: {pf.fix.text}")
        if pf.reason:
            lines.append(f"  computed: {pf.reason}")
        if pf.already_applied:
            lines.append("  already applied: the config has these values; nothing to change")
        for e in pf.edits:
            if e.changes:
                lines.append(f"  {e.describe()}")
        lines.append(f"  predicted: {pf.effect.describe()}")
        for n in pf.effect.notes:
            lines.append(f"  note: {n}")
    for r in p.refused:
        lines.append(f"refused for {r.signature.id} {r.signature.slug} [unsafe: changes the parallel layout or "
                     f"batch semantics; rerun with --unsafe-fixes]: {r.fix.text}")
        if r.reason:
            lines.append(f"  computed: {r.reason}")
        for e in r.edits:
            if e.changes:
                lines.append(f"  {e.describe()}")
        lines.append(f"  predicted: {r.effect.describe()}")
    for sig, why in p.no_fix:
        lines.append(f"no fix known for {sig.id} {sig.slug}: {why}")
    for sig, text in p.advice:
        if not any(pf.signature is sig for pf in p.fixes):
            lines.append(f"advice for {sig.id} (not applied automatically): {text}")
    for n in p.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def to_json(p: Plan) -> dict:
    def est(e):
        return None if e is None else {"per_gpu_gb": round(e.per_gpu_gb, 2), "peak_gb": round(e.peak_gb, 2),
                                       "capacity_gb": round(e.capacity_gb, 2), "fits": e.fits,
                                       "fits_with_margin": e.fits_with_margin, "calibrated": e.calibrated}
    return {
        "status": p.status,
        "causes": [s.id for s in p.causes],
        "fixes": [{"signature": pf.signature.id, "safety": pf.safety, "text": pf.fix.text, "reason": pf.reason,
                   "already_applied": pf.already_applied,
                   "edits": [{"key": e.key, "old": None if e.old is MISSING else e.old,
                              "new": None if e.new is DELETE else e.new, "delete": e.new is DELETE}
                             for e in pf.edits if e.changes],
                   "predicted": {"before": est(pf.effect.before), "after": est(pf.effect.after),
                                 "slowdown": pf.effect.slowdown,
                                 "iteration_time": pf.effect.time[0] if pf.effect.time else None,
                                 "text": pf.effect.describe()}}
                  for pf in p.fixes],
        "refused": [{"signature": r.signature.id, "safety": r.fix.safety, "text": r.fix.text, "reason": r.reason,
                     "edits": [{"key": e.key, "new": None if e.new is DELETE else e.new} for e in r.edits if e.changes],
                     "predicted": {"before": est(r.effect.before), "after": est(r.effect.after),
                                   "slowdown": r.effect.slowdown,
                                 "iteration_time": r.effect.time[0] if r.effect.time else None,
                                 "text": r.effect.describe()}}
                    for r in p.refused],
        "no_fix": [{"signature": s.id, "reason": why} for s, why in p.no_fix],
        "overrides": p.overrides,
    }
