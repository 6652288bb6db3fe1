"""config/fit.py, the one place for "fits": the memory model's verdict, its calibration by an OOM
the log proved, and the lowest optimizer-offload fraction that fits (no megatron-core needed)."""
from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.config import fit as F
from diagnose.config import memory as mm
from diagnose.config.load import load_config
from diagnose.edits import DELETE

CFG = Path(__file__).resolve().parents[2] / "fixtures" / "configs" / "seed_optimizer_offload_100_overlap.yaml"


def cfg():
    return load_config(str(CFG))


@pytest.mark.parametrize("x, text", [(1.0, "1.0 GB"), (84.93, "84.9 GB"), (0.5, "500.0 MB"), (0.9994, "999.4 MB"),
                                     (-2.0, "-2.0 GB"), (-0.25, "-250.0 MB")])
def test_gb_for_a_report(x, text):
    assert F.gb(x) == text


def test_get_and_int_fall_back_on_missing_none_and_junk():
    c = cfg()
    c.set("model.x_none", None)
    c.set("model.x_text", "two")
    assert F._get(c, "model.no_such_key", 7) == 7 and F._get(c, "model.x_none", 7) == 7
    assert F._get(c, "model.num_layers") == c.get("model.num_layers") != 7
    assert F._int(c, "model.x_text", 5) == 5 and F._int(c, "model.x_none", 5) == 5 and F._int(c, "model.nope") == 1
    c.set("model.x_int", "3")
    assert F._int(c, "model.x_int") == 3


def test_with_changes_sets_and_deletes_on_a_copy():
    c = cfg()
    after = F.with_changes(c, [("model.pipeline_model_parallel_size", 4), ("optimizer.optimizer_offload_fraction", DELETE)])
    assert after.get("model.pipeline_model_parallel_size") == 4
    assert after.get("optimizer.optimizer_offload_fraction") is None
    assert c.get("optimizer.optimizer_offload_fraction") == 1.0 and c.get("model.pipeline_model_parallel_size") != 4


def test_an_uncalibrated_estimate_is_the_memory_model_s():
    c = cfg()
    ctx = F.Sizing(world_size=16)
    e = F.estimate(c, ctx)
    m = mm.estimate(mm.fill_from_preset(c)[0], world_size=16)
    assert (e.per_gpu_gb, e.peak_gb, e.capacity_gb, e.fits, e.host_gb, e.margin_gb, e.pinned_gb) == pytest.approx(
        (m.per_gpu_gb, m.peak_gb, m.capacity_gb, m.fits, m.host_gb, m.margin_gb, m.pinned_gb))
    assert e.notes == list(m.notes) and not e.calibrated and e.fits_with_margin is e.fits is True
    # a failed config alone, or a need alone, calibrates nothing
    assert not F.estimate(c, F.Sizing(world_size=16, observed_need_gb=None), calibrate_on=c).calibrated
    assert not F._est(c, F.Sizing(world_size=16, failed_cfg=c)).calibrated


def test_an_oom_the_log_proved_scales_every_estimate():
    c = cfg()
    base = F.estimate(c, F.Sizing(world_size=16))
    need = base.peak_gb * 1.5  # the run died needing half as much again as the model says
    ctx = F.Sizing(world_size=16, observed_need_gb=need, failed_cfg=c)
    e = F._est(c, ctx)
    assert e.calibrated and e.peak_gb == pytest.approx(need) and e.per_gpu_gb == pytest.approx(base.per_gpu_gb * 1.5)
    assert e.capacity_gb == base.capacity_gb and e.margin_gb == base.margin_gb and e.host_gb == base.host_gb
    assert e.fits is (need + base.margin_gb <= base.capacity_gb)
    assert e.notes == base.notes and e.pinned_gb == base.pinned_gb  # calibration scales memory only
    # a need just under the capacity: it fits only without the model's margin, so it does not fit
    need = base.capacity_gb - base.margin_gb / 2
    e = F._est(c, F.Sizing(world_size=16, observed_need_gb=need, failed_cfg=c))
    assert e.calibrated and e.peak_gb == pytest.approx(need) and e.fits is False
    # a need the model already predicts (or more than) calibrates nothing
    assert not F._est(c, F.Sizing(world_size=16, observed_need_gb=base.peak_gb, failed_cfg=c)).calibrated
    assert not F._est(c, F.Sizing(world_size=16, observed_need_gb=base.peak_gb * 0.5, failed_cfg=c)).calibrated


def test_the_gpu_given_is_the_capacity_used():
    c = cfg()
    h100 = F.estimate(c, F.Sizing(world_size=16))
    a100 = F.estimate(c, F.Sizing(world_size=16, gpu="A100-40"))
    small = F.estimate(c, F.Sizing(world_size=16, gpu_memory_gb=30.0))
    assert a100.peak_gb == pytest.approx(h100.peak_gb) and a100.capacity_gb < h100.capacity_gb
    assert small.capacity_gb < a100.capacity_gb and not small.fits


def test_a_config_the_model_cannot_size_is_no_fix_with_the_reason():
    c = cfg()
    c.set("model.num_layers", None)
    c.set("model.hidden_size", None)
    c.set("model.hf_model_id", None)
    with pytest.raises(F.NoFix, match="the memory model cannot size this config: "):
        F.estimate(c, F.Sizing(world_size=16))


def test_offload_on_turns_on_what_offload_needs_and_drops_an_old_fraction():
    c = cfg()
    c.set("optimizer.use_distributed_optimizer", False)
    c.set("ddp.use_distributed_optimizer", None)
    got = F._offload_on([("model.x", 1), ("optimizer.optimizer_offload_fraction", 0.5)], c)
    assert got == [("model.x", 1), ("optimizer.optimizer_cpu_offload", True),
                   ("optimizer.use_distributed_optimizer", True), ("ddp.use_distributed_optimizer", True)]
    c.set("optimizer.use_distributed_optimizer", True)
    c.set("ddp.use_distributed_optimizer", True)
    assert F._offload_on([("optimizer.optimizer_cpu_offload", True)], c) == [("optimizer.optimizer_cpu_offload", True)]


def _fits(c, f, ctx) -> bool:
    base = F._offload_on([], c)
    return F.estimate(F.with_changes(c, base + [("optimizer.optimizer_offload_fraction", f)]), ctx).fits


# on 16 GPUs of this much memory the lowest fitting fraction is 25 %, 50 %, 75 %, 100 %, none
@pytest.mark.parametrize("gpu_memory_gb, lowest", [(80.0, 0.25), (48.0, 0.5), (44.0, 0.75), (40.0, 1.0), (30.0, None)])
def test_the_lowest_fitting_fraction_is_the_first_that_fits(gpu_memory_gb, lowest):
    c = cfg()
    ctx = F.Sizing(world_size=16, gpu_memory_gb=gpu_memory_gb)
    fits = {f: _fits(c, f, ctx) for f in F.FRACTIONS}
    assert next((f for f in F.FRACTIONS if fits[f]), None) == lowest
    if lowest is None:
        with pytest.raises(F.NoFix, match=r"no optimizer-offload fraction fits \(25%: .*, 50%: .*, 75%: .*, "
                                          r"100%: .* of [\d.]+ GB\)"):
            F.lowest_fitting_fraction(c, ctx)
        return
    f, e = F.lowest_fitting_fraction(c, ctx)
    assert fits[f] and e.fits and not any(fits[g] for g in F.FRACTIONS if g < f)


def test_the_fractions_tried_start_above_the_current_one():
    c = cfg()
    ctx = F.Sizing(world_size=16)
    base = F._offload_on([], c)
    assert F._lowest_fraction(c, ctx, base)[0] == 0.25
    assert F._lowest_fraction(c, ctx, base, above=0.25)[0] == 0.5
    assert F._lowest_fraction(c, ctx, base, above=0.5)[0] == 0.75
    with pytest.raises(F.NoFix, match=r"^the fraction is already 100%$"):
        F._lowest_fraction(c, ctx, base, above=1.0)
