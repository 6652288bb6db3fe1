"""Baselines of accepted findings, and the CI gate that uses them.

``diagnose LOG --write-baseline FILE`` records the current findings' fingerprints
(diagnose/fingerprint.py); ``diagnose LOG --baseline FILE`` then fails only on findings whose
fingerprint is not in FILE, so a nightly job goes red on new failures, not on known ones.

The file is JSON, sorted and stable (it is meant to be committed and reviewed)::

    {"diagnose_baseline": 1, "fingerprint_version": 1,
     "findings": [{"fingerprint": "...", "signature": "MB-OOM-001", "title": "...",
                   "severity": "error", "file": "slurm-<n>.out", "evidence": "<normalised line>"}]}

Which findings fail the gate is decided here, in one place: a finding fails when its severity is at
or above ``--fail-on``, its role is not ``advice``, and it is not in the baseline.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from . import atomic
from .errors import DiagnoseError
from .fingerprint import FINGERPRINT_VERSION, fingerprint, normalize_file, normalize_text
from .model import Finding, fails_gate

BASELINE_VERSION = 1
MAX_BASELINE_BYTES = 16 << 20


class BaselineError(DiagnoseError):
    """The baseline file cannot be read or is not a diagnose baseline (one line)."""


@dataclass
class Baseline:
    fingerprints: set = field(default_factory=set)
    entries: list = field(default_factory=list)
    source: str = ""

    def __contains__(self, f: Finding) -> bool:
        return fingerprint(f) in self.fingerprints


def entry(f: Finding) -> dict:
    s = f.signature
    return {"fingerprint": fingerprint(f), "signature": s.id, "title": s.title, "severity": s.severity,
            "file": normalize_file(f.first.file), "evidence": normalize_text(f.first.text)}


def dumps(findings: Iterable[Finding]) -> str:
    entries = sorted({e["fingerprint"]: e for e in map(entry, findings)}.values(),
                     key=lambda e: (e["signature"], e["fingerprint"]))
    doc = {"diagnose_baseline": BASELINE_VERSION, "fingerprint_version": FINGERPRINT_VERSION, "findings": entries}
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def write(path: str, findings: Iterable[Finding]) -> int:
    """Write the baseline atomically; returns how many findings it holds."""
    text = dumps(findings)
    try:
        atomic.replace(Path(os.path.abspath(path)), text)
    except OSError as exc:
        raise BaselineError(f"{path}: cannot write ({exc.strerror or exc})") from None
    return len(json.loads(text)["findings"])


def load(path: str) -> Baseline:
    try:
        if os.path.getsize(path) > MAX_BASELINE_BYTES:
            raise BaselineError(f"{path}: larger than {MAX_BASELINE_BYTES >> 20} MiB, not a diagnose baseline")
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise BaselineError(f"{path}: no such baseline file (write one with --write-baseline)") from None
    except IsADirectoryError:
        raise BaselineError(f"{path}: is a directory, expected a baseline file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BaselineError(f"{path}: not a diagnose baseline (invalid JSON: {exc})") from None
    except RecursionError:
        raise BaselineError(f"{path}: not a diagnose baseline (JSON nested too deep)") from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise BaselineError(f"{path}: not a diagnose baseline ({exc})") from None
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not isinstance(doc, dict) or "diagnose_baseline" not in doc or not isinstance(doc.get("findings"), list):
        raise BaselineError(f"{path}: not a diagnose baseline (no 'diagnose_baseline' / 'findings')")
    if doc["diagnose_baseline"] != BASELINE_VERSION:
        raise BaselineError(f"{path}: baseline version {doc['diagnose_baseline']!r} is not supported "
                            f"(this diagnose reads version {BASELINE_VERSION})")
    if doc.get("fingerprint_version", FINGERPRINT_VERSION) != FINGERPRINT_VERSION:
        raise BaselineError(f"{path}: written with fingerprint version {doc.get('fingerprint_version')!r}, "
                            f"this diagnose computes version {FINGERPRINT_VERSION}: write it again")
    fps = set()
    for i, e in enumerate(doc["findings"]):
        if not isinstance(e, dict) or not isinstance(e.get("fingerprint"), str):
            raise BaselineError(f"{path}: findings[{i}] has no 'fingerprint'")
        fps.add(e["fingerprint"])
    return Baseline(fps, list(doc["findings"]), path)


# --------------------------------------------------------------------------- the gate

def at_or_above(f: Finding, fail_on: str) -> bool:
    """Severity at or above ``fail_on``; advice lines never fail a gate."""
    return fails_gate(f.signature.severity, f.signature.role, fail_on)


@dataclass
class Gate:
    failing: list  # findings that fail the gate (new, at or above --fail-on)
    known: list  # at or above --fail-on, but accepted by the baseline
    below: list  # under the threshold (or advice)

    @property
    def ok(self) -> bool:
        return not self.failing


def gate(findings: Iterable[Finding], fail_on: str = "error", baseline: Baseline | None = None) -> Gate:
    g = Gate([], [], [])
    for f in findings:
        if not at_or_above(f, fail_on):
            g.below.append(f)
        elif baseline is not None and f in baseline:
            g.known.append(f)
        else:
            g.failing.append(f)
    return g
