"""Tricky configs: every plan is proved by real megatron-core objects, or refused with a reason.

Each case is a config (the seed's Qwen3-30B-A3B run_config, or the tiny GPT job, with a twist),
a log (real error text: torch's OOM line, MCore's and Bridge's messages, Bridge's checkpoint
lines) and a world size. The planner runs as ``--fix --unsafe-fixes`` would. Whatever it
plans must pass, checked here independently of the planner:

- the layout arithmetic (TP x PP x CP divides the world, layers, experts, heads, the batch);
- megatron-core 0.16.1's own TransformerConfig and OptimizerConfig, built from the planned
  config (diagnose/config/mcore.py), with nothing refused that the run's config did not
  already have;
- the memory model: the planned config fits;
- the checkpoint: what the next run resumes can be loaded into it (remedy/resume.py).

A case whose plan cannot pass must be refused (or "no fix") with the reason said.
"""
from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from diagnose.config import fit as FIT
from diagnose.config.runconfig import RunConfig
from diagnose.db import load
from diagnose.diagnosis import diagnose_text
from diagnose.remedy import causes as C
from diagnose.remedy import plan as PL
from diagnose.remedy import resume as RS
from diagnose.remedy import search as SE

mcore = pytest.importorskip("diagnose.config.mcore")
if mcore.version() is None:  # pragma: no cover - the tests install megatron-core
    pytest.skip("needs megatron-core (pip install -e '.[mcore]')", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
SEED = yaml.safe_load((REPO / "fixtures/logs/seed/qwen3_30b_a3b_activation_offload_pp1_oom.yaml").read_text())
TINY = yaml.safe_load((REPO / "fixtures/jobs/tiny_gpt_pp_offload.yaml").read_text())

OOM = ("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity "
       "of 79.11 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process has 77.87 GiB memory in "
       "use. Of the allocated memory 70.30 GiB is allocated by PyTorch, and 6.12 GiB is reserved by PyTorch but "
       "unallocated.")
PP_OFFLOAD = "[rank0]: ValueError: Currently there is no support for Pipeline parallelism with CPU offloading"
FRESH = "Starting training loop at iteration 0"
RESUMED = ("  successfully loaded checkpoint from /ckpt/qwen3 [ t 0/2, p 0/1 ] at iteration 500\n"
           "Starting training loop at iteration 500")
LAYERS_PP = ("[rank0]: AssertionError: num_layers=30 should be divisible by config.pipeline_model_parallel_size=4")
HEADS_TP = "[rank0]: ValueError: num_attention_heads (3) must be a multiple of tensor_model_parallel_size (2)."


@pytest.fixture(scope="module")
def db():
    return load()


def seed(**changes) -> dict:
    d = copy.deepcopy(SEED)
    for key, value in changes.items():
        cur = d
        parts = key.split("__")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = value
    return d


def tiny(**changes) -> dict:
    d = copy.deepcopy(TINY)
    for key, value in changes.items():
        sec, k = key.split("__")
        d.setdefault(sec, {})[k] = value
    return d


def _mlm_args(**args) -> str:
    """Megatron-LM's arguments dump (arguments.py _print_args): sorted, dots to column 48."""
    lines = ["------------------------ arguments ------------------------"]
    lines += ["  {} {} {}".format(k, "." * (48 - len(k)), args[k]) for k in sorted(args, key=str.lower)]
    return "\n".join(lines + ["-------------------- end of arguments ---------------------"]) + "\n"


# a Megatron-LM run (no YAML at all: its config is the arguments dump it printed)
MLM_LOG = _mlm_args(num_layers=4, hidden_size=64, num_attention_heads=4, tensor_model_parallel_size=1,
                    pipeline_model_parallel_size=2, cpu_offloading=True, cpu_offloading_num_layers=1,
                    use_distributed_optimizer=True, optimizer_cpu_offload=False, optimizer_offload_fraction=0.0,
                    micro_batch_size=1, global_batch_size=4, world_size=2, seq_length=64, bf16=True,
                    params_dtype="torch.bfloat16", pipeline_dtype="torch.bfloat16", padded_vocab_size=128,
                    ffn_hidden_size=256) + PP_OFFLOAD + "\n"
RESUME = {"checkpoint__load": "/ckpt/qwen3", "checkpoint__save": "/ckpt/qwen3", "checkpoint__load_optim": True}
# (id, config, log, world, bridge version, expected: "plan" | "refused" | None (either, proved))
CASES = [
    ("seed-16-fresh", seed(), f"{FRESH}\n{OOM}", 16, None, "plan"),
    ("seed-8-fresh", seed(), f"{FRESH}\n{OOM}", 8, None, "plan"),
    # nothing fits at TP2 on 4 GPUs: TP4 + full recompute + 100 % optimizer offload does
    ("seed-4-fresh-tp4-recompute-full-offload", seed(), f"{FRESH}\n{OOM}", 4, None, "plan"),
    ("seed-2-fresh-nothing-fits", seed(), f"{FRESH}\n{OOM}", 2, None, "refused"),
    # a TP move under MoE with EP turns sequence parallelism on (MCore requires it)
    ("seed-finetune-8-sp-off-tp-move", seed(checkpoint__pretrained_checkpoint="/hf/qwen3", model__sequence_parallel=False),
     f"{FRESH}\n{OOM}", 8, "0.5.1", "plan"),
    # the checkpoint is resumed with dp_reshardable optimizer state: no TP or EP move either
    ("seed-4-resumed-dp-reshardable-no-moves", seed(**RESUME), f"{RESUMED}\n{OOM}", 4, None, "refused"),
    ("seed-resumed-dp-reshardable", seed(**RESUME), f"{RESUMED}\n{OOM}", 16, None, "plan"),
    ("seed-resumed-fully-reshardable", seed(**RESUME, checkpoint__dist_ckpt_optim_fully_reshardable=True),
     f"{RESUMED}\n{OOM}", 16, None, "plan"),
    ("seed-resumed-finetune", seed(**RESUME, checkpoint__finetune=True), f"{RESUMED}\n{OOM}", 16, None, "plan"),
    ("seed-resumed-no-load-optim", seed(**{**RESUME, "checkpoint__load_optim": False}), f"{RESUMED}\n{OOM}", 16, None, "plan"),
    ("seed-load-dir-unknown", seed(**RESUME), OOM, 16, None, None),
    # optimizer offload is refused on this fine-tune; full recompute (no offload) fits instead
    ("seed-finetune-8-bridge-unknown", seed(checkpoint__pretrained_checkpoint="/hf/qwen3"), f"{FRESH}\n{OOM}", 8,
     None, "plan"),
    ("seed-finetune-8-bridge-0.5.1", seed(checkpoint__pretrained_checkpoint="/hf/qwen3"), f"{FRESH}\n{OOM}", 8,
     "0.5.1", "plan"),
    ("seed-finetune-8-ep-a2a-overlap-no-recompute-tp4-pp2-vpp2",
     seed(checkpoint__pretrained_checkpoint="/hf/qwen3", model__overlap_moe_expert_parallel_comm=True,
          model__moe_token_dispatcher_type="alltoall", model__bf16=True), f"{FRESH}\n{OOM}", 8, None, "plan"),
    ("seed-finetune-8-bridge-0.6.0", seed(checkpoint__pretrained_checkpoint="/hf/qwen3"), f"{FRESH}\n{OOM}", 8,
     "0.6.0", "plan"),
    ("seed-finetune-16-no-offload-needed", seed(checkpoint__pretrained_checkpoint="/hf/qwen3"), f"{FRESH}\n{OOM}", 16,
     None, "plan"),
    ("seed-ep-a2a-overlap-no-vpp", seed(model__overlap_moe_expert_parallel_comm=True,
                                        model__moe_token_dispatcher_type="alltoall", model__bf16=True),
     f"{FRESH}\n{OOM}", 16, None, None),
    ("seed-account-for-embedding-and-loss", seed(model__account_for_embedding_in_pipeline_split=True,
                                                 model__account_for_loss_in_pipeline_split=True),
     f"{FRESH}\n{OOM}", 16, None, None),
    ("seed-uneven-first-last-stage", seed(model__num_layers_in_first_pipeline_stage=11,
                                          model__num_layers_in_last_pipeline_stage=13),
     f"{FRESH}\n{OOM}", 16, None, None),
    ("seed-fp8-hybrid", seed(model__fp8="hybrid", model__fp8_recipe="delayed"), f"{FRESH}\n{OOM}", 16, None, None),
    ("seed-precision-aware-optimizer", seed(optimizer__use_precision_aware_optimizer=True, optimizer__bf16=True,
                                            model__bf16=True),
     f"{FRESH}\n{OOM}", 8, None, None),
    ("seed-overlap-d2h-h2d", seed(optimizer__overlap_cpu_optimizer_d2h_h2d=True), f"{FRESH}\n{OOM}", 8, None, "plan"),
    ("seed-gbs-not-divisible-at-pp2", seed(train__global_batch_size=12, train__micro_batch_size=1),
     f"{FRESH}\n{OOM}", 16, None, None),
    ("seed-cp2", seed(model__context_parallel_size=2), f"{FRESH}\n{OOM}", 16, None, None),
    # (MCore takes ETP > 1 only without MoE biases)
    ("seed-etp2", seed(model__expert_tensor_parallel_size=2, model__add_bias_linear=False), f"{FRESH}\n{OOM}", 16,
     None, None),
    ("seed-h200", seed(), f"{FRESH}\n" + OOM.replace("79.11 GiB", "139.81 GiB"), 8, None, None),
    ("seed-no-distopt-resumed", seed(**RESUME, optimizer__use_distributed_optimizer=False,
                                     ddp__use_distributed_optimizer=False),
     f"{RESUMED}\n{OOM}", 8, None, None),
    ("tiny-pp2-activation-offload", tiny(), PP_OFFLOAD, 2, None, "plan"),
    ("tiny-pp2-activation-offload-vpp2", tiny(model__virtual_pipeline_model_parallel_size=2, model__num_layers=4,
                                              train__micro_batch_size=1),
     PP_OFFLOAD, 2, None, None),
    ("tiny-pp2-offload-resumed", tiny(checkpoint__load="/ckpt/tiny"), f"{RESUMED}\n{PP_OFFLOAD}", 2, None, None),
    ("tiny-layers-not-divisible-by-pp", tiny(model__num_layers=30, model__pipeline_model_parallel_size=4,
                                             model__cpu_offloading=False),
     LAYERS_PP, 8, None, None),
    ("tiny-heads-not-divisible-by-tp-sp", tiny(model__num_attention_heads=3, model__tensor_model_parallel_size=2,
                                               model__sequence_parallel=True, model__pipeline_model_parallel_size=1,
                                               model__cpu_offloading=False, train__micro_batch_size=2),
     HEADS_TP, 2, None, "plan"),
    ("tiny-heads-tp-batch-cannot-follow", tiny(model__num_attention_heads=3, model__tensor_model_parallel_size=2,
                                               model__pipeline_model_parallel_size=1, model__cpu_offloading=False),
     HEADS_TP, 2, None, "refused"),  # TP1 -> DP2: global batch 4 is not micro batch 4 x DP2
    ("seed-partial-offload-oom", seed(model__cpu_offloading=False, model__pipeline_model_parallel_size=2,
                                      optimizer__optimizer_cpu_offload=True, optimizer__optimizer_offload_fraction=0.25),
     f"{FRESH}\n{OOM}", 8, None, None),
    ("seed-partial-offload-oom-finetune-old-bridge",
     seed(model__cpu_offloading=False, model__pipeline_model_parallel_size=2, optimizer__optimizer_cpu_offload=True,
          optimizer__optimizer_offload_fraction=0.25, checkpoint__pretrained_checkpoint="/hf/qwen3"),
     f"{FRESH}\n{OOM}", 8, "0.5.0", None),
    ("seed-offload-fraction-zero", seed(model__cpu_offloading=False, model__pipeline_model_parallel_size=2,
                                        optimizer__optimizer_cpu_offload=True, optimizer__optimizer_offload_fraction=0.0),
     f"{FRESH}\n{OOM}", 8, None, None),
    ("seed-pipeline-layout-string", seed(model__pipeline_model_parallel_layout="Et*24|t*24L"),
     f"{FRESH}\n{OOM}", 16, None, None),
    ("seed-vpp2-microbatch-group-kept-at-pp", seed(model__cpu_offloading=False, model__pipeline_model_parallel_size=2,
                                                   model__virtual_pipeline_model_parallel_size=2,
                                                   model__microbatch_group_size_per_vp_stage=2),
     f"{FRESH}\n{OOM}", 8, None, None),
    ("mlm-args-dump-pp-offload", {}, MLM_LOG, 2, None, "plan"),
    ("seed-pp2-oom-resumed-dp-reshardable", seed(**RESUME, model__cpu_offloading=False,
                                                 model__pipeline_model_parallel_size=2),
     f"{RESUMED}\n{OOM}", 8, None, None),
]


def plan_case(db, cfg: dict, log: str, world: int, bridge, tmp_path=None):
    config = RunConfig(copy.deepcopy(cfg), "case.yaml")
    report = diagnose_text(log, db, config)
    ctx = C.context_from_report(report, world, None, None, db, bridge)
    return report, ctx, PL.plan(C.from_report(report), report.config, ctx, allow_unsafe=True)


def refusals(cfg: RunConfig, db) -> set:
    return {r.line for r in mcore.validate(cfg, db) if not r.environment}


def reasons(p: PL.Plan) -> str:
    return " ".join([why for _, why in p.no_fix] + [r.reason for r in p.refused])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_plan_is_proved_or_refused_with_a_reason(db, case):
    name, cfg, log, world, bridge, expected = case
    report, ctx, p = plan_case(db, cfg, log, world, bridge)
    assert report.root_cause is not None, name
    if p.edits:
        before = report.config
        after = FIT.with_changes(before, [(e.key, None if e.new is PL.DELETE else e.new) for e in p.edits])
        tp = int(after.get("model.tensor_model_parallel_size") or 1)
        pp = int(after.get("model.pipeline_model_parallel_size") or 1)
        bad = SE.valid_layout(after, world, tp, pp)
        # nothing the plan brings: a problem the run's own layout already had is another finding
        assert bad is None or bad == SE.valid_layout(before, world, int(before.get("model.tensor_model_parallel_size") or 1),
                                                     int(before.get("model.pipeline_model_parallel_size") or 1)), (name, bad)
        # megatron-core 0.16.1 builds the planned config: nothing it refuses, neither new nor the
        # run's own refusal (every case's config is one MCore takes but for the failure planned for)
        assert not refusals(after, db), (name, refusals(after, db))
        est = FIT.estimate(after, ctx)
        assert est.fits, (name, est)
        res = RS.read(before, report.structure, bridge)
        assert RS.blocks(res, before, after) is None and RS.blocks_offload(res, after) is None, name
        assert expected in ("plan", None), (name, p.edits)
    else:
        assert p.status in ("no_fix", "unsafe", "applied"), (name, p.status)
        if p.status != "applied":
            assert reasons(p).strip(), name  # refused with the reason said
        assert expected in ("refused", None), (name, reasons(p))


def _edits(p):
    return {e.key: e.new for e in p.edits}


def test_resumed_dp_reshardable_checkpoint_keeps_the_layout(db):
    """A run that resumed its optimizer state saved dp_reshardable (Bridge's default) cannot take
    a (TP, PP) change: the plan keeps PP1 (optimizer offload there) and says why PP2 is out."""
    _, ctx, p = plan_case(db, seed(**RESUME), f"{RESUMED}\n{OOM}", 16, None)
    e = _edits(p)
    assert "model.pipeline_model_parallel_size" not in e and e["optimizer.optimizer_cpu_offload"] is True
    assert ctx.resume.loads is True and ctx.resume.optimizer_state
    assert "dist_ckpt_optim_fully_reshardable" in p.fixes[0].reason and "load_optim=false" in p.fixes[0].reason


def test_fully_reshardable_checkpoint_takes_the_layout_change(db):
    _, _, p = plan_case(db, seed(**RESUME, checkpoint__dist_ckpt_optim_fully_reshardable=True),
                        f"{RESUMED}\n{OOM}", 16, None)
    assert _edits(p)["model.pipeline_model_parallel_size"] == 2


def test_a_fresh_run_that_died_before_saving_takes_the_layout_change(db):
    """load = save (the seed's recipe), but the run started at iteration 0 and saved nothing: the
    next run starts from scratch too, so PP2 is safe."""
    _, ctx, p = plan_case(db, seed(**RESUME), f"{FRESH}\n{OOM}", 16, None)
    assert ctx.resume.loads is False and _edits(p)["model.pipeline_model_parallel_size"] == 2


def _offload_refused_recompute_planned(p) -> str:
    """The plan turns no optimizer offload on: nothing fits at the run's own TP; of TP4 (x1.10,
    a rule of thumb) and full recompute (x1.33), TP4 + PP2 is the cheaper; it says why offload
    was refused and what else fits; returns the search's account."""
    e = _edits(p)
    assert e.get("optimizer.optimizer_cpu_offload") is not True and "model.recompute_granularity" not in e
    assert e["model.tensor_model_parallel_size"] == 4 and e["model.pipeline_model_parallel_size"] == 2
    text = " ".join(f.reason or "" for f in p.fixes) + " " + PL.describe(p)
    assert "MB-OFF-039" in text and "at the run's own TP and EP: no layout" in text
    assert "TP2 -> TP4 x1.10 (a rule of thumb, not measured)" in text
    assert "also fit: PP2 + no optimizer offload + full recompute x1.34" in text
    assert "iteration time x1.10 of the failed run's" in text  # the predicted effect says it too
    return text


def test_finetune_on_old_bridge_refuses_optimizer_offload_with_the_reason(db):
    _, _ctx, p = plan_case(db, seed(checkpoint__pretrained_checkpoint="/hf/qwen3"), f"{FRESH}\n{OOM}", 8, "0.5.1")
    assert "0.6.0" in _offload_refused_recompute_planned(p)
    _, _, p = plan_case(db, seed(checkpoint__pretrained_checkpoint="/hf/qwen3"), f"{FRESH}\n{OOM}", 8, "0.6.0")
    assert _edits(p)["optimizer.optimizer_cpu_offload"] is True


@pytest.mark.parametrize("printed, version", [
    ("megatron-bridge                          0.5.1", "0.5.1"),  # pip list
    ("megatron-bridge==0.6.0rc0", "0.6.0rc0"),  # pip freeze
    ("megatron_bridge-0.6.0.dist-info", "0.6.0"),  # a site-packages path
    ("megatron-bridge: 0.5.0", "0.5.0"),  # an environment dump
    ("Megatron-Bridge version 0.6.1", "0.6.1"),
])
def test_the_bridge_version_is_read_from_the_log(db, printed, version):
    from diagnose.logs.structure import version_of

    report, ctx, _ = plan_case(db, seed(checkpoint__pretrained_checkpoint="/hf/qwen3"), f"{printed}\n{FRESH}\n{OOM}", 8, None)
    found = version_of(report.structure)
    assert found is not None and found[0] == version and found[2] == 1
    assert ctx.resume.bridge_version == RS.parse_version(version)


def test_a_bridge_version_printed_in_the_log_decides_offload_on_a_fine_tune(db):
    """No --bridge-version: the version pip printed in the job's log is used, and said."""
    _, _, p = plan_case(db, seed(checkpoint__pretrained_checkpoint="/hf/qwen3"),
                        f"megatron-bridge                          0.5.1\n{FRESH}\n{OOM}", 8, None)
    assert "0.5.1 (from <text>:1)" in _offload_refused_recompute_planned(p)  # the log line that printed it
    _, _, p = plan_case(db, seed(checkpoint__pretrained_checkpoint="/hf/qwen3"),
                        f"megatron-bridge                          0.6.0\n{FRESH}\n{OOM}", 8, None)
    assert _edits(p)["optimizer.optimizer_cpu_offload"] is True
    # the flag wins over the log
    _, _, p = plan_case(db, seed(checkpoint__pretrained_checkpoint="/hf/qwen3"),
                        f"megatron-bridge                          0.6.0\n{FRESH}\n{OOM}", 8, "0.5.1")
    assert "0.5.1 (from --bridge-version)" in _offload_refused_recompute_planned(p)


def test_full_recompute_is_not_tried_under_ep_a2a_overlap_and_a_pp_move_brings_its_vpp(db):
    """A fine-tune on 8 GPUs (optimizer offload refused on Bridge < 0.6) that overlaps the MoE
    all-to-all: megatron-core refuses full recompute with the overlap, so the search does not try
    it; PP2 under the overlap needs a virtual pipeline, which the PP move brings: TP4 + PP2 + VPP2
    fits without offload (it was refused: PP2 without VPP failed megatron-core's check)."""
    report, _, p = plan_case(db, seed(checkpoint__pretrained_checkpoint="/hf/qwen3",
                                      model__overlap_moe_expert_parallel_comm=True,
                                      model__moe_token_dispatcher_type="alltoall", model__bf16=True),
                             f"{FRESH}\n{OOM}", 8, None)
    e = _edits(p)
    assert e["model.tensor_model_parallel_size"] == 4 and e["model.pipeline_model_parallel_size"] == 2
    assert e["model.virtual_pipeline_model_parallel_size"] == 2 and "model.recompute_granularity" not in e
    assert "full recompute" not in PL.describe(p).split("computed:")[1]
    after = FIT.with_changes(report.config, list(e.items()))
    assert not (refusals(after, db) - refusals(report.config, db))


def test_a_model_parallel_move_is_tried_only_where_the_runs_own_layout_fits_nothing(db):
    """16 GPUs: PP2 fits at TP2 (no move); 4 GPUs: nothing fits at TP2, TP4 with full recompute
    and 100 % optimizer offload does, its cost said part by part; 2 GPUs: nothing at all."""
    _, _, p = plan_case(db, seed(), f"{FRESH}\n{OOM}", 16, None)
    assert "model.tensor_model_parallel_size" not in _edits(p) and "at the run's own TP" not in PL.describe(p)
    _, _, p = plan_case(db, seed(), f"{FRESH}\n{OOM}", 4, None)
    e = _edits(p)
    assert e["model.tensor_model_parallel_size"] == 4 and e["model.recompute_granularity"] == "full"
    assert e["optimizer.optimizer_offload_fraction"] == 1.0
    assert "TP4 + PP1 + 100% optimizer offload + full recompute" in PL.describe(p)
    assert "x6.16: TP2 -> TP4 x1.10" in PL.describe(p)
    _, _, p = plan_case(db, seed(), f"{FRESH}\n{OOM}", 2, None)
    assert not p.edits and "with TP" not in reasons(p)  # TP4 does not fit 2 GPUs: no move tried


def test_a_tp_move_under_moe_and_ep_turns_sequence_parallel_on(db):
    _, _, p = plan_case(db, seed(checkpoint__pretrained_checkpoint="/hf/qwen3", model__sequence_parallel=False),
                        f"{FRESH}\n{OOM}", 8, "0.5.1")
    e = _edits(p)
    assert e["model.tensor_model_parallel_size"] == 4 and e["model.sequence_parallel"] is True


def test_a_resumed_dp_reshardable_checkpoint_takes_no_tp_or_ep_move(db):
    """The next run resumes a dp_reshardable optimizer state: a TP or EP change cannot load it,
    so the moves are rejected with MCore's reason, as a PP change is (4 GPUs: only TP4 fits, see
    above; resumed, nothing does)."""
    _, _, p = plan_case(db, seed(**RESUME), f"{RESUMED}\n{OOM}", 4, None)
    assert not p.edits
    assert "with TP4, no layout or offload setting passes: TP4 + PP1: the run resumes" in reasons(p)
    assert "(TP, PP) (2, 1) -> (4, 1) is 'not supported for DistributedOptimizer" in reasons(p)


def test_an_ep_change_of_a_dp_reshardable_checkpoint_is_blocked():
    r = RS.Resume(loads=True, optimizer_state=True, weights_only=False, ckpt_distopt=True, ckpt_fully_reshardable=False,
                  ckpt_layout=None, bridge_version=None, source="", evidence="")
    before = RunConfig(seed())
    why = RS.blocks(r, before, FIT.with_changes(before, [("model.expert_model_parallel_size", 8)]))
    assert why and "EP4 -> EP8" in why and "dp_reshardable" in why
    why = RS.blocks(r, before, FIT.with_changes(before, [("model.tensor_model_parallel_size", 4)]))
    assert why and "(TP, PP) (2, 1) -> (4, 1)" in why
    r.ckpt_fully_reshardable = True
    assert RS.blocks(r, before, FIT.with_changes(before, [("model.expert_model_parallel_size", 8)])) is None


def test_ep_a2a_overlap_never_gets_pp_without_vpp(db):
    _, _, p = plan_case(db, seed(model__overlap_moe_expert_parallel_comm=True, model__moe_token_dispatcher_type="alltoall",
                                 model__bf16=True), f"{FRESH}\n{OOM}", 16, None)
    e = _edits(p)
    assert e["model.pipeline_model_parallel_size"] == 2 and e["model.virtual_pipeline_model_parallel_size"] == 2


def test_tp_to_one_turns_sequence_parallel_off(db):
    _, _, p = plan_case(db, tiny(model__num_attention_heads=3, model__tensor_model_parallel_size=2,
                                 model__sequence_parallel=True, model__pipeline_model_parallel_size=1,
                                 model__cpu_offloading=False, train__micro_batch_size=2), HEADS_TP, 2, None)
    e = _edits(p)
    assert e["model.tensor_model_parallel_size"] == 1 and e["model.sequence_parallel"] is False


def test_pp_to_one_drops_the_virtual_pipeline_and_a_group_that_followed_pp():
    cfg = RunConfig(seed(model__pipeline_model_parallel_size=2, model__virtual_pipeline_model_parallel_size=2,
                         model__microbatch_group_size_per_vp_stage=2))
    assert dict(SE.pp_changes(cfg, 1)) == {"model.pipeline_model_parallel_size": 1,
                                            "model.virtual_pipeline_model_parallel_size": None,
                                            "model.microbatch_group_size_per_vp_stage": None}
    assert dict(SE.pp_changes(cfg, 4)) == {"model.pipeline_model_parallel_size": 4,
                                            "model.microbatch_group_size_per_vp_stage": None}  # 48 % (4 x 2) == 0


def test_interleaved_schedule_group_is_checked():
    """schedules.py: the micro-batch group per virtual stage must range in [PP, M]."""
    cfg = RunConfig(seed(model__pipeline_model_parallel_size=4, model__virtual_pipeline_model_parallel_size=2,
                         model__microbatch_group_size_per_vp_stage=2))
    assert "should range in [PP=4" in SE.valid_layout(cfg, 16, 2, 4)


def test_checkpoints_own_run_config_is_read(db, tmp_path):
    """The newest iter_*/run_config.yaml in the load folder is the checkpoint's truth."""
    ckpt = tmp_path / "ckpt"
    it = ckpt / "iter_0000500"
    it.mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("500")
    saved = seed(**RESUME)
    saved["model"]["pipeline_model_parallel_size"] = 1
    (it / "run_config.yaml").write_text(yaml.safe_dump(saved))
    cfg = RunConfig(seed(**{**RESUME, "checkpoint__load": str(ckpt)}))
    r = RS.read(cfg, SimpleNamespace(resume=[("x", 1, "loaded", 500)], peaks={}))
    assert r.ckpt_layout == (2, 1, 4) and "iter_0000500" in r.source and r.optimizer_state
    after = FIT.with_changes(cfg, [("model.pipeline_model_parallel_size", 2)])
    assert "dp_reshardable" in RS.blocks(r, cfg, after)


UNEVEN_46 = seed(model__num_layers=46, model__num_layers_in_first_pipeline_stage=11,
                 model__num_layers_in_last_pipeline_stage=11)
EP_OVERLAP = seed(model__overlap_moe_expert_parallel_comm=True, model__moe_token_dispatcher_type="alltoall",
                  model__bf16=True)


@pytest.mark.parametrize("with_mcore", [True, False], ids=["megatron-core", "no-megatron-core"])
@pytest.mark.parametrize("name,cfg,want", [
    # 46 layers with 11 / 11 at the ends: PP4 leaves 24 for 2 middle stages (PP2 leaves 24 for none)
    ("uneven-46-11-11", UNEVEN_46, {"model.pipeline_model_parallel_size": 4}),
    # the EP all-to-all overlap runs under PP only with a virtual pipeline: PP2 brings VPP2
    ("ep-a2a-overlap", EP_OVERLAP, {"model.pipeline_model_parallel_size": 2,
                                    "model.virtual_pipeline_model_parallel_size": 2}),
    # 48 layers + the embedding and the loss counted as layers = 50: PP2 splits them; the embedding
    # alone (49) splits into no PP the 16 GPUs allow
    ("account-embedding-and-loss", seed(model__account_for_embedding_in_pipeline_split=True,
                                        model__account_for_loss_in_pipeline_split=True),
     {"model.pipeline_model_parallel_size": 2}),
])
def test_pipeline_splits_are_megatron_cores_with_or_without_it(db, name, cfg, want, with_mcore):
    """Issue 12, item 3: the layout arithmetic knows megatron-core's pipeline split (uneven first /
    last stages, the embedding and loss counted as layers, the EP all-to-all overlap's virtual
    pipeline), so a plan is valid where megatron-core is not installed to check it, and a PP it
    accepts is not rejected (PP4 of 46 layers with 11 / 11 was refused as '46 % 4', and 50 %
    optimizer offload (x2.5) was planned instead)."""
    config = RunConfig(copy.deepcopy(cfg), "case.yaml")
    report = diagnose_text(f"{FRESH}\n{OOM}", db, config)
    ctx = C.context_from_report(report, 16, None, None, db, None)
    if not with_mcore:
        ctx.validator = None
    p = PL.plan(C.from_report(report), report.config, ctx, allow_unsafe=True)
    e = _edits(p)
    for k, v in want.items():
        assert e.get(k) == v, (name, e)
    assert not any(k.startswith("optimizer.optimizer_cpu_offload") and v for k, v in e.items()), (name, e)
    after = FIT.with_changes(report.config, list(e.items()))
    assert not (refusals(after, db) - refusals(report.config, db)), name  # megatron-core 0.16.1 builds it
