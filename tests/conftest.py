import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session", autouse=True)
def _cold_caches_under_mutmut():
    """mutmut (bench/mutation.py) runs the tests once, then forks a child per mutant: the child
    inherits every cache the first run filled (the database, its layer tables), so a mutant in a
    cached loader would never run and always "survive". Each child starts cold."""
    import os

    if os.environ.get("MUTANT_UNDER_TEST"):
        for name, mod in list(sys.modules.items()):
            if name.split(".")[0] == "diagnose":
                for obj in list(vars(mod).values()):
                    clear = getattr(obj, "cache_clear", None)
                    if callable(clear):
                        clear()
    yield


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


# ---- logs for the --jobs and --shard tests (test_parallel.py, test_shard.py)

def _gen():
    sys.path.insert(0, str(REPO))
    try:
        from bench.gen_log import generate
    finally:
        sys.path.remove(str(REPO))
    return generate


@pytest.fixture(scope="session")
def rank_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranks")
    _gen()(d / "job", 3 << 20, seed=5, per_rank=8)
    # a second job's single interleaved log beside it, and an empty file
    _gen()(d / "other.log", 1 << 20, ranks=16, seed=9, failure_kind="none")
    (d / "empty.log").write_bytes(b"")
    return d


@pytest.fixture(scope="session")
def big_single(tmp_path_factory):
    """One log of many chunks (the chunk made small for the test): a generated MLM-format job
    (timer blocks, dense iteration and memory lines) with the fixture logs' tracebacks, torchrun
    blocks and errors spliced in every few hundred lines, so that blocks cross piece ends."""
    d = tmp_path_factory.mktemp("single")
    gen = d / "gen.log"
    _gen()(gen, 3 << 20, ranks=64, seed=11, fmt="mlm")
    lines = gen.read_bytes().splitlines(keepends=True)
    extras = [p.read_bytes() for p in sorted((REPO / "fixtures" / "logs").glob("*.log"))]
    out = []
    for i in range(0, len(lines), 700):
        out.extend(lines[i:i + 700])
        out.append(extras[(i // 700) % len(extras)])
    log = d / "run.out"
    log.write_bytes(b"".join(out))
    return log


