"""Every fixture log through ``diagnose --format json``, against fixtures/logs/expected.yaml.

expected.yaml says what each fixture was built to show (fixtures/gen/make_synthetic_logs.py marks
the evidence line while it writes the log; the real torchrun logs of make_real_logs.py are located
by the line their scenario forces). The tool's output is never the source of an expectation.
"""
from __future__ import annotations

import gzip
import json
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from diagnose.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
EXPECTED = yaml.safe_load((LOGS / "expected.yaml").read_text())["fixtures"]


def _run(capsys, path: Path, engine: str = "auto") -> dict:
    code = main([str(path), "--format", "json", "-q", "--engine", engine])
    out = capsys.readouterr().out
    doc = json.loads(out)
    rc = doc["root_cause"]
    # exit 1 when a finding reaches --fail-on error; a warning-level root cause (a slowdown) exits 0
    if rc is None or rc["severity"] == "error":
        assert code == (0 if rc is None else 1), (code, rc and rc["signature"])
    else:
        assert code in (0, 1)
    return doc


def _rel(p: str) -> str:
    p = p.replace("\\", "/")
    marker = "fixtures/logs/"
    return p.split(marker, 1)[1] if marker in p else p


@pytest.mark.parametrize("engine", ["regex", "hyperscan"])
@pytest.mark.parametrize("case", EXPECTED, ids=[c["path"] for c in EXPECTED])
def test_fixture_root_cause(case, engine, capsys):
    if engine == "hyperscan":
        pytest.importorskip("hyperscan")
    path = LOGS / case["path"]
    assert path.exists(), f"{path} missing: run fixtures/gen/make_synthetic_logs.py / make_real_logs.py"
    doc = _run(capsys, path, engine)
    want = case["root_cause"]
    got = doc["root_cause"]
    if want is None:
        assert got is None, f"healthy fixture diagnosed as {got['signature']} at {got['file']}:{got['line']}"
        assert doc["healthy"] is True
        return
    assert got is not None, f"{case['path']}: no root cause, findings: {[f['signature'] for f in doc['findings']]}"
    summary = {k: got[k] for k in ("signature", "category", "rank", "line")} | {"file": _rel(got["file"])}
    assert summary == {k: want[k] for k in ("signature", "category", "rank", "line", "file")}, (
        f"{case['path']}: got {summary}, text={got['text'][:160]!r}")
    if "confidence" in want:  # the config printed in the log confirms the diagnosis
        assert got["confidence"] == want["confidence"], (got["confidence"], got["because"])
    for sig in case.get("set_aside_includes", []):
        assert sig in {s["signature"] for s in got["set_aside"]}, (sig, got["set_aside"])


def test_expectations_cover_every_fixture_kind():
    paths = [c["path"] for c in EXPECTED]
    assert any(p.endswith(".gz") for p in paths)
    assert any((LOGS / p).is_dir() for p in paths)
    assert any(c["root_cause"] is None for c in EXPECTED)
    cats = {c["root_cause"]["category"] for c in EXPECTED if c["root_cause"]}
    for cat in ("cuda_oom", "host_oom", "nccl_timeout", "config_pp_cpu_offload", "config_recompute_cpu_offload",
                "config_cuda_graph_cpu_offload", "config_fine_grained_conflict", "config_offload_layers_range",
                "slow_optimizer_offload"):
        assert cat in cats, cat


def test_fixtures_hold_no_absolute_path_of_this_machine():
    """The generated logs (real torchrun output especially) carry no path of the generating machine."""
    paths = {LOGS / c["path"] for c in EXPECTED}
    files = [f for p in paths for f in ([p] if p.is_file() else p.rglob("*"))] + list((LOGS / "real_mcore").rglob("*"))
    for p in files:
        if not p.is_file():
            continue
        data = gzip.open(p).read() if p.suffix == ".gz" else p.read_bytes()
        # the checkout's own parent folder, the home folder, the interpreter's prefix
        # (the parent only where it is not a shared temp folder: torchelastic writes /tmp paths of
        # its own, so a clone under /tmp would see them)
        machine = {str(REPO_ROOT), str(Path.home()), sys.prefix, sys.base_prefix}
        if str(REPO_ROOT.parent) not in {"/tmp", "/var/tmp", tempfile.gettempdir()}:
            machine.add(str(REPO_ROOT.parent))
        for bad in [b"site-packages/../"] + [m.encode() + b"/" for m in machine if len(m) > 1]:
            assert bad not in data, (p, bad)


@pytest.mark.slow
def test_make_real_logs_regenerates_a_real_failure(tmp_path, capsys):
    """The generator really runs MCore under torchrun: rank 1's real ValueError, named as root cause."""
    import subprocess
    import sys

    pytest.importorskip("megatron.core")
    gen = LOGS.parent / "gen" / "make_real_logs.py"
    p = subprocess.run([sys.executable, str(gen), "--out", str(tmp_path), "--only", "config_fail_rank1"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    log = tmp_path / "config_fail_rank1.log"
    text = log.read_text()
    assert "venv/lib/python3.11/site-packages/megatron/core/transformer/transformer_config.py" in text
    assert "Root Cause (first observed failure)" in text
    doc = _run(capsys, log)
    rc = doc["root_cause"]
    assert (rc["signature"], rc["category"], rc["rank"]) == ("MB-OFF-002", "config_pp_cpu_offload", 1)
    assert "[rank1]: ValueError: Currently there is no support for Pipeline parallelism" in rc["text"]
