#!/usr/bin/env python3
"""Top-1 root-cause accuracy on a labelled folder of real failure logs.

    python bench/eval_real_logs.py ../shared/real-logs-dev [--json]

The folder holds *.log files and labels.json ([{file, root_cause, root_cause_evidence, ...}],
``root_cause`` from product.md's category vocabulary or ``healthy``). A log counts as correct
when diagnose's root-cause category equals the label (``healthy`` = no root cause). The logs are
read where they are; nothing is copied.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def evaluate(folder: Path) -> dict:
    from diagnose.diagnosis import diagnose_paths

    labels = json.loads((folder / "labels.json").read_text(encoding="utf-8"))
    rows = []
    for lab in labels:
        path = folder / lab["file"]
        rep = diagnose_paths([str(path)])
        rc = rep.root_cause
        got = rc.finding.signature.category if rc else "healthy"
        evidence = rc.hit.text if rc else ""
        want_ev = (lab.get("root_cause_evidence") or "").strip()
        ev_ok = bool(want_ev) and bool(evidence) and (want_ev[:60] in evidence or evidence[:60] in want_ev
                                                      or want_ev.split(":")[-1].strip()[:50] in evidence)
        rows.append({
            "file": lab["file"], "expected": lab["root_cause"], "got": got,
            "signature": rc.finding.signature.id if rc else None, "line": rc.hit.line if rc else None,
            "rank": rc.hit.rank if rc else None, "correct": got == lab["root_cause"],
            "evidence_match": ev_ok if lab["root_cause"] != "healthy" else (rc is None),
            "evidence": evidence[:160],
        })
    healthy = [r for r in rows if r["expected"] == "healthy"]
    return {
        "total": len(rows), "correct": sum(r["correct"] for r in rows),
        "evidence_matches": sum(r["evidence_match"] for r in rows),
        "healthy_flagged": sum(1 for r in healthy if r["got"] != "healthy"),
        "rows": rows,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if not (a.folder / "labels.json").is_file():
        print(f"{a.folder}: no labels.json", file=sys.stderr)
        return 2
    res = evaluate(a.folder)
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    for r in res["rows"]:
        mark = "ok  " if r["correct"] else "MISS"
        print(f"{mark} {r['file']:<55} expected {r['expected']:<22} got {r['got']:<22} {r['signature'] or '-':<11} "
              f"line {r['line'] if r['line'] is not None else '-':<4} rank {r['rank'] if r['rank'] is not None else '-'}"
              f"  evidence {'=' if r['evidence_match'] else '~'}")
    print(f"top-1 root-cause accuracy: {res['correct']}/{res['total']}; evidence line matches: "
          f"{res['evidence_matches']}/{res['total']}; healthy logs flagged: {res['healthy_flagged']}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
