#!/usr/bin/env python3
"""The throughput matrix: one big log per composition, each timed against ripgrep (bench/run.py).

    python bench/matrix.py --size 500M               # every composition, 500 MB each
    python bench/matrix.py --size 64M --only quiet,storm   # a quick look

Compositions (each written to a temporary folder, timed, then deleted):

  quiet       Bridge iteration, step-time and memory lines only: no NCCL INFO, no chatter
  nccl        an NCCL_DEBUG=INFO storm: 95 % of the bytes are NCCL INFO lines
  storm       glog-framed c10d warnings from 512 ranks, each with its own time and thread id, every
              line holding an anchor that the regex then rejects (the worst case per byte)
  timers      MLM format with a timer block every logged iteration, no NCCL INFO
  tracebacks  interleaved Python tracebacks from 512 ranks (30 frames each), repeated
  corpus      the real logs of fixtures/corpus concatenated, over and over

For each: bench/run.py's rows (diagnose with each engine on one core and on every core, rg -c -f
on one core), and the issue's targets: Hyperscan >= 1.0x rg end to end on one core, the
pure-Python engine >= 100 MB/s, all cores >= 1.8x one core, peak RSS < 200 MB. The table prints
the worst composition first (lowest Hyperscan / rg ratio).
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.gen_log import generate, parse_size  # noqa: E402

COMPOSITIONS = ("quiet", "nccl", "storm", "timers", "tracebacks", "corpus")


def _fill(out: Path, size: int, block) -> int:
    """Write ``block(i)`` (bytes) until ``size`` bytes are written."""
    n, i = 0, 0
    with open(out, "wb") as fh:
        while n < size:
            b = block(i)
            fh.write(b)
            n += len(b)
            i += 1
    return n


def storm(out: Path, size: int) -> int:
    rng = random.Random(7)

    def block(i):
        lines = []
        for _ in range(1000):
            r = rng.randrange(512)
            lines.append(f"{r}: [rank{r}]:W1130 03:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(10**6):06d} "
                         f"{rng.randrange(10**6)} torch/distributed/c10d/ProcessGroupNCCL.cpp:4{rng.randrange(1000):03d}] "
                         "Warning: TORCH_NCCL_AVOID_RECORD_STREAMS is deprecated and will be removed; "
                         "the default is now the new behavior (function operator())\n")
        return "".join(lines).encode()
    return _fill(out, size, block)


def tracebacks(out: Path, size: int) -> int:
    rng = random.Random(11)

    def block(i):
        ranks = rng.sample(range(512), 64)
        per = {r: [f"[rank{r}]: Traceback (most recent call last):"]
               + [f'[rank{r}]:   File "/opt/megatron/megatron/core/module_{k}.py", line {100 + k}, in step_{k}\n'
                  f"[rank{r}]:     out = self.step_{k + 1}(batch)" for k in range(30)]
               + [f"[rank{r}]: KeyError: 'batch_{i}_{r}'"] for r in ranks}
        lines = []
        while per:
            r = rng.choice(list(per))
            lines.append(per[r].pop(0))
            if not per[r]:
                del per[r]
        return ("\n".join(lines) + "\n").encode()
    return _fill(out, size, block)


def corpus(out: Path, size: int) -> int:
    logs = [p.read_bytes() for p in sorted((REPO / "fixtures" / "corpus").glob("*/*.log"))]
    blob = b"".join(x if x.endswith(b"\n") else x + b"\n" for x in logs)
    return _fill(out, size, lambda i: blob)


def write(kind: str, folder: Path, size: int) -> Path:
    out = folder / f"{kind}.log"
    if kind == "quiet":
        generate(out, size, nccl_share=0.0, chatter=0, failure_kind="none")
    elif kind == "nccl":
        generate(out, size, nccl_share=0.95)
    elif kind == "timers":
        generate(out, size, fmt="mlm", timers=True, nccl_share=0.0)
    else:
        {"storm": storm, "tracebacks": tracebacks, "corpus": corpus}[kind](out, size)
    return out


def row(kind: str, res: dict) -> dict:
    """One line of the matrix from bench/run.py's JSON."""
    runs = res["results"]

    def get(prefix, cores=1):
        return next((r for r in runs if r["tool"].startswith(prefix) and r["cores"] == cores), None)

    rg = get("rg")
    hs1, hsn = get("diagnose --engine hyperscan"), get("diagnose --engine hyperscan", res["cores"])
    rx1 = get("diagnose --engine regex")
    out = {"composition": kind, "MB": round(res["bytes"] / 1e6)}
    if rg and hs1:
        out["hyperscan x rg"] = round(hs1["mb_s"] / rg["mb_s"], 2)
    for name, r in (("hyperscan MB/s", hs1), ("regex MB/s", rx1), ("rg MB/s", rg)):
        if r:
            out[name] = round(r["mb_s"])
    if hs1 and hsn and res["cores"] > 1:
        out["all cores / one"] = round(hs1["best_s"] / hsn["best_s"], 2)
    out["peak RSS MB"] = round(max(r["rss_mb"] for r in runs if r["tool"].startswith("diagnose")))
    same = next((c["ok"] for c in res.get("checks", []) if c["check"].startswith("same findings")), None)
    out["same findings"] = "yes" if same else ("NO" if same is False else "-")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=parse_size, default=parse_size("500M"))
    ap.add_argument("--only", default=",".join(COMPOSITIONS), help="compositions, comma-separated")
    ap.add_argument("--repeat", type=int, default=1, help="runs per command in bench/run.py (fastest counts)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    a = ap.parse_args(argv)
    kinds = [k for k in a.only.split(",") if k]
    bad = [k for k in kinds if k not in COMPOSITIONS]
    if bad:
        ap.error(f"unknown composition(s) {bad}; known: {', '.join(COMPOSITIONS)}")
    rows = []
    for kind in kinds:
        tmp = Path(tempfile.mkdtemp(prefix=f"matrix-{kind}-"))
        try:
            log = write(kind, tmp, a.size)
            res_path = tmp / "run.json"
            subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), str(log), "--repeat", str(a.repeat),
                            "--no-grep", "--json", str(res_path)], check=False, stdout=subprocess.DEVNULL)
            rows.append(row(kind, json.loads(res_path.read_text())))
            print(f"{kind}: {rows[-1]}", file=sys.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    rows.sort(key=lambda r: r.get("hyperscan x rg", 0.0))  # the worst first
    cols = ["composition", "MB", "hyperscan x rg", "hyperscan MB/s", "regex MB/s", "rg MB/s", "all cores / one",
            "peak RSS MB", "same findings"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "-")) for c in cols) + " |")
    targets = [("hyperscan x rg", ">=", 1.0), ("regex MB/s", ">=", 100), ("all cores / one", ">=", 1.8),
               ("peak RSS MB", "<", 200)]
    for name, op, limit in targets:
        worst = [r for r in rows if name in r]
        if not worst:
            continue
        vals = [r[name] for r in worst]
        ok = all(v >= limit for v in vals) if op == ">=" else all(v < limit for v in vals)
        print(f"{'PASS' if ok else 'MISS'} {name} {op} {limit}: worst {min(vals) if op == '>=' else max(vals)}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
