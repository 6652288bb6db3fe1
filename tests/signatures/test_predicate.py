import pytest

from diagnose import predicate as P


def test_three_valued_logic():
    roots = {"model": {"cpu_offloading": True, "pipeline_model_parallel_size": 2}}
    assert P.evaluate("model.cpu_offloading and model.pipeline_model_parallel_size > 1", roots) is True
    assert P.evaluate("model.cpu_offloading and model.recompute_granularity is not None", roots) is P.UNKNOWN
    assert P.evaluate("model.cpu_offloading == False and model.missing > 1", roots) is False
    assert P.evaluate("model.missing > 1 or model.cpu_offloading", roots) is True
    assert P.evaluate("divides(model.pipeline_model_parallel_size, 48)", roots) is True


def test_null_comparisons():
    roots = {"model": {"recompute_granularity": None}}
    assert P.evaluate("model.recompute_granularity is not None", roots) is False
    assert P.evaluate('model.recompute_granularity == "full"', roots) is False


@pytest.mark.parametrize("expr", ["__import__('os')", "model.x.__class__()", "[x for x in y]", "lambda: 1", "a if b else c"])
def test_rejects_code(expr):
    with pytest.raises(P.PredicateError):
        P.compile_predicate(expr)


def test_names():
    assert P.names("model.a and optimizer.b > metrics.c") == {"model.a", "optimizer.b", "metrics.c"}
