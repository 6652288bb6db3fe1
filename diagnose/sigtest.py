"""Run every signature's examples (``diagnose signatures test`` and the test suite)."""
from __future__ import annotations

from dataclasses import dataclass

from .config.runconfig import RunConfig
from .db import Database
from .match.verify import line_matches
from .model import Scope, Signature


@dataclass
class CaseResult:
    sig: Signature
    expect: bool
    case: object
    ok: bool
    detail: str = ""


def run_case(db: Database, sig: Signature, case, expect: bool) -> CaseResult:
    from .diagnosis import diagnose_text

    if isinstance(case, str):
        got = line_matches(sig, case)
        if sig.scope != Scope.LINE:
            report = diagnose_text(case, db)
            got = any(f.signature.id == sig.id for f in report.findings)
        return CaseResult(
            sig, expect, case, got == expect, "" if got == expect else ("missed" if expect else "matched")
        )
    cfg = RunConfig(dict(case.get("config") or {}), "<test config>") if case.get("config") is not None else None
    text = case.get("log") or case.get("line") or ""
    report = diagnose_text(text, db, cfg, baseline_ms=case.get("baseline_ms"))
    ids = {f.signature.id for f in report.findings}
    if report.root_cause is not None:
        ids.add(report.root_cause.finding.signature.id)
    got = sig.id in ids
    detail = ""
    if got != expect:
        rc = report.root_cause.finding.signature.id if report.root_cause else None
        detail = f"{'missed' if expect else 'matched'} (findings: {sorted(ids)}, root: {rc})"
    return CaseResult(sig, expect, case, got == expect, detail)


def run_all(db: Database, only=None) -> list[CaseResult]:
    out = []
    for sig in db.signatures:
        if only and sig.id not in only and sig.slug not in only:
            continue
        for c in sig.tests_match:
            out.append(run_case(db, sig, c, True))
        for c in sig.tests_no_match:
            out.append(run_case(db, sig, c, False))
    return out
