"""Many files across processes: the merged result is the serial scan's, root cause included."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from diagnose.diagnosis import analyze
from diagnose.parallel import plan_jobs, scan_parallel
from diagnose.scan import Scanner

REPO = Path(__file__).resolve().parent.parent


def _gen():
    sys.path.insert(0, str(REPO))
    try:
        from bench.gen_log import generate
    finally:
        sys.path.remove(str(REPO))
    return generate


@pytest.fixture(scope="module")
def rank_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranks")
    _gen()(d / "job", 3 << 20, seed=5, per_rank=8)
    # a second job's single interleaved log beside it, and an empty file
    _gen()(d / "other.log", 1 << 20, ranks=16, seed=9, failure_kind="none")
    (d / "empty.log").write_bytes(b"")
    return d


def summary(db, res) -> dict:
    report = analyze(db, res)
    rc = report.root_cause
    s = res.structure
    return {
        "root": (rc.finding.signature.id, rc.hit.file, rc.hit.line, rc.hit.rank) if rc else None,
        "findings": [(f.signature.id, f.count, sorted(f.ranks.items(), key=str), (f.first.file, f.first.line),
                      [(h.file, h.line, h.rank) for h in f.samples]) for f in report.findings],
        "iterations": [(p.file, p.line, p.iteration, p.elapsed_ms) for p in s.iterations],
        "memory": [(m["file"], m["line"], m["rank"]) for m in s.memory],
        "timers": (s.timer_blocks, s.timers),
        "tracebacks": [(t.file, t.line, t.rank, t.exc_type) for t in s.tracebacks],
        "exceptions": [e[:5] for e in s.exceptions],
        "torchrun": [(t.section, t.rank, t.file, t.line) for t in s.torchrun],
        "config_blocks": [(k, f, line) for k, f, line, _ in s.config_blocks],
        "step_times": s.step_times,
        "evidence": s.evidence,
        "notes": res.notes,
        "sources": res.sources,
        "bytes": res.bytes_read,
        "lines": res.lines_read,
        "line_hits": sorted(res.findings.lines),
    }


@pytest.mark.parametrize("engine", ["regex", "auto"])
def test_parallel_equals_serial(db, rank_dir, engine):
    sc = Scanner(db, None if engine == "auto" else engine)
    paths = [str(rank_dir), str(rank_dir / "missing.log")]
    serial = scan_parallel(sc, paths, jobs=1)
    par = scan_parallel(sc, paths, jobs=2)
    assert getattr(par, "jobs", 1) == 2  # really ran in two processes
    want, got = summary(db, serial), summary(db, par)
    assert want["root"] is not None
    assert len(want["sources"]) == 10 and want["iterations"]
    assert any("missing.log" in n for n in want["notes"])
    assert got == want


def test_progress_is_reported_from_workers(db, rank_dir):
    sc = Scanner(db)
    seen = []
    res = scan_parallel(sc, [str(rank_dir)], jobs=2, progress=seen.append)
    assert sum(seen) == res.bytes_read > 0


def test_auto_jobs(db, rank_dir, tmp_path):
    from diagnose.logs.read import iter_sources

    many = list(iter_sources([str(rank_dir)], []))
    one = list(iter_sources([str(rank_dir / "other.log")], []))
    assert plan_jobs(one, None) == 1 and plan_jobs(one, 8) == 1
    assert plan_jobs(many, 1) == 1
    assert plan_jobs(many, 3) == 3
    assert plan_jobs(many, None) == 1  # a few MB in all: not worth starting processes
    stdin = list(iter_sources(["-"], []))
    assert plan_jobs(stdin, 4) == 1


def test_cli_jobs_gives_the_same_report(run_cli, rank_dir):
    outs = []
    for j in ("1", "2"):
        code, out, _err = run_cli(str(rank_dir), "--jobs", j, "--format", "json", "-q")
        doc = json.loads(out)
        for k in ("stats", "seconds", "timing"):
            doc.pop(k, None)
        outs.append((code, doc))
    assert outs[0][0] == outs[1][0] == 1
    assert outs[0][1]["root_cause"]["signature"] == outs[1][1]["root_cause"]["signature"]
    assert outs[0][1]["findings"] == outs[1][1]["findings"]


def test_cli_rejects_zero_jobs(run_cli, rank_dir):
    code, _out, err = run_cli(str(rank_dir), "--jobs", "0")
    assert code == 2 and "jobs" in err.lower()
