"""--format markdown: the report as GitHub-flavoured Markdown."""
from ci_samples import healthy_lines, oom_lines, write


def test_markdown_root_cause_and_findings(tmp_path, run_cli):
    log = write(tmp_path / "run.log", healthy_lines() + oom_lines())
    code, out, err = run_cli(log, "--format", "markdown")
    assert code == 1 and "root cause" in err
    assert out.startswith("## diagnose: ")
    assert "Gate **failed**" in out
    assert "### Root cause: CUDA out of memory" in out
    assert "| Fix |" in out and "| Source | [" in out and "https://github.com/" in out
    assert "### Findings" in out and "| ❌ | `MB-OOM-001` |" in out


def test_markdown_healthy(tmp_path, run_cli):
    code, out, _ = run_cli(write(tmp_path / "ok.log", healthy_lines(160)), "--format", "markdown")
    assert code == 0 and "Gate **passed**" in out and "looks healthy" in out and "### Findings" not in out
