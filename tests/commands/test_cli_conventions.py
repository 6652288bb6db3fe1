"""Conventions of the command line that issue 13 found missing, one test each: a baseline-accepted
root cause is said calmly, help points at the scan's options, each command lists its own exit
codes, -q silences stderr, and `signatures list` takes the terminal's width."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SEED = str(REPO / "fixtures" / "logs" / "seed" / "qwen3_30b_a3b_activation_offload_pp1_oom.log")


def test_a_root_cause_the_baseline_accepts_is_known_not_an_alarm(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    base = str(tmp_path / "accepted.json")
    assert run_cli(SEED, "--write-baseline", base, "-q")[0] == 0
    code, out, _ = run_cli(SEED, "--baseline", base, "--color", "never")
    head = " ".join(ln.strip() for ln in out.splitlines()[:3])
    assert code == 0 and out.startswith("known[MB-OFF-101]") and "not failing the gate" in head
    assert "error[" not in out


def test_help_says_where_the_scan_options_are_and_each_command_lists_its_own_exit_codes(run_cli):
    code, out, _ = run_cli("--help")
    assert code == 0 and "diagnose scan --help" in " ".join(out.split())
    _, check_help, _ = run_cli("check", "--help")
    flat = " ".join(check_help.split())
    assert "the config passes" in flat and "relaunched" not in flat and "unsafe fix" not in flat


def test_quiet_leaves_stderr_empty(run_cli, tmp_path):
    report = tmp_path / "report.json"
    code, out, err = run_cli(SEED, "--format", "json", "-o", str(report))
    assert code == 1 and out == "" and "diagnose:" in err  # the one-line summary goes to stderr
    code, out, err = run_cli(SEED, "--format", "json", "-o", str(report), "-q")
    assert code == 1 and out == "" and err == "" and report.read_text().startswith("{")


def test_signatures_list_takes_the_terminals_width(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "90")
    code, out, _ = run_cli("signatures", "list")
    lines = out.splitlines()
    assert code == 0 and lines and max(len(ln) for ln in lines) <= 90
