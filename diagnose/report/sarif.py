"""``--format sarif``: SARIF 2.1.0 (OASIS), valid against the official JSON schema.

* ``tool.driver.rules``: every signature of the database (stable ``ruleIndex``), with the title as
  short description, the cause as full description, help text and Markdown built from cause /
  confirm / fixes, ``helpUri`` to the MCore / Bridge source file the message comes from, the
  default level, and category / role / tags as properties.
* ``results``: one per finding (all hits of one signature, so GitHub's per-run limits are never
  near), located at the first hit in the log (``artifactLocation`` + ``region.startLine`` + the
  line as snippet), further hits as ``relatedLocations``; the message carries the evidence, the
  cause and the fix as text; ``partialFingerprints`` from diagnose/fingerprint.py (logs are
  not source files, so GitHub cannot compute them itself); ``baselineState`` when ``--baseline``
  is given; the root cause is ranked first and marked in ``properties``.
* ``artifacts``: the logs read; ``invocations``: the gate outcome.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .. import __version__
from ..fingerprint import SARIF_KEY, fingerprint
from ..model import Report, Role
from . import ci
from .base import Formatter

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
INFORMATION_URI = "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/training/cpu-offloading.md"
MAX_RELATED = 100  # GitHub shows 100 of up to 1,000 locations per result


def artifact_uri(path: str) -> tuple[str, bool]:
    """(uri, relative?) for a log path: relative POSIX paths stay relative (to %SRCROOT%),
    absolute ones become file:// URIs unless they are under the working directory."""
    if path in ("-", "<stdin>", ""):
        return "stdin", True
    p = Path(path)
    if p.is_absolute():
        try:
            p = p.resolve().relative_to(Path.cwd().resolve())
        except ValueError:
            return p.resolve().as_uri(), False
    posix = p.as_posix()
    while posix.startswith("./"):
        posix = posix[2:]
    return quote(posix, safe="/-._~"), True


def _location(uri: str, relative: bool, line: int, text: str, index=None) -> dict:
    art: dict = {"uri": uri}
    if relative:
        art["uriBaseId"] = "%SRCROOT%"
    if index is not None:
        art["index"] = index
    region: dict = {"startLine": max(1, int(line or 1))}
    if text:
        region["snippet"] = {"text": text[:2000]}
    return {"physicalLocation": {"artifactLocation": art, "region": region}}


class SarifFormatter(Formatter):
    name = "sarif"

    def render(self, report: Report) -> str:
        return json.dumps(self.document(report), indent=2) + "\n"

    def document(self, report: Report) -> dict:
        db = self.options.get("db")
        if db is None:
            from ..db import load

            db = load()
        baseline = self.options.get("baseline")
        g = ci.gate_of(report, self.fail_on, baseline)
        sigs = list(db.signatures)
        known_ids = {s.id for s in sigs}
        for f in report.findings:  # a finding from another database (e.g. --signatures): still a rule
            if f.signature.id not in known_ids:
                sigs.append(f.signature)
                known_ids.add(f.signature.id)
        rule_index = {s.id: i for i, s in enumerate(sigs)}
        rules = [self._rule(s) for s in sigs]

        artifacts: list[dict] = []
        art_index: dict[str, int] = {}
        for path in report.inputs:
            uri, rel = artifact_uri(path)
            if uri in art_index:
                continue
            a: dict = {"location": {"uri": uri, **({"uriBaseId": "%SRCROOT%"} if rel else {})},
                       "roles": ["analysisTarget"], "mimeType": "text/plain"}
            try:
                if path not in ("-", "<stdin>"):
                    a["length"] = os.path.getsize(path)
            except OSError:
                pass
            art_index[uri] = len(artifacts)
            artifacts.append(a)

        results = []
        for f in ci.ordered(report):
            s = f.signature
            uri, rel = artifact_uri(f.first.file)
            if uri not in art_index:
                art_index[uri] = len(artifacts)
                artifacts.append({"location": {"uri": uri, **({"uriBaseId": "%SRCROOT%"} if rel else {})},
                                  "roles": ["analysisTarget"], "mimeType": "text/plain"})
            st = ci.status(f, g)
            res: dict = {
                "ruleId": s.id,
                "ruleIndex": rule_index[s.id],
                "level": ci.level(f),
                "kind": "fail",
                "message": {"text": ci.message(f, report)},
                "locations": [_location(uri, rel, f.first.line, f.first.text, art_index[uri])],
                "partialFingerprints": {SARIF_KEY: fingerprint(f)},
                "occurrenceCount": max(1, f.count),
                "rank": 100.0 if ci.is_root(report, f) else {"error": 70.0, "warning": 40.0}.get(s.severity, 10.0),
                "properties": {
                    "category": s.category, "severity": s.severity, "role": s.role,
                    "rootCause": ci.is_root(report, f), "gate": st,
                    "ranks": {("unknown" if r is None else str(r)): n for r, n in
                              sorted(f.ranks.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))},
                },
            }
            fx = ci.fix_text(f, report)
            if fx:
                res["properties"]["fix"] = " ".join(fx.split())
            rc = report.root_cause
            if rc is not None and ci.is_root(report, f):
                res["properties"]["confidence"] = rc.confidence
                if rc.overrides:
                    res["properties"]["overrides"] = list(rc.overrides)
                if rc.hit is not f.first:
                    uri2, rel2 = artifact_uri(rc.hit.file)
                    res["locations"] = [_location(uri2, rel2, rc.hit.line, rc.hit.text, art_index.get(uri2))]
            related = []
            for i, h in enumerate(x for x in f.samples if x is not f.first):
                if i >= MAX_RELATED:
                    break
                ru, rr = artifact_uri(h.file)
                loc = _location(ru, rr, h.line, h.text, art_index.get(ru))
                loc["id"] = i + 1
                if h.rank is not None:
                    loc["message"] = {"text": f"rank {h.rank}"}
                related.append(loc)
            if related:
                res["relatedLocations"] = related
            if baseline is not None:
                res["baselineState"] = "unchanged" if f in baseline else "new"
            results.append(res)

        run: dict[str, Any] = {
            "tool": {
                "driver": {
                    "name": "diagnose",
                    "fullName": "diagnose: Megatron-Core / Megatron-Bridge failure diagnostics",
                    "version": __version__,
                    "semanticVersion": __version__,
                    "informationUri": INFORMATION_URI,
                    "rules": rules,
                }
            },
            "automationDetails": {"id": "diagnose/training-log/"},
            "artifacts": artifacts,
            "results": results,
            "columnKind": "unicodeCodePoints",
            "invocations": [
                {
                    "executionSuccessful": True,
                    "properties": {
                        "failOn": self.fail_on,
                        "gate": "fail" if g.failing else "pass",
                        "failing": len(g.failing),
                        "baselined": len(g.known),
                        "healthy": report.root_cause is None,
                    },
                    "toolExecutionNotifications": [{"message": {"text": n}, "level": "warning"} for n in report.notes][
                        :100
                    ],
                }
            ],
        }
        if not run["invocations"][0]["toolExecutionNotifications"]:
            del run["invocations"][0]["toolExecutionNotifications"]
        return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}

    @staticmethod
    def _rule(s) -> dict:
        urls = ci.reference_urls(s)
        rule: dict = {
            "id": s.id,
            "name": "".join(w.capitalize() for w in s.slug.split("-")),
            "shortDescription": {"text": s.title},
            "fullDescription": {"text": " ".join(s.cause.split()) or s.title},
            "help": {"text": ci.help_text(s), "markdown": ci.help_markdown(s)},
            "defaultConfiguration": {"level": "note" if s.role == Role.ADVICE else
                                     {"error": "error", "warning": "warning"}.get(s.severity, "note")},
            "properties": {"tags": list(dict.fromkeys([s.category, *s.tags]))[:20], "category": s.category,
                           "role": s.role, "scope": s.scope, "slug": s.slug,
                           "precision": "high" if s.scope in ("line", "refine") else "medium"},
        }
        if urls:
            rule["helpUri"] = urls[0]
            if len(urls) > 1:
                rule["properties"]["references"] = urls
        if s.aliases:
            rule["deprecatedIds"] = list(s.aliases)
        return rule
