"""--format junit: testsuites/testsuite/testcase/failure as GitLab and Jenkins read it, one testcase
per signature of the database."""
import xml.etree.ElementTree as ET

from ci_samples import healthy_lines, nan_count_lines, oom_lines, write


def junit(run_cli, *args):
    code, out, err = run_cli(*args, "--format", "junit")
    return code, ET.fromstring(out.encode("utf-8")), err


def cases(root):
    return {tc.get("name").split()[0]: tc for suite in root.findall("testsuite") for tc in suite.findall("testcase")}


def test_structure_one_testcase_per_signature(tmp_path, run_cli, db):
    log = write(tmp_path / "run.log", healthy_lines() + oom_lines())
    code, root, _ = junit(run_cli, log)
    assert code == 1
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert suites and all(s.get("name").startswith("diagnose.") for s in suites)
    assert {s.get("name") for s in suites} == {f"diagnose.{f.rsplit('.', 1)[0]}" for f in db.files}
    tcs = cases(root)
    assert set(tcs) == {s.id for s in db.signatures}
    assert int(root.get("tests")) == len(db.signatures) == sum(int(s.get("tests")) for s in suites)
    for s in suites:  # the counts GitLab / Jenkins read agree with the children
        assert int(s.get("tests")) == len(s.findall("testcase"))
        assert int(s.get("failures")) == sum(1 for tc in s.findall("testcase") if tc.find("failure") is not None)
        assert s.get("errors") == "0" and s.get("timestamp")
    oom = tcs["MB-OOM-001"]
    fail = oom.find("failure")
    assert fail is not None and "CUDA out of memory" in fail.get("message") and "Cause:" in fail.text
    assert oom.get("classname") == "diagnose.oom.cuda_oom" and oom.get("file").endswith("run.log")
    # the NCCL timeout on rank 1 is a cascade of the OOM, but still an error finding: it fails too
    failing = {k for k, tc in tcs.items() if tc.find("failure") is not None}
    assert "MB-NCCL-001" in failing
    assert int(root.get("failures")) == len(failing)
    # signatures not found pass without output
    assert tcs["MB-OFF-002"].find("failure") is None and tcs["MB-OFF-002"].find("system-out") is None


def test_below_threshold_passes_with_output_and_fail_on_warning_fails(tmp_path, run_cli):
    log = write(tmp_path / "nan.log", nan_count_lines())
    code, root, _ = junit(run_cli, log)
    assert code == 0
    tc = cases(root)["MB-NAN-007"]
    assert tc.find("failure") is None and "below --fail-on error" in tc.find("system-out").text
    code, root, _ = junit(run_cli, log, "--fail-on", "warning")
    assert code == 1
    assert cases(root)["MB-NAN-007"].find("failure") is not None
    assert root.get("failures") == "1"


def test_healthy_log_has_no_failure(tmp_path, run_cli):
    code, root, _ = junit(run_cli, write(tmp_path / "ok.log", healthy_lines(160)))
    assert code == 0 and root.get("failures") == "0"
    assert all(tc.find("failure") is None for tc in cases(root).values())


def test_the_root_cause_is_the_first_testcase(run_cli, repo):
    """A CI page lists cases in file order: the root cause comes first, before confirmations."""
    log = str(repo / "fixtures" / "logs" / "seed" / "qwen3_30b_a3b_activation_offload_pp1_oom.log")
    _code, root, _ = junit(run_cli, log)
    first = root.find("testsuite").find("testcase")
    assert first.get("name").startswith("MB-OFF-101") and first.find("failure") is not None
