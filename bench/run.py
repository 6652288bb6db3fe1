"""Time ``diagnose`` against ripgrep and GNU grep on the same log and the same patterns.

    python bench/gen_log.py /tmp/big.log --size 512M            # a log (never commit it)
    python bench/run.py /tmp/big.log                            # one file, one core
    python bench/gen_log.py /tmp/ranks --size 512M --per-rank 64
    python bench/run.py /tmp/ranks                              # many files: one core and all cores

In one run: the patterns are exported from the database (``diagnose signatures export
--patterns``: every anchor the scan uses, regex-escaped), the input is read once to warm the
page cache, then each command runs ``--repeat`` times and the fastest run counts:

* ``diagnose`` with each installed engine (hyperscan, regex), pinned to one core
  (``taskset -c 0``, ``--jobs 1``), and with ``--jobs <cores>`` when the input is a folder or
  a file large enough to be scanned in pieces;
* ``rg -c -f PATTERNS`` (pinned to one core, ``-j1``; and unpinned on a folder);
* ``grep -c -E -f PATTERNS`` (``LC_ALL=C``, its fastest setting; ``-r`` on a folder).

``-c`` (count matching lines) is the cheapest mode for rg and grep, so the comparison is
conservative; ``diagnose`` does much more per line (rank prefixes, regexes, structure, one
root cause). For each run: wall time, MB/s (input bytes / wall time, process start-up
included), the ratio to rg on one core, and the peak RSS of the largest process (GNU time's
``%M``, i.e. wait4's ``ru_maxrss`` of a child of ``/usr/bin/time``). The findings of the engines are compared:
the root cause and every signature's count must be the same.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def input_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def warm(path: Path):
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(16 << 20):
                pass


GNU_TIME = "/usr/bin/time"


def run_once(cmd: list, env=None) -> tuple[float, int, int, str]:
    """(wall seconds, peak RSS in bytes of the largest process, exit code, stderr tail).

    The RSS comes from GNU time's ``%M`` when it is installed: a child started straight from this
    Python process inherits this process's high-water mark through fork/exec (Linux keeps the
    larger of the two), so wait4 here would never report less than the runner's own ~40 MB.
    """
    err = tempfile.TemporaryFile()
    rss_file = tempfile.NamedTemporaryFile(suffix=".rss", delete=False)
    rss_file.close()
    wrapped = [GNU_TIME, "-f", "%M", "-o", rss_file.name] + cmd if os.path.exists(GNU_TIME) else cmd
    t0 = time.perf_counter()
    # stdout to a file, never /dev/null: GNU grep treats -c >/dev/null like -q and stops at the first match
    out = tempfile.TemporaryFile()
    p = subprocess.Popen(wrapped, stdout=out, stderr=err, env=env)
    _pid, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    rss = ru.ru_maxrss * 1024
    try:
        kb = Path(rss_file.name).read_text().split()
        if wrapped is not cmd and kb and kb[-1].isdigit():
            rss = int(kb[-1]) * 1024
    finally:
        os.unlink(rss_file.name)
    err.seek(0)
    tail = err.read()[-400:].decode("utf-8", "replace")
    out.seek(0)
    run_once.stdout = out.read(4096).decode("utf-8", "replace")
    return wall, rss, p.returncode, tail


def diagnose_cmd() -> list:
    return [sys.executable, "-c", "import sys; from diagnose.cli import main; sys.exit(main())"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", type=Path, help="a generated log file, or a folder of per-rank logs")
    ap.add_argument("--repeat", type=int, default=3, help="runs per command; the fastest counts (default 3)")
    ap.add_argument("--diagnose-repeat", type=int, default=None,
                    help="runs per diagnose command (default: --repeat); 1 saves minutes on a 500 MB log")
    ap.add_argument("--engines", default="hyperscan,regex", help="diagnose engines to time (default: both)")
    ap.add_argument("--no-grep", action="store_true", help="skip GNU grep (slow on big logs)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    a = ap.parse_args(argv)
    if not a.log.exists():
        ap.error(f"{a.log}: no such file or folder (make one with bench/gen_log.py)")
    size = input_bytes(a.log)
    if size == 0:
        ap.error(f"{a.log}: empty")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    folder = a.log.is_dir()
    from diagnose.match.engines import available_engines
    from diagnose.parallel import SPLIT_MIN as split_min  # one file this large is scanned in pieces

    have = available_engines()
    engines = [e for e in a.engines.split(",") if e]
    missing = [e for e in engines if e not in have]
    engines = [e for e in engines if e in have]

    tmp = Path(tempfile.mkdtemp(prefix="diagnose-bench-"))
    pats = tmp / "patterns.txt"
    p = subprocess.run(diagnose_cmd() + ["signatures", "export", "--patterns"], capture_output=True, text=True)
    if p.returncode != 0:
        print(f"bench: cannot export patterns: {p.stderr.strip()}", file=sys.stderr)
        return 2
    pats.write_text(p.stdout)
    npats = len(p.stdout.splitlines())

    runs = []  # (label, cores, cmd, env, kind, report path)
    for eng in engines:
        rep = tmp / f"report-{eng}-1.json"
        runs.append((f"diagnose --engine {eng}", 1, pin + diagnose_cmd() + [
            str(a.log), "--engine", eng, "--jobs", "1", "--format", "json", "-o", str(rep), "-q"], None, "diagnose", rep))
        if (folder or size >= split_min) and cores > 1:  # many files, or one cut in pieces
            rep = tmp / f"report-{eng}-{cores}.json"
            runs.append((f"diagnose --engine {eng}", cores, diagnose_cmd() + [
                str(a.log), "--engine", eng, "--jobs", str(cores), "--format", "json", "-o", str(rep), "-q"],
                None, "diagnose", rep))
    for eng in engines:  # the sweep alone: the like-for-like comparison with rg -c
        runs.append((f"sweep only --engine {eng}", 1, pin + [sys.executable, str(REPO / "bench" / "sweep.py"), str(a.log),
                                                             "--engine", eng], None, "sweep", None))
    if "hyperscan" in engines:  # the matcher alone: the ceiling of any scan built on it
        runs.append(("hyperscan matcher alone", 1, pin + [sys.executable, str(REPO / "bench" / "sweep.py"), str(a.log),
                                                           "--engine", "hyperscan", "--raw"], None, "sweep", None))
    if shutil.which("rg"):
        runs.append(("rg -c -f", 1, pin + ["rg", "-j1", "-c", "-f", str(pats), str(a.log)], None, "rg", None))
        if folder and cores > 1:
            runs.append(("rg -c -f", cores, ["rg", "-c", "-f", str(pats), str(a.log)], None, "rg", None))
    else:
        print("bench: rg not found (apt-get install ripgrep): no ratios", file=sys.stderr)
    if not a.no_grep and shutil.which("grep"):
        env = dict(os.environ, LC_ALL="C")
        runs.append(("grep -c -E -f", 1, pin + ["grep", "-c", "-E"] + (["-r"] if folder else []) + [
            "-f", str(pats), str(a.log)], env, "grep", None))

    warm(a.log)
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    results = []
    for label, ncores, cmd, env, kind, rep in runs:
        walls, rss, codes, tail, best_out = [], 0, set(), "", ""
        reps = a.diagnose_repeat if (kind == "diagnose" and a.diagnose_repeat) else a.repeat
        for _ in range(max(1, reps)):
            wall, peak, code, tail = run_once(cmd, env)
            if not walls or wall < min(walls):
                best_out = run_once.stdout  # the fastest run's own report
            walls.append(wall)
            rss = max(rss, peak)
            codes.add(code)
        ok = codes <= ({0, 1} if kind in ("diagnose", "grep", "rg") else {0})
        scan_s = None
        if kind == "diagnose" and rep is not None and rep.exists():
            doc = json.loads(rep.read_text())
            scan_s = (doc.get("stats") or {}).get("seconds")
        elif kind == "sweep":
            import re as _re

            m = _re.search(r"(\d+) MB/s", best_out)
            scan_s = size / (float(m.group(1)) * 1e6) if m and float(m.group(1)) > 0 else None
        results.append({"tool": label, "cores": ncores, "best_s": min(walls), "median_s": statistics.median(walls),
                        "mb_s": size / min(walls) / 1e6, "scan_mb_s": size / scan_s / 1e6 if scan_s else None,
                        "rss_mb": rss / 1e6, "ok": ok, "stderr": "" if ok else tail, "report": str(rep) if rep else None})

    rg1 = next((r for r in results if r["tool"].startswith("rg") and r["cores"] == 1), None)
    print(f"input: {a.log} ({size / 1e6:.1f} MB{', folder' if folder else ''}), {npats} patterns from the database,"
          f" {cores} core(s), best of {a.repeat} (diagnose: {a.diagnose_repeat or a.repeat}),"
          f" load average at start: {load0:.1f}")
    print(f"{'tool':<28} {'cores':>5} {'seconds':>8} {'MB/s':>8} {'scan MB/s':>10} {'x rg':>6} {'peak RSS MB':>12}")
    for r in results:
        ratio = f"{r['mb_s'] / rg1['mb_s']:.2f}" if rg1 else "-"
        scan = f"{r['scan_mb_s']:.0f}" if r["scan_mb_s"] else "-"
        flag = "" if r["ok"] else "  FAILED: " + r["stderr"].strip().splitlines()[-1:][0] if r["stderr"] else "  FAILED"
        print(f"{r['tool']:<28} {r['cores']:>5} {r['best_s']:>8.2f} {r['mb_s']:>8.0f} {scan:>10} {ratio:>6}"
              f" {r['rss_mb']:>12.0f}{flag}")
    if missing:
        print(f"(not installed here, not timed: {', '.join(missing)})")

    # the engines must agree: same root cause, same counts per signature
    docs = {}
    for r in results:
        if r["report"] and Path(r["report"]).exists():
            d = json.loads(Path(r["report"]).read_text())
            rc = d.get("root_cause") or {}
            docs[f"{r['tool']} x{r['cores']}"] = (rc.get("signature"), rc.get("file"), rc.get("line"),
                                                   sorted((f.get("signature") or f.get("id"), f.get("count"))
                                                          for f in d.get("findings", [])))
    same = len(set(map(repr, docs.values()))) <= 1
    if docs:
        first = next(iter(docs.values()))
        print(f"root cause: {first[0]} at {first[1]}:{first[2]}; {len(first[3])} signatures found; "
              f"{'identical' if same else 'DIFFERENT'} across {len(docs)} diagnose runs")

    # the targets of the issue, measured here
    checks = []

    def best(tool, ncores=1):
        return next((r for r in results if r["tool"] == tool and r["cores"] == ncores), None)

    hs, rx = best("diagnose --engine hyperscan"), best("diagnose --engine regex")
    hs_sweep, rx_sweep = best("sweep only --engine hyperscan"), best("sweep only --engine regex")

    def scan(r):  # the tool's own throughput, start-up (imports, database) excluded
        return r["scan_mb_s"] or r["mb_s"]

    if hs and rg1:
        checks.append((f"diagnose, hyperscan, one core, >= 3x rg: {hs['mb_s'] / rg1['mb_s']:.2f}x end to end, "
                       f"{scan(hs) / rg1['mb_s']:.2f}x without start-up", scan(hs) >= 3 * rg1["mb_s"]))
    if rx:
        checks.append((f"diagnose, regex fallback >= 100 MB/s: {rx['mb_s']:.0f} MB/s end to end, "
                       f"{scan(rx):.0f} without start-up", scan(rx) >= 100))
    if hs_sweep and rg1:
        checks.append((f"sweep only (what rg -c does), hyperscan, >= 3x rg: {scan(hs_sweep) / rg1['mb_s']:.2f}x",
                       scan(hs_sweep) >= 3 * rg1["mb_s"]))
    if rx_sweep:
        checks.append((f"sweep only, regex engine >= 100 MB/s: {scan(rx_sweep):.0f} MB/s", scan(rx_sweep) >= 100))
    raw = best("hyperscan matcher alone")
    if raw and rg1:
        print(f"  ceiling: Hyperscan's matcher alone over the same chunks (no line grouping, no diagnosis) runs at "
              f"{scan(raw):.0f} MB/s = {scan(raw) / rg1['mb_s']:.2f}x rg on one core")
    dg = [r for r in results if r["tool"].startswith("diagnose")]
    if dg:
        worst = max(r["rss_mb"] for r in dg)
        checks.append((f"peak RSS < 200 MB: {worst:.0f} MB (largest process)", worst < 200))
    if docs:
        checks.append(("same findings with every engine and job count", same))
    for text, ok in checks:
        print(f"  [{'PASS' if ok else 'MISS'}] {text}")
    if a.json:
        a.json.write_text(json.dumps({"input": str(a.log), "bytes": size, "patterns": npats, "cores": cores,
                                      "results": results, "checks": [{"check": t, "ok": o} for t, o in checks]},
                                     indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(r["ok"] for r in results) and same else 1


if __name__ == "__main__":
    sys.exit(main())
