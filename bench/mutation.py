#!/usr/bin/env python3
"""Mutation score of the modules where a silent break costs users most (mutmut).

    pip install -e ".[test,mutation]"
    python bench/mutation.py            # runs mutmut with [tool.mutmut] of pyproject.toml, prints the table
    python bench/mutation.py --report   # the table of the last run only

Each mutant (a flipped comparison, a changed constant, a dropped call ...) is run against the
tests that cover the mutated function; a mutant no test notices "survived". The modules and the
test files are listed in pyproject.toml [tool.mutmut]; mutmut works in ./mutants (ignored by git).
Not a test: it takes minutes per module on two cores.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# the mutmut installed beside this Python (a venv's bin/ need not be on PATH)
MUTMUT = str(Path(sys.executable).with_name("mutmut")) if Path(sys.executable).with_name("mutmut").exists() else "mutmut"


def results() -> dict:
    """{module: Counter(status)} and the survivors, from ``mutmut results --all true``."""
    out = subprocess.run([MUTMUT, "results", "--all", "true"], cwd=REPO, capture_output=True, text=True).stdout
    table: dict = defaultdict(Counter)
    survivors = []
    for line in out.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if not name:
            continue
        module = re.split(r"\.x(?:_|ǁ)", name, maxsplit=1)[0]  # functions: .x_f__mutmut_1; methods: .xǁClassǁm__...
        table[module][status] += 1
        if status == "survived":
            survivors.append(name)
    return {"table": table, "survivors": survivors}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--report", action="store_true", help="only print the last run's table")
    a = ap.parse_args(argv)
    if not a.report:
        run = subprocess.run([MUTMUT, "run", "--max-children", str(a.jobs)], cwd=REPO, check=False)
        if run.returncode != 0:
            print(f"mutmut run failed (exit {run.returncode}): see its output above", file=sys.stderr)
            return 1
    res = results()
    if not res["table"]:
        print("no mutmut results: run it first (python bench/mutation.py)", file=sys.stderr)
        return 1
    print(f"\n{'module':<34} {'mutants':>8} {'killed':>7} {'survived':>9} {'timeout':>8} {'score':>7}")
    for module, c in sorted(res["table"].items()):
        n = sum(c.values())
        killed = c["killed"] + c["timeout"]
        print(f"{module:<34} {n:>8} {c['killed']:>7} {c['survived']:>9} {c['timeout']:>8} {killed / n:>7.1%}")
    print(f"\n{len(res['survivors'])} survivors (mutmut show NAME for the diff):")
    for name in res["survivors"]:
        print("  " + name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
