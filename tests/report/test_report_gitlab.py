"""--format gitlab: Code Quality JSON with the fields GitLab requires and unique fingerprints."""
import json

from ci_samples import healthy_lines, oom_lines, write

from diagnose.fingerprint import fingerprint, unique_fingerprints
from diagnose.model import Finding, Hit

REQUIRED = ("description", "check_name", "fingerprint", "severity", "location")
SEVERITIES = {"info", "minor", "major", "critical", "blocker"}


def test_required_fields_and_unique_fingerprints(tmp_path, run_cli):
    log = write(tmp_path / "run.log", healthy_lines() + oom_lines())
    code, out, _ = run_cli(log, "--format", "gitlab")
    assert code == 1
    issues = json.loads(out)
    assert isinstance(issues, list) and len(issues) >= 2
    for i in issues:
        for k in REQUIRED:
            assert i[k], k
        assert i["severity"] in SEVERITIES
        assert i["location"]["path"].endswith("run.log")
        assert isinstance(i["location"]["lines"]["begin"], int) and i["location"]["lines"]["begin"] >= 1
    assert len({i["fingerprint"] for i in issues}) == len(issues)
    root = issues[0]
    assert root["check_name"] == "MB-OOM-001" and root["severity"] == "blocker"
    assert root["description"].startswith("Root cause: MB-OOM-001")


def test_healthy_log_is_an_empty_array(tmp_path, run_cli):
    code, out, _ = run_cli(write(tmp_path / "ok.log", healthy_lines(160)), "--format", "gitlab")
    assert code == 0 and json.loads(out) == []


def test_colliding_fingerprints_are_made_unique_and_stay_stable(db):
    sig = db.get("MB-OOM-001")
    text = oom_lines()[3]
    a = Finding(sig, Hit(sig.id, "a/train.log", 10, text))
    b = Finding(sig, Hit(sig.id, "b/train.log", 99, text))  # same signature, text and basename
    assert fingerprint(a) == fingerprint(b)
    fps = unique_fingerprints([a, b])
    assert len(set(fps)) == 2 and fps[0] == fingerprint(a)
    assert unique_fingerprints([a, b]) == fps  # deterministic
