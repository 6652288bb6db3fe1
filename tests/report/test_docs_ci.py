"""docs/ci.md: the GitHub Actions and GitLab CI jobs parse, and use only formats and options that exist."""
import re

import yaml
from ci_samples import REPO

from diagnose.report import FORMATS

DOC = REPO / "docs" / "ci.md"


def blocks():
    return re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_ci_jobs_parse_and_use_real_options(run_cli):
    docs = [yaml.safe_load(b) for b in blocks()]
    assert len(docs) == 2
    gh, gl = docs
    steps = gh["jobs"]["gate"]["steps"]
    assert any("--format github" in s.get("run", "") for s in steps)
    assert any(s.get("uses", "").startswith("github/codeql-action/upload-sarif") for s in steps)
    job = gl["training-log-gate"]
    assert set(job["artifacts"]["reports"]) == {"codequality", "junit"}
    commands = [s.get("run", "") for s in steps] + job["script"]
    text = "\n".join(commands)
    for fmt in re.findall(r"--format (\w+)", text):
        assert fmt in FORMATS
    _, scan_help, _ = run_cli("scan", "--help")
    _, cmp_help, _ = run_cli("compare", "--help")
    for line in text.splitlines():
        if "diagnose compare" in line:
            opts, helptext = re.findall(r"(--[\w-]+)", line), cmp_help
        elif re.search(r"\bdiagnose logs/", line):
            opts, helptext = re.findall(r"(--[\w-]+)", line), scan_help
        else:
            continue
        for o in opts:
            assert o in helptext, (o, line)


def _user_docs():
    return [REPO / "README.md", REPO / "signatures" / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_docs_name_no_file_a_user_does_not_have():
    """The specification and facts files live beside the repository, not in it (issue 13)."""
    for p in _user_docs():
        text = p.read_text()
        for name in ("product.md", "megatron-facts.md", "architecture.md", "conventions.md", "../shared",
                     "shared/spec"):
            assert name not in text, (p.name, name)


def test_docs_install_the_distribution_by_its_free_name():
    """`diagnose` on the package index is an unrelated project: every pip line that names the
    distribution names megatron-diagnose (the command stays `diagnose`)."""
    import tomllib

    name = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
    assert name == "megatron-diagnose"
    for p in _user_docs():
        for line in p.read_text().splitlines():
            for m in re.finditer(r"pip install\s+['\"]?([\w.-]+)\[", line):
                assert m.group(1) == name, (p.name, line)
