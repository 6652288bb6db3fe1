"""From findings, structure and config to ONE root cause (or a healthy verdict).

Order of reasoning:
1. symptom (metric) and config-trap signatures are evaluated and join the line findings;
2. exceptions no signature recognised become the generic "uncaught exception" finding;
3. root candidates: role ``root`` findings, most severe first, then the earliest (timestamps
   across ranks where every candidate has one, else line order); a candidate that another
   ``supersedes`` gives way to it;
4. with no root, the highest-priority ``cascade`` (then the earliest) is promoted;
5. a ``refine`` signature that holds for the chosen hit (config predicate and/or captures)
   sharpens it (e.g. CUDA OOM + activation offload at PP=1 -> the seed's "model too large");
6. the rank: torchrun's "Root Cause (first observed failure)" names it where it is ambiguous;
7. confidence is "confirmed" when the config (``--config`` or recovered from the log) satisfies
   the signature's ``confirm.when`` predicate, else "suspected".
"""
from __future__ import annotations

from .. import predicate as P
from ..db import Database
from ..edits import fix_overrides
from ..model import SEVERITY_RANK, Finding, Hit, Role, RootCause, Scope, Severity, Signature
from . import layers, symptoms
from .findings import Findings, first_hit

GENERIC_EXCEPTION_ID = "MB-GEN-001"


def _roots(cfg, metrics: dict, captures: dict | None = None) -> dict:
    roots = dict(cfg.data) if cfg is not None else {}
    # metrics the caller computed win over any the config carries (preflight puts host_gb there)
    roots["metrics"] = {**(roots.get("metrics") or {}), **metrics}
    if captures is not None:
        roots["captures"] = captures
    return roots


def add_symptoms(db: Database, findings: Findings, structure, cfg, metrics: dict, config_where: tuple):
    """Evaluate metric- and config-scope signatures; add what holds as findings."""
    roots = _roots(cfg, metrics)
    for sig in db.of_scope("metric"):
        if sig.id == GENERIC_EXCEPTION_ID:
            continue  # added by add_unexplained_exceptions, one hit per exception
        if not P.is_true(P.evaluate(sig.metric, roots)):
            continue
        if sig.confirm_when and P.evaluate(sig.confirm_when, roots) is False:
            continue  # the config contradicts it (e.g. slow, but no optimizer offload at all)
        ev = None
        for name in sorted(P.names(sig.metric)):
            keys = symptoms.EVIDENCE_FOR.get(name.split(".", 1)[-1]) or ()
            key = next((k for k in ((keys,) if isinstance(keys, str) else keys) if k in structure.evidence), None)
            if key:
                ev = structure.evidence[key]
                break
        if ev is None:
            # private entries ("_max_elapsed") are bookkeeping, not (file, line, text) evidence
            ev = next((v for k, v in structure.evidence.items() if not k.startswith("_")), ("", 0, sig.title))
        file, line, text = ev
        findings.add(sig, Hit(sig.id, file, line, text.strip(), None, None, {}, order=_order_of(file, line, findings)))
    if cfg is not None:
        for sig in db.of_scope("config"):
            if P.is_true(P.evaluate(sig.confirm_when, roots)):
                file, line = config_where
                text = "; ".join(f"{n} = {P.lookup(roots, n)!r}" for n in sorted(P.names(sig.confirm_when)))
                findings.add(sig, Hit(sig.id, file, line, text, None, None, {}, order=10**15))


def _order_of(file: str, line: int, findings: Findings) -> int:
    for f in findings.all():
        for h in f.samples:
            if h.file == file:
                return (h.order // 10**12) * 10**12 + line
    return line


def add_unexplained_exceptions(db: Database, findings: Findings, structure, covered: set) -> int:
    """Exceptions and tracebacks that no signature explains, read by the evidence layers
    (analyze/layers.py): a row of the tables that holds adds a finding of its ``scope: layer``
    signature; an exception no row knows is the generic "uncaught exception" finding; so is a
    traceback cut before its exception line. Returns how many exceptions no signature explained."""
    tables = layers.load_tables(db.root) if db.root else layers.Tables((), ())
    generic = db.get(GENERIC_EXCEPTION_ID)
    # a run stopped by hand (KeyboardInterrupt) is read for a hang only: the rows naming one
    hang_rows = {r.signature for r in tables.rows() if getattr(db.get(r.signature), "category", "") == "hang"}
    covered = set(covered)  # the signatures' lines, not the ones added here
    n = 0
    recs = [(tb.file, tb.line, tb.rank, tb.exc_type, tb.message, tb.text, tb.frames, tb.source, tb.start or tb.line)
            for tb in structure.tracebacks]
    recs += [(*e, [], [], e[1]) for e in structure.exceptions]
    seen = set()
    for file, line, rank, etype, message, text, frames, source, start in recs:
        if (file, line) in seen or any((file, line + d, True) in covered for d in (-2, -1, 0)) or \
                any((file, line + d, False) in covered for d in (-2, -1, 0, 1, 2)):  # findings.Findings.add
            continue
        seen.add((file, line))
        if (etype or "").endswith("Warning") or etype == "SystemExit":
            continue
        if etype == "KeyboardInterrupt":  # stopped by hand: a hang where it waited, else nothing
            row = layers.classify(tables, None, "", frames, source, only=hang_rows)
            if row is None:
                continue
        else:
            row = layers.classify(tables, etype, message, frames, source) or \
                layers.classify_context(tables, file, start, structure.activity)
        n += 1
        sig = db.get(row.signature) if row is not None else generic
        if sig is None:
            continue
        caps = {"exc_type": etype, "message": message}
        if row is not None:
            caps.update(layer=row.basis, layer_row=row.id)
        findings.add(sig, Hit(sig.id, file, line, text.strip(), rank, None, caps,
                              order=_order_of(file, line, findings)))
    return n


def basis_of(f: Finding, hit: Hit) -> str:
    """Which evidence layer (layers.BASES) a finding's hit comes from."""
    sig = f.signature
    if hit.captures.get("layer"):
        return hit.captures["layer"]
    if sig.id == GENERIC_EXCEPTION_ID:
        return "exception"
    if sig.scope == Scope.METRIC:
        return "symptom"
    if "wrapper" in sig.tags:
        return "wrapper"
    return "signature"


def choose(db: Database, findings: Findings, cfg, metrics: dict, torchrun: list) -> RootCause | None:
    """The one root cause, by tiers of evidence (analyze/layers.py): exact root signatures;
    then what the layers read from unknown exceptions and tracebacks (earliest first); then the
    consequences (cascades) and the generic uncaught exception (priority, then earliest); then
    the plain fact that the job failed (torchrun / srun / Ray report a failed worker)."""
    allf = findings.all()
    present = {f.signature.id for f in allf}
    # a root whose evidence another finding explains (torchrun's own SIGKILL of a stuck worker
    # explains an "exitcode -9") counts as a cascade
    demoted = {f.signature.id for f in allf if set(f.signature.demoted_by) & present}
    roots = [f for f in allf if f.signature.role == Role.ROOT and f.signature.id != GENERIC_EXCEPTION_ID
             and f.signature.scope != Scope.LAYER and f.signature.id not in demoted]
    # what the layers read from exceptions and tracebacks; "failure" rows (a failed subprocess
    # or worker) only say that the job failed and wait for the last tier
    layered = [f for f in allf if f.signature.scope == Scope.LAYER and f.signature.role == Role.ROOT
               and "failure" not in f.signature.tags]
    chosen: Finding | None = None
    tier = ""
    if roots:
        top = max(SEVERITY_RANK[f.signature.severity] for f in roots)
        roots = [f for f in roots if SEVERITY_RANK[f.signature.severity] == top]
        firsts = {id(f): f.first for f in roots}
        earliest = first_hit(list(firsts.values()))
        chosen = next(f for f in roots if f.first is earliest)
        # a more specific root present in the same run takes the place of the one it supersedes
        for f in roots:
            if chosen.signature.id in f.signature.supersedes:
                chosen = f
    elif layered:
        # a guess from where a traceback was cut ("suspicion": a step's compute is most often an
        # OOM) gives way to any other layer's reading (a fragment of the same traceback further
        # on, cut in a split across ranks; an exception another rank printed)
        layered = [f for f in layered if "suspicion" not in f.signature.tags] or layered
        earliest = first_hit([f.first for f in layered])
        chosen = next(f for f in layered if f.first is earliest)
    else:
        cands = [f for f in allf if (f.signature.role == Role.CASCADE or f.signature.id in demoted)
                 and f.signature.severity == Severity.ERROR and f.signature.scope != Scope.LAYER]
        generic = findings.get(GENERIC_EXCEPTION_ID)
        if generic and cands and first_hit([generic.first] + [f.first for f in cands]) is generic.first:
            # an exception no signature knows, raised before the first consequence (one rank's
            # error, then every other rank's collective timing out waiting for it): the cause
            chosen, tier = generic, ""
        elif generic:
            cands.append(generic)
        if cands and chosen is None:
            best = max(f.signature.priority for f in cands)
            pool = [f for f in cands if f.signature.priority == best]
            earliest = first_hit([f.first for f in pool])
            chosen = next(f for f in pool if f.first is earliest)
            tier = "" if chosen is generic else "cascade"
        else:
            failed = [f for f in allf if f.signature.severity == Severity.ERROR
                      and (f.signature.role == Role.CONFIRMATION or "failure" in f.signature.tags)]
            if failed:
                chosen = min(failed, key=lambda f: (-f.signature.priority, f.first.order))
                tier = "failure"
    if chosen is None:
        return None

    hit, rank_source = _pick_hit(chosen, torchrun)
    finding, sig = chosen, chosen.signature
    refined = _refine(db, sig, hit, cfg, metrics)
    if refined is not None:
        finding = findings.add(refined, Hit(refined.id, hit.file, hit.line, hit.text, hit.rank, hit.time,
                                            hit.captures, order=hit.order))
        sig = refined
    roots_map = _roots(cfg, metrics, hit.captures)
    confirmed = bool(sig.confirm_when) and P.is_true(P.evaluate(sig.confirm_when, roots_map))
    because = []
    if sig.confirm_when and cfg is not None:
        for n in sorted(P.names(sig.confirm_when)):
            v = P.lookup(roots_map, n)
            if v is not P.UNKNOWN:
                because.append(f"{n} = {v!r}")
    set_aside = [f for f in allf if f is not chosen and (f.signature.role in ("cascade", "confirmation")
                                                         or f.signature.id in demoted)]
    return RootCause(finding=finding, hit=hit, confidence="confirmed" if confirmed else "suspected",
                     because=because, set_aside=set_aside, overrides=static_overrides(sig, cfg, roots_map),
                     rank_source=rank_source, refines=chosen if refined is not None else None,
                     basis=basis_of(chosen, hit) if hit.captures.get("layer") else (tier or basis_of(chosen, hit)))


def _pick_hit(f: Finding, torchrun: list) -> tuple[Hit, str]:
    hit = f.first
    roots = [t for t in torchrun if t.section == "root" and t.rank is not None]
    if roots:
        want = roots[0].rank
        for h in f.samples:
            if h.rank == want:
                return h, "torchrun Root Cause block"
        if hit.rank is None and len(f.ranks) <= 1:
            hit.rank = want
            return hit, "torchrun Root Cause block"
    return hit, "log line" if hit.rank is not None else ""


def _refine(db: Database, sig: Signature, hit: Hit, cfg, metrics: dict) -> Signature | None:
    best = None
    roots = _roots(cfg, metrics, hit.captures)
    for r in db.refiners_of(sig):
        ok = True
        if r.when_captures:
            ok = P.is_true(P.evaluate(r.when_captures, roots))
        if ok and r.confirm_when:
            ok = P.is_true(P.evaluate(r.confirm_when, roots))
        if ok and not (r.when_captures or r.confirm_when):
            ok = False
        if ok and (best is None or r.priority > best.priority):
            best = r
    return best


def static_overrides(sig: Signature, cfg, roots: dict) -> list[str]:
    """``key=value`` overrides of the first applicable fix (edits.fix_overrides, in a diagnosis)."""
    return fix_overrides(sig, cfg, roots, preflight=False)


def straggler(root: RootCause, findings: Findings, seen_ranks: set, world_size: int | None) -> dict | None:
    """A collective timeout that every rank but one reports: the one that did not is the rank
    the others waited for (the straggler), not any of the ranks whose watchdog fired.

    ``seen_ranks``: every rank the log names (prefixes, files, tracebacks, torchrun);
    ``world_size``: from the config where it says so, else the highest rank seen + 1."""
    if root.finding.signature.category != "nccl_timeout":
        return None
    reporting: set[int] = set()
    for f in findings.all():
        if f.signature.category == "nccl_timeout" and f.signature.severity == Severity.ERROR:
            reporting.update(r for r in f.ranks if r is not None)
    known = {r for r in seen_ranks if r is not None} | reporting
    if not reporting or not known:
        return None
    world = world_size if isinstance(world_size, int) and world_size > max(known) else max(known) + 1
    silent = sorted(set(range(world)) - reporting)
    if len(reporting) < 2 or not silent:
        return None
    rank = silent[0] if len(silent) == 1 else None
    out = {"reporting": sorted(reporting), "not_reporting": silent, "world_size": world, "rank": rank}
    if rank is not None:
        from dataclasses import replace

        root.hit = replace(root.hit, rank=rank)
        root.rank_source = f"straggler: the only one of {world} ranks without a collective timeout"
    return out

