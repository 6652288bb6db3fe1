"""The code style and type checks of pyproject.toml ([tool.ruff], [tool.mypy]) pass: ruff on the
package, tests, benchmarks and docs scripts; mypy (check_untyped_defs) on the package."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]' installs it")
    return found


def test_ruff_is_clean():
    r = subprocess.run([_tool("ruff"), "check", "diagnose", "tests", "bench", "docs"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_mypy_is_clean():
    r = subprocess.run([_tool("mypy"), "--no-incremental"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "Success" in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]
