from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def db():
    from diagnose import db as DB

    return DB.load()


@pytest.fixture(scope="session")
def repo():
    return REPO


@pytest.fixture
def run_cli(capsys):
    """Run the CLI in-process: returns (exit code, stdout, stderr)."""
    from diagnose.cli import main

    def _run(*args):
        code = main(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    return _run
