"""One generic test runs every signature's must-match / must-not-match examples."""
import pytest

from diagnose import db as DB
from diagnose.sigtest import run_case

_db = DB.load()
CASES = [
    pytest.param(s.id, i, expect, id=f"{s.id}-{'match' if expect else 'no_match'}-{i}")
    for s in _db.signatures
    for expect, cases in ((True, s.tests_match), (False, s.tests_no_match))
    for i in range(len(cases))
]


@pytest.mark.parametrize("sig_id,index,expect", CASES)
def test_signature_example(sig_id, index, expect):
    sig = _db.get(sig_id)
    case = (sig.tests_match if expect else sig.tests_no_match)[index]
    r = run_case(_db, sig, case, expect)
    assert r.ok, f"{sig_id}: {r.detail}: {case!r}"


def test_every_signature_has_examples_and_known_category():
    for s in _db.signatures:
        assert s.tests_match, s.id
        assert s.cause and s.title


def test_anchors_occur_in_every_string_match_example():
    for s in _db.signatures:
        if s.scope != "line":
            continue
        for case in s.tests_match:
            if isinstance(case, str):
                assert any(a in case for a in s.anchors), (s.id, case)


def test_categories_cover_the_seed_rows():
    cats = {s.category for s in _db.signatures}
    for c in ("config_pp_cpu_offload", "config_recompute_cpu_offload", "config_cuda_graph_cpu_offload",
              "config_fine_grained_conflict", "config_offload_layers_range", "config_optimizer_offload",
              "slow_optimizer_offload", "cuda_oom"):
        assert c in cats, c


def test_cli_signatures_test_passes(run_cli):
    code, out, _ = run_cli("signatures", "test")
    assert code == 0, out
    assert " 0 failed" in out
