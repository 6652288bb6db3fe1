"""``--format json``: the documented, versioned JSON document (docs/json-schema.md)."""
from __future__ import annotations

import json
import math

from .. import __version__
from ..model import Finding, Hit, Report
from .base import Formatter

JSON_SCHEMA_VERSION = 1


def hit_dict(h: Hit) -> dict:
    return {"file": h.file, "line": h.line, "rank": h.rank, "text": h.text}


def fix_dict(fx) -> dict:
    return {
        "text": fx.text, "safety": fx.safety, "compute": fx.compute, "effect": fx.effect,
        "edits": [{"key": e.key, "op": e.op, "value": e.value, **({"max": e.max} if e.max is not None else {}),
                   **({"min": e.min} if e.min is not None else {})} for e in fx.edits],
    }


def finding_dict(f: Finding) -> dict:
    s = f.signature
    return {
        "signature": s.id,
        "slug": s.slug,
        "title": s.title,
        "category": s.category,
        "severity": s.severity,
        "role": s.role,
        "count": f.count,
        "ranks": {
            ("unknown" if r is None else str(r)): n
            for r, n in sorted(f.ranks.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
        },
        "first": hit_dict(f.first),
    }


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def report_dict(r: Report) -> dict:
    rc = r.root_cause
    root = None
    if rc is not None:
        s = rc.finding.signature
        root = {
            "signature": s.id, "slug": s.slug, "title": s.title, "category": s.category,
            "severity": s.severity, "confidence": rc.confidence,
            "file": rc.hit.file, "line": rc.hit.line, "rank": rc.hit.rank, "rank_source": rc.rank_source or None,
            "text": rc.hit.text, "cause": s.cause, "confirm": s.confirm_text,
            "fix": s.fixes[0].text if s.fixes else None, "overrides": rc.overrides,
            "fixes": [fix_dict(fx) for fx in s.fixes], "because": rc.because,
            "set_aside": [{"signature": f.signature.id, "title": f.signature.title, "count": f.count,
                           "ranks": len([k for k in f.ranks if k is not None])} for f in rc.set_aside],
            "references": list(s.references),
            "refines": rc.refines.signature.id if rc.refines is not None else None,
            "basis": rc.basis,
            "straggler": rc.straggler,
        }
    st = r.structure
    structure = {}
    if st is not None:
        structure = {
            "iterations": st.iteration_count(),
            "last_iteration": st.peaks.get("last_iteration"),
            "memory_reports": st.memory_count(), "timer_blocks": st.timer_blocks,
            "tracebacks": st.traceback_count,
            "torchrun": [{"section": t.section, "rank": t.rank, "local_rank": t.local_rank, "exitcode": t.exitcode,
                          "host": t.host, "time": t.time, "file": t.file, "line": t.line} for t in st.torchrun],
            "config_blocks": [{"kind": k, "file": f, "line": ln} for k, f, ln, _ in st.config_blocks],
        }
    return _clean({
        "schema_version": JSON_SCHEMA_VERSION,
        "tool": {"name": "diagnose", "version": __version__},
        "inputs": r.inputs,
        "healthy": rc is None,
        "root_cause": root,
        "findings": [finding_dict(f) for f in r.findings],
        "config": {"source": r.config_source, "recovered": r.config is not None},
        "metrics": getattr(r, "metrics", {}),
        "structure": structure,
        "notes": r.notes,
        "stats": {"bytes": r.bytes_read, "lines": r.lines_read, "seconds": round(r.seconds, 3),
                  "engine": getattr(r, "engine", "")},
    })


class JsonFormatter(Formatter):
    name = "json"

    def render(self, report: Report) -> str:
        return json.dumps(report_dict(report), indent=2, sort_keys=False, default=str) + "\n"
