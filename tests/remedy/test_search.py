"""The planner's search and its cost model, without megatron-core (remedy/search.py, cost.py,
computed.py): the layout arithmetic, the moves, the predicted time by hand, what the search picks
on the seed config at each world size, and why it refuses. Fast: bench/mutation.py runs it."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from diagnose.config import fit as FIT
from diagnose.config.runconfig import RunConfig
from diagnose.remedy import computed as CO
from diagnose.remedy import cost as COST
from diagnose.remedy import resume as RS
from diagnose.remedy import search as SE

REPO = Path(__file__).resolve().parents[2]
SEED = yaml.safe_load((REPO / "fixtures/logs/seed/qwen3_30b_a3b_activation_offload_pp1_oom.yaml").read_text())


def seed(**changes) -> RunConfig:
    cfg = RunConfig(yaml.safe_load(yaml.safe_dump(SEED)), "seed.yaml")
    for key, value in changes.items():
        cfg.set(key.replace("__", "."), value)
    return cfg


def ctx(world, **kw) -> SE.Context:
    return SE.Context(world_size=world, gpu="h100", **kw)


# --- the layout arithmetic ---------------------------------------------------------------------
@pytest.mark.parametrize("changes, world, tp, pp, why", [
    ({}, 16, 2, 2, None),
    ({}, 16, 2, 3, "TP2 x PP3 x CP1 does not divide 16 GPUs"),
    ({"model__context_parallel_size": 2}, 16, 2, 8, "TP2 x PP8 x CP2 does not divide 16 GPUs"),
    ({"model__num_layers": 30}, 16, 2, 4, "PP4 does not divide 30 layers"),
    ({"model__virtual_pipeline_model_parallel_size": 4}, 16, 2, 8, "PP8 does not divide 48 layers"),
    ({}, 8, 2, 4, "EP4 x ETP1 does not divide the 2 GPUs of a pipeline stage"),
    ({"model__num_moe_experts": 6}, 16, 2, 1, "EP4 does not divide 6 experts"),
    ({"train__global_batch_size": 12}, 16, 2, 1, "global batch 12 is not a multiple of micro batch 1 x DP8"),
    ({"model__num_attention_heads": 6}, 16, 4, 1, "TP4 does not divide 6 attention heads"),
    ({"model__num_query_groups": 3}, 16, 2, 1, "TP2 and 3 query groups: neither divides the other"),
    ({"model__num_query_groups": 1}, 16, 2, 1, None),  # TP a multiple of the groups: replicated
    # the interleaved schedule: the micro-batch group per virtual stage in [PP, M], M's rest >= PP
    ({"model__virtual_pipeline_model_parallel_size": 2, "train__global_batch_size": 8}, 16, 2, 2, None),
    ({"model__virtual_pipeline_model_parallel_size": 2, "train__global_batch_size": 4}, 16, 2, 4,
     "microbatch_group_size_per_vp_stage 4 should range in [PP=4, M=2]"),
    ({"model__virtual_pipeline_model_parallel_size": 2, "train__global_batch_size": 10,
      "model__microbatch_group_size_per_vp_stage": 4}, 8, 2, 2,
     "5 micro-batches leave a last group of 1 < PP2 (microbatch_group_size_per_vp_stage 4)"),
])
def test_each_layout_refusal_names_its_reason(changes, world, tp, pp, why):
    assert SE.valid_layout(seed(**changes), world, tp, pp) == why


def test_the_layout_takes_an_ep_or_cp_given():
    cfg = seed()
    assert SE.valid_layout(cfg, 16, 2, 1, ep=8) is None
    assert SE.valid_layout(cfg, 16, 2, 1, ep=32) == "EP32 x ETP1 does not divide the 16 GPUs of a pipeline stage"
    assert SE.valid_layout(cfg, 16, 2, 1, cp=16) == "TP2 x PP1 x CP16 does not divide 16 GPUs"
    assert SE.layout(cfg, 16) == {"tp": 2, "pp": 1, "cp": 1, "ep": 4, "etp": 1, "dp": 8}
    assert SE.layout(cfg, 7)["dp"] is None
    assert SE.divisors(12) == [1, 2, 3, 4, 6, 12]


def test_a_pp_change_drops_what_no_longer_divides():
    cfg = seed(model__pipeline_model_parallel_size=2, model__virtual_pipeline_model_parallel_size=3,
               model__microbatch_group_size_per_vp_stage=2)
    # 48 layers: PP4 x VPP3 = 12 divides them, the virtual pipeline stays; the group followed PP
    assert dict(SE.pp_changes(cfg, 4)) == {"model.pipeline_model_parallel_size": 4,
                                           "model.microbatch_group_size_per_vp_stage": None}
    # PP8 x VPP3 = 24 divides 48 too; PP1 has no virtual pipeline
    assert dict(SE.pp_changes(cfg, 1))["model.virtual_pipeline_model_parallel_size"] is None
    assert "model.virtual_pipeline_model_parallel_size" not in dict(SE.pp_changes(cfg, 8))
    # PP 5 x VPP 3 = 15 does not divide 48: it goes
    assert dict(SE.pp_changes(cfg, 5))["model.virtual_pipeline_model_parallel_size"] is None
    # a group the user set apart from PP stays
    cfg = seed(model__pipeline_model_parallel_size=2, model__microbatch_group_size_per_vp_stage=4)
    assert dict(SE.pp_changes(cfg, 4)) == {"model.pipeline_model_parallel_size": 4}
    assert dict(SE.pp_changes(seed(), 2)) == {"model.pipeline_model_parallel_size": 2}


def test_tp_to_one_turns_sequence_parallel_off_and_other_sizes_drag_nothing():
    cfg = seed()  # sequence_parallel: true
    assert dict(SE.companions(cfg, "model.tensor_model_parallel_size", 1)) == {
        "model.tensor_model_parallel_size": 1, "model.sequence_parallel": False}
    assert dict(SE.companions(cfg, "model.tensor_model_parallel_size", 4)) == {"model.tensor_model_parallel_size": 4}
    assert dict(SE.companions(cfg, "model.expert_model_parallel_size", 1)) == {"model.expert_model_parallel_size": 1}
    assert dict(SE.companions(cfg, "model.pipeline_model_parallel_size", 2)) == {"model.pipeline_model_parallel_size": 2}


def test_the_moves_double_tp_inside_a_node_and_ep_while_it_divides_the_experts():
    names = lambda cfg, world: [n for n, _ in SE.parallel_moves(cfg, world)]  # noqa: E731
    assert names(seed(), 16) == ["TP4", "TP8", "EP8", "EP16"]
    assert names(seed(), 8) == ["TP4", "TP8", "EP8"]
    assert names(seed(), 4) == ["TP4"]  # EP8 > 4 GPUs
    assert names(seed(model__num_moe_experts=24), 64) == ["TP4", "TP8", "EP8"]  # EP16 does not divide 24
    assert names(seed(model__num_moe_experts=None), 16) == ["TP4", "TP8"]  # a dense model: TP only
    assert names(seed(model__tensor_model_parallel_size=8), 16) == ["EP8", "EP16"]  # TP16 leaves the node
    # MoE with EP > 1 needs sequence parallelism under TP: turned on where it was off
    moves = dict(SE.parallel_moves(seed(model__sequence_parallel=False), 8))
    assert dict(moves["TP4"]) == {"model.tensor_model_parallel_size": 4, "model.sequence_parallel": True}
    assert dict(dict(SE.parallel_moves(seed(), 8))["TP4"]) == {"model.tensor_model_parallel_size": 4}
    dense = dict(SE.parallel_moves(seed(model__sequence_parallel=False, model__num_moe_experts=None), 8))
    assert dict(dense["TP4"]) == {"model.tensor_model_parallel_size": 4}  # dense: not required
    one = dict(SE.parallel_moves(seed(model__sequence_parallel=False, model__expert_model_parallel_size=1), 8))
    assert dict(one["TP4"]) == {"model.tensor_model_parallel_size": 4}  # EP1: not required


# --- the predicted iteration time ----------------------------------------------------------------
def test_the_pipeline_bubble_by_hand():
    # 512 samples, micro batch 1: at 16 GPUs TP2 PP2 -> DP4, m = 128 micro-batches per pipeline
    assert COST.pipeline_bubble(seed(model__pipeline_model_parallel_size=2), 16) == pytest.approx(129 / 128)
    # interleaved (VPP 2): the bubble halves
    cfg = seed(model__pipeline_model_parallel_size=4, model__virtual_pipeline_model_parallel_size=2)
    assert COST.pipeline_bubble(cfg, 16) == pytest.approx((256 + 3 / 2) / 256)
    assert COST.pipeline_bubble(seed(), 16) == 1.0
    assert COST.pipeline_bubble(seed(train__global_batch_size=None), 16) is None
    assert COST.pipeline_bubble(seed(), 7) is None  # the layout does not divide 7 GPUs
    assert COST.pipeline_bubble(seed(train__global_batch_size=4), 16) is None  # fewer than one per pipeline


def test_predicted_time_part_by_part():
    before = seed()
    t, why = COST.predicted_time(before, before, 16)
    assert (t, why) == (1.0, "same schedule")
    after = FIT.with_changes(before, [("model.pipeline_model_parallel_size", 2)])
    t, why = COST.predicted_time(before, after, 16)
    assert t == pytest.approx(129 / 128) and why == "pipeline bubble x1.01"
    after = FIT.with_changes(before, [("optimizer.optimizer_cpu_offload", True), ("optimizer.optimizer_offload_fraction", 0.25)])
    t, why = COST.predicted_time(before, after, 16)
    assert t == pytest.approx(COST.slowdown(0.25)) and why.startswith(f"optimizer offload x{COST.slowdown(0.25):.2f} (measured")
    after = FIT.with_changes(before, list(COST.FULL_RECOMPUTE))
    t, why = COST.predicted_time(before, after, 16)
    assert t == pytest.approx(4 / 3) and "full recompute x1.33" in why
    after = FIT.with_changes(before, [("model.tensor_model_parallel_size", 8)])  # two doublings
    t, why = COST.predicted_time(before, after, 16)
    assert t == pytest.approx(1.1 ** 2) and why == "TP2 -> TP8 x1.21 (a rule of thumb, not measured)"
    after = FIT.with_changes(before, [("model.expert_model_parallel_size", 8)])
    t, why = COST.predicted_time(before, after, 16)
    assert t == pytest.approx(1.05) and why == "EP4 -> EP8 x1.05 (a rule of thumb, not measured)"
    # back to the unmoved layout: the inverse factor; the parts multiply
    t, _ = COST.predicted_time(after, before, 16)
    assert t == pytest.approx(1 / 1.05)
    both = FIT.with_changes(before, [("model.tensor_model_parallel_size", 4), *COST.FULL_RECOMPUTE])
    assert COST.predicted_time(before, both, 16)[0] == pytest.approx(1.1 * 4 / 3)
    # an offloaded run's own fraction is the reference
    off = FIT.with_changes(before, [("optimizer.optimizer_cpu_offload", True), ("optimizer.optimizer_offload_fraction", 1.0)])
    t, _ = COST.predicted_time(off, FIT.with_changes(off, [("optimizer.optimizer_offload_fraction", 0.5)]), 16)
    assert t == pytest.approx(COST.slowdown(0.5) / COST.slowdown(1.0))
    assert math.isclose(COST.slowdown(0.0), 1.0)


# --- prove --------------------------------------------------------------------------------------
def test_prove_refuses_only_what_the_change_brings():
    cfg = seed()
    assert SE.prove(cfg, FIT.with_changes(cfg, [("model.pipeline_model_parallel_size", 3)]), ctx(16), 16) == \
        "TP2 x PP3 x CP1 does not divide 16 GPUs"
    bad = seed(train__global_batch_size=12)  # the run's own layout problem: another finding's
    assert SE.prove(bad, FIT.with_changes(bad, [("model.cpu_offloading", False)]), ctx(16), 16) is None
    refuse = ctx(16, validator=lambda c: "no" if c.get("model.pipeline_model_parallel_size") == 2 else None)
    assert SE.prove(cfg, FIT.with_changes(cfg, [("model.pipeline_model_parallel_size", 2)]), refuse, 16) == \
        "megatron-core refuses it: no"
    assert SE.prove(cfg, FIT.with_changes(cfg, [("model.pipeline_model_parallel_size", 2)]), refuse, 16,
                    mcore=False) is None
    resumed = RS.Resume(loads=True, optimizer_state=True, weights_only=False, ckpt_distopt=True,
                        ckpt_fully_reshardable=False, ckpt_layout=None, bridge_version=None, source="", evidence="")
    why = SE.prove(cfg, FIT.with_changes(cfg, [("model.pipeline_model_parallel_size", 2)]), ctx(16, resume=resumed), 16)
    assert why and "dp_reshardable" in why
    assert SE.prove(cfg, FIT.with_changes(cfg, [("model.pipeline_model_parallel_size", 2)]), ctx(16), None) is None


def test_recompute_is_possible_unless_already_full_or_under_activation_offload():
    assert SE.recompute_possible(seed(), [("model.cpu_offloading", False)])
    assert not SE.recompute_possible(seed(), [])  # the seed offloads activations
    assert not SE.recompute_possible(seed(model__cpu_offloading=False, model__recompute_granularity="full"), [])
    assert SE.recompute_possible(seed(model__cpu_offloading=False), [])


def test_the_world_size_must_be_known():
    with pytest.raises(FIT.NoFix, match="the world size is unknown"):
        SE.world_of(SE.Context())
    assert SE.world_of(SE.Context(world_size=8)) == 8


# --- the search on the seed config -------------------------------------------------------------
def test_at_16_gpus_pp2_without_offload_is_the_cheapest():
    changes, text = CO.pp_and_optimizer_offload(seed(), ctx(16), [])
    assert dict(changes) == {"model.cpu_offloading": False, "model.cpu_offloading_num_layers": 0,
                             "model.pipeline_model_parallel_size": 2}
    assert text.startswith("searched 70 settings, 3 fit and pass: PP2 + no optimizer offload (60.7 GB of 84.9 GB; "
                           "predicted iteration time x1.01: pipeline bubble x1.01); next: PP4 + no optimizer offload "
                           "x1.01, PP1 + 50% optimizer offload x2.50; rejected: PP1: 86.1 GB does not fit 78.7 GB")
    assert "at the run's own TP" not in text  # something fitted: no move was tried


def test_at_8_gpus_pp2_with_the_lowest_fitting_fraction():
    changes, text = CO.pp_and_optimizer_offload(seed(), ctx(8), [])
    assert dict(changes)["model.pipeline_model_parallel_size"] == 2
    assert dict(changes)["optimizer.optimizer_offload_fraction"] == 0.25
    assert "2 fit and pass: PP2 + 25% optimizer offload (76.0 GB of 84.9 GB; predicted iteration time x1.91" in text
    assert "next: PP1 + 100% optimizer offload x4.20" in text


def test_at_4_gpus_only_a_tp_move_with_recompute_and_full_offload_fits():
    changes, text = CO.pp_and_optimizer_offload(seed(), ctx(4), [])
    assert dict(changes) == {"model.cpu_offloading": False, "model.cpu_offloading_num_layers": 0,
                             "model.tensor_model_parallel_size": 4, "model.recompute_granularity": "full",
                             "model.recompute_method": "uniform", "model.recompute_num_layers": 1,
                             "model.pipeline_model_parallel_size": 1, "optimizer.optimizer_cpu_offload": True,
                             "optimizer.optimizer_offload_fraction": 1.0}
    assert text.startswith("searched 20 settings, 1 fit and pass: TP4 + PP1 + 100% optimizer offload + full recompute "
                           "(77.4 GB of 84.9 GB; predicted iteration time x6.16: TP2 -> TP4 x1.10")
    assert "; at the run's own TP and EP: no layout or offload setting passes: PP1: 154.8 GB does not fit" in text


def test_a_move_beats_recompute_when_cheaper_and_recompute_is_said_to_fit_too():
    fine = seed(checkpoint__pretrained_checkpoint="/hf/qwen3")  # offload refused on this fine-tune (no version)
    resume = RS.read(fine, None, None)
    changes, text = CO.pp_and_optimizer_offload(fine, ctx(8, resume=resume), [])
    assert dict(changes)["model.tensor_model_parallel_size"] == 4 and "model.recompute_granularity" not in dict(changes)
    assert "1 fit and pass: TP4 + PP2 + no optimizer offload" in text
    assert "also fit: PP2 + no optimizer offload + full recompute x1.34" in text


def test_without_moves_recompute_is_the_fallback_and_is_named_so(monkeypatch):
    """The same fine-tune with no model-parallel move to try: full recompute, said to be the
    fallback of a search that found nothing without it."""
    fine = seed(checkpoint__pretrained_checkpoint="/hf/qwen3")
    monkeypatch.setattr(SE, "parallel_moves", lambda cfg, world: [])
    changes, text = CO.pp_and_optimizer_offload(fine, ctx(8, resume=RS.read(fine, None, None)), [])
    assert dict(changes)["model.recompute_granularity"] == "full" and dict(changes)["model.pipeline_model_parallel_size"] == 2
    assert "1 fit and pass: PP2 + no optimizer offload + full recompute" in text
    assert "; without recompute: no layout or offload setting passes: PP1: 109.0 GB does not fit 78.7 GB" in text
    assert "also fit" not in text


def test_nothing_fits_says_every_search():
    with pytest.raises(FIT.NoFix) as exc:
        CO.pp_and_optimizer_offload(seed(), ctx(2), [])
    assert "world size 2 is not divisible" in str(exc.value) and "; with full recompute, " in str(exc.value)


def test_a_move_the_fix_sets_itself_is_not_tried_again():
    base = [("model.cpu_offloading", False), ("model.tensor_model_parallel_size", 2)]
    with pytest.raises(FIT.NoFix) as exc:
        SE.search(seed(), ctx(4), base, [1, 2, 4], [None, 1.0])
    assert "with TP4" not in str(exc.value) and "with EP8" not in str(exc.value)


# --- what the mutation run of search.py / cost.py found untested ---------------------------------
@pytest.mark.parametrize("changes, world, tp, pp, why", [
    ({"model__num_layers": None}, 16, 2, 2, None),  # layers unknown: no layer check
    ({"model__num_layers": 47, "model__virtual_pipeline_model_parallel_size": 2}, 16, 2, 1, None),  # PP1: none
    ({"model__expert_tensor_parallel_size": 2}, 4, 2, 1, "EP4 x ETP2 does not divide the 4 GPUs of a pipeline stage"),
    ({"model__virtual_pipeline_model_parallel_size": 2, "train__global_batch_size": None}, 16, 2, 2, None),
    ({"model__virtual_pipeline_model_parallel_size": 2, "train__global_batch_size": 10,
      "model__microbatch_group_size_per_vp_stage": 3}, 8, 2, 2, None),  # 5 % 3 = 2 = PP: allowed
    ({"model__virtual_pipeline_model_parallel_size": 2, "train__global_batch_size": 8}, 8, 2, 2, None),
])
def test_layout_edges(changes, world, tp, pp, why):
    assert SE.valid_layout(seed(**changes), world, tp, pp) == why


def test_the_moves_and_companions_set_the_right_keys():
    moves = dict(SE.parallel_moves(seed(model__expert_model_parallel_size=2, model__sequence_parallel=False), 8))
    assert dict(moves["TP4"]) == {"model.tensor_model_parallel_size": 4, "model.sequence_parallel": True}  # EP2 > 1
    assert moves["EP4"] == [("model.expert_model_parallel_size", 4)]
    cfg = seed(model__pipeline_model_parallel_size=2, model__virtual_pipeline_model_parallel_size=2)
    assert dict(SE.companions(cfg, "model.pipeline_model_parallel_size", 1)) == {
        "model.pipeline_model_parallel_size": 1, "model.virtual_pipeline_model_parallel_size": None}
    assert CO.COMPUTED["pp_and_optimizer_offload"] is CO.pp_and_optimizer_offload
    assert CO.COMPUTED["divisor_tp"] is CO.divisor_tp


def test_prove_leaves_the_runs_own_layout_problem_to_its_finding():
    own = seed(model__pipeline_model_parallel_size=3)  # TP2 x PP3 does not divide 16: the run's own problem
    assert SE.prove(own, FIT.with_changes(own, [("model.cpu_offloading", False)]), ctx(16), 16) is None
    assert SE.prove(own, FIT.with_changes(own, [("model.tensor_model_parallel_size", 4)]), ctx(16), 16) == \
        "TP4 x PP3 x CP1 does not divide 16 GPUs"


def test_the_world_size_message():
    with pytest.raises(FIT.NoFix) as exc:
        SE.world_of(SE.Context(world_size=0))
    assert str(exc.value) == "the world size is unknown (give --world-size, or a log that shows the ranks)"


def test_uniq_keeps_the_first_of_each_reason():
    assert SE.uniq(["PP1: 9 GB", "PP2: 9 GB", "PP3: x: y", "PP4: x: y", "PP5: z"]) == ["PP1: 9 GB", "PP3: x: y", "PP5: z"]
    assert SE.uniq(["a", "a", "b"]) == ["a", "b"]


def test_the_search_turns_offload_off_where_no_offload_is_tried_and_names_each_candidate():
    cfg = seed(optimizer__optimizer_cpu_offload=True, optimizer__optimizer_offload_fraction=0.5)
    changes, text = CO.pp_and_optimizer_offload(cfg, ctx(16), [])
    assert changes == [("model.cpu_offloading", False), ("model.cpu_offloading_num_layers", 0),
                       ("model.pipeline_model_parallel_size", 2), ("optimizer.optimizer_cpu_offload", False)]
    assert "PP2 + no optimizer offload (60.7 GB of 84.9 GB; predicted iteration time x0.40" in text
    _, text = CO.pp_and_optimizer_offload(seed(), ctx(8), [])
    assert "rejected: PP1: 109.0 GB does not fit 78.7 GB; PP1 + 25%: 101.3 GB does not fit 78.7 GB; PP1 + 50%: 93.7 GB" \
        in text
    _, text = CO.pp_and_optimizer_offload(seed(), ctx(4), [])
    assert "rejected: TP4 + PP1: 138.5 GB does not fit 78.7 GB; TP4 + PP1 + 25%: 123.3 GB does not fit 78.7 GB" in text


def test_the_search_asks_megatron_core_last_and_says_what_it_refused():
    asked = []

    def validator(c):
        asked.append(c.get("model.pipeline_model_parallel_size"))
        return "PP2 refused" if c.get("model.pipeline_model_parallel_size") == 2 else None

    changes, text = CO.pp_and_optimizer_offload(seed(), ctx(16, validator=validator), [])
    assert dict(changes)["model.pipeline_model_parallel_size"] == 4
    assert text.endswith("; PP2: megatron-core refuses it: PP2 refused")
    # megatron-core is asked last: of PP1, only the fraction that fits by the memory model (50 %)
    assert asked.count(1) == 1


def test_the_account_lists_two_next_and_three_rejected():
    _, text = CO.pp_and_optimizer_offload(seed(), ctx(32), [])
    assert text == ("searched 144 settings, 4 fit and pass: PP1 + no optimizer offload (74.6 GB of 84.9 GB; predicted "
                    "iteration time x1.00: same schedule); next: PP2 + no optimizer offload x1.02, PP4 + no optimizer "
                    "offload x1.02; rejected: PP3: TP2 x PP3 x CP1 does not divide 32 GPUs; PP5: TP2 x PP5 x CP1 does "
                    "not divide 32 GPUs; PP6: TP2 x PP6 x CP1 does not divide 32 GPUs")


def test_moves_that_fail_are_each_said_and_the_first_search_leads():
    resumed = RS.Resume(loads=True, optimizer_state=True, weights_only=False, ckpt_distopt=True,
                        ckpt_fully_reshardable=False, ckpt_layout=None, bridge_version=None, source="", evidence="")
    with pytest.raises(FIT.NoFix) as exc:
        CO.pp_and_optimizer_offload(seed(), ctx(4, resume=resumed), [])
    msg = str(exc.value)
    assert msg.startswith("no layout or offload setting passes: PP1: 154.8 GB does not fit 78.7 GB")
    assert "; with TP4, no layout or offload setting passes: TP4 + PP1: the run resumes" in msg
    assert "; with full recompute, no layout or offload setting passes" in msg


def test_predicted_time_edges():
    before = seed()
    # the overlapped offload curve is another curve
    # the overlapped offload curve is another curve (measured at 100 %: 3.9 instead of 4.2)
    on = [("optimizer.optimizer_cpu_offload", True), ("optimizer.optimizer_offload_fraction", 1.0)]
    over = FIT.with_changes(before, on + [("optimizer.overlap_cpu_optimizer_d2h_h2d", True)])
    assert COST.predicted_time(before, over, 16)[0] == pytest.approx(3.9)
    assert COST.predicted_time(before, FIT.with_changes(before, on), 16)[0] == pytest.approx(4.2)
    # offload on without a fraction: nothing is offloaded
    assert COST.predicted_time(before, FIT.with_changes(before, on[:1]), 16) == (1.0, "same schedule")
    # two moves at once multiply
    both = FIT.with_changes(before, [("model.tensor_model_parallel_size", 4), ("model.expert_model_parallel_size", 8)])
    t, why = COST.predicted_time(before, both, 16)
    assert t == pytest.approx(1.10 * 1.05) and why == ("TP2 -> TP4 x1.10 (a rule of thumb, not measured), "
                                                       "EP4 -> EP8 x1.05 (a rule of thumb, not measured)")
    # a size the config leaves out is 1
    no_ep = seed(model__expert_model_parallel_size=None, model__num_moe_experts=None)
    t, why = COST.predicted_time(no_ep, FIT.with_changes(no_ep, [("model.expert_model_parallel_size", 2)]), 16)
    assert t == pytest.approx(1.05) and why.startswith("EP1 -> EP2 x1.05")
    # from a run that already recomputes or offloads: the factors and their text are ratios
    rec = FIT.with_changes(before, list(COST.FULL_RECOMPUTE))
    t, why = COST.predicted_time(rec, before, 16)
    assert t == pytest.approx(0.75) and why.startswith("full recompute x0.75")
    off = FIT.with_changes(before, [("optimizer.optimizer_cpu_offload", True), ("optimizer.optimizer_offload_fraction", 1.0)])
    t, why = COST.predicted_time(off, FIT.with_changes(off, [("optimizer.optimizer_offload_fraction", 0.5)]), 16)
    assert why.startswith(f"optimizer offload x{COST.slowdown(0.5) / COST.slowdown(1.0):.2f} (")
    # the bubble from PP2 to PP4 is a ratio of two bubbles; unknown bubbles count as none
    pp2 = seed(model__pipeline_model_parallel_size=2)
    t, why = COST.predicted_time(pp2, FIT.with_changes(pp2, [("model.pipeline_model_parallel_size", 4)]), 16)
    # TP2 PP4 at 16 GPUs: DP2, 256 micro-batches; TP2 PP2: DP4, 128
    assert t == pytest.approx((256 + 3) / 256 / ((128 + 1) / 128)) and why == "pipeline bubble x1.00"
    nob = seed(train__global_batch_size=None, model__pipeline_model_parallel_size=2)
    assert COST.predicted_time(nob, FIT.with_changes(nob, [("model.pipeline_model_parallel_size", 4)]), 16) == \
        (1.0, "same schedule")


def test_the_bubble_with_one_micro_batch_and_a_batch_that_does_not_divide():
    # one micro-batch per pipeline: PP2 waits a whole stage
    assert COST.pipeline_bubble(seed(model__pipeline_model_parallel_size=2, train__global_batch_size=4), 16) == 2.0
    # a global batch that does not divide: whole micro-batches only (10 // 4 = 2)
    assert COST.pipeline_bubble(seed(model__pipeline_model_parallel_size=2, train__global_batch_size=10), 16) == 1.5


def test_the_pipeline_split_is_megatron_cores():
    """search.pipeline_split, rule by rule (TransformerConfig.__post_init__ of megatron-core 0.16)."""
    def cfg(**model):
        return RunConfig({"model": {"num_layers": 46, **model}})

    split = SE.pipeline_split
    assert split(cfg(), 2) is None and split(cfg(), 4) == "PP4 does not divide 46 layers"
    uneven = cfg(num_layers_in_first_pipeline_stage=11, num_layers_in_last_pipeline_stage=11)
    assert split(uneven, 4) is None and split(uneven, 2) == "PP2: 24 middle layers for 0 middle stages"
    assert split(uneven, 3) is None  # 24 layers on the one middle stage
    assert split(uneven, 5) is None and split(uneven, 7) == "PP7: 24 middle layers do not divide into 5 middle stages"
    first = cfg(num_layers_in_first_pipeline_stage=10)
    assert split(first, 2) is None and split(first, 4) is None  # 36 layers on 3 middle stages
    assert split(first, 6) == "PP6: 36 middle layers do not divide into 5 middle stages"
    assert split(cfg(num_layers_in_first_pipeline_stage=11, virtual_pipeline_model_parallel_size=2), 4) \
        == "the first stage's 11 layers are not a multiple of VPP2"
    emb = cfg(num_layers=48, account_for_embedding_in_pipeline_split=True)
    assert split(emb, 2) == "PP2 does not divide 48 layers + 1 (the embedding / loss counted as layers)"
    both = cfg(num_layers=48, account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    assert split(both, 2) is None and split(both, 5) is None and split(both, 4) is not None
    assert split(cfg(pipeline_model_parallel_layout="Et*24|t*22L"), 2) is None
    assert split(cfg(pipeline_model_parallel_layout="Et*24|t*22L"), 4) == \
        "pipeline_model_parallel_layout has 2 stages, not PP4"
    assert split(cfg(pipeline_model_parallel_layout="E|(t|)*22L"), 8) is None  # repeated groups: MCore's call
    overlap = cfg(num_layers=48, overlap_moe_expert_parallel_comm=True)
    assert split(overlap, 2) == "PP2 with the EP all-to-all overlap needs a virtual pipeline (VPP)"
    assert split(cfg(num_layers=48, overlap_moe_expert_parallel_comm=True, virtual_pipeline_model_parallel_size=2),
                 2) is None
    assert split(overlap, 1) is None  # no pipeline: no virtual one needed


def test_a_pp_move_under_the_ep_overlap_brings_a_virtual_pipeline_and_recompute_is_not_tried():
    c = RunConfig({"model": {"num_layers": 48, "overlap_moe_expert_parallel_comm": True,
                             "pipeline_model_parallel_size": 1}})
    assert ("model.virtual_pipeline_model_parallel_size", 2) in SE.pp_changes(c, 2)
    assert ("model.virtual_pipeline_model_parallel_size", 2) not in SE.pp_changes(c, 1)
    odd = RunConfig({"model": {"num_layers": 46, "overlap_moe_expert_parallel_comm": True}})
    assert ("model.virtual_pipeline_model_parallel_size", 2) not in SE.pp_changes(odd, 2)  # 23 per stage
    assert not SE.recompute_possible(c, [])
    assert SE.recompute_possible(c, [("model.overlap_moe_expert_parallel_comm", False)])
    assert SE.recompute_possible(RunConfig({"model": {"num_layers": 48}}), [])
