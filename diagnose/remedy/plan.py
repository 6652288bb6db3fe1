"""From root causes and a config to a Plan: ordered config edits with safety and predicted effect.

The fixes are data (the signature's ``fixes`` in ``signatures/*.yaml``). For each cause the
planner takes the first fix that applies (its ``when`` predicate holds or is unknown), that
has edits (``display-only`` fixes are advice and are reported, never applied) and whose safety
is allowed (``unsafe`` needs ``allow_unsafe``). A fix with ``compute: NAME`` is completed by the
function registered under NAME in remedy/computed.py (``COMPUTED``); one that finds nothing
says why, and the planner moves on to the next fix; a name no function is registered under is
reported as "no fix known", never guessed. Every fix is proved (remedy/search.py ``prove``)
before it is shown.

Every planned fix carries its predicted effect: memory per GPU before and after (the memory
model, calibrated against the OOM the log shows when there is one) and the iteration time
against the failed run's (remedy/cost.py). This module also renders a plan (text and JSON).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import predicate as P
from ..config import offload_curve
from ..config.fit import Estimate, NoFix, _est, _get, gb, with_changes
from ..config.runconfig import MISSING, RunConfig
from ..edits import DELETE, apply_edit, format_value, override
from ..model import Edit, Fix, Safety, Signature
from .computed import COMPUTED
from .cost import predicted_time, slowdown
from .search import Context, prove


# --- results -----------------------------------------------------------------------------------
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
            env = _env_only_in_the_environment(changes, ctx)
            if env:  # env_vars.* is a config key from Megatron-Bridge 0.6 only: export them instead
                out.advice.append((sig, env))
                changes = [(k, v) for k, v in changes if not k.startswith("env_vars.")]
                if not changes:
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


BRIDGE_ENV_VARS = (0, 6)  # Megatron-Bridge's ConfigContainer has env_vars from 0.6.0


def _env_only_in_the_environment(changes: list, ctx: Context) -> str:
    """Advice to export the ``env_vars.*`` of ``changes`` in the job's environment, where the run's
    Megatron-Bridge is known to predate env_vars (0.6.0): its ConfigContainer has no such key
    (the override would be refused, a written key ignored). "" where it has it or may have it."""
    env = [(k[len("env_vars."):], v) for k, v in changes if k.startswith("env_vars.")]
    version = getattr(getattr(ctx, "resume", None), "bridge_version", None)
    if not env or version is None or tuple(version) >= BRIDGE_ENV_VARS:
        return ""
    shown = ".".join(str(x) for x in version)
    return ("export " + " ".join(f"{k}={v}" for k, v in env) + " in the job's environment (env_vars is a config "
            f"key from Megatron-Bridge 0.6.0; this run has {shown})")


def env_vars_caveat(overrides: list, ctx: Context) -> str:
    """What to say of ``env_vars.*`` overrides where the run's Megatron-Bridge version is unknown
    (a known older one got advice to export them instead: _env_only_in_the_environment)."""
    env = [o.lstrip("+")[len("env_vars."):] for o in overrides if o.lstrip("+").startswith("env_vars.")]
    if not env or getattr(getattr(ctx, "resume", None), "bridge_version", None) is not None:
        return ""
    shown = ".".join(str(x) for x in BRIDGE_ENV_VARS)
    return (f"env_vars.* needs Megatron-Bridge >= {shown}; on an older Bridge export " + ", ".join(env)
            + " in the job's environment instead")


def unplannable(cfg: RunConfig) -> str | None:
    """Why no plan can be made on ``cfg`` (a NaN, a size 0, a date or text where a count
    belongs: config/schema.py's checks of types and values), or None. Keys this version does
    not know are the job's business, not a reason."""
    from ..config.schema import impossible_values, validate

    bad = validate(cfg.data, unknown=False)
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

