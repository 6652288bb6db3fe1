#!/usr/bin/env python3
"""Top-1 root-cause accuracy on labelled real failure logs.

    python bench/eval_real_logs.py ../shared/real-logs-dev          # one folder with labels.json
    python bench/eval_real_logs.py fixtures/corpus --part test      # the corpus: dev | test | all
    python bench/eval_real_logs.py fixtures/corpus --table          # per-category and per-slice tables

A folder holds *.log files and labels.json ([{file, source, root_cause, root_cause_evidence or root_cause_line, ...}],
``root_cause`` from product.md's category vocabulary or ``healthy``); a corpus root holds such
folders (one per slice of the ecosystem). A log counts as correct when diagnose's root-cause
category equals the label (``healthy`` = no root cause).

The corpus is split by source repository (``part_of``): a repository's logs are all in the dev
part (rules may be written from them) or all in the test part (only scored). The rule is a hash
of the repository's name, fixed before any rule was written from the corpus.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path


def part_of(repo: str) -> str:
    """"dev" or "test" for a source repository ("owner/name", any case)."""
    return "test" if int(hashlib.sha1(repo.strip().lower().encode()).hexdigest(), 16) % 2 else "dev"


def repo_of(label: dict) -> str:
    if label.get("repo"):
        return label["repo"]
    src = label.get("source", "")
    parts = src.split("github.com/", 1)[-1].split("/")
    return "/".join(parts[:2]) if len(parts) >= 2 else src


def labelled_folders(root: Path) -> list[Path]:
    if (root / "labels.json").is_file():
        return [root]
    return sorted(p.parent for p in root.glob("*/labels.json"))


def evidence_of(folder: Path, lab: dict) -> str:
    """The line a good tool points to: ``root_cause_evidence`` (its text), or ``root_cause_line``
    (its 1-based number in the log: the corpus keeps the text in the log only)."""
    if lab.get("root_cause_evidence"):
        return lab["root_cause_evidence"].strip()
    n = lab.get("root_cause_line")
    if not n:
        return ""
    lines = (folder / lab["file"]).read_text(encoding="utf-8", errors="replace").splitlines()
    return lines[n - 1].strip() if 0 < n <= len(lines) else ""


def _row(folder: Path, lab: dict) -> dict:
    from diagnose.diagnosis import diagnose_paths

    rep = diagnose_paths([str(folder / lab["file"])], jobs=1)
    rc = rep.root_cause
    got = rc.finding.signature.category if rc else "healthy"
    evidence = rc.hit.text if rc else ""
    want_ev = evidence_of(folder, lab)
    ev_ok = bool(want_ev) and bool(evidence) and (want_ev[:60] in evidence or evidence[:60] in want_ev
                                                  or want_ev.split(":")[-1].strip()[:50] in evidence)
    return {
        "file": lab["file"], "slice": folder.name, "repo": repo_of(lab), "part": part_of(repo_of(lab)),
        "expected": lab["root_cause"], "got": got,
        "signature": rc.finding.signature.id if rc else None, "basis": rc.basis if rc else None,
        "line": rc.hit.line if rc else None, "rank": rc.hit.rank if rc else None,
        "correct": got == lab["root_cause"],
        "evidence_match": ev_ok if lab["root_cause"] != "healthy" else (rc is None),
        "evidence": evidence[:160],
    }


SEEN = "test-seen.txt"  # test-part logs someone here read while writing rules (corpus root)


def seen_test_logs(root: Path) -> set:
    """``slice/file`` of the test-part logs listed in <root>/test-seen.txt (# comments)."""
    p = root / SEEN
    if not p.is_file():
        return set()
    return {ln.split("#", 1)[0].strip() for ln in p.read_text(encoding="utf-8").splitlines()} - {""}


def evaluate(root: Path, part: str = "all") -> dict:
    rows = []
    seen = seen_test_logs(root)
    for folder in labelled_folders(root):
        for lab in json.loads((folder / "labels.json").read_text(encoding="utf-8")):
            if part != "all" and part_of(repo_of(lab)) != part:
                continue
            rows.append(_row(folder, lab))
            rows[-1]["seen"] = f"{folder.name}/{lab['file']}" in seen
    healthy = [r for r in rows if r["expected"] == "healthy"]
    failed = [r for r in rows if r["expected"] != "healthy"]
    return {
        "part": part, "total": len(rows), "correct": sum(r["correct"] for r in rows),
        "evidence_matches": sum(r["evidence_match"] for r in rows),
        "healthy_flagged": sum(1 for r in healthy if r["got"] != "healthy"),
        "failed_called_healthy": sum(1 for r in failed if r["got"] == "healthy"),
        "unseen_total": sum(1 for r in rows if not r["seen"]),
        "unseen_correct": sum(r["correct"] for r in rows if not r["seen"]),
        "rows": rows,
    }


def table(rows: list, key: str) -> list[tuple]:
    """(value, logs, correct) per value of ``key``, most logs first."""
    n, ok = defaultdict(int), defaultdict(int)
    for r in rows:
        n[r[key]] += 1
        ok[r[key]] += r["correct"]
    return sorted(((k, n[k], ok[k]) for k in n), key=lambda t: (-t[1], t[0]))


def _print_table(title: str, rows: list, key: str):
    print(f"\n{title:<26} {'logs':>5} {'right':>6} {'top-1':>7}")
    for k, n, ok in table(rows, key):
        print(f"{k:<26} {n:>5} {ok:>6} {ok / n:>7.0%}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--part", choices=("dev", "test", "all"), default="all",
                    help="the corpus part to score (split by source repository)")
    ap.add_argument("--table", action="store_true", help="per-category and per-slice tables")
    ap.add_argument("--quiet", action="store_true", help="no per-log lines")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if not labelled_folders(a.folder):
        print(f"{a.folder}: no labels.json (nor */labels.json)", file=sys.stderr)
        return 2
    res = evaluate(a.folder, a.part)
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    if not a.quiet:
        for r in res["rows"]:
            mark = "ok  " if r["correct"] else "MISS"
            print(f"{mark} {r['slice'] + '/' + r['file']:<62} expected {r['expected']:<20} got {r['got']:<20} "
                  f"{r['signature'] or '-':<11} {r['basis'] or '-':<10} line {r['line'] if r['line'] is not None else '-'}")
    if a.table:
        _print_table("category (expected)", res["rows"], "expected")
        _print_table("slice", res["rows"], "slice")
    print(f"\n{a.folder} part {res['part']}: top-1 root-cause accuracy {res['correct']}/{res['total']}"
          f" = {res['correct'] / max(res['total'], 1):.1%}; evidence line matches {res['evidence_matches']}/{res['total']};"
          f" healthy logs flagged {res['healthy_flagged']}; failed logs called healthy {res['failed_called_healthy']}")
    if res["unseen_total"] < res["total"]:
        print(f"  without the {res['total'] - res['unseen_total']} test logs read while writing rules ({SEEN}): "
              f"{res['unseen_correct']}/{res['unseen_total']} = {res['unseen_correct'] / max(res['unseen_total'], 1):.1%}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
