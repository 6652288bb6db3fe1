"""Baselines: a known finding passes, a new one fails; fingerprints survive reruns."""
import json

import pytest
from ci_samples import healthy_lines, nccl_error_lines, oom_lines, write

from diagnose import baseline as BL
from diagnose.fingerprint import normalize_file, normalize_text


@pytest.fixture
def nights(tmp_path):
    for d in ("n1", "n2", "n3"):
        (tmp_path / d).mkdir()
    return tmp_path


def test_known_finding_passes_new_finding_fails(nights, run_cli):
    base = str(nights / "accepted.json")
    first = write(nights / "n1" / "slurm-1001.out", healthy_lines() + oom_lines(0))
    code, _, err = run_cli(first, "--write-baseline", base, "--format", "json")
    assert code == 0  # everything found is now accepted
    assert "baseline of" in err
    doc = json.loads(open(base, encoding="utf-8").read())
    assert doc["diagnose_baseline"] == 1
    assert {e["signature"] for e in doc["findings"]} >= {"MB-OOM-001", "MB-NCCL-001"}
    assert all("<n>" in e["file"] for e in doc["findings"])  # the job id is masked

    assert run_cli(first, "--baseline", base, "-q")[0] == 1 - 1  # the same log: nothing new
    rerun = write(nights / "n2" / "slurm-2417.out", healthy_lines(60) + oom_lines(1))
    code, _, err = run_cli(rerun, "--baseline", base, "--format", "json")
    assert code == 0, err  # the same failure on a rerun (other ranks, sizes, times, job id) is known
    assert "0 at or above --fail-on error not in the baseline" in err

    worse = write(nights / "n3" / "slurm-3000.out", healthy_lines() + oom_lines(2) + nccl_error_lines())
    code, _out, err = run_cli(worse, "--baseline", base, "--format", "json")
    assert code == 1
    assert "1 at or above --fail-on error not in the baseline" in err
    # without the baseline every error fails
    assert run_cli(worse, "-q")[0] == 1


def test_the_same_failure_in_another_log_is_new(tmp_path, run_cli):
    """The fingerprint holds the log's (digit-masked) name: an OOM accepted in train.log does not
    let the same OOM in eval.log through."""
    base = str(tmp_path / "accepted.json")
    train = write(tmp_path / "train.log", healthy_lines() + oom_lines(0))
    assert run_cli(train, "--write-baseline", base, "-q")[0] == 0
    assert run_cli(train, "--baseline", base, "-q")[0] == 0
    other = write(tmp_path / "eval.log", healthy_lines() + oom_lines(0))
    assert run_cli(other, "--baseline", base, "-q")[0] == 1


def test_gate_function(db):
    from diagnose.model import Finding, Hit

    oom, nan7, adv = db.get("MB-OOM-001"), db.get("MB-NAN-007"), db.get("MB-OOM-011")
    f_oom = Finding(oom, Hit(oom.id, "x.log", 1, oom_lines(0)[3]))
    f_nan = Finding(nan7, Hit(nan7.id, "x.log", 2, "number of nan iterations:   1"))
    f_adv = Finding(adv, Hit(adv.id, "x.log", 3, "advice"))
    g = BL.gate([f_oom, f_nan, f_adv], "error")
    assert g.failing == [f_oom] and f_nan in g.below and f_adv in g.below
    g = BL.gate([f_oom, f_nan, f_adv], "info")
    assert g.failing == [f_oom, f_nan] and g.below == [f_adv]  # advice never fails
    bl = BL.Baseline({BL.entry(f_oom)["fingerprint"]})
    g = BL.gate([f_oom, f_nan], "warning", bl)
    assert g.known == [f_oom] and g.failing == [f_nan] and not g.ok


@pytest.mark.parametrize("content,msg", [
    ("{not json", "invalid JSON"),
    ('{"findings": []}', "not a diagnose baseline"),
    ('{"diagnose_baseline": 99, "findings": []}', "version 99"),
    ('{"diagnose_baseline": 1, "findings": [{"signature": "x"}]}', "no 'fingerprint'"),
])
def test_bad_baseline_is_a_usage_error(tmp_path, run_cli, content, msg):
    bad = tmp_path / "b.json"
    bad.write_text(content, encoding="utf-8")
    log = write(tmp_path / "ok.log", healthy_lines(160))
    code, out, err = run_cli(log, "--baseline", str(bad))
    assert code == 2 and msg in err and "Traceback" not in err and out == ""


def test_missing_baseline_is_a_usage_error(tmp_path, run_cli):
    code, _, err = run_cli(write(tmp_path / "ok.log", healthy_lines(160)), "--baseline", str(tmp_path / "nope.json"))
    assert code == 2 and "no such baseline file" in err


def test_normalisation_masks_what_reruns_change():
    a = "[rank3]:[E1128 02:21:14.061727749 ProcessGroupNCCL.cpp:683] [Rank 3] pid=4021 at 0x7f3a2b1c: 2.00 GiB"
    b = "[rank9]:[E1129 11:05:59.000000001 ProcessGroupNCCL.cpp:683] [Rank 9] pid=77 at 0x7f00aa: 12.5 GiB"
    assert normalize_text(a) == normalize_text(b)
    assert normalize_text("CUDA out of memory") != normalize_text("NCCL error")
    assert normalize_file("logs/2026-11-28/slurm-1234.out") == normalize_file("/x/slurm-99.out") == "slurm-<n>.out"
    assert normalize_file("train.log") != normalize_file("eval.log")


def test_baseline_file_is_stable_and_sorted(tmp_path, db):
    from diagnose.diagnosis import diagnose_paths

    log = write(tmp_path / "run.log", healthy_lines() + oom_lines(0))
    rep = diagnose_paths([log], db)
    a, b = BL.dumps(rep.findings), BL.dumps(list(reversed(rep.findings)))
    assert a == b
    n = BL.write(str(tmp_path / "bl.json"), rep.findings)
    assert n == len(rep.findings) and BL.load(str(tmp_path / "bl.json")).fingerprints


def test_fingerprint_depends_on_the_evidence_and_the_log_name_not_on_numbers():
    from diagnose.fingerprint import fingerprint_of

    oom = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    same = "[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB"
    other = "[rank3]: torch.OutOfMemoryError: CUDA out of memory while capturing a CUDA graph"
    a = fingerprint_of("MB-OOM-001", oom, "/ci/slurm-1001.out")
    assert len(a) == 32 and int(a, 16) >= 0
    assert fingerprint_of("MB-OOM-001", same, "/other/slurm-2417.out") == a  # numbers and folders masked
    assert fingerprint_of("MB-OOM-001", other, "/ci/slurm-1001.out") != a  # another failure
    assert fingerprint_of("MB-OOM-003", oom, "/ci/slurm-1001.out") != a  # another signature


def test_normalisation_of_empty_multiline_and_windows_paths():
    assert normalize_text("") == "" and normalize_text(None) == ""
    assert normalize_text("[rank1]: line one\n[rank1]:   line  two") == "line one line two"
    assert len(normalize_text("x " * 400)) == 500
    assert normalize_file("C:\\runs\\job-42\\train-7.log") == "train-<n>.log"
    assert normalize_file("") == "" and normalize_file(None) == ""


def test_colliding_fingerprints_are_made_unique_and_stable():
    from diagnose.db import load
    from diagnose.fingerprint import fingerprint, unique_fingerprints
    from diagnose.model import Finding, Hit

    sig = load().get("MB-OOM-001")
    text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    fs = [Finding(sig, Hit(sig.id, "run.log", line, text)) for line in (10, 20, 30)]
    fps = unique_fingerprints(fs)
    assert fps[0] == fingerprint(fs[0]) and len(set(fps)) == 3 and all(len(x) == 32 for x in fps)
    assert unique_fingerprints(fs) == fps  # the same log gives the same answer
    # two collisions at one line: the counter takes over, still unique
    twins = [Finding(sig, Hit(sig.id, "run.log", 10, text)) for _ in range(3)]
    got = unique_fingerprints(twins)
    assert len(set(got)) == 3 and all(isinstance(x, str) and len(x) == 32 and int(x, 16) >= 0 for x in got)
    from diagnose.fingerprint import fingerprint_of

    assert fingerprint(fs[0]) == fingerprint_of("MB-OOM-001", text, "run.log")  # the first hit's text and file


def test_baseline_file_format_is_the_documented_one(tmp_path, db):
    """A baseline is reviewed in pull requests: its layout is part of the contract (docs/ci.md):
    the three top-level keys in this order, 2-space indentation, each entry with its signature,
    title, severity, normalised file and evidence (mutation testing found none of it checked)."""
    from diagnose.diagnosis import diagnose_paths

    log = write(tmp_path / "run.log", healthy_lines() + oom_lines(0))
    rep = diagnose_paths([log], db)
    text = BL.dumps(rep.findings)
    assert text.startswith('{\n  "diagnose_baseline": ') and text.endswith("}\n")
    doc = json.loads(text)
    assert list(doc) == ["diagnose_baseline", "fingerprint_version", "findings"]
    assert doc["fingerprint_version"] == BL.FINGERPRINT_VERSION
    by_sig = {f.signature.id: f for f in rep.findings}
    for e in doc["findings"]:
        assert list(e) == ["fingerprint", "signature", "title", "severity", "file", "evidence"]
        f = by_sig[e["signature"]]
        assert (e["title"], e["severity"]) == (f.signature.title, f.signature.severity)
        assert e["file"] == normalize_file(f.first.file) and e["evidence"] == normalize_text(f.first.text)
    path = tmp_path / "bl.json"
    BL.write(str(path), rep.findings)
    got = BL.load(str(path))
    assert got.entries == doc["findings"] and got.source == str(path)
    assert path.read_text() == text


def test_a_baseline_of_another_fingerprint_version_is_refused(tmp_path):
    p = tmp_path / "bl.json"
    p.write_text(json.dumps({"diagnose_baseline": BL.BASELINE_VERSION, "fingerprint_version": BL.FINGERPRINT_VERSION + 1,
                             "findings": []}))
    with pytest.raises(BL.BaselineError, match="fingerprint"):
        BL.load(str(p))


def test_a_baseline_written_elsewhere_in_another_encoding_is_read_as_utf8(tmp_path, monkeypatch):
    import locale

    p = tmp_path / "bl.json"
    p.write_bytes(json.dumps({"diagnose_baseline": BL.BASELINE_VERSION, "fingerprint_version": BL.FINGERPRINT_VERSION,
                              "findings": [{"fingerprint": "f" * 16, "evidence": "é ✓"}]}, ensure_ascii=False).encode())
    monkeypatch.setattr(locale, "getpreferredencoding", lambda *a, **k: "latin-1")
    assert BL.load(str(p)).entries[0]["evidence"] == "é ✓"
