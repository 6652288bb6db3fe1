"""Stable fingerprints for findings: the same failure gets the same fingerprint on every rerun.

A fingerprint is a hash of three things, each normalised so that what changes between two runs of
the same job does not change it:

* the signature id;
* the evidence line (the finding's first hit) with launcher prefixes, ANSI codes, timestamps,
  hex addresses, pids, hostnames' numbers, ranks and every other number masked (``Tried to
  allocate 2.00 GiB`` on rank 3 at 10:01 and ``Tried to allocate 2.50 GiB`` on rank 5 at 11:40 are
  the same failure);
* the log's basename with its digits masked (``slurm-1234.out`` and ``slurm-1240.out`` are the
  same job's log; the folder is ignored, so a CI workspace path does not matter).

Unrelated changes to the log (lines added before or after, a different line number, other
findings) do not change a finding's fingerprint. Used by the SARIF ``partialFingerprints``, the
GitLab Code Quality ``fingerprint`` and the baseline file (diagnose/baseline.py).
"""
from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable

from .logs.lines import split_prefix, strip_ansi
from .model import Finding

#: bump when the normalisation changes (baselines written by another version then stop matching)
FINGERPRINT_VERSION = 1
SARIF_KEY = f"diagnoseFingerprint/v{FINGERPRINT_VERSION}"

_MASKS = [
    # ISO / syslog / glog timestamps, with optional fractions and zones
    (re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"), "<time>"),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?"), "<time>"),
    (re.compile(r"\b[EWIF]\d{4} "), "<glog> "),
    # hex addresses, CUDA pointers, hashes
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b[0-9a-f]{12,}\b"), "<hex>"),
    # pids, ranks, devices, tids (named before the generic number mask so the word stays)
    (re.compile(r"\b(pid|tid|rank|local_rank|node|device|gpu|GPU|Rank|PG ID|pg_id)([ =:#]+)\d+", re.I), r"\1\2<n>"),
    # numbers: integers, decimals, exponents, with units glued on or not
    (re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?"), "<n>"),
]
_SPACE = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """The evidence line with everything that differs between reruns masked."""
    text = strip_ansi(text or "")
    lines = []
    for ln in text.splitlines() or [""]:
        _, msg = split_prefix(ln)
        lines.append(msg)
    s = " ".join(lines)
    for rx, repl in _MASKS:
        s = rx.sub(repl, s)
    return _SPACE.sub(" ", s).strip()[:500]


def normalize_file(path: str) -> str:
    """The log's basename with digits masked (job ids, dates, attempt numbers)."""
    base = os.path.basename((path or "").replace("\\", "/")) or path or ""
    return re.sub(r"\d+", "<n>", base)


def fingerprint_of(sig_id: str, text: str, file: str) -> str:
    h = hashlib.sha256()
    h.update(f"v{FINGERPRINT_VERSION}\0{sig_id}\0{normalize_text(text)}\0{normalize_file(file)}".encode())
    return h.hexdigest()[:32]


def fingerprint(f: Finding) -> str:
    """A finding's stable fingerprint (its signature and its first evidence line)."""
    return fingerprint_of(f.signature.id, f.first.text, f.first.file)


def unique_fingerprints(findings: Iterable[Finding]) -> list[str]:
    """One fingerprint per finding, made unique where two findings would collide (GitLab shows only
    the first issue of a fingerprint). A collision suffix is derived from the evidence line number,
    then a counter, so it stays the same while the log does."""
    out: list[str] = []
    seen: set[str] = set()
    for f in findings:
        fp = fingerprint(f)
        if fp in seen:
            fp = hashlib.sha256(f"{fp}\0{f.first.file}\0{f.first.line}".encode()).hexdigest()[:32]
            n = 1
            base = fp
            while fp in seen:
                n += 1
                fp = hashlib.sha256(f"{base}\0{n}".encode()).hexdigest()[:32]
        seen.add(fp)
        out.append(fp)
    return out
