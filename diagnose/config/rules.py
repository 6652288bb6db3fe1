"""Static preflight rules, generated from the signature database (no rule lives in Python).

The rules are every signature with ``preflight: true`` (its ``confirm.when`` predicate is the
rule) and every ``scope: config`` signature (config traps no framework reports), restricted to
the MCore version the job runs (``db.applies_to``). A rule that holds for the config becomes a
finding with the SAME id as the runtime error it prevents, so a preflight finding and the log
scan's finding for the failed run read alike.

Predicates see the config's sections (``model.*``, ``optimizer.*`` ...) and ``metrics.*``: the
memory estimate (``peak_gb``, ``capacity_gb``, ``margin_gb``, ``per_gpu_gb``, ``host_gb``) and
``host_capacity_gb`` from ``--host-memory``. A key the config lacks is UNKNOWN and never fires a
rule (three-valued predicates, diagnose/predicate.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import predicate as P
from ..db import Database, applies_to
from ..edits import fix_overrides as edit_overrides
from ..model import SEVERITY_RANK, Scope, Signature, fails_gate
from .runconfig import RunConfig


@dataclass
class CheckFinding:
    signature: Signature | None  # None: MCore refused the config with a message no signature knows
    source: str  # "static" | "mcore"
    evidence: str  # "model.cpu_offloading = True; ..." or MCore's exception line
    overrides: list = field(default_factory=list)
    title: str = ""
    severity: str = "error"

    @property
    def id(self) -> str | None:
        return self.signature.id if self.signature else None

    @property
    def level(self) -> str:
        return self.signature.severity if self.signature else self.severity

    def fails(self, threshold: str) -> bool:
        return fails_gate(self.level, self.signature.role if self.signature is not None else None, threshold)


def rule_signatures(db: Database, versions: dict) -> list[Signature]:
    return [s for s in db.signatures
            if s.confirm_when and (s.preflight or s.scope == Scope.CONFIG) and applies_to(s, versions)]


def roots(cfg: RunConfig, metrics: dict | None = None) -> dict:
    r = dict(cfg.data)
    r["metrics"] = {**(r.get("metrics") or {}), **(metrics or {})}
    return r


def fix_overrides(sig: Signature, cfg: RunConfig, rts: dict) -> list[str]:
    """The first applicable fix's edits as ``key=value`` overrides (edits.fix_overrides, preflight)."""
    return edit_overrides(sig, cfg, rts, preflight=True)


def evaluate(cfg: RunConfig, db: Database, versions: dict, metrics: dict | None = None) -> list[CheckFinding]:
    rts = roots(cfg, metrics)
    out = []
    for sig in rule_signatures(db, versions):
        if not sig.confirm_when or not P.is_true(P.evaluate(sig.confirm_when, rts)):
            continue
        ev = "; ".join(f"{n} = {_show(P.lookup(rts, n))}" for n in sorted(P.names(sig.confirm_when)))
        out.append(CheckFinding(sig, "static", ev, fix_overrides(sig, cfg, rts), sig.title, sig.severity))
    out.sort(key=lambda f: (-SEVERITY_RANK[f.level], f.id or ""))
    return out


def _show(v) -> str:
    if v is P.UNKNOWN:
        return "(not set)"
    if isinstance(v, float):
        return f"{v:.4g}"
    return repr(v)
