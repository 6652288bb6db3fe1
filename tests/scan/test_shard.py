"""Past one machine: ``diagnose PATH --shard K/N -o PART`` on N machines, then ``diagnose merge``,
gives exactly the serial scan's result (the merge is the one ``--jobs`` uses)."""
from __future__ import annotations

import json
import pickle

import pytest
from test_parallel import summary

from diagnose.parallel import ShardError, merge_partials, read_partial, scan_parallel, scan_shard, write_partial
from diagnose.scan import Scanner


def _sigs(db):
    return {s.id: s for s in db.signatures}


def _sharded(db, paths, n, tmp_path):
    sc = Scanner(db, "regex")
    parts = []
    for k in range(1, n + 1):
        out = tmp_path / f"p{k}.dpart"
        write_partial(scan_shard(sc, paths, k, n), str(out))
        parts.append(read_partial(str(out)))  # through the file, as on a cluster
    return merge_partials(parts[::-1], _sigs(db))  # in any order


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_shards_of_a_folder_merge_to_the_serial_result(db, rank_dir, tmp_path, n):
    serial = scan_parallel(Scanner(db, "regex"), [str(rank_dir)], jobs=1)
    merged = _sharded(db, [str(rank_dir)], n, tmp_path)
    want, got = summary(db, serial), summary(db, merged)
    assert want["root"] is not None
    for key in want:
        assert got[key] == want[key], key


def test_shards_of_one_big_file_cut_in_pieces_merge_to_the_serial_result(db, big_single, tmp_path, monkeypatch):
    import diagnose.parallel as P
    from diagnose.logs import read as R

    monkeypatch.setattr(R, "CHUNK", 48 << 10)
    monkeypatch.setattr(P, "SPLIT_MIN", 512 << 10)
    serial = scan_parallel(Scanner(db, "regex"), [str(big_single)], jobs=1)
    sc = Scanner(db, "regex")
    part = scan_shard(sc, [str(big_single)], 2, 3)
    assert part["tasks"] == 3 and [tid for tid, _ in part["results"]] == [1]  # the middle piece
    merged = _sharded(db, [str(big_single)], 3, tmp_path)
    want, got = summary(db, serial), summary(db, merged)
    for key in want:
        assert got[key] == want[key], key
    for field in ("tally", "peaks", "skipped", "year", "timer_blocks", "traceback_count", "tails"):
        assert getattr(merged.structure, field) == getattr(serial.structure, field), field


def test_merge_refuses_an_incomplete_or_mixed_set(db, rank_dir, tmp_path):
    sc = Scanner(db, "regex")
    p = [scan_shard(sc, [str(rank_dir)], k, 3) for k in (1, 2, 3)]
    with pytest.raises(ShardError, match=r"shard\(s\) 2/3 missing"):
        merge_partials([p[0], p[2]], _sigs(db))
    with pytest.raises(ShardError, match="given twice"):
        merge_partials([p[0], p[1], p[1], p[2]], _sigs(db))
    other = scan_shard(sc, [str(rank_dir / "other.log")], 2, 3)
    with pytest.raises(ShardError, match="different runs"):
        merge_partials([p[0], other, p[2]], _sigs(db))
    with pytest.raises(ShardError, match="K must be"):
        scan_shard(sc, [str(rank_dir)], 4, 3)


def test_a_file_that_is_not_a_partial_is_refused(tmp_path):
    for name, data in (("text.dpart", b"just a log line\n"), ("cut.dpart", pickle.dumps({"format": "x"})[:5]),
                       ("other.dpart", pickle.dumps({"format": "something-else"}))):
        f = tmp_path / name
        f.write_bytes(data)
        with pytest.raises(ShardError):
            read_partial(str(f))


def test_cli_shard_then_merge_gives_the_scan_report_and_exit_code(run_cli, rank_dir, tmp_path):
    code, out, _ = run_cli(str(rank_dir), "--format", "json", "-j", "1")
    for k in (1, 2):
        c, _, err = run_cli(str(rank_dir), "--shard", f"{k}/2", "-o", str(tmp_path / f"p{k}"))
        assert c == 0 and f"shard {k}/2" in err
    mcode, mout, _ = run_cli("merge", str(tmp_path / "p2"), str(tmp_path / "p1"), "--format", "json")
    assert mcode == code == 1
    a, b = json.loads(out), json.loads(mout)
    a.pop("stats", None)
    b.pop("stats", None)
    assert a == b


@pytest.mark.parametrize("args,words", [
    (["--shard", "1/2"], "needs -o FILE"),
    (["--shard", "3/2", "-o", "p"], "1 <= K <= N"),
    (["--shard", "x", "-o", "p"], "K/N"),
    (["--shard", "1/2", "-o", "p", "--format", "json"], "belong to 'diagnose merge'"),
])
def test_cli_shard_usage_errors(run_cli, rank_dir, tmp_path, args, words):
    args = [str(tmp_path / a) if a == "p" else a for a in args]
    code, _, err = run_cli(str(rank_dir), *args)
    assert code == 2 and words in err and "Traceback" not in err


def test_cli_merge_errors_are_one_line(run_cli, rank_dir, tmp_path):
    run_cli(str(rank_dir), "--shard", "1/2", "-o", str(tmp_path / "p1"))
    code, _, err = run_cli("merge", str(tmp_path / "p1"))
    assert code == 2 and "2/2 missing" in err and "Traceback" not in err
    (tmp_path / "junk").write_text("hello\n")
    code, _, err = run_cli("merge", str(tmp_path / "junk"))
    assert code == 2 and "not a partial result" in err
    code, _, err = run_cli("merge", str(tmp_path / "nope"))
    assert code == 2 and "does not exist" in err


def test_evidence_that_follows_a_peak_merges_as_the_serial_scan_notes_it(db, tmp_path):
    """CI's 64-file Slurm array once merged to another evidence line than the serial scan: the
    smallest loss scale's line came from the first file with any scale, not from the file with the
    smallest. DeepSpeed's skipped-step report is the one with the most steps, its two counts together."""
    logs = tmp_path / "logs"
    logs.mkdir()
    ds = "[2021-11-26 03:07:16,494] [INFO] [logging.py:69:log_dist] [Rank 0] step={}, skipped={}, lr=[0.001, 0.001]\n"
    (logs / "a.log").write_text("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 2.0\n"
                                + ds.format(2000, 1995))
    (logs / "b.log").write_text("| epoch 028 | loss 3.976 | nll_loss 2.204 | ppl 4.61 | wps 279460 | ups 3 | "
                                "loss_scale 0.000 | wall 4043 | train_wall 3606\n" + ds.format(60, 58))
    (logs / "c.log").write_text("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 1.0\n"
                                + ds.format(2000, 16))
    serial = scan_parallel(Scanner(db, "regex"), [str(logs)], jobs=1)
    s = serial.structure
    assert s.evidence["loss_scale_min"][0].endswith("b.log")  # 0.000 is the smallest
    assert s.evidence["ds_skipped"][0].endswith("c.log") and (s.peaks["ds_steps"], s.peaks["ds_skipped"]) == (2000, 16)
    want = summary(db, serial)  # (analyze adds the symptoms to the result: once)
    for n in (2, 3):
        merged = _sharded(db, [str(logs)], n, tmp_path)
        assert merged.structure.evidence == s.evidence, n
        assert merged.structure.peaks == s.peaks, n
        assert summary(db, merged) == want, n
