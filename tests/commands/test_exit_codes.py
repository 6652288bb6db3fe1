"""One test per exit code of the scan (0 / 1 / 2 / 3) and of compare (0 / 1 / 2), as documented."""
import pytest
from ci_samples import COMPARE, healthy_lines, nan_count_lines, oom_lines, write

from diagnose import exitcodes


def test_0_healthy(tmp_path, run_cli):
    assert run_cli(write(tmp_path / "ok.log", healthy_lines(160)))[0] == exitcodes.OK == 0


def test_1_failure_found(tmp_path, run_cli):
    assert run_cli(write(tmp_path / "oom.log", healthy_lines() + oom_lines()), "-q")[0] == exitcodes.FINDINGS == 1


@pytest.mark.parametrize("fail_on,expected", [("error", 0), ("warning", 1), ("info", 1)])
def test_fail_on_threshold(tmp_path, run_cli, fail_on, expected):
    log = write(tmp_path / "nan.log", nan_count_lines())  # a warning-severity root cause
    assert run_cli(log, "--fail-on", fail_on, "-q")[0] == expected


@pytest.mark.parametrize("args", [
    ["{missing}"],
    ["{ok}", "--fail-on", "fatal"],
    ["{ok}", "--format", "nope"],
    ["{ok}", "-o", "{tmp}/no/such/dir/report.sarif", "--format", "sarif"],
    ["{ok}", "--baseline", "{tmp}/missing.json"],
    ["{ok}", "--write-baseline", "{tmp}/no/such/dir/b.json"],
    [],
])
def test_2_usage_or_input_error(tmp_path, run_cli, args):
    ok = write(tmp_path / "ok.log", healthy_lines(160))
    argv = [a.format(missing=str(tmp_path / "missing.log"), ok=ok, tmp=str(tmp_path)) for a in args]
    code, _out, err = run_cli(*argv)
    assert code == exitcodes.USAGE == 2
    assert "Traceback" not in err and err.strip()


def test_3_internal_error(tmp_path, run_cli, monkeypatch):
    import importlib

    scan_cmd = importlib.import_module("diagnose.commands.scan")  # the module (the package exports the command)

    def boom(*a, **k):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(scan_cmd, "diagnose_paths", boom)
    monkeypatch.delenv("DIAGNOSE_DEBUG", raising=False)
    code, _, err = run_cli(write(tmp_path / "ok.log", healthy_lines(160)))
    assert code == exitcodes.INTERNAL == 3
    assert "internal error: RuntimeError: simulated bug" in err and "Traceback" not in err


def test_machine_format_to_file_keeps_stdout_clean(tmp_path, run_cli):
    out_file = tmp_path / "report.sarif"
    code, out, err = run_cli(write(tmp_path / "oom.log", healthy_lines() + oom_lines()), "--format", "sarif",
                             "-o", str(out_file))
    assert code == 1 and out == "" and out_file.read_text(encoding="utf-8").startswith("{")
    assert "root cause: MB-OOM-001" in err and f"report written to {out_file}" in err


def test_text_to_file_puts_the_summary_on_stderr(tmp_path, run_cli):
    out_file = tmp_path / "report.txt"
    code, out, err = run_cli(write(tmp_path / "ok.log", healthy_lines(160)), "-o", str(out_file))
    assert code == 0 and out == "" and "healthy" in out_file.read_text(encoding="utf-8")
    assert "diagnose: healthy" in err


def test_help_documents_the_exit_codes(run_cli):
    code, out, _ = run_cli("scan", "--help")
    assert code == 0
    flat = " ".join(out.split())
    assert "Exit codes: 0" in flat and "1 failure found" in flat and "2 usage or input error" in flat
    assert "3 internal error" in flat and "--fail-on" in flat and "--baseline" in flat


def test_compare_exit_codes(run_cli, tmp_path):
    base = str(COMPARE / "bridge_baseline.log")
    assert run_cli("compare", base, str(COMPARE / "bridge_offload50_pass.log"), "--world-size", "16")[0] == 0
    assert run_cli("compare", base, str(COMPARE / "bridge_offload50_slow_fail.log"), "--world-size", "16")[0] == 1
    assert run_cli("compare", base, str(tmp_path / "missing.log"))[0] == 2
    assert run_cli("compare", base, base, "--max-loss-delta", "0")[0] == 2


def test_an_output_that_names_an_input_is_refused_and_the_input_kept(tmp_path, run_cli):
    log = write(tmp_path / "run.log", oom_lines(0))
    before = open(log, "rb").read()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("optimizer:\n  optimizer_cpu_offload: true\n")
    link = tmp_path / "link.log"
    link.symlink_to(log)
    for args in (("-o", log), ("--write-baseline", log), ("-o", str(link)), ("--config", str(cfg), "-o", str(cfg))):
        code, _, err = run_cli(log, *args, "--format", "json")
        assert code == 2 and "one of the inputs" in err, (args, err)
    assert open(log, "rb").read() == before and cfg.read_text() == "optimizer:\n  optimizer_cpu_offload: true\n"
    # a new file, or updating the baseline that was read, is fine
    assert run_cli(log, "-o", str(tmp_path / "report.json"), "--format", "json")[0] == 1
    base = str(tmp_path / "accepted.json")
    assert run_cli(log, "--write-baseline", base, "-q")[0] == 0
    assert run_cli(log, "--baseline", base, "--write-baseline", base, "-q")[0] == 0


# --- the conventions of the tools users know (issue 13) -----------------------------------------
def test_a_misspelt_subcommand_gets_did_you_mean(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _out, err = run_cli("chek", "foo.yaml")
    assert code == exitcodes.USAGE and "did you mean 'diagnose check'" in err


def test_a_file_named_like_a_command_is_still_scanned(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "chek").write_text("all good\n")
    code, _out, err = run_cli("chek")
    assert code == exitcodes.OK and "did you mean" not in err


def test_short_version_flag(run_cli):
    code, out, _err = run_cli("-V")
    assert code == 0 and out.startswith("diagnose, version")


def test_signatures_test_and_list_refuse_what_does_not_exist(run_cli):
    code, _, err = run_cli("signatures", "test", "MB-NOPE")
    assert code == exitcodes.USAGE and "no signature 'MB-NOPE'" in err
    code, _, err = run_cli("signatures", "list", "--category", "cuda_omm")
    assert code == exitcodes.USAGE and "did you mean 'cuda_oom'" in err
    code, out, _ = run_cli("signatures", "test", "MB-OFF-101")
    assert code == 0 and "(1 signatures)" in out


def test_every_user_error_is_one_error_model_and_exits_2(tmp_path, run_cli, monkeypatch):
    """A DiagnoseError that no command translated still reaches the user as one line and exit 2
    (cli.main translates it once), never as an internal error (3) with a traceback."""
    import diagnose.commands.scan as SC
    from diagnose.baseline import BaselineError
    from diagnose.compare import CompareError
    from diagnose.config.load import ConfigError
    from diagnose.db import DatabaseError
    from diagnose.errors import DiagnoseError
    from diagnose.launch.base import LaunchError
    from diagnose.layer_tables import LayerError
    from diagnose.logs.read import InputError
    from diagnose.parallel import ShardError
    from diagnose.remedy.edit import EditError
    from diagnose.settings import SettingsError

    for cls in (BaselineError, CompareError, ConfigError, DatabaseError, LaunchError, LayerError, InputError,
                ShardError, EditError, SettingsError):
        assert issubclass(cls, DiagnoseError), cls

    def boom(*a, **k):
        raise InputError("run.log: permission denied")

    monkeypatch.setattr(SC, "diagnose_paths", boom)
    code, out, err = run_cli(write(tmp_path / "ok.log", healthy_lines(10)))
    assert code == exitcodes.USAGE == 2 and out == ""
    assert err.strip() == "Error: run.log: permission denied"
