"""``--format gitlab``: GitLab Code Quality report (``artifacts:reports:codequality``).

A JSON array with one issue per finding: ``description``, ``check_name`` (the signature id),
``fingerprint`` (stable across reruns, unique per finding: GitLab shows only the first issue of a
fingerprint), ``severity`` (info | minor | major | critical | blocker), ``location.path`` and
``location.lines.begin``, plus the Code Climate fields GitLab tolerates (type, categories, content,
engine_name).
"""
from __future__ import annotations

import json

from ..fingerprint import unique_fingerprints
from ..model import Report, Role, Severity
from . import ci
from .base import Formatter

SEVERITY = {"error": "critical", "warning": "major", "info": "info"}


def severity(f, root: bool) -> str:
    if f.signature.role == Role.ADVICE:
        return "info" if f.signature.severity == Severity.INFO else "minor"
    if root and f.signature.severity == Severity.ERROR:
        return "blocker"
    return SEVERITY.get(f.signature.severity, "info")


class GitlabFormatter(Formatter):
    name = "gitlab"

    def render(self, report: Report) -> str:
        findings = ci.ordered(report)
        fps = unique_fingerprints(findings)
        issues = []
        for f, fp in zip(findings, fps):
            s = f.signature
            root = ci.is_root(report, f)
            issues.append({
                "type": "issue",
                "engine_name": "diagnose",
                "check_name": s.id,
                "description": (("Root cause: " if root else "") + f"{s.id} {ci.summary_line(f)}: "
                                + " ".join(f.first.text.split())[:300]),
                "content": {"body": ci.message(f, report)},
                "categories": ["Bug Risk"] if s.role != Role.ADVICE else ["Style"],
                "severity": severity(f, root),
                "fingerprint": fp,
                "location": {"path": f.first.file, "lines": {"begin": max(1, int(f.first.line or 1))}},
            })
        return json.dumps(issues, indent=2) + "\n"
