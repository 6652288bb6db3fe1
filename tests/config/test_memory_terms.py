"""The memory model term by term, on a tiny model counted by hand (bytes, not GB).

Each case changes one setting of a small dense model and states the bytes the formulas of
diagnose/config/memory.py's docstring give, worked out here in plain arithmetic (never by
calling the model): parameters, gradients and optimizer states per stage, activations per layer,
recompute, activation offload, microbatches in flight, VPP and uneven stages, MLA, MoE and MTP.
"""
from __future__ import annotations

import copy
import math

import pytest

from diagnose.config import memory as M
from diagnose.config.runconfig import RunConfig

# L=4 layers, h=64, 4 heads of d=16 (no GQA), ffn 256 without SwiGLU, V=1000 -> padded 1024,
# s=128, micro batch 2 -> T = 256 tokens; bf16 parameters, fp32 grads, fp32 master + Adam m, v
BASE = {"model": {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 4,
                  "kv_channels": 16, "ffn_hidden_size": 256, "vocab_size": 1000, "seq_length": 128,
                  "gated_linear_unit": False, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1},
        "train": {"micro_batch_size": 2, "global_batch_size": 16}}
h, T, Vp = 64, 256, 1024
ATTN = h * 64 + 2 * h * 64 + 64 * h  # q, k, v, o: 16384
MLP = h * 256 * 2  # 32768
NORMS = 2 * h
LAYER = ATTN + MLP + NORMS  # 49280
EMB = Vp * h  # 65536, input embedding and (untied) output layer
ACT = T * (10 * h + (8 * h + 4 * 256))  # one layer's activations, no SP, TP=1: 557056
CKPT = 2 * T * h  # a recompute chunk's input: 32768
EMB_ACT = 8 * T + 2 * T * h  # input ids + embedding output: 34816
LOGITS = 4 * T * (h + Vp)  # fp32 logits and loss: 1114112
B_PER_PARAM = 2 + 4 + 4 + 8  # bf16 weight, fp32 grad, fp32 master, Adam m + v (no distributed optimizer)


def est(world=1, **changes):
    cfg = copy.deepcopy(BASE)
    for key, value in changes.items():
        section, name = key.split("__")
        cfg.setdefault(section, {})[name] = value
    return M.estimate(RunConfig(cfg, "test"), world_size=world, gpu_memory_gb=80)


def bytes_of(e, part):
    return e.breakdown[part] * M.GB


def test_the_hand_count_of_the_base_model():
    e = est()
    params = 4 * LAYER + 2 * EMB + h  # + the final norm
    assert e.per_gpu_gb * M.GB == pytest.approx(B_PER_PARAM * params, abs=1e-3)
    assert bytes_of(e, "weights") == pytest.approx(2 * params, abs=1e-3)
    assert bytes_of(e, "grads") == pytest.approx(4 * params, abs=1e-3)
    assert bytes_of(e, "activations") == pytest.approx(4 * ACT + EMB_ACT + LOGITS, abs=1e-3)
    assert e.peak_gb * M.GB == pytest.approx(B_PER_PARAM * params + 4 * ACT + EMB_ACT + LOGITS, abs=1e-3)
    assert e.margin_gb == pytest.approx(2.0 + 0.05 * 80) and e.fits and e.stage == "only stage (PP=1)"


@pytest.mark.parametrize("changes,acts", [
    # full recompute, uniform chunks of 2: the two chunks' inputs, and one chunk recomputed
    ({"model__recompute_granularity": "full", "model__recompute_method": "uniform", "model__recompute_num_layers": 2},
     2 * CKPT + 2 * ACT),
    # full recompute, block of 1: that layer's input kept, the other 3 stored whole, 1 recomputed
    ({"model__recompute_granularity": "full", "model__recompute_method": "block", "model__recompute_num_layers": 1},
     CKPT + 3 * ACT + ACT),
    # selective recompute of the MLP: half of every layer's activations
    ({"model__recompute_granularity": "selective", "model__recompute_modules": ["mlp"]}, 0.5 * 4 * ACT),
    # selective recompute of core attention only: flash attention stores none anyway
    ({"model__recompute_granularity": "selective"}, 4 * ACT),
    # activation offload of 2 layers: 2 kept, 1 in transit; double buffering: 1 more
    ({"model__cpu_offloading": True, "model__cpu_offloading_num_layers": 2}, 3 * ACT),
    ({"model__cpu_offloading": True, "model__cpu_offloading_num_layers": 2,
      "model__cpu_offloading_double_buffering": True}, 4 * ACT),
    # activation offload with the activations switched off offloads nothing
    ({"model__cpu_offloading": True, "model__cpu_offloading_num_layers": 2,
      "model__cpu_offloading_activations": False}, 4 * ACT),
    # a larger micro batch: linear in the tokens (so are the embedding and logits terms, below)
    ({"train__micro_batch_size": 4}, 2 * 4 * ACT),
])
def test_recompute_offload_and_micro_batch_activations(changes, acts):
    """``acts``: the layers' part; the embedding output and the logits scale with the micro batch."""
    edge = (EMB_ACT + LOGITS) * changes.get("train__micro_batch_size", 2) / 2
    assert bytes_of(est(**changes), "activations") == pytest.approx(acts + edge, abs=1e-3)


def test_sequence_parallel_and_tensor_parallel_divide_the_activations():
    e = est(world=2, model__tensor_model_parallel_size=2, model__sequence_parallel=True)
    per_layer = T * (18 * h + 4 * 256) / 2
    logits = 4 * T * (h + Vp) / 2  # V padded to 128*TP = 256: still 1024
    emb = 8 * T + 2 * T * h / 2
    assert bytes_of(e, "activations") == pytest.approx(4 * per_layer + emb + logits, abs=1e-3)
    nosp = est(world=2, model__tensor_model_parallel_size=2)
    per_layer_nosp = T * (10 * h + (8 * h + 4 * 256) / 2)
    assert bytes_of(nosp, "activations") == pytest.approx(4 * per_layer_nosp + 8 * T + 2 * T * h + logits, abs=1e-3)


def test_pipeline_stages_microbatches_in_flight_and_the_most_loaded_stage():
    # PP=2, DP=1: m = 16 / 2 = 8 microbatches; the first stage holds 2 in flight, the last 1
    e = est(world=2, model__pipeline_model_parallel_size=2)
    first = 2 * LAYER + EMB
    last = 2 * LAYER + EMB + h
    acts_first = 2 * (2 * ACT) + 2 * EMB_ACT
    acts_last = 1 * (2 * ACT) + LOGITS
    peak_first, peak_last = B_PER_PARAM * first + acts_first, B_PER_PARAM * last + acts_last
    assert e.peak_gb * M.GB == pytest.approx(max(peak_first, peak_last), abs=1e-3)
    assert e.stage == ("first stage" if peak_first >= peak_last else "last stage")
    assert any("microbatch(es) in flight" in n for n in e.notes)


def test_interleaved_stages_hold_more_microbatches():
    # VPP=2 at PP=2: chunks of 1 layer, stage 0 holds layers 0 and 2; in flight x (1 + 1/4)
    assert M._stage_layers(4, 2, 2, 0, None, None) == [0, 2]
    assert M._stage_layers(4, 2, 2, 1, None, None) == [1, 3]
    e = est(world=2, model__pipeline_model_parallel_size=2, model__virtual_pipeline_model_parallel_size=2)
    first = B_PER_PARAM * (2 * LAYER + EMB) + 2.5 * (2 * ACT) + 2.5 * EMB_ACT  # 2 in flight x 1.25
    last = B_PER_PARAM * (2 * LAYER + EMB + h) + 1.25 * (2 * ACT) + LOGITS
    assert first > last and e.stage == "first stage"
    assert bytes_of(e, "activations") == pytest.approx(2.5 * (2 * ACT) + 2.5 * EMB_ACT, abs=1e-3)
    assert e.peak_gb * M.GB == pytest.approx(first, abs=1e-3)


def test_uneven_first_and_last_stages():
    assert M._stage_layers(6, 3, 1, 0, 1, 1) == [0]
    assert M._stage_layers(6, 3, 1, 1, 1, 1) == [1, 2, 3, 4]
    assert M._stage_layers(6, 3, 1, 2, 1, 1) == [5]
    assert M._stage_layers(6, 3, 1, 2, 2, None) == [4, 5]  # only the first is uneven: 2 + 2 + 2
    assert M._stage_layers(5, 1, 1, 0, None, None) == [0, 1, 2, 3, 4]
    assert M._stage_layers(2, 4, 1, 1, None, None) == []  # more stages than layers: none each


def test_distributed_optimizer_and_offload_shard_the_optimizer_states():
    params = 4 * LAYER + 2 * EMB + h
    e = est(world=4, optimizer__use_distributed_optimizer=True)  # DP = 4
    assert bytes_of(e, "optimizer_gpu") == pytest.approx((4 + 8) * params / 4, abs=1e-3)
    off = est(world=4, optimizer__use_distributed_optimizer=True, optimizer__optimizer_cpu_offload=True,
              optimizer__optimizer_offload_fraction=0.5)
    assert bytes_of(off, "optimizer_gpu") == pytest.approx((4 + 8 * 0.5) * params / 4, abs=1e-3)
    assert off.breakdown["optimizer_host_per_gpu"] * M.GB == pytest.approx(16 * 0.5 * params / 4, abs=1e-3)
    assert off.host_gb * M.GB == pytest.approx(4 * 16 * 0.5 * params / 4, abs=1e-3)  # 4 GPUs on the node
    assert off.pinned_gb == pytest.approx(off.host_gb * 8 / 16)
    nogradpin = est(world=4, optimizer__use_distributed_optimizer=True, optimizer__optimizer_cpu_offload=True,
                    optimizer__optimizer_offload_fraction=0.5, optimizer__pin_cpu_grads=False)
    assert nogradpin.pinned_gb == pytest.approx(off.host_gb * 4 / 16)
    # a fraction given while offload is off counts for nothing
    assert est(world=4, optimizer__use_distributed_optimizer=True,
               optimizer__optimizer_offload_fraction=0.5).breakdown["optimizer_gpu"] == e.breakdown["optimizer_gpu"]


def test_bf16_gradients_and_fp8_parameters():
    params = 4 * LAYER + 2 * EMB + h
    e = est(ddp__grad_reduce_in_fp32=False)
    assert bytes_of(e, "grads") == pytest.approx(2 * params, abs=1e-3)
    fp8 = est(model__fp8="hybrid", model__fp8_param=True)
    assert bytes_of(fp8, "weights") == pytest.approx(1 * params, abs=1e-3)
    assert est(model__fp8_param=True).breakdown["weights"] == est().breakdown["weights"]  # no fp8 recipe: bf16


def test_precision_aware_optimizer_dtypes_in_any_spelling():
    params = 4 * LAYER + 2 * EMB + h
    e = est(optimizer__use_precision_aware_optimizer=True, optimizer__main_params_dtype="torch.float16",
            optimizer__exp_avg_dtype={"_target_": "torch.bfloat16", "_call_": False}, optimizer__exp_avg_sq_dtype="fp8")
    assert bytes_of(e, "optimizer_gpu") == pytest.approx((2 + 2 + 1) * params, abs=1e-3)
    assert M._dtype_bytes(None, 4) == 4 and M._dtype_bytes("torch.no_such", 3) == 3 and M._dtype_bytes(5, 4) == 4


def test_multi_latent_attention_parameters():
    # q LoRA 32, kv LoRA 16, qk head 8 + rope 4, v head 8, 4 heads
    e = est(model__multi_latent_attention=True, model__q_lora_rank=32, model__kv_lora_rank=16,
            model__qk_head_dim=8, model__qk_pos_emb_head_dim=4, model__v_head_dim=8)
    attn_tp = 32 * 4 * (8 + 4) + 16 * 4 * (8 + 8) + 4 * 8 * h
    attn_rep = (h * 32 + 32) + h * (16 + 4) + 16
    params = 4 * (attn_tp + attn_rep + MLP + NORMS) + 2 * EMB + h
    assert bytes_of(e, "weights") == pytest.approx(2 * params, abs=1e-3)
    # without a q LoRA rank, q is one up-projection from h
    e2 = est(model__multi_latent_attention=True, model__kv_lora_rank=16, model__qk_head_dim=8,
             model__qk_pos_emb_head_dim=4, model__v_head_dim=8)
    attn_tp2 = h * 4 * 12 + 16 * 4 * 16 + 4 * 8 * h
    attn_rep2 = h * (16 + 4) + 16
    params2 = 4 * (attn_tp2 + attn_rep2 + MLP + NORMS) + 2 * EMB + h
    assert bytes_of(e2, "weights") == pytest.approx(2 * params2, abs=1e-3)


def test_moe_every_other_layer_with_a_multi_token_prediction_layer():
    # 4 experts of ffn 32 on layers 0 and 2 (moe_layer_freq 2), top-2; router h x E replicated
    moe = dict(model__num_moe_experts=4, model__moe_ffn_hidden_size=32, model__moe_layer_freq=2,
               model__moe_router_topk=2)
    e = est(**moe)
    experts = 4 * h * 32 * 2
    params = 2 * LAYER + 2 * (ATTN + NORMS + h * 4 + experts) + 2 * EMB + h
    assert bytes_of(e, "weights") == pytest.approx(2 * params, abs=1e-3)
    moe_act = T * (10 * h + (8 * h + 2 * (4 * 32 + 4 * h) + 4 * 4))
    assert bytes_of(e, "activations") == pytest.approx(2 * ACT + 2 * moe_act + EMB_ACT + LOGITS, abs=1e-3)
    # an MTP layer: attention, its MoE layer (routed experts, router), two norms and the h x 2h projection
    mtp = est(model__mtp_num_layers=1, **moe)
    extra = ATTN + 2 * h * h + NORMS + 2 * h + h * 4 + experts
    assert bytes_of(mtp, "weights") - bytes_of(e, "weights") == pytest.approx(2 * extra, abs=1e-3)
    # a per-layer pattern list must have one entry per layer
    assert bytes_of(est(model__num_moe_experts=4, model__moe_ffn_hidden_size=32, model__moe_router_topk=2,
                        model__moe_layer_freq=[1, 0, 1, 0]), "weights") == bytes_of(e, "weights")
    with pytest.raises(M.MemoryModelError, match="3 entries for 4 layers"):
        est(model__num_moe_experts=4, model__moe_layer_freq=[1, 0, 1])


def test_tied_embeddings_vocab_padding_and_swiglu():
    params = 4 * LAYER + 2 * EMB + h
    assert bytes_of(est(model__share_embeddings_and_output_weights=True), "weights") == \
        pytest.approx(2 * (params - EMB), abs=1e-3)
    # padding to a multiple of 1000: V stays 1000
    assert bytes_of(est(model__make_vocab_size_divisible_by=1000), "weights") == \
        pytest.approx(2 * (params - 2 * (Vp - 1000) * h), abs=1e-3)
    swiglu = est(model__gated_linear_unit=True)
    assert bytes_of(swiglu, "weights") == pytest.approx(2 * (params + 4 * h * 256), abs=1e-3)


def test_capacity_margin_and_the_fits_boundary():
    e = est()
    at = M.estimate(RunConfig(copy.deepcopy(BASE), "t"), world_size=1, gpu_memory_gb=(e.peak_gb + 2.0) / 0.95)
    assert at.fits  # peak + margin == capacity
    below = M.estimate(RunConfig(copy.deepcopy(BASE), "t"), world_size=1, gpu_memory_gb=(e.peak_gb + 2.0) / 0.95 - 1e-6)
    assert not below.fits
    # what torch reports for an H100 80GB ("GPU 3 has a total capacity of 79.11 GiB"), in GB
    assert M.gpu_capacity_gb("h100") == pytest.approx(79.11 * (1 << 30) / 1e9)
    with pytest.raises(M.MemoryModelError, match="unknown GPU"):
        M.gpu_capacity_gb("voodoo5")


def test_missing_or_wrong_shapes_and_layouts_are_errors():
    with pytest.raises(M.MemoryModelError, match="world size 3"):
        est(world=3, model__tensor_model_parallel_size=2)
    with pytest.raises(M.MemoryModelError, match="not a number"):
        est(model__hidden_size="big")
    with pytest.raises(M.MemoryModelError) as exc:
        est(model__seq_length=None)
    assert str(exc.value) == "the memory model needs model.seq_length (or dataset.sequence_length)"
    assert est(model__seq_length=None, dataset__sequence_length=128).peak_gb == est().peak_gb
    assert est(model__seq_length=None, dataset__seq_length=128).peak_gb == est().peak_gb
    assert math.isclose(est(world=None).world_size, 1)


# ---- defaults, notes and edges (each case is something the model's code must not get wrong)

def test_defaults_equal_the_explicit_values():
    base = est()
    absent_mb = copy.deepcopy(BASE)
    del absent_mb["train"]["micro_batch_size"]
    e1 = M.estimate(RunConfig(absent_mb, "t"), world_size=1, gpu_memory_gb=80)
    assert e1.breakdown["activations"] == est(train__micro_batch_size=1).breakdown["activations"]
    # SwiGLU unless gated_linear_unit is false; untied; vocab padded to 128 x TP
    no_gate = copy.deepcopy(BASE)
    del no_gate["model"]["gated_linear_unit"]
    e2 = M.estimate(RunConfig(no_gate, "t"), world_size=1, gpu_memory_gb=80)
    assert e2.breakdown["weights"] == est(model__gated_linear_unit=True).breakdown["weights"] > base.breakdown["weights"]
    assert bytes_of(est(model__gated_linear_unit=True), "activations") == pytest.approx(
        4 * T * (10 * h + (8 * h + 6 * 256)) + EMB_ACT + LOGITS, abs=1e-3)  # fc1 output 2 x ffn wide
    assert est(model__share_embeddings_and_output_weights=False).breakdown == base.breakdown
    tp2 = est(world=2, model__tensor_model_parallel_size=2, model__vocab_size=1100)  # 128 x 2 = 256: 1280
    assert bytes_of(tp2, "weights") == pytest.approx(2 * ((4 * (ATTN + MLP) / 2 + 4 * NORMS) + 2 * 1280 * h / 2 + h),
                                                     abs=1e-3)
    # ffn defaults to 4 h; kv_channels to h // heads (60 // 8 = 7)
    no_ffn = copy.deepcopy(BASE)
    del no_ffn["model"]["ffn_hidden_size"]
    e3 = M.estimate(RunConfig(no_ffn, "t"), world_size=1, gpu_memory_gb=80)
    assert e3.breakdown["weights"] == est().breakdown["weights"]  # 4 x 64 = 256 already
    odd = est(model__hidden_size=60, model__num_attention_heads=8, model__num_query_groups=8, model__kv_channels=None,
              model__ffn_hidden_size=240)
    attn = 60 * 8 * 7 + 2 * 60 * 8 * 7 + 8 * 7 * 60
    params = 4 * (attn + 60 * 240 * 2 + 120) + 2 * 1024 * 60 + 60
    assert bytes_of(odd, "weights") == pytest.approx(2 * params, abs=1e-3)


def test_notes_say_what_the_model_assumed():
    def notes(**kw):
        return est(**kw).notes

    base = notes()
    assert "no distributed optimizer: every GPU holds the full optimizer state (18 B/param)" in base
    assert not any(("fp32 parameters" in n or "most-loaded stage" in n or "MoE:" in n) for n in base)
    assert "MoE: tokens assumed balanced across experts (no dispatcher workspace, no imbalance)" in notes(
        model__num_moe_experts=4, model__moe_ffn_hidden_size=32)
    assert "multi-latent attention: the q/kv down-projections are counted as replicated" in notes(
        model__multi_latent_attention=True, model__kv_lora_rank=16)
    assert "FP8 parameters: 1 byte per weight" in notes(model__fp8="hybrid", model__fp8_param_gather=True)
    assert "fp32 parameters: no separate FP32 master copy" in notes(model__bf16=False)
    assert not any("fp32 parameters" in n for n in notes(model__bf16=False, model__fp16=True))
    assert "CUDA graphs: their private memory pools are not counted (measure them)" in notes(
        model__cuda_graph_impl="local")
    assert "selective recompute of core_attn: core attention is not stored in any case (flash attention)" in notes(
        model__recompute_granularity="selective")
    assert ("selective recompute of core_attn, mlp: core attention is not stored in any case (flash attention)"
            in notes(model__recompute_granularity="selective", model__recompute_modules=["core_attn", "mlp"]))
    assert "fine-grained activation offloading is not modelled (activations counted on the GPU)" in notes(
        model__fine_grained_activation_offloading=True)
    assert "weight offloading: no effect on the estimate (parameters stay on the GPU for the optimizer)" in notes(
        model__cpu_offloading=True, model__cpu_offloading_weights=True)
    assert not any("weight offloading" in n for n in notes(model__cpu_offloading_weights=True))
    assert "precision-aware optimizer: master 2 B, Adam moments 3 B per parameter" in notes(
        optimizer__use_precision_aware_optimizer=True, optimizer__main_params_dtype="bf16",
        optimizer__exp_avg_dtype="bf16", optimizer__exp_avg_sq_dtype="fp8")
    nogbs1 = copy.deepcopy(BASE)
    del nogbs1["train"]["global_batch_size"]
    assert not any("global batch size unknown" in n
                   for n in M.estimate(RunConfig(nogbs1, "t"), world_size=1, gpu_memory_gb=80).notes)  # PP=1
    pp = est(world=2, model__pipeline_model_parallel_size=2)
    assert "most-loaded stage: first stage; 2 microbatch(es) in flight" in pp.notes
    nogbs = copy.deepcopy(BASE)
    nogbs["model"]["pipeline_model_parallel_size"] = 2
    del nogbs["train"]["global_batch_size"]
    e = M.estimate(RunConfig(nogbs, "t"), world_size=2, gpu_memory_gb=80)
    assert "global batch size unknown: as many microbatches in flight as pipeline stages" in e.notes
    assert not any("global batch size unknown" in n for n in est().notes + pp.notes)
    d = M.estimate(RunConfig(copy.deepcopy(BASE), "t"), world_size=1)
    assert d.gpu == "h100" and "GPU: H100 80GB assumed (give --gpu or --gpu-memory)" in d.notes
    g = M.estimate(RunConfig(copy.deepcopy(BASE), "t"), world_size=1, gpu="H100")
    assert g.gpu == "h100" and not any("assumed" in n for n in g.notes)
    assert est().gpu == "80 GB"
    w = M.estimate(RunConfig({**copy.deepcopy(BASE), "model": {**BASE["model"], "tensor_model_parallel_size": 2,
                                                                 "pipeline_model_parallel_size": 2,
                                                                 "context_parallel_size": 2}}, "t"))
    assert w.world_size == 8 and any("world size 8: the smallest the layout allows (TP·PP·CP = 8, ETP·EP·PP = 4)" in n
                                     for n in w.notes)
    with pytest.raises(M.MemoryModelError, match=r"world size 4 is not divisible by TP·PP·CP = 8 and ETP·EP·PP = 8"):
        M.estimate(RunConfig({**copy.deepcopy(BASE), "model": {**BASE["model"], "tensor_model_parallel_size": 2,
                                                                "pipeline_model_parallel_size": 2,
                                                                "context_parallel_size": 2,
                                                                "expert_model_parallel_size": 2}}, "t"), world_size=4)
    with pytest.raises(M.MemoryModelError, match=r"known: a100, a100-40, .*h100, "):
        M.gpu_capacity_gb("voodoo5")


def test_context_parallel_divides_tokens_and_shards_the_optimizer():
    e = est(world=4, model__context_parallel_size=2, optimizer__use_distributed_optimizer=True)  # DP = 2, CP = 2
    params = 4 * LAYER + 2 * EMB + h
    assert bytes_of(e, "optimizer_gpu") == pytest.approx(12 * params / 4, abs=1e-3)  # shard = DP x CP
    t = T / 2
    acts = 4 * t * (10 * h + (8 * h + 4 * 256)) + 8 * t + 2 * t * h + 4 * t * (h + Vp)
    assert bytes_of(e, "activations") == pytest.approx(acts, abs=1e-3)
    assert est(world=4, ddp__use_distributed_optimizer=True).breakdown["optimizer_gpu"] == \
        est(world=4, optimizer__use_distributed_optimizer=True).breakdown["optimizer_gpu"]


def test_sequence_parallel_needs_tensor_parallel():
    assert est(model__sequence_parallel=True).breakdown == est().breakdown


def test_odd_option_values_fall_back_safely():
    base = est()
    # a MoE frequency that is not a number or a list (Megatron also takes a Python expression
    # string): every layer is MoE, as with the default 1
    moe = dict(model__num_moe_experts=4, model__moe_ffn_hidden_size=32)
    every = est(**moe)
    for freq in ("([1]*4)", True, 0, -3):
        assert est(model__moe_layer_freq=freq, **moe).breakdown == every.breakdown, freq
    assert est(model__moe_layer_freq=1, **moe).breakdown == every.breakdown
    assert est(model__moe_router_topk=2, **moe).breakdown == every.breakdown  # top-2 by default
    # every layer MoE: no dense MLP needs ffn_hidden_size
    no_ffn = copy.deepcopy(BASE)
    del no_ffn["model"]["ffn_hidden_size"]
    no_ffn["model"].update(num_moe_experts=4, moe_ffn_hidden_size=32)
    assert M.estimate(RunConfig(no_ffn, "t"), world_size=1, gpu_memory_gb=80).peak_gb > 0
    # an offload fraction that is not a number (or a bool) offloads nothing; none given: 0
    off = dict(optimizer__use_distributed_optimizer=True, optimizer__optimizer_cpu_offload=True)
    zero = est(world=2, optimizer__optimizer_offload_fraction=0.0, **off)
    for frac in ("half", True):
        assert est(world=2, optimizer__optimizer_offload_fraction=frac, **off).breakdown == zero.breakdown, frac
    assert est(world=2, **off).breakdown == zero.breakdown
    # activation offload switched on with no layer count offloads nothing
    assert est(model__cpu_offloading=True).breakdown["activations"] == base.breakdown["activations"]
    with pytest.raises(M.MemoryModelError, match="hidden_size"):
        est(model__hidden_size=0)
    assert est(model__num_attention_heads=1, model__num_query_groups=1, model__kv_channels=64).peak_gb > 0


def test_precision_aware_defaults_and_fp32_parameters():
    params = 4 * LAYER + 2 * EMB + h
    e = est(optimizer__use_precision_aware_optimizer=True)  # every dtype fp32 by default
    assert bytes_of(e, "optimizer_gpu") == pytest.approx(12 * params, abs=1e-3)
    fp32 = est(model__bf16=False, optimizer__use_precision_aware_optimizer=True)
    assert bytes_of(fp32, "optimizer_gpu") == pytest.approx(8 * params, abs=1e-3)  # no master copy
    assert bytes_of(est(model__bf16=False), "weights") == pytest.approx(4 * params, abs=1e-3)
    assert bytes_of(est(model__bf16=False, ddp__grad_reduce_in_fp32=False), "grads") == \
        pytest.approx(4 * params, abs=1e-3)  # fp32 parameters: fp32 grads
    fp16 = est(model__bf16=False, model__fp16=True)
    assert bytes_of(fp16, "weights") == pytest.approx(2 * params, abs=1e-3)
    assert bytes_of(est(model__fp8="hybrid", model__fp8_param_gather=True), "weights") == \
        pytest.approx(params, abs=1e-3)


def test_expert_and_tensor_parallel_shard_the_experts():
    moe = dict(model__num_moe_experts=4, model__moe_ffn_hidden_size=32)
    one = est(**moe)
    four = est(world=4, model__tensor_model_parallel_size=2, model__expert_model_parallel_size=2, **moe)
    experts = 4 * (4 * h * 32 * 2)  # 4 layers of 4 experts
    router_norms = 4 * (h * 4 + NORMS) + h  # replicated
    tp_part = 4 * ATTN + 2 * 1024 * h  # / TP (V padded to 256: still 1024)
    assert bytes_of(four, "weights") == pytest.approx(2 * (tp_part / 2 + router_norms + experts / 4), abs=1e-3)
    assert bytes_of(one, "weights") == pytest.approx(2 * (tp_part + router_norms + experts), abs=1e-3)


def test_shared_experts_count_in_parameters_and_activations():
    moe = dict(model__num_moe_experts=4, model__moe_ffn_hidden_size=32, model__moe_router_topk=2)
    e, s = est(**moe), est(model__moe_shared_expert_intermediate_size=48, **moe)
    assert bytes_of(s, "weights") - bytes_of(e, "weights") == pytest.approx(2 * 4 * h * 48 * 2, abs=1e-3)
    assert bytes_of(s, "activations") - bytes_of(e, "activations") == pytest.approx(4 * T * 4 * 48, abs=1e-3)


def test_mla_default_head_dims():
    explicit = est(model__multi_latent_attention=True, model__kv_lora_rank=16, model__qk_head_dim=128,
                   model__qk_pos_emb_head_dim=64, model__v_head_dim=128)
    assert est(model__multi_latent_attention=True, model__kv_lora_rank=16).breakdown == explicit.breakdown


def test_recompute_edges():
    # uniform full recompute without a layer count: chunks of one layer
    assert est(model__recompute_granularity="full", model__recompute_method="uniform").breakdown == \
        est(model__recompute_granularity="full", model__recompute_method="uniform",
            model__recompute_num_layers=1).breakdown
    # without SP the chunk's input is not divided by TP
    e = est(world=2, model__tensor_model_parallel_size=2, model__recompute_granularity="full",
            model__recompute_method="uniform", model__recompute_num_layers=4)
    per_layer = T * (10 * h + (8 * h + 4 * 256) / 2)
    assert bytes_of(e, "activations") == pytest.approx(
        1 * 2 * T * h + 4 * per_layer + 8 * T + 2 * T * h + 4 * T * (h + Vp) / 2, abs=1e-3)
    # uniform recompute works on the largest layers (MoE here), offload keeps the first in transit
    moe = dict(model__num_moe_experts=4, model__moe_ffn_hidden_size=512, model__moe_layer_freq=[1, 0, 0, 0],
               model__moe_router_topk=2)
    big = T * (10 * h + (8 * h + 2 * (4 * 512 + 4 * h) + 4 * 4))
    r = est(model__recompute_granularity="full", model__recompute_method="uniform", model__recompute_num_layers=1,
            **moe)
    assert bytes_of(r, "activations") == pytest.approx(4 * CKPT + big + EMB_ACT + LOGITS, abs=1e-3)
    sel = est(model__recompute_granularity="selective", model__recompute_modules=["moe"], **moe)
    assert bytes_of(sel, "activations") == pytest.approx(0.5 * (big + 3 * ACT) + EMB_ACT + LOGITS, abs=1e-3)
    off = est(model__cpu_offloading=True, model__cpu_offloading_num_layers=3,
              model__cpu_offloading_double_buffering=True, **moe)
    assert bytes_of(off, "activations") == pytest.approx(ACT + big + big + EMB_ACT + LOGITS, abs=1e-3)
    # a stage with no layer (more stages than layers) is sized, not a crash
    assert est(world=4, model__num_layers=2, model__pipeline_model_parallel_size=4,
               model__recompute_granularity="full", model__recompute_method="block").peak_gb > 0


def test_microbatches_in_flight_follow_the_global_batch():
    # PP=4, DP=1: 7 // 2 = 3 microbatches: the first stage holds 3, not 4 (nor 3.5)
    e = est(world=4, model__pipeline_model_parallel_size=4, train__global_batch_size=7)
    assert "most-loaded stage: first stage; 3 microbatch(es) in flight" in e.notes
    one = est(world=2, model__pipeline_model_parallel_size=2, train__global_batch_size=2)  # one microbatch:
    assert "most-loaded stage: last stage; 1 microbatch(es) in flight" in one.notes  # 1 each, + the logits
    nogbs = copy.deepcopy(BASE)
    nogbs["model"]["pipeline_model_parallel_size"] = 2
    del nogbs["train"]["global_batch_size"]
    e2 = M.estimate(RunConfig(nogbs, "t"), world_size=2, gpu_memory_gb=80)
    assert "most-loaded stage: first stage; 2 microbatch(es) in flight" in e2.notes
    # the last stage is the most loaded when the logits are big: its 1 microbatch in flight
    big_v = est(world=2, model__pipeline_model_parallel_size=2, model__vocab_size=200000)
    assert big_v.stage == "last stage" and "most-loaded stage: last stage; 1 microbatch(es) in flight" in big_v.notes


def test_uneven_stages_are_read_from_the_config():
    even = est(world=2, model__pipeline_model_parallel_size=2)
    first3 = est(world=2, model__pipeline_model_parallel_size=2, model__num_layers_in_first_pipeline_stage=3)
    last3 = est(world=2, model__pipeline_model_parallel_size=2, model__num_layers_in_last_pipeline_stage=3)
    assert first3.peak_gb > even.peak_gb and last3.peak_gb > even.peak_gb and first3.peak_gb != last3.peak_gb
    assert M._stage_layers(6, 3, 1, 0, 3, None) == [0, 1, 2]
    assert M._stage_layers(6, 3, 1, 1, 3, None) == [3]
    assert M._stage_layers(6, 3, 1, 0, None, 1) == [0, 1]
    assert M._stage_layers(6, 3, 1, 2, None, 1) == [4]
    assert M._stage_layers(4, 2, 1, 1, 2, 2) == [2, 3]
    assert M._stage_layers(3, 2, 2, 1, None, None) == [1]  # PP x VPP > layers: no interleaving


def test_host_memory_is_per_node_of_8_gpus():
    off = dict(optimizer__use_distributed_optimizer=True, optimizer__optimizer_cpu_offload=True,
               optimizer__optimizer_offload_fraction=1.0)
    e = est(world=16, **off)
    assert e.host_gb == pytest.approx(8 * e.breakdown["optimizer_host_per_gpu"])


def test_a_multi_token_prediction_layer_on_a_dense_model_with_qk_norm():
    # an MTP layer: attention (+ its q/k norms), the dense MLP, the h x 2h projection, two norms
    e = est(model__qk_layernorm=True)
    mtp = est(model__qk_layernorm=True, model__mtp_num_layers=1)
    extra = ATTN + MLP + 2 * h * h + NORMS + 2 * 16 + 2 * h
    assert bytes_of(mtp, "weights") - bytes_of(e, "weights") == pytest.approx(2 * extra, abs=1e-3)


def test_microbatches_divide_by_micro_batch_times_data_parallel():
    # DP = 2, PP = 2: global batch 4 / (micro batch 2 x DP 2) = 1 microbatch: 1 in flight on stage 0
    e = est(world=4, model__pipeline_model_parallel_size=2, train__global_batch_size=4)
    assert "most-loaded stage: last stage; 1 microbatch(es) in flight" in e.notes
