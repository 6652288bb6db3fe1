"""Many files across processes: the merged result is the serial scan's, root cause included."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnose.diagnosis import analyze
from diagnose.parallel import plan_jobs, scan_parallel
from diagnose.scan import Scanner

REPO = Path(__file__).resolve().parents[2]


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
    import diagnose.parallel as P
    from diagnose.logs.read import iter_sources

    many = list(iter_sources([str(rank_dir)], []))
    one = list(iter_sources([str(rank_dir / "other.log")], []))
    assert plan_jobs(one, None) == 1 and plan_jobs(one, 8) == 1
    assert plan_jobs(many, 1) == 1
    assert plan_jobs(many, 3) == min(3, P.cpu_count())
    assert plan_jobs(many, None) == 1  # a few MB in all: not worth starting processes
    assert plan_jobs(many, 64) <= P.cpu_count()  # never more processes than cores (issue 16, item 12)
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


@pytest.mark.parametrize("jobs", [2, 3])
def test_one_big_file_cut_in_pieces_equals_serial(db, big_single, monkeypatch, jobs):
    import diagnose.parallel as P
    from diagnose.logs import read as R
    from diagnose.match.engine import Engine

    monkeypatch.setattr(R, "CHUNK", 48 << 10)  # ~100 chunks: block ends and piece ends meet
    monkeypatch.setattr(P, "SPLIT_MIN", 512 << 10)
    monkeypatch.setattr(P, "cpu_count", lambda: 8)  # the pieces are the subject, not this machine's cores
    monkeypatch.setattr(Engine, "EXACT", 16)  # and the dense lines of each chunk are sampled
    sc = Scanner(db, "regex")
    serial = scan_parallel(sc, [str(big_single)], jobs=1)
    par = scan_parallel(sc, [str(big_single)], jobs=jobs)
    assert getattr(par, "jobs", 1) == jobs
    want, got = summary(db, serial), summary(db, par)
    assert want["root"] is not None and want["tracebacks"] and want["torchrun"] and want["timers"][0] > 5
    assert serial.structure.skipped  # the dense lines were sampled
    for key in want:
        assert got[key] == want[key], key
    for field in ("tally", "peaks", "skipped", "year", "timer_blocks", "traceback_count"):
        assert getattr(par.structure, field) == getattr(serial.structure, field), field


def test_split_points_are_serial_chunk_ends(big_single, monkeypatch):
    from diagnose.logs import read as R

    monkeypatch.setattr(R, "CHUNK", 48 << 10)
    ends, pos = set(), 0
    for chunk in R.read_chunks(R.Source(str(big_single), big_single), []):
        pos = chunk.offset + len(chunk.data)
        ends.add(pos)
    cuts = R.split_points(big_single, 5)
    assert len(cuts) == 4 and cuts == sorted(cuts) and set(cuts) <= ends
    data = big_single.read_bytes()
    assert all(data[c - 1:c] == b"\n" for c in cuts)


def test_many_pieces_in_process_blocks_read_on_past_a_piece_end(db, big_single, monkeypatch):
    """The pieces of a file, scanned one by one in this process and merged in order, give the
    serial result; and some piece ended inside a block, which its scan then read on for."""
    import gc

    import diagnose.parallel as P
    from diagnose.analyze.findings import Findings
    from diagnose.logs import read as R
    from diagnose.logs import structure as S
    from diagnose.match.engine import Engine
    from diagnose.scan import ScanResult

    monkeypatch.setattr(R, "CHUNK", 16 << 10)
    monkeypatch.setattr(P, "SPLIT_MIN", 64 << 10)
    monkeypatch.setattr(Engine, "EXACT", 16)
    sc = Scanner(db)
    serial = sc.scan_paths([str(big_single)])
    sources = list(R.iter_sources([str(big_single)], []))

    class InProcess:
        map = staticmethod(lambda f, xs: list(map(f, xs)))

    work = P._number_pieces(InProcess, P.plan_tasks(sources, 40))
    assert len(work) == 40
    calls = []
    real = R.read_chunks
    monkeypatch.setattr(R, "read_chunks", lambda *a, **k: (calls.append(k.get("start")), real(*a, **k))[1])
    gc_was = gc.isenabled()
    P._init(db, None, None, True, None)
    try:
        out = ScanResult(Findings(), S.Structure(), [])
        read_on = 0
        for task in work:
            before = len(calls)
            _tid, res = P._scan_one(task)
            read_on += len(calls) - before > 1
            P.merge(out, res, sc.sigs)
    finally:
        if gc_was:
            gc.enable()
    assert read_on >= 1  # a piece ended inside a block (a traceback, timers, torchrun's summary)
    assert summary(db, out) == summary(db, serial)
    for field in ("tally", "peaks", "skipped", "year", "timer_blocks", "traceback_count"):
        assert getattr(out.structure, field) == getattr(serial.structure, field), field


def test_lone_crs_number_lines_the_same_in_pieces(db, big_single, tmp_path, monkeypatch):
    """A lone CR is a line end (logs/read.py normalize): the pieces of a parallel scan count them
    too, so every line number agrees with the serial scan (CR LF pairs cut between two blocks
    included)."""
    import diagnose.parallel as P
    from diagnose.logs import read as R

    data = big_single.read_bytes().split(b"\n")
    mixed = b"".join(line + (b"\r" if i % 7 == 0 else b"\r\n" if i % 5 == 0 else b"\n") for i, line in enumerate(data))
    log = tmp_path / "cr.log"
    log.write_bytes(mixed)
    monkeypatch.setattr(R, "CHUNK", 48 << 10)
    monkeypatch.setattr(P, "SPLIT_MIN", 512 << 10)
    monkeypatch.setattr(P, "cpu_count", lambda: 8)
    sc = Scanner(db, "regex")
    serial = scan_parallel(sc, [str(log)], jobs=1)
    par = scan_parallel(sc, [str(log)], jobs=3)
    assert getattr(par, "jobs", 1) == 3
    assert serial.lines_read == par.lines_read
    assert serial.lines_read >= len(data) - 5  # not 6/7 of it: every lone CR ended a line
    want, got = summary(db, serial), summary(db, par)
    assert want["root"] is not None
    for key in want:
        assert got[key] == want[key], key


def test_progress_bar_series_are_the_same_in_pieces(db, tmp_path, monkeypatch):
    """Another framework's step times (tqdm here) continue across piece ends."""
    import diagnose.parallel as P
    from diagnose.logs import read as R

    monkeypatch.setattr(R, "CHUNK", 48 << 10)
    monkeypatch.setattr(P, "SPLIT_MIN", 512 << 10)
    monkeypatch.setattr(P, "cpu_count", lambda: 8)
    log = tmp_path / "bars.log"
    rows = [f"Train:  {i // 200}%|#   | {i}/20000 [00:{i % 60:02d}<10:00, {1 + i / 4000:.2f}s/it]\n" for i in range(1, 20001)]
    log.write_text("".join(rows))
    sc = Scanner(db, "regex")
    serial, par = scan_parallel(sc, [str(log)], jobs=1), scan_parallel(sc, [str(log)], jobs=3)
    assert getattr(par, "jobs", 1) == 3

    def series(res):
        return {k: [(p.line, p.iteration, p.elapsed_ms) for p in v] for k, v in res.structure.paced.items()}

    assert series(par) == series(serial) and len(series(serial)[("tqdm", 20000)]) > 100
    assert analyze(db, par).metrics == analyze(db, serial).metrics
