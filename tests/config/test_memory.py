"""The memory model against the seed's measurements (megatron-facts.md §5-6) and its contract."""
from __future__ import annotations

import dataclasses

import pytest

from diagnose.config import memory as M
from diagnose.config import schema
from diagnose.config.load import load_config
from diagnose.config.overrides import apply_overrides
from diagnose.config.runconfig import RunConfig

MARCH = "fixtures/configs/qwen3_30b_a3b_tp2_pp2_ep4.yaml"
# card.yaml measured_results: Qwen3-30B-A3B TP2 PP2 EP4, 16 H100, mem-allocated-gigabytes
MEASURED = [(None, 47.2), (0.25, 43.4), (0.5, 39.6), (0.75, 35.6), (1.0, 32.0)]


@pytest.fixture(scope="module")
def march(repo):
    return load_config(str(repo / MARCH), strict=True)


def _with(cfg, *ov):
    return apply_overrides(cfg, list(ov), schema.known)[0]


@pytest.mark.parametrize("fraction,measured", MEASURED)
def test_measured_table_within_1_percent(march, fraction, measured):
    """docs/check.md gives the errors (all within 0.9 %): a 5 % change of a memory term must fail."""
    ov = [] if fraction is None else ["optimizer.optimizer_cpu_offload=true", f"optimizer.optimizer_offload_fraction={fraction}"]
    est = M.estimate(_with(march, *ov), world_size=16, gpu="h100")
    assert abs(est.per_gpu_gb - measured) / measured <= 0.01, (fraction, est.per_gpu_gb, measured)
    assert est.fits  # every measured run completed
    # the peak adds the activations in flight, the same at every fraction (docs/check.md: 1.75 GB)
    assert est.peak_gb - est.per_gpu_gb == pytest.approx(1.75, abs=0.02)


def test_savings_per_25_percent_and_at_100(march):
    base = M.estimate(march, world_size=16).per_gpu_gb
    full = M.estimate(_with(march, "optimizer.optimizer_cpu_offload=true", "optimizer.optimizer_offload_fraction=1.0"),
                      world_size=16).per_gpu_gb
    quarter = M.estimate(_with(march, "optimizer.optimizer_cpu_offload=true", "optimizer.optimizer_offload_fraction=0.25"),
                         world_size=16).per_gpu_gb
    assert base - full == pytest.approx(15.3, abs=0.8)  # card: -15.3 GB at 100%
    assert base - quarter == pytest.approx(3.8, abs=0.3)  # docs: 3.8 GB saved per 25%


def test_activation_offload_24_layers_pp1_does_not_fit(march, repo):
    cfg = load_config(str(repo / "fixtures/configs/qwen3_30b_a3b_activation_offload_24_pp1.yaml"), strict=True)
    est = M.estimate(cfg, world_size=16, gpu="h100")
    assert not est.fits
    assert est.peak_gb + est.margin_gb > est.capacity_gb
    # it died at 70.3 GB allocated: the steady state alone is already about there
    assert est.per_gpu_gb == pytest.approx(70.3, rel=0.05)


def test_fraction_zero_saves_nothing_and_out_of_range_is_clamped(march):
    base = M.estimate(march, world_size=16)
    zero = M.estimate(_with(march, "optimizer.optimizer_cpu_offload=true"), world_size=16)
    over = M.estimate(_with(march, "optimizer.optimizer_cpu_offload=true", "optimizer.optimizer_offload_fraction=1.5"), world_size=16)
    full = M.estimate(_with(march, "optimizer.optimizer_cpu_offload=true", "optimizer.optimizer_offload_fraction=1.0"), world_size=16)
    assert zero.per_gpu_gb == pytest.approx(base.per_gpu_gb) and zero.host_gb == 0
    assert over.per_gpu_gb == pytest.approx(full.per_gpu_gb)


def test_host_memory_is_16_bytes_per_offloaded_sharded_param(march):
    est = M.estimate(_with(march, "optimizer.optimizer_cpu_offload=true", "optimizer.optimizer_offload_fraction=1.0"),
                     world_size=16, gpus_per_node=8)
    # expert params/GPU ≈ 3.62 B sharded over expert-DP 2, dense ≈ 0.39 B over DP 4 -> ≈ 1.91 B x 16 B x 8 GPUs
    assert est.host_gb == pytest.approx(1.91 * 16 * 8, rel=0.03)
    half = M.estimate(_with(march, "optimizer.optimizer_cpu_offload=true", "optimizer.optimizer_offload_fraction=0.5"),
                      world_size=16, gpus_per_node=8)
    assert half.host_gb == pytest.approx(est.host_gb / 2)


def test_pinned_host_memory_is_the_fp32_clone_and_the_grads(march):
    """MCore 0.16.1's HybridDeviceOptimizer pins its FP32 clone always (``.cpu().pin_memory()``)
    and the grad buffer with pin_cpu_grads; torch's CPU Adam keeps m and v pageable: 8 of the
    16 bytes are pinned, 4 with pin_cpu_grads=false; pin_cpu_params changes nothing."""
    on = ("optimizer.optimizer_cpu_offload=true", "optimizer.optimizer_offload_fraction=1.0")
    est = M.estimate(_with(march, *on), world_size=16, gpus_per_node=8)
    assert est.pinned_gb == pytest.approx(est.host_gb * 8 / 16)
    no_grads = M.estimate(_with(march, *on, "optimizer.pin_cpu_grads=false"), world_size=16, gpus_per_node=8)
    assert no_grads.pinned_gb == pytest.approx(est.host_gb * 4 / 16) and no_grads.host_gb == est.host_gb
    no_params = M.estimate(_with(march, *on, "optimizer.pin_cpu_params=false"), world_size=16, gpus_per_node=8)
    assert no_params.pinned_gb == est.pinned_gb


def test_no_fix_sets_pin_cpu_params(db):
    """The HybridDeviceOptimizer ignores pin_cpu_params: a fix that sets it changes nothing."""
    assert not [s.id for s in db.signatures for f in s.fixes for e in f.edits if e.key == "optimizer.pin_cpu_params"]


def test_distributed_optimizer_bytes(march):
    no = M.estimate(_with(march, "optimizer.use_distributed_optimizer=false", "ddp.use_distributed_optimizer=false"),
                    world_size=16)
    yes = M.estimate(march, world_size=16)
    params = no.breakdown["weights"] / 2
    assert (no.per_gpu_gb / params) == pytest.approx(18.0)  # 2 + 4 + 12
    assert yes.per_gpu_gb < no.per_gpu_gb


@pytest.mark.parametrize("name,billions", [
    ("qwen3-30b-a3b", 30.5), ("llama3-8b", 8.03), ("llama3-70b", 70.6), ("mixtral-8x7b", 46.7),
    ("deepseek-v3", 671 + 14), ("qwen3-235b-a22b", 235.1), ("llama3.1-405b", 405.9),
])
def test_presets_parameter_counts(name, billions):
    cfg = RunConfig({"model": dict(M.presets()[name]["model"])})
    est = M.estimate(cfg)  # TP = PP = EP = 1: the only stage holds every parameter
    assert est.breakdown["weights"] / 2 == pytest.approx(billions, rel=0.01)


def test_tied_embeddings_count_once_at_pp1():
    base = dict(M.presets()["llama3-8b"]["model"])
    untied = M.estimate(RunConfig({"model": base})).breakdown["weights"]
    tied = M.estimate(RunConfig({"model": {**base, "share_embeddings_and_output_weights": True}})).breakdown["weights"]
    assert untied - tied == pytest.approx(2 * 128256 * 4096 / 1e9, rel=0.01)


def test_recompute_sp_and_offload_lower_activations():
    m = {**M.presets()["llama3-8b"]["model"], "tensor_model_parallel_size": 2}
    plain = M.estimate(RunConfig({"model": m})).breakdown["activations"]
    sp = M.estimate(RunConfig({"model": {**m, "sequence_parallel": True}})).breakdown["activations"]
    full = M.estimate(RunConfig({"model": {**m, "sequence_parallel": True, "recompute_granularity": "full",
                                           "recompute_method": "uniform", "recompute_num_layers": 1}})).breakdown["activations"]
    off = M.estimate(RunConfig({"model": {**m, "sequence_parallel": True, "cpu_offloading": True,
                                          "cpu_offloading_num_layers": 16}})).breakdown["activations"]
    assert plain > sp > off > full


def test_world_size_default_is_smallest_and_said(march):
    est = M.estimate(march)
    assert est.world_size == 8  # lcm(TP·PP·CP = 4, ETP·EP·PP = 8)
    assert any("smallest the layout allows" in n for n in est.notes)
    with pytest.raises(M.MemoryModelError, match="not divisible"):
        M.estimate(march, world_size=12)


def test_gpu_capacity_and_contract():
    assert M.gpu_capacity_gb("h100") == pytest.approx(84.94, abs=0.01)
    assert M.gpu_capacity_gb("H200") > M.gpu_capacity_gb("a100-80") > M.gpu_capacity_gb("a100-40")
    assert M.gpu_capacity_gb("b200") > 190
    with pytest.raises(M.MemoryModelError, match="unknown GPU"):
        M.gpu_capacity_gb("tpu-v5")
    fields = {f.name for f in dataclasses.fields(M.MemoryEstimate)}
    assert {"per_gpu_gb", "peak_gb", "capacity_gb", "fits", "host_gb", "breakdown", "world_size", "notes"} <= fields
    est = M.estimate(RunConfig({"model": dict(M.presets()["llama3-8b"]["model"])}), gpu_memory_gb=500.0)
    assert est.capacity_gb == 500.0 and est.fits
    assert {"weights", "grads", "optimizer_gpu", "activations", "margin"} <= set(est.breakdown)


def test_missing_shape_is_an_error_not_a_guess():
    with pytest.raises(M.MemoryModelError, match=r"model\.hidden_size"):
        M.estimate(RunConfig({"model": {"num_layers": 4}}))


def test_precision_aware_optimizer_and_grad_dtype_change_the_bytes(march):
    """Issue 12, item 8: MCore's precision-aware optimizer keeps Adam's moments in the dtypes the
    config names (bf16 moments: 4 B instead of 8), and without grad_reduce_in_fp32 the gradient
    buffer is bf16 (2 B instead of 4); the changes are exactly those bytes per local parameter."""
    base = M.estimate(march, world_size=16)
    pa = M.estimate(_with(march, "optimizer.use_precision_aware_optimizer=true",
                          "optimizer.exp_avg_dtype=torch.bfloat16", "optimizer.exp_avg_sq_dtype=torch.bfloat16"),
                    world_size=16)
    assert pa.breakdown["optimizer_gpu"] < base.breakdown["optimizer_gpu"]
    assert pa.breakdown["weights"] == base.breakdown["weights"] and pa.breakdown["grads"] == base.breakdown["grads"]
    # moments 8 -> 4 of the (master 4 + moments 8) per sharded parameter: a third less optimizer state
    assert pa.breakdown["optimizer_gpu"] == pytest.approx(base.breakdown["optimizer_gpu"] * 8 / 12, rel=1e-6)
    bf16_grads = M.estimate(_with(march, "ddp.grad_reduce_in_fp32=false"), world_size=16)
    assert bf16_grads.breakdown["grads"] == pytest.approx(base.breakdown["grads"] / 2, rel=1e-6)


def test_cuda_graph_pools_are_said_not_counted(march):
    est = M.estimate(_with(march, "model.cuda_graph_impl=transformer_engine"), world_size=16)
    assert any("CUDA graphs" in n for n in est.notes)


# --- each term of the model against a hand count (a small dense GPT, bf16, one GPU) -----------
# h 1024, 16 heads of d 64 in 4 query groups, SwiGLU ffn 4096, 4 layers, vocab 32000: a change of
# one setting moves the parameters by a count written out below; weights are 2 B per parameter
# (bf16), gradients 4 B, the optimizer 12 B (FP32 master + Adam m, v) on one GPU.
SMALL = {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "num_query_groups": 4,
         "ffn_hidden_size": 4096, "vocab_size": 32000, "seq_length": 2048, "gated_linear_unit": True,
         "make_vocab_size_divisible_by": 128}
Lh, H, D, G, F, V = 4, 1024, 64, 4, 4096, 32000


def _small(model=None, **top):
    return M.estimate(RunConfig({"model": {**SMALL, **(model or {})}, **top}), world_size=1)


@pytest.mark.parametrize("change,params", [
    ({"add_qkv_bias": True}, (16 * D + 2 * G * D) * Lh),          # q, k, v biases
    ({"qk_layernorm": True}, 2 * D * Lh),                         # a norm of the head dim for q and k
    ({"gated_linear_unit": False}, -H * F * Lh),                  # 2 matrices instead of 3
    ({"num_query_groups": 8}, 2 * D * H * (8 - G) * Lh),          # k and v grow with the groups
    ({"share_embeddings_and_output_weights": True}, -V * H),      # one vocab matrix at PP=1
    ({"vocab_size": 32001}, 128 * H * 2),                         # padded to the next multiple of 128, twice
], ids=["qkv-bias", "qk-norm", "no-swiglu", "more-kv-groups", "tied", "vocab-padding"])
def test_each_parameter_term_moves_weights_grads_and_optimizer_by_its_count(change, params):
    base, after = _small().breakdown, _small(change).breakdown
    assert after["weights"] - base["weights"] == pytest.approx(2 * params / 1e9, abs=1e-12)
    assert after["grads"] - base["grads"] == pytest.approx(4 * params / 1e9, abs=1e-12)
    assert after["optimizer_gpu"] - base["optimizer_gpu"] == pytest.approx(12 * params / 1e9, abs=1e-12)
    if not {"gated_linear_unit", "vocab_size"} & set(change):  # the MLP's and the logits' activations move
        assert after["activations"] == base["activations"]


def test_a_multi_token_prediction_layer_is_a_layer_and_its_projection():
    layer = 2 * H * H + 2 * G * D * H + 3 * H * F + 2 * H  # attention, SwiGLU MLP, two norms
    grown = (_small({"mtp_num_layers": 1}).breakdown["weights"] - _small().breakdown["weights"]) * 1e9 / 2
    assert layer + 2 * H * H <= grown <= layer + 2 * H * H + 4 * H  # + the 2h -> h projection (and its norms)


def test_fp32_parameters_have_no_separate_master_copy():
    base, fp32 = _small(), _small({"bf16": False})
    assert fp32.breakdown["weights"] == pytest.approx(2 * base.breakdown["weights"])
    assert fp32.breakdown["grads"] == pytest.approx(base.breakdown["grads"])
    assert fp32.breakdown["optimizer_gpu"] == pytest.approx(base.breakdown["optimizer_gpu"] * 8 / 12)
    assert any("no separate FP32 master copy" in n for n in fp32.notes)


def test_activations_scale_with_the_micro_batch_and_only_full_recompute_saves_them():
    base = _small().breakdown["activations"]
    assert _small(train={"micro_batch_size": 2}).breakdown["activations"] == pytest.approx(2 * base)
    assert _small(train={"micro_batch_size": 4}).breakdown["activations"] == pytest.approx(4 * base)
    selective = _small({"recompute_granularity": "selective"})
    assert selective.breakdown["activations"] == pytest.approx(base)  # core attention is never stored (flash)
    assert any("selective recompute" in n for n in selective.notes)
    full = _small({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1})
    assert full.breakdown["activations"] < 0.7 * base
    assert _small(model={"seq_length": 4096}).breakdown["activations"] > 2 * base - 1e-9


def test_cuda_graphs_are_said_whichever_switch_turns_them_on():
    for change in ({"enable_cuda_graph": True}, {"cuda_graph_impl": "transformer_engine"}):
        est = _small(change)
        assert any("CUDA graphs" in n for n in est.notes), change
        assert est.breakdown["activations"] == _small().breakdown["activations"]
    assert not any("CUDA graphs" in n for n in _small({"cuda_graph_impl": "none"}).notes)
