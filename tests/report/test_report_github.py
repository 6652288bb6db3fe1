"""--format github: workflow commands aggregated per signature within GitHub's per-step limits,
plus the Markdown job summary appended to $GITHUB_STEP_SUMMARY."""
import re

from ci_samples import healthy_lines, nan_count_lines, oom_lines, write

from diagnose.model import Finding, Hit, Report
from diagnose.report.github import MAX_PER_LEVEL, GithubFormatter, escape_data, escape_property

CMD = re.compile(r"^::(error|warning|notice)(?: ([^:]*))?::(.*)$")


def parse(out):
    rows = []
    for line in out.splitlines():
        m = CMD.match(line)
        assert m, line
        props = dict(p.split("=", 1) for p in m.group(2).split(",")) if m.group(2) else {}
        rows.append((m.group(1), props, m.group(3)))
    return rows


def test_annotations_per_signature_and_step_summary(tmp_path, run_cli, monkeypatch):
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    log = write(tmp_path / "run.log", healthy_lines() + oom_lines())
    code, out, err = run_cli(log, "--format", "github")
    assert code == 1 and "root cause" in err
    rows = parse(out)
    ids = [p["title"].split()[0] for _, p, _ in rows]
    assert len(ids) == len(set(ids))  # one annotation per signature, not per rank or line
    level, props, msg = rows[0]
    assert level == "error" and props["title"].startswith("MB-OOM-001")
    assert props["file"].endswith("run.log") and props["line"] == "44"
    assert "%0A" in msg and "\n" not in msg and "Fix: " in msg
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("# earlier step\n")  # appended, not overwritten
    assert "### Root cause: CUDA out of memory" in text and "| `MB-OOM-001` |" in text


def test_no_summary_file_without_the_variable(tmp_path, run_cli, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    code, out, _ = run_cli(write(tmp_path / "ok.log", healthy_lines(160)), "--format", "github")
    assert code == 0
    assert parse(out)[0][0] == "notice" and "healthy" in out


def test_levels_follow_the_gate(tmp_path, run_cli, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    log = write(tmp_path / "nan.log", nan_count_lines())
    _, out, _ = run_cli(log, "--format", "github")
    assert [r[0] for r in parse(out)] == ["warning"]
    _, out, _ = run_cli(log, "--format", "github", "--fail-on", "warning")
    assert [r[0] for r in parse(out)] == ["error"]


def test_at_most_ten_annotations_per_level(db, tmp_path):
    errors = [s for s in db.signatures if s.severity == "error" and s.role == "root" and s.scope == "line"][:14]
    assert len(errors) == 14
    findings = [Finding(s, Hit(s.id, "run.log", 100 + i, f"line {i}", order=i), count=1, samples=[])
                for i, s in enumerate(errors)]
    report = Report(inputs=["run.log"], root_cause=None, findings=findings, config=None, config_source=None,
                    structure=None)
    rows = parse(GithubFormatter(step_summary=str(tmp_path / "s.md"), db=db).render(report))
    assert len([r for r in rows if r[0] == "error"]) == MAX_PER_LEVEL
    last = rows[MAX_PER_LEVEL - 1]
    assert "5 more error findings" in last[1]["title"]
    for s in errors[MAX_PER_LEVEL - 1:]:
        assert s.id in last[2]
    assert (tmp_path / "s.md").read_text(encoding="utf-8").count("| ❌ |") == 14


def test_escaping():
    assert escape_data("50%\r\nx") == "50%25%0D%0Ax"
    assert escape_property("a:b,c%") == "a%3Ab%2Cc%25"


def test_paths_relative_to_the_workspace(tmp_path, run_cli, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    (tmp_path / "logs").mkdir()
    log = write(tmp_path / "logs" / "train.log", healthy_lines() + oom_lines())
    _, out, _ = run_cli(log, "--format", "github")
    assert parse(out)[0][1]["file"] == "logs/train.log"


def test_a_refining_root_cause_is_annotated_once_per_line(run_cli, repo):
    """The seed's OOM is MB-OFF-101, which refines MB-OOM-001 on the same line: one annotation."""
    log = str(repo / "fixtures" / "logs" / "seed" / "qwen3_30b_a3b_activation_offload_pp1_oom.log")
    _code, out, _ = run_cli(log, "--format", "github")
    rows = parse(out)
    ids = [p["title"].split()[0] for _, p, _ in rows]
    assert "MB-OFF-101" in ids and "MB-OOM-001" not in ids
