"""diagnose compare on fixture pairs (fixtures/logs/compare/) that pass and that fail each criterion."""
import json

import pytest
from ci_samples import COMPARE

from diagnose import compare as C
from diagnose.compare_logs import compare as compare_logs

BASE = str(COMPARE / "bridge_baseline.log")
MLM_BASE = str(COMPARE / "mlm_baseline.log")


def run(run_cli, *args):
    code, out, err = run_cli("compare", *args, "--format", "json")
    doc = json.loads(out) if out.strip() else None
    return code, doc, err


def status(doc):
    return {c["name"]: c["status"] for c in doc["criteria"]}


def test_bridge_50_percent_passes_every_criterion(run_cli):
    code, doc, _ = run(run_cli, BASE, str(COMPARE / "bridge_offload50_pass.log"), "--world-size", "16")
    assert code == 0 and doc["passed"] is True
    assert status(doc) == dict.fromkeys(["config", "completed", "loss", "memory", "speed"], "pass")
    crit = {c["name"]: c for c in doc["criteria"]}
    assert crit["loss"]["measured"] < 0.001
    assert crit["speed"]["expected"] == pytest.approx(2.5)
    assert 2.3 < crit["speed"]["measured"] < 2.7
    assert 7.0 < crit["memory"]["measured"] < 8.2  # 47.2 GB -> 39.6 GB
    assert doc["offload"]["effective_fraction"] == 0.5
    assert len(doc["series"]["baseline"]) == len(doc["series"]["run"]) == 20


def test_mlm_100_percent_with_overlap_passes(run_cli):
    code, doc, _ = run(run_cli, MLM_BASE, str(COMPARE / "mlm_offload100_overlap_pass.log"))
    assert code == 0, doc["criteria"]
    crit = {c["name"]: c for c in doc["criteria"]}
    assert crit["speed"]["expected"] == pytest.approx(3.9)  # 100 % with overlap_cpu_optimizer_d2h_h2d
    assert doc["offload"]["overlap_cpu_optimizer_d2h_h2d"] is True
    assert doc["run"]["peak_allocated_gb"] == pytest.approx(32.0, abs=0.1)  # MiB lines read as GB


@pytest.mark.parametrize("log,failing,extra", [
    ("bridge_offload50_loss_fail.log", {"loss"}, ["--world-size", "16"]),
    ("bridge_offload50_memory_fail.log", {"memory"}, ["--world-size", "16"]),
    ("bridge_offload50_slow_fail.log", {"speed"}, ["--world-size", "16"]),
    ("bridge_offload25_oom_fail.log", {"completed"}, ["--world-size", "16"]),
    ("bridge_offload50_nccl_fail.log", {"completed"}, ["--world-size", "16"]),
    ("bridge_offload50_stopped_fail.log", {"completed"}, ["--world-size", "16"]),
    ("bridge_activation_offload_pp2_config_fail.log", {"config", "completed"}, []),
    ("mlm_offload100_slow_fail.log", {"speed"}, []),
])
def test_each_criterion_fails_on_its_fixture(run_cli, log, failing, extra):
    base = MLM_BASE if log.startswith("mlm") else BASE
    code, doc, _ = run(run_cli, base, str(COMPARE / log), *extra)
    assert code == 1 and doc["passed"] is False
    assert {k for k, v in status(doc).items() if v == "fail"} == failing


def test_failure_details(run_cli):
    _, doc, _ = run(run_cli, BASE, str(COMPARE / "bridge_offload25_oom_fail.log"), "--world-size", "16")
    done = next(c for c in doc["criteria"] if c["name"] == "completed")
    assert "MB-OOM-001" in done["detail"] and "stopped at iteration 3 of 20" in done["detail"]
    _, doc, _ = run(run_cli, BASE, str(COMPARE / "bridge_offload50_nccl_fail.log"), "--world-size", "16")
    assert "NCCL" in next(c for c in doc["criteria"] if c["name"] == "completed")["detail"]
    _, doc, _ = run(run_cli, BASE, str(COMPARE / "bridge_offload50_loss_fail.log"), "--world-size", "16")
    loss = next(c for c in doc["criteria"] if c["name"] == "loss")
    assert loss["measured"] == pytest.approx(0.052, abs=1e-4) and "iteration 20" in loss["detail"]


def test_max_loss_delta_is_settable(run_cli):
    log = str(COMPARE / "bridge_offload50_loss_fail.log")
    code, doc, _ = run(run_cli, BASE, log, "--world-size", "16", "--max-loss-delta", "0.1")
    assert code == 0 and status(doc)["loss"] == "pass"
    code, doc, _ = run(run_cli, BASE, str(COMPARE / "bridge_offload50_pass.log"), "--world-size", "16",
                       "--max-loss-delta", "0.0001")
    assert code == 1 and status(doc)["loss"] == "fail"


def test_memory_not_checked_without_world_size_or_config(run_cli):
    # a Bridge log does not print the world size: the expected drop is not guessed
    code, doc, err = run(run_cli, BASE, str(COMPARE / "bridge_offload50_memory_fail.log"))
    assert code == 0 and status(doc)["memory"] == "not checked"
    assert "not checked: memory" in err  # said, not silent (issue 13)
    assert "--world-size" in next(c for c in doc["criteria"] if c["name"] == "memory")["detail"]
    code, doc, _ = run(run_cli, BASE, str(COMPARE / "bridge_offload50_memory_fail.log"), "--strict")
    assert code == 1  # --strict: what cannot be checked fails the gate
    # no config in the log and none given: neither memory nor speed can be judged
    code, doc, _ = run(run_cli, BASE, str(COMPARE / "bridge_offload50_noconfig.log"), "--world-size", "16")
    assert status(doc)["memory"] == "not checked" and status(doc)["speed"] == "not checked"
    # ... with --config they can
    code, doc, _ = run(run_cli, BASE, str(COMPARE / "bridge_offload50_noconfig.log"), "--world-size", "16",
                       "--config", str(COMPARE / "offload50_run_config.yaml"))
    assert code == 0 and set(status(doc).values()) == {"pass"}


def test_measured_rule_only_for_the_reference_job(monkeypatch, db):
    def cannot_size(*a, **k):
        raise C.mm.MemoryModelError("the config leaves out the model's shape")

    monkeypatch.setattr(C.mm, "estimate", cannot_size)  # as if the memory model could not size it
    cmp = compare_logs(BASE, str(COMPARE / "bridge_offload50_pass.log"), db, world_size=16)
    mem = cmp.criterion("memory")
    assert mem.status == "pass" and mem.expected == pytest.approx(7.6) and "3.8 GB per 25 %" in mem.detail
    cmp = compare_logs(BASE, str(COMPARE / "bridge_offload50_memory_fail.log"), db, world_size=16)
    assert cmp.criterion("memory").status == "fail"
    # another world size: not the reference job, so the rule does not apply
    cmp = compare_logs(BASE, str(COMPARE / "bridge_offload50_pass.log"), db, world_size=32)
    assert cmp.criterion("memory").status == "not checked"
    assert "holds only for Qwen3-30B-A3B" in cmp.criterion("memory").detail


def test_memory_model_is_used_when_present(db):
    cmp = compare_logs(BASE, str(COMPARE / "bridge_offload50_pass.log"), db, world_size=16)
    mem = cmp.criterion("memory")
    assert "memory model" in mem.detail and mem.status == "pass"
    assert 6.0 < mem.expected < 9.0  # HDO moves Adam m+v of half the sharded states: ~7.6 GB here


def test_expected_penalty_curve():
    assert C.expected_penalty(0.0) == 1.0
    assert C.expected_penalty(0.25) == pytest.approx(1.9)
    assert C.expected_penalty(0.5) == pytest.approx(2.5)
    assert C.expected_penalty(0.75) == pytest.approx(3.2)
    assert C.expected_penalty(1.0) == pytest.approx(4.2)
    assert C.expected_penalty(1.0, overlap=True) == pytest.approx(3.9)
    assert C.expected_penalty(0.375) == pytest.approx(2.2)  # interpolated
    assert C.expected_penalty(1.5) == pytest.approx(4.2)  # HDO offloads everything above 1.0


def test_text_table_and_terminal_chart(run_cli):
    code, out, _ = run_cli("compare", BASE, str(COMPARE / "bridge_offload50_slow_fail.log"), "--world-size", "16")
    assert code == 1
    assert "Iteration time within the expected penalty" in out and "FAIL" in out and "FAILED" in out
    assert "lm loss (" in out and "iteration time (" in out
    chart = out[out.index("iterations 1..20"):]
    rows = [ln for ln in chart.splitlines() if ln.strip().startswith(("baseline", "run"))]
    assert len(rows) == 5  # loss (2), iteration time (2), |loss delta| (1)
    assert "within the limit" in rows[4]
    base_t, run_t = rows[2].split()[1], rows[3].split()[1]
    assert len(base_t) == len(run_t) == 20
    assert set(run_t) == {"█"} and base_t.count("▁") >= 18  # 3.6x slower, on one shared scale


def test_ascii_chart_and_loss_delta_row():
    from diagnose.commands.compare import render_chart

    cmp = compare_logs(BASE, str(COMPARE / "bridge_offload50_loss_fail.log"))
    text = render_chart(cmp, ascii_only=True)
    assert text.isascii() and "baseline" in text
    assert "over the limit at 13 iteration(s) from 8" in text


def test_plot_png(run_cli, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'diagnose[plot]')")
    png = tmp_path / "cmp.png"
    code, doc, _ = run(run_cli, BASE, str(COMPARE / "bridge_offload50_pass.log"), "--world-size", "16",
                       "--plot", str(png))
    assert code == 0 and doc["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_bad_input_is_exit_2(run_cli, tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("nothing to see\n", encoding="utf-8")
    code, _, err = run_cli("compare", str(empty), str(COMPARE / "bridge_offload50_pass.log"))
    assert code == 2 and "no iteration line" in err and "Traceback" not in err
    code, _, err = run_cli("compare", str(tmp_path / "missing.log"), BASE)
    assert code == 2 and "Traceback" not in err
    code, _, err = run_cli("compare", BASE, BASE, "--config", str(tmp_path / "missing.yaml"))
    assert code == 2 and "no such file" in err


def test_different_log_intervals_are_not_compared_for_loss(tmp_path, db):
    lines = (COMPARE / "bridge_offload50_pass.log").read_text(encoding="utf-8").splitlines()
    keep = [ln for ln in lines if " iteration " not in ln or any(f"iteration {i:8d}/" in ln for i in (2, 4, 6, 8))]
    sparse = tmp_path / "every2.log"
    sparse.write_text("\n".join(keep) + "\n", encoding="utf-8")
    cmp = compare_logs(BASE, str(sparse), db, world_size=16)
    loss = cmp.criterion("loss")
    assert loss.status == "not checked" and "log_interval" in loss.detail
