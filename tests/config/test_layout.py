"""config/layout.py: one reading of the parallel layout, with MCore's defaults, for the memory
model, the planner and the world-size inference alike."""
import pytest

from diagnose.config import layout as L
from diagnose.config.runconfig import RunConfig


def cfg(**model):
    return RunConfig({"model": {f"{k}_parallel_size": v for k, v in model.items()}})


def test_defaults_and_expert_tensor_parallel_follows_tp():
    assert L.of(RunConfig()) == L.Layout(1, 1, 1, 1, 1, 1)
    lay = L.of(cfg(tensor_model=2, pipeline_model=2, expert_model=4))
    assert lay.etp == 2  # MCore: expert_tensor_parallel_size defaults to tensor_model_parallel_size
    assert L.of(cfg(tensor_model=2, expert_tensor=1)).etp == 1


def test_world_arithmetic():
    lay = L.of(cfg(tensor_model=2, pipeline_model=2, expert_model=4, expert_tensor=1))  # the seed's layout
    assert (lay.dense_group, lay.expert_group, lay.smallest_world()) == (4, 8, 8)
    assert lay.fits(16) and not lay.fits(12) and not lay.fits(0)
    assert lay.dp(16) == 4 and lay.dp(10) is None and lay.dp(None) is None
    assert lay.round_up(13) == 16 and lay.round_up(16) == 16 and lay.round_up(1) == 8


@pytest.mark.parametrize("value,why", [(0, "at least 1"), (-2, "at least 1"), (2.5, "whole number"),
                                       ("4", "whole number"), (True, "whole number")])
def test_a_size_that_is_no_whole_number_is_one_error(value, why):
    with pytest.raises(L.LayoutError, match=why):
        L.of(cfg(pipeline_model=value))
    assert L.of(cfg(pipeline_model=4.0)).pp == 4


def test_one_gpu_fits_a_layout_of_one_and_dp_is_a_whole_number():
    one = L.of(RunConfig())
    assert one.fits(1) and one.dp(1) == 1 and one.smallest_world() == 1
    dp = L.of(cfg(tensor_model=2)).dp(8)
    assert dp == 4 and isinstance(dp, int)
