"""Follow mode: lines of a growing log are diagnosed within a second of being written."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from diagnose.db import load
from diagnose.launch.follow import Follower

REPO = Path(__file__).resolve().parents[2]
OOM = ("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity "
       "of 79.11 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process has 77.87 GiB memory in use. "
       "Of the allocated memory 70.30 GiB is allocated by PyTorch, and 6.12 GiB is reserved by PyTorch but unallocated.")
ITER = (" [2026-08-22 15:22:{s:02d}] iteration {i:8d}/     100 | consumed samples: {c:12d} | elapsed time per iteration "
        "(ms): 996.3 | learning rate: 3.000000E-05 | global batch size:  1024 | lm loss: 1.023456E+01 | loss scale: 1.0 | "
        "number of skipped iterations:   0 | number of nan iterations:   0 |")


def _append(path: Path, text: str):
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()


def test_half_written_line_waits_for_its_newline(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("")
    fol = Follower(log, load())
    _append(log, OOM[:60])
    assert fol.poll() == [] and fol.fatal() is None
    _append(log, OOM[60:] + "\n")
    found = fol.poll()
    assert {f.id for f in found} == {"MB-OOM-001", "MB-OOM-011"}  # the OOM and its expandable-segments advice
    assert fol.fatal().id == "MB-OOM-001"
    assert fol.fatal().first.line == 1 and fol.fatal().first.rank == 3


def test_a_warning_root_does_not_end_the_follow_an_error_root_does(tmp_path):
    """One NaN iteration is a warning (MB-NAN-007): the run goes on and so does the follow."""
    log = tmp_path / "run.log"
    log.write_text("")
    fol = Follower(log, load())
    nan_line = ITER.format(s=1, i=10, c=10240).replace("number of nan iterations:   0", "number of nan iterations:   1")
    _append(log, nan_line + "\n")
    found = fol.poll()
    assert [f.id for f in found] == ["MB-NAN-007"] and found[0].signature.severity == "warning"
    assert fol.fatal() is None
    _append(log, OOM + "\n")
    fol.poll()
    assert fol.fatal().id == "MB-OOM-001"


def test_traceback_across_polls_and_report(tmp_path):
    log = tmp_path / "run.log"
    _append(log, "".join(ITER.format(s=i, i=i, c=i * 1024) + "\n" for i in range(1, 4)))
    fol = Follower(log, load())
    fol.poll()
    _append(log, "[rank0]: Traceback (most recent call last):\n[rank0]:   File \"train.py\", line 3, in <module>\n")
    fol.poll()
    _append(log, "[rank0]: ValueError: Currently there is no support for Pipeline parallelism with CPU offloading\n")
    fol.poll()
    assert fol.fatal().id == "MB-OFF-002"
    rep = fol.report()
    assert rep.root_cause.finding.signature.id == "MB-OFF-002" and rep.root_cause.hit.line == 6
    assert len(rep.structure.iterations) == 3 and rep.structure.tracebacks


def test_truncated_file_is_read_again(tmp_path):
    log = tmp_path / "run.log"
    _append(log, OOM + "\n")
    fol = Follower(log, load())
    fol.poll()
    assert fol.fatal() is not None
    log.write_text(ITER.format(s=1, i=1, c=1024) + "\n")  # a new run replaced the file
    fol.poll()
    assert fol.fatal() is None and fol.offset == log.stat().st_size


def test_detected_within_one_second_of_being_written(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("")
    fol = Follower(log, load())
    written = {}

    def writer():
        for i in range(1, 6):
            _append(log, ITER.format(s=i, i=i, c=i * 1024) + "\n")
            time.sleep(0.15)
        written["t"] = time.monotonic()
        _append(log, OOM + "\n")

    th = threading.Thread(target=writer)
    th.start()
    deadline = time.monotonic() + 20
    while fol.fatal() is None and time.monotonic() < deadline:
        fol.poll()
        time.sleep(0.05)
    th.join()
    assert fol.fatal() is not None
    lag = fol.first_fatal_at - written["t"]
    print(f"fatal line diagnosed {lag * 1000:.0f} ms after it was written")
    assert 0 <= lag < 1.0


def test_cli_follow_prints_findings_live_and_stops_at_the_fatal_line(tmp_path):
    """Live lines are announced within a second; with --format json they go to stderr and stdout
    holds the JSON report alone (issue 16, item 16); with -o FILE the report goes to FILE."""
    import json

    log = tmp_path / "run.log"
    log.write_text("")
    out_file = tmp_path / "report.json"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from diagnose.cli import main; sys.exit(main(sys.argv[1:]))",
                             str(log), "--follow", "--format", "json", "-o", str(out_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert "following" in proc.stderr.readline()  # started (imports done) and following
        time.sleep(0.2)
        t_write = time.monotonic()
        _append(log, OOM + "\n")
        line = proc.stderr.readline()  # the live line for the first finding
        lag = time.monotonic() - t_write
        assert "MB-OOM-001" in line or "MB-OOM-011" in line, line
        assert lag < 1.0, f"live line after {lag:.2f} s"
        out = proc.stdout.read()
        err = line + proc.stderr.read()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert out == "" and "fatal root cause seen" in err and "report written to" in err
    doc = json.loads(out_file.read_text())  # the report alone, whole JSON
    assert doc["root_cause"]["signature"] == "MB-OOM-001"


def test_a_file_rewritten_in_place_past_the_old_offset_is_read_anew(tmp_path):
    """Issue 16, item 14: truncated and regrown beyond where the follower was between two polls
    (same inode, larger size): the new content is read from its first line."""
    log = tmp_path / "run.log"
    with open(log, "w") as fh:
        fh.write("".join(ITER.format(s=1, i=i, c=1024 * i) + "\n" for i in range(1, 4)))
    fol = Follower(log, load())
    fol.poll()
    assert fol.fatal() is None
    ino = log.stat().st_ino
    with open(log, "r+") as fh:  # in place: same inode
        fh.truncate(0)
        fh.write("a new run started here\n" * 40 + OOM + "\n")
    assert log.stat().st_ino == ino and log.stat().st_size > fol.offset
    fol.poll()
    rc = fol.fatal()
    assert rc is not None and rc.first.line == 41


def test_a_line_without_end_is_followed_in_bounded_memory(tmp_path):
    """Issue 16, item 12: 20 MB with no newline, then a failure: the pending part of the line
    never exceeds the reader's MAX_LINE, and the failure after it is still found."""
    from diagnose.logs.read import MAX_LINE

    log = tmp_path / "run.log"
    with open(log, "wb") as fh:
        fh.write(b"x" * (20 << 20))
    fol = Follower(log, load())
    for _ in range(10):
        fol.poll()
        assert len(fol.carry) < MAX_LINE
    _append(log, "\n" + OOM + "\n")
    fol.poll()
    assert fol.fatal() is not None and fol.fatal().first.line == 2


def test_a_long_unfinished_line_after_whole_lines_is_bounded_too(tmp_path):
    """Found by tests/remedy/test_fuzz_surfaces.py: whole lines, then 3 MB without a newline in the same
    poll: the unfinished tail was held whole (up to a poll's 8 MB read)."""
    from diagnose.logs.read import MAX_LINE

    log = tmp_path / "run.log"
    log.write_bytes(b"a line\n" + b"y" * (3 * MAX_LINE))
    fol = Follower(log, load())
    fol.poll()
    assert len(fol.carry) < MAX_LINE
    _append(log, "\n" + OOM + "\n")
    fol.poll()
    assert fol.fatal() is not None and fol.fatal().first.line >= 3


WARN = ("[rank0]:[W1130 03:22:06.224000418 ProcessGroupNCCL.cpp:4561] [PG ID 0 PG GUID 0 Rank 0]  using GPU 0 "
        "to perform barrier as devices used by this process are currently unknown.")
PP_OFFLOAD = "[rank0]: ValueError: Currently there is no support for Pipeline parallelism with CPU offloading"


def test_only_new_or_grown_findings_are_reported_and_the_bytes_add_up(tmp_path):
    """From mutation survivors: a finding is returned when it first appears or its count grows,
    not on every poll; the bytes read add up over the polls; the report closes a last line that
    has no newline."""
    log = tmp_path / "run.log"
    log.write_text(OOM + "\n")
    fol = Follower(log, load())
    first = {f.id: f.count for f in fol.poll()}
    assert first and set(first.values()) == {1} and "MB-OOM-001" in first
    assert fol.poll() == []  # nothing new
    _append(log, "an ordinary line\n")
    assert fol.poll() == []  # new bytes, but no finding grew
    _append(log, OOM + "\n")
    again = {f.id: f.count for f in fol.poll()}
    assert set(again) == set(first) and set(again.values()) == {2}
    _append(log, "iteration 3 without its newline")
    rep = fol.report()
    assert rep.bytes_read == log.stat().st_size and rep.lines_read == 4
    assert rep.inputs == [str(log)] and rep.root_cause.finding.signature.id == "MB-OOM-001"


def test_the_fatal_finding_is_the_earliest_error_root_and_a_warning_is_not_fatal(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(WARN + "\n")
    fol = Follower(log, load())
    fol.poll()
    assert fol.fatal() is None and fol.first_fatal_at is None  # a warning never stops a run
    _append(log, PP_OFFLOAD + "\n" + OOM + "\n")
    fol.poll()
    assert fol.first_fatal_at is not None
    assert fol.fatal().signature.id == "MB-OFF-002"  # the earlier of two fatal lines, not the last


def test_a_truncated_or_replaced_file_is_read_anew_from_line_one(tmp_path):
    """From mutation survivors: a log cut shorter (a job restarted with `>`) or replaced by
    another file (a new inode: rotation) is read from its start, lines numbered from 1."""
    log = tmp_path / "run.log"
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    fol = Follower(log, load())
    fol.poll()
    log.write_text(OOM + "\n")  # truncated: shorter than what was read
    fol.poll()
    assert fol.fatal() is not None and fol.fatal().first.line == 1
    assert fol.fatal().first.text == OOM and fol.offset == log.stat().st_size  # from its first byte
    new = tmp_path / "new.log"
    new.write_text("restarted\n" + PP_OFFLOAD + "\n")
    os.replace(new, log)  # another file at the same path
    fol.poll()
    assert fol.line == 3 and fol.res.findings.get("MB-OFF-002").first.line == 2
    assert fol.res.findings.get("MB-OOM-001") is None  # the old file's findings are gone


def test_a_burst_is_read_a_bounded_piece_per_poll(tmp_path):
    from diagnose.launch.follow import READ_MAX

    log = tmp_path / "run.log"
    with open(log, "w") as fh:
        line = "an ordinary line of a busy log, " * 3 + "\n"
        fh.write(line * ((2 * READ_MAX) // len(line) + 1))
        fh.write(OOM + "\n")
    fol = Follower(log, load())
    fol.poll()
    assert fol.offset + len(fol.carry) <= READ_MAX and fol.fatal() is None
    for _ in range(3):
        fol.poll()
    assert fol.fatal() is not None and fol.offset == log.stat().st_size


# ---- what the follower keeps between polls (each found by a mutation run's survivors)

def test_a_warning_finding_never_sets_the_fatal_time(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("")
    fol = Follower(log, load())
    _append(log, ITER.format(s=1, i=10, c=10240).replace("number of nan iterations:   0",
                                                         "number of nan iterations:   1") + "\n")
    assert [f.id for f in fol.poll()] == ["MB-NAN-007"]
    assert fol.first_fatal_at is None
    _append(log, OOM + "\n")
    fol.poll()
    assert fol.first_fatal_at is not None


def test_the_follower_uses_the_database_config_and_versions_it_is_given(tmp_path, repo):
    from diagnose.config.load import load_config

    log = tmp_path / "run.log"
    log.write_text(OOM + "\n")
    db = load()
    cfg = load_config(str(repo / "fixtures" / "configs" / "qwen3_30b_a3b_tp2_pp2_ep4.yaml"))
    fol = Follower(log, db, config=cfg, versions={"megatron-core": "0.16.1"})
    assert fol.db is db and fol.scanner.versions == {"megatron-core": "0.16.1"}
    fol.poll()
    rep = fol.report()
    assert rep.config is not None and rep.config.get("model.num_layers") == cfg.get("model.num_layers")
    assert rep.engine == fol.scanner.engine.name and rep.engine in ("regex", "hyperscan")


def test_report_counts_every_line_once_and_can_be_asked_twice(tmp_path):
    log = tmp_path / "run.log"
    lines = [ITER.format(s=i, i=i, c=i * 1024) for i in range(1, 4)] + [OOM]
    log.write_text("\n".join(lines) + "\n")
    fol = Follower(log, load())
    fol.poll()
    first = fol.report()
    assert first.lines_read == 4 and fol.carry == b"" and first.inputs == [str(log)]
    again = fol.report()
    assert again.lines_read == 4 and again.inputs == [str(log)]
    assert [(f.id, f.count) for f in again.findings] == [(f.id, f.count) for f in first.findings]


def test_nothing_new_leaves_nothing_pending(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(ITER.format(s=1, i=1, c=1024) + "\n")
    fol = Follower(log, load())
    fol.poll()
    assert fol.poll() == [] and fol.carry == b""
    _append(log, OOM + "\n")
    found = {f.id: f for f in fol.poll()}
    assert "MB-OOM-001" in found and found["MB-OOM-001"].first.line == 2
    assert found["MB-OOM-001"].first.text == OOM


def test_truncated_in_place_to_the_same_first_bytes_is_read_anew(tmp_path):
    """A job restarted into the same file (`>`): the same start-up lines, then a different end.
    The file is shorter than what was read: its size says so even where its first bytes agree."""
    head = "".join(ITER.format(s=i, i=i, c=i * 1024) + "\n" for i in range(1, 4))  # > 256 bytes
    log = tmp_path / "run.log"
    log.write_text(head + ITER.format(s=9, i=9, c=9 * 1024) + "\n" + ITER.format(s=10, i=10, c=10240) + "\n")
    fol = Follower(log, load())
    fol.poll()
    with open(log, "r+", encoding="utf-8") as fh:  # truncate in place (same inode), shorter content
        fh.seek(0)
        fh.truncate()
        fh.write(head + OOM[:200] + "\n")
    found = fol.poll()
    assert fol.offset == len((head + OOM[:200] + "\n").encode())
    assert any(f.id == "MB-OOM-001" and f.first.line == 4 for f in found), [(f.id, f.first.line) for f in found]
    _append(log, ITER.format(s=11, i=11, c=11264) + "\n")
    assert all(f.id != "MB-OOM-001" for f in fol.poll())  # not found again: no restart on every poll


def test_a_small_file_that_grows_keeps_its_first_bytes(tmp_path):
    """The first bytes are kept across polls while the file is shorter than HEAD_BYTES: a grown
    file is not taken for a rewritten one (which would report everything again)."""
    log = tmp_path / "run.log"
    log.write_text("9aee1c01f3e7:6727:7168 [1] NCCL INFO [Service thread] Connection closed by localRank 2\n")
    fol = Follower(log, load())
    assert [f.id for f in fol.poll()] == ["MB-NCCL-042"]
    _append(log, "x" * 100 + "\n")
    assert fol.poll() == []
    _append(log, OOM + "\n")
    ids = [f.id for f in fol.poll()]
    assert "MB-OOM-001" in ids and "MB-NCCL-042" not in ids  # not read anew from the start
    _append(log, "y" * 100 + "\n")
    assert fol.poll() == [] and fol.offset == log.stat().st_size
