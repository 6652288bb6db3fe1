"""--format sarif: valid SARIF 2.1.0 (the official schema), rules from the database, stable fingerprints."""
import json

import pytest
from ci_samples import SCHEMA, healthy_lines, oom_lines, write

from diagnose.fingerprint import SARIF_KEY


@pytest.fixture(scope="module")
def schema():
    return json.loads(SCHEMA.read_text(encoding="utf-8"))  # tests/data: shipped, never skipped


def validate(doc, schema):
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    errors = sorted(cls(schema).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])


def sarif(run_cli, *args):
    code, out, err = run_cli(*args, "--format", "sarif")
    return code, json.loads(out), err


def test_oom_log_is_valid_sarif_with_rules_results_and_fix(tmp_path, run_cli, schema, db):
    log = write(tmp_path / "run.log", healthy_lines() + oom_lines())
    code, doc, err = sarif(run_cli, log)
    assert code == 1
    assert "root cause: MB-OOM-001" in err  # the human summary goes to stderr, the SARIF alone to stdout
    validate(doc, schema)
    run = doc["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules][:len(db.signatures)] == [s.id for s in db.signatures]
    oom_rule = next(r for r in rules if r["id"] == "MB-OOM-001")
    assert oom_rule["shortDescription"]["text"] == db.get("MB-OOM-001").title
    assert "How to confirm" in oom_rule["help"]["text"] and "Fix (safe)" in oom_rule["help"]["text"]
    for r in rules:  # every reference becomes a link to the MCore / Bridge source file
        s = db.get(r["id"])
        refs = [x for x in s.references if x.get("repo") and x.get("path")]
        if refs:
            assert r["helpUri"] == f"https://github.com/{refs[0]['repo']}/blob/main/{refs[0]['path']}"
    results = run["results"]
    first = results[0]
    assert first["ruleId"] == "MB-OOM-001" and first["level"] == "error"
    assert rules[first["ruleIndex"]]["id"] == "MB-OOM-001"
    assert first["properties"]["rootCause"] is True
    loc = first["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"].endswith("run.log")
    assert loc["region"]["startLine"] == 44  # 40 healthy lines, then the traceback: the exception line
    assert "CUDA out of memory" in loc["region"]["snippet"]["text"]
    overrides = first["properties"]["overrides"]
    assert overrides and all("=" in o for o in overrides)
    fix_texts = [" ".join(fx.text.split()) for fx in db.get("MB-OOM-001").fixes]
    assert first["properties"]["fix"].split(" Overrides: ")[0] in fix_texts  # the fix, as text
    assert "Fix: " in first["message"]["text"] and " ".join(overrides) in first["message"]["text"]
    assert all(SARIF_KEY in r["partialFingerprints"] for r in results)
    assert len({r["partialFingerprints"][SARIF_KEY] for r in results}) == len(results)
    assert run["artifacts"][0]["location"]["uri"].endswith("run.log")
    assert run["invocations"][0]["properties"]["gate"] == "fail"


def test_healthy_log_is_valid_sarif_without_results(tmp_path, run_cli, schema):
    log = write(tmp_path / "ok.log", healthy_lines(160))
    code, doc, _ = sarif(run_cli, log)
    assert code == 0
    validate(doc, schema)
    assert doc["runs"][0]["results"] == []


def test_fingerprints_are_stable_across_reruns_and_unrelated_changes(tmp_path, run_cli):
    a = write(tmp_path / "slurm-1001.out", healthy_lines() + oom_lines(0))
    # a rerun: other timestamps, pids, ranks and sizes, more lines before and after, another job id
    b = write(tmp_path / "slurm-2417.out", healthy_lines(90) + ["some unrelated line"] + oom_lines(1) + ["bye"])
    _, da, _ = sarif(run_cli, a)
    _, db_, _ = sarif(run_cli, b)
    fa = {r["ruleId"]: r["partialFingerprints"][SARIF_KEY] for r in da["runs"][0]["results"]}
    fb = {r["ruleId"]: r["partialFingerprints"][SARIF_KEY] for r in db_["runs"][0]["results"]}
    assert fa and fa == fb
    la = da["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["startLine"]
    lb = db_["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["startLine"]
    assert la != lb  # the line moved, the fingerprint did not


def test_baseline_state_marks_new_and_unchanged(tmp_path, run_cli, schema):
    (tmp_path / "night1").mkdir()
    (tmp_path / "night2").mkdir()
    old = write(tmp_path / "night1" / "train.log", healthy_lines() + oom_lines(0))
    base = str(tmp_path / "baseline.json")
    assert run_cli(old, "--write-baseline", base, "-q")[0] == 0
    new = write(tmp_path / "night2" / "train.log", healthy_lines() + oom_lines(1) + nccl_lines())
    code, doc, _ = sarif(run_cli, new, "--baseline", base)
    validate(doc, schema)
    states = {r["ruleId"]: r["baselineState"] for r in doc["runs"][0]["results"]}
    assert states["MB-OOM-001"] == "unchanged"
    assert "new" in states.values()
    assert code == 1


def nccl_lines():
    from ci_samples import nccl_error_lines

    return nccl_error_lines()
