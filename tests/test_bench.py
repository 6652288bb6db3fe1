"""bench/: the log generator's output, and a smoke run of the benchmark runner on a few MB."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.gen_log import generate, parse_size  # noqa: E402

# (bench stays importable: bench.matrix is imported by a test below)


def test_generated_log_has_the_size_and_the_structure(tmp_path, db):
    from diagnose.diagnosis import diagnose_paths

    log = tmp_path / "g.log"
    n = generate(log, 2 << 20, ranks=32, seed=1)
    assert log.stat().st_size == n and (2 << 20) * 0.9 <= n <= (2 << 20) + (1 << 20)
    text = log.read_text()
    for needle in ("NCCL INFO", "iteration", "memory (GB)", "ProcessGroupNCCL.cpp", "Final configuration:",
                   "Watchdog caught collective operation timeout", "ChildFailedError"):
        assert needle in text, needle
    report = diagnose_paths([str(log)], db, jobs=1)
    assert report.root_cause is not None and report.root_cause.finding.signature.category == "cuda_oom"
    assert len(report.structure.iterations) > 10


def test_generator_is_deterministic_and_writes_per_rank_files(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    generate(a, 512 << 10, ranks=16, seed=4, fmt="mlm")
    generate(b, 512 << 10, ranks=16, seed=4, fmt="mlm")
    assert a.read_bytes() == b.read_bytes()
    assert "memory (MB)" in a.read_text() and "time across ranks (ms):" in a.read_text()
    d = tmp_path / "ranks"
    generate(d, 1 << 20, per_rank=4, seed=2)
    files = sorted(p.name for p in d.iterdir())
    assert files == [f"rank{r:05d}.log" for r in range(4)]
    assert "[default" not in (d / "rank00001.log").read_text()  # one file per rank: no launcher prefix


def test_parse_size():
    assert parse_size("500M") == 500 << 20 and parse_size("2G") == 2 << 30 and parse_size("4096") == 4096
    with pytest.raises(Exception):
        parse_size("lots")


@pytest.mark.slow
def test_benchmark_runner_smoke(tmp_path):
    log = tmp_path / "g.log"
    generate(log, 3 << 20, ranks=32, seed=1)
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), str(log), "--repeat", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "MB/s" in p.stdout and "peak RSS" in p.stdout and "identical across" in p.stdout
    doc = json.loads(out.read_text())
    tools = {r["tool"] for r in doc["results"]}
    assert "diagnose --engine regex" in tools
    for r in doc["results"]:
        assert r["ok"] and r["mb_s"] > 0 and r["rss_mb"] > 0
    assert any(c["check"].startswith("same findings") and c["ok"] for c in doc["checks"])


def test_signature_anchors_stay_rare_on_a_generated_log(tmp_path, db):
    """An anchor that every iteration line or every warning holds sends each such line through
    Python (prefix split, regex): the scan of a big log then crawls. No signature's anchors may
    hit more than 0.5% of the lines of a generated training log (MB-NAN-007 anchors the non-zero
    NaN counts, MB-IMP-014 "deprecat", not the field or "UserWarning:" itself)."""
    from diagnose.match.anchors import scan_anchors
    from diagnose.match.engines import make_engine

    log = tmp_path / "g.log"
    generate(log, 4 << 20, ranks=64, seed=9)
    data = log.read_bytes()
    eng = make_engine(scan_anchors(db, structure=False), "regex")
    per_key: dict = {}
    for _start, _end, keys in eng.scan(data):
        for k in keys:
            per_key[k] = per_key.get(k, 0) + 1
    lines = data.count(b"\n")
    noisy = {k: n for k, n in per_key.items() if n > 0.005 * lines}
    assert not noisy, f"anchors on {', '.join(f'{k} ({n} of {lines} lines)' for k, n in noisy.items())}"


@pytest.mark.parametrize("kind,expect", [
    ("quiet", "healthy"), ("nccl", "cuda_oom"), ("storm", "healthy"), ("timers", "cuda_oom"),
    ("tracebacks", "other"), ("corpus", None),
])
def test_every_composition_of_the_matrix_is_written_to_size_and_read(tmp_path, db, kind, expect):
    """bench/matrix.py's compositions: the size asked for, and the story each one tells."""
    from bench.matrix import write
    from diagnose.diagnosis import diagnose_paths

    log = write(kind, tmp_path, 1 << 20)
    assert log.stat().st_size >= 0.8 * (1 << 20)  # the generator stops within its tail reserve
    rep = diagnose_paths([str(log)], db, jobs=1)
    got = rep.root_cause.finding.signature.category if rep.root_cause else "healthy"
    if expect is not None:
        assert got == expect, (kind, got)
    if kind == "tracebacks":  # every rank's traceback is followed through the interleaving to its end
        assert len(rep.structure.tracebacks) >= 60 and all(t.exc_type == "KeyError" for t in rep.structure.tracebacks)
