"""What to fix: the root cause of a log, or the preflight of a config alone.

``from_report(report)`` gives the root cause's signature and the planning context the log
holds: the OOM line's captures (GPU capacity, what was allocated), the failed run's config (the
``Final configuration:`` YAML or the MLM arguments it printed), the ranks it shows.

``from_preflight(db, cfg)`` (``diagnose --fix cfg.yaml`` with no log) gives every preflight
rule that holds on the config (``diagnose/config/rules.py`` where present, else the database's
``preflight: true`` / ``scope: config`` predicates evaluated here) and, when the memory model
says the config does not fit the GPU, the OOM signature the config would die of (the most
specific ``refine`` of the CUDA OOM whose config predicate holds).
"""
from __future__ import annotations

import re
import shlex

from .. import predicate as P
from ..config import memory as mm
from ..config.fit import NoFix, estimate
from ..config.layout import LayoutError
from ..config.layout import of as layout_of
from ..config.runconfig import RunConfig, from_log_blocks
from ..db import Database, applies_to
from ..model import SEVERITY_RANK, Report, Role, Scope, Signature
from . import plan as PL
from .search import Context

OOM_ID = "MB-OOM-001"


def world_from_command(command: str | None) -> int | None:
    """nproc_per_node x nnodes from a torchrun / torch.distributed.run command line."""
    if not command:
        return None
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    nproc = nnodes = None
    for i, a in enumerate(argv):
        for name in ("--nproc_per_node", "--nproc-per-node", "--nnodes"):
            val = None
            if a == name and i + 1 < len(argv):
                val = argv[i + 1]
            elif a.startswith(name + "="):
                val = a.split("=", 1)[1]
            if val is None:
                continue
            m = re.fullmatch(r"(\d+)(?::(\d+))?", val)
            if not m:
                continue
            if name == "--nnodes":
                nnodes = int(m.group(2) or m.group(1))
            else:
                nproc = int(m.group(1))
    if nproc is None:
        return None
    return nproc * (nnodes or 1)


def world_from_log(report: Report) -> int | None:
    ranks: set[int] = set()
    for f in report.findings:
        ranks.update(r for r in f.ranks if isinstance(r, int))
    st = report.structure
    for t in getattr(st, "torchrun", []) or []:
        if isinstance(getattr(t, "rank", None), int):
            ranks.add(t.rank)
    for m in getattr(st, "memory", []) or []:
        if isinstance(m.get("rank"), int):
            ranks.add(m["rank"])
    return max(ranks) + 1 if ranks else None


def round_up_world(seen: int | None, cfg: RunConfig | None) -> int | None:
    """The ranks a log shows are a lower bound of the world size (only some ranks print):
    round up to the next multiple the config's layout allows (TP x PP x CP and EP x ETP x PP)."""
    if not seen:
        return None
    if cfg is None:
        return seen
    try:
        return layout_of(cfg).round_up(seen)
    except LayoutError:  # a printed config with a size that is no number: the log's count stands
        return seen


def mcore_validator(db: Database, base: RunConfig | None):
    """A Context.validator backed by megatron-core's own config checks (config/mcore.py), or None
    where megatron-core is not installed. What MCore already refuses in ``base`` (the failed
    run's config) is not held against a candidate: only what the change brings."""
    try:
        from ..config import mcore
        if mcore.version() is None:
            return None
    except ImportError:
        return None

    def refusals(cfg: RunConfig) -> list:
        try:
            return [r.line for r in mcore.validate(cfg, db) if not r.environment]
        except mcore.MCoreUnavailable:
            return []

    known = set(refusals(base)) if base is not None else set()

    def validator(cfg: RunConfig) -> str | None:
        new = [x for x in refusals(cfg) if x not in known]
        return new[0] if new else None
    return validator


def context_from_report(report: Report, world_size: int | None = None, gpu: str | None = None,
                        gpu_memory_gb: float | None = None, db: Database | None = None,
                        bridge_version: str | None = None, base_dir=None) -> Context:
    from . import resume as RS

    rc = report.root_cause
    caps = dict(rc.hit.captures) if rc else {}
    failed = from_log_blocks(report.structure.config_blocks) if report.structure else None
    ctx = Context(world_size=world_size, gpu=gpu, gpu_memory_gb=gpu_memory_gb, captures=caps, failed_cfg=failed)
    if report.config is not None:
        ctx.resume = RS.read(report.config, report.structure, bridge_version, base_dir)
    if db is not None:
        ctx.validator = mcore_validator(db, report.config)
    if ctx.world_size is None and report.config is not None:
        w = report.config.get("mlm.world_size")
        if isinstance(w, int) and w > 0:
            ctx.world_size = w
    if ctx.world_size is None:
        ctx.world_size = round_up_world(world_from_log(report), report.config)
        ctx.world_inferred = ctx.world_size is not None
    if rc is not None and rc.finding.signature.category == "cuda_oom":
        ctx.oom = True
        cap = caps.get("capacity_size_bytes")
        if cap and ctx.gpu_memory_gb is None and gpu is None:
            ctx.gpu_memory_gb = cap / 1e9
        used = caps.get("allocated_size_bytes") or caps.get("process_size_bytes")
        tried = caps.get("tried_size_bytes") or 0
        if used:
            ctx.observed_need_gb = (used + tried) / 1e9
    return ctx


def from_report(report: Report) -> list[Signature]:
    return [report.root_cause.finding.signature] if report.root_cause else []


def _rules_module():
    try:
        from ..config import rules
    except ImportError:
        return None
    return rules


MEMORY_RULE_ID = "MB-OFF-055"  # the preflight rule "the memory estimate does not fit the GPU"


def _metrics(cfg: RunConfig, ctx: Context) -> dict:
    try:
        e = mm.estimate(mm.fill_from_preset(cfg)[0], world_size=ctx.world_size, gpu=ctx.gpu,
                        gpu_memory_gb=ctx.gpu_memory_gb, gpus_per_node=ctx.gpus_per_node)
    except mm.MemoryModelError:
        return {}
    return e.metrics()


def preflight_signatures(db: Database, cfg: RunConfig, ctx: Context, versions: dict | None = None) -> list[Signature]:
    """The preflight rules (config predicates, with the memory estimate as ``metrics.*``) that
    hold on ``cfg``, most severe first: config/rules.py where present, else evaluated here."""
    rcfg = cfg.copy()
    if ctx.world_size and rcfg.get("mlm.world_size") is None:
        rcfg.set("mlm.world_size", int(ctx.world_size))
    metrics = _metrics(cfg, ctx)
    rules = _rules_module()
    if rules is not None and hasattr(rules, "evaluate"):
        found = rules.evaluate(rcfg, db, versions or {}, metrics)
        return [f.signature for f in found if f.signature is not None and f.signature.role != Role.ADVICE]
    roots = dict(rcfg.data)
    roots["metrics"] = {**(roots.get("metrics") or {}), **metrics}
    out = []
    for s in db.signatures:
        if not (s.preflight or s.scope == Scope.CONFIG) or not s.confirm_when or s.role == Role.ADVICE:
            continue
        if versions and not applies_to(s, versions):
            continue
        if P.is_true(P.evaluate(s.confirm_when, roots)):
            out.append(s)
    out.sort(key=lambda s: -SEVERITY_RANK[s.severity])  # stable: database order within a severity
    return out


def oom_signature(db: Database, cfg: RunConfig, ctx: Context) -> tuple[Signature | None, str | None]:
    """The OOM signature the config would die of when the memory model says it does not fit:
    the most specific refine of the CUDA OOM whose config predicate holds (the seed's cases),
    else the preflight memory rule, else the plain CUDA OOM."""
    try:
        e = estimate(cfg, ctx)
    except NoFix as exc:
        return None, f"memory not checked: {exc}"
    if e.fits:
        return None, (f"memory: {PL.gb(e.peak_gb)} peak per GPU of {PL.gb(e.capacity_gb)} fits "
                      f"(margin {PL.gb(e.margin_gb)})")
    base = db.get(OOM_ID)
    roots = dict(cfg.data)
    best = None
    for r in (db.refiners_of(base) if base else []):
        if (r.confirm_when and not r.when_captures and P.is_true(P.evaluate(r.confirm_when, roots))
                and (best is None or r.priority > best.priority)):
            best = r
    sig = best or db.get(MEMORY_RULE_ID) or base
    if sig is None:
        return None, "the database has no CUDA OOM signature"
    return sig, (f"memory: {PL.gb(e.peak_gb)} peak per GPU does not fit {PL.gb(e.capacity_gb)} "
                 f"(margin {PL.gb(e.margin_gb)}) -> planned as {sig.id} {sig.slug}")


def plan_preflight(db: Database, cfg: RunConfig, ctx: Context, allow_unsafe: bool = False,
                   versions: dict | None = None) -> PL.Plan:
    """The plan for a config alone: the static rules first, then the memory model on the
    config as those fixes leave it (a fix can make it fit, or stop it fitting)."""
    sigs = [s for s in preflight_signatures(db, cfg, ctx, versions) if s.id != MEMORY_RULE_ID]
    p = PL.plan(sigs, cfg, ctx, allow_unsafe)
    after = PL.with_changes(cfg, [(e.key, e.new) for e in p.edits])
    oom, note = oom_signature(db, after, ctx)
    if note:
        p.notes.append(note)
    if oom is not None:
        q = PL.plan([oom], after, ctx, allow_unsafe)
        p.causes += q.causes
        p.fixes += q.fixes
        p.refused += q.refused
        p.no_fix += q.no_fix
        p.advice += q.advice
        p.notes += q.notes
    if p.edits:
        p.effect = PL.effect_of(cfg, p.edits, ctx)
    return p


def show_computed_overrides(report) -> None:
    """Where the root cause's fix is computed (PP, offload fraction ...), show the planner's answer.

    The plan is what ``--fix`` would write (unsafe fixes included, labelled as such in the fixes
    list); the report only shows it. A planner that finds nothing leaves the static overrides.
    """
    root = report.root_cause
    if root is None or report.config is None:
        return
    sig = root.finding.signature
    if not any(fx.compute for fx in sig.fixes):
        return
    try:
        ctx = context_from_report(report)
        p = PL.plan([sig], report.config, ctx, allow_unsafe=True)
    except Exception:  # noqa: BLE001 - the report must not fail because a plan could not be made
        return
    if p.overrides:
        root.overrides = p.overrides
