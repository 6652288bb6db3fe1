"""Real Megatron-Core messages through the scanner.

Each case builds megatron-core's own config objects (TransformerConfig, OptimizerConfig, the
microbatch calculator, parallel_state, a tiny GPTModel) on CPU with one violation, captures the
exception MCore really raises, formats it the way a torchrun log shows it (every rank prints its
traceback with the ``[rankN]:`` prefix), and checks that ``diagnose`` names the right signature
as the root cause, on the right rank and line. Nothing here is a hand-written message: if MCore
changes a string, these tests fail until the database follows.
"""
from __future__ import annotations

import contextlib
import re
import traceback
import warnings

import pytest

mcore = pytest.importorskip("megatron.core")
torch = pytest.importorskip("torch")

from diagnose.diagnosis import diagnose_text  # noqa: E402

pytestmark = pytest.mark.mcore

MCORE_VERSION = getattr(mcore, "__version__", "0.16.1")
VERSIONS = {"megatron-core": MCORE_VERSION}
BASE = dict(num_layers=4, hidden_size=64, num_attention_heads=4)


def before_0_18(old_id: str, new_id: str) -> str:
    """Signatures split at MCore 0.18 (cuda_graph_impl="full_iteration"): the id for this version."""
    from packaging.version import Version

    return old_id if Version(MCORE_VERSION) < Version("0.18") else new_id


CUDA_GRAPH_OFFLOAD = before_0_18("MB-OFF-006", "MB-OFF-007")
F32 = {"pipeline_dtype": torch.float32}

_SITE = re.compile(r'File "[^"]*?/(?:site|dist)-packages/')
_ABS = re.compile(r'File "/[^"]*/([^"/]+)"')


def _rel(line: str) -> str:
    """Absolute paths out: the site-packages prefix becomes the venv-relative one."""
    line = _SITE.sub('File "venv/lib/python3.11/site-packages/', line)
    return _ABS.sub(r'File "\1"', line)


def torchrun_log(exc: BaseException, ranks=(1, 0), script: str = "pretrain_gpt.py") -> tuple[str, dict]:
    """A torchrun log in which every rank in ``ranks`` prints ``exc``'s traceback, in that order.

    Returns the text and {rank: 1-based line of that rank's exception line}.
    """
    tb_lines = []
    for chunk in traceback.format_exception(type(exc), exc, exc.__traceback__):
        tb_lines.extend(chunk.rstrip("\n").split("\n"))
    tb_lines = [_rel(x) for x in tb_lines]
    out = [
        "*****************************************",
        "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your "
        "system being overloaded, please further tune the variable for optimal performance in your "
        "application as needed. ",
        "*****************************************",
    ]
    exc_line = {}
    # the exception line is the last line that starts with the exception's type name
    name = type(exc).__name__
    last = max(i for i, x in enumerate(tb_lines) if x.startswith((name, f"{type(exc).__module__}.{name}")))
    if not str(exc).strip():
        # a bare ``assert cond``: the source line shown above the empty AssertionError is the evidence
        last = max(i for i, x in enumerate(tb_lines[:last]) if x.lstrip().startswith("assert"))
    for r in ranks:
        for i, x in enumerate(tb_lines):
            out.append(f"[rank{r}]: {x}")
            if i == last:
                exc_line[r] = len(out)
    out.append("E1130 10:59:07.361000 19363 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
               "(exitcode: 1) local_rank: 0 (pid: 19368) of binary: venv/bin/python")
    return "\n".join(out) + "\n", exc_line


def raised(fn, *a, **kw) -> BaseException:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fn(*a, **kw)
        except Exception as e:  # noqa: BLE001 - the real MCore exception, whatever its type
            return e
    pytest.fail(f"{getattr(fn, '__name__', fn)}({kw}) raised nothing on megatron-core {MCORE_VERSION}")


def transformer_config(**kw):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(**{**BASE, **kw})


def optimizer_config(**kw):
    from megatron.core.optimizer import OptimizerConfig

    return OptimizerConfig(**kw)


# --------------------------------------------------------------------------- the cases
# (case id, builder kwargs, expected root-cause signature, expected category, expected message part)
OFFLOAD = [
    ("pp2", dict(cpu_offloading=True, pipeline_model_parallel_size=2, **F32),
     "MB-OFF-002", "config_pp_cpu_offload", "no support for Pipeline parallelism"),
    ("pp4-with-layers", dict(cpu_offloading=True, cpu_offloading_num_layers=1, pipeline_model_parallel_size=4, **F32),
     "MB-OFF-002", "config_pp_cpu_offload", "no support for Pipeline parallelism"),
    ("recompute-full", dict(cpu_offloading=True, recompute_granularity="full"),
     "MB-OFF-003", "config_recompute_cpu_offload", "activation recomputation"),
    ("recompute-full-uniform", dict(cpu_offloading=True, recompute_granularity="full", recompute_method="uniform",
                                    recompute_num_layers=1),
     "MB-OFF-003", "config_recompute_cpu_offload", "activation recomputation"),
    ("recompute-selective", dict(cpu_offloading=True, recompute_granularity="selective"),
     "MB-OFF-003", "config_recompute_cpu_offload", "activation recomputation"),
    ("layers-minus-1", dict(cpu_offloading=True, cpu_offloading_num_layers=-1),
     "MB-OFF-001", "config_offload_layers_range", "layers less than 4"),
    ("layers-eq-num-layers", dict(cpu_offloading=True, cpu_offloading_num_layers=4),
     "MB-OFF-001", "config_offload_layers_range", "layers less than 4"),
    ("layers-gt-num-layers", dict(cpu_offloading=True, cpu_offloading_num_layers=5),
     "MB-OFF-001", "config_offload_layers_range", "layers less than 4"),
    ("fine-grained-and-cpu-offloading", dict(cpu_offloading=True, cpu_offloading_num_layers=2,
                                             fine_grained_activation_offloading=True, offload_modules=["core_attn"]),
     "MB-OFF-004", "config_fine_grained_conflict", "cannot be enabled with cpu_offloading"),
    ("cuda-graph-local", dict(cpu_offloading=True, cpu_offloading_num_layers=2, cuda_graph_impl="local"),
     CUDA_GRAPH_OFFLOAD, "config_cuda_graph_cpu_offload", "CUDA graphs not supported with CPU offloading"),
    ("cuda-graph-te", dict(cpu_offloading=True, cpu_offloading_num_layers=2, cuda_graph_impl="transformer_engine"),
     CUDA_GRAPH_OFFLOAD, "config_cuda_graph_cpu_offload", "CUDA graphs not supported with CPU offloading"),
    ("enable-cuda-graph", dict(cpu_offloading=True, cpu_offloading_num_layers=2, enable_cuda_graph=True),
     CUDA_GRAPH_OFFLOAD, "config_cuda_graph_cpu_offload", "CUDA graphs not supported with CPU offloading"),
    ("external-cuda-graph", dict(cpu_offloading=True, cpu_offloading_num_layers=2, external_cuda_graph=True),
     CUDA_GRAPH_OFFLOAD, "config_cuda_graph_cpu_offload", "CUDA graphs not supported with CPU offloading"),
    ("fine-grained-empty-modules", dict(fine_grained_activation_offloading=True, offload_modules=[]),
     "MB-OFF-020", "config_other", ""),
    ("fine-grained-invalid-module", dict(fine_grained_activation_offloading=True, offload_modules=["bogus"]),
     "MB-OFF-021", "config_other", "Invalid choices for offload_modules"),
    ("fine-grained-attn-proj-alone", dict(fine_grained_activation_offloading=True, offload_modules=["attn_proj"]),
     "MB-OFF-022", "config_other", "attn_proj cannot be set"),
]

CONFIG = [
    ("sp-without-tp", dict(sequence_parallel=True), "MB-CFG-001", "config_other", "sequence parallelism"),
    ("pp-without-pipeline-dtype", dict(pipeline_model_parallel_size=2), "MB-CFG-002", "config_other",
     "pipeline_dtype must be specified"),
    ("pp-without-dtype-and-offload", dict(cpu_offloading=True, pipeline_model_parallel_size=2),
     "MB-CFG-002", "config_other", "pipeline_dtype must be specified"),
    ("defer-wgrad-without-pp", dict(defer_embedding_wgrad_compute=True), "MB-CFG-004", "config_other",
     "defer embedding wgrad"),
    ("fp16-and-bf16", dict(fp16=True, bf16=True), "MB-CFG-006", "config_other", "Only one of self.fp16"),
    ("heads-not-multiple-of-tp", dict(num_attention_heads=3, tensor_model_parallel_size=2), "MB-CFG-007",
     "config_divisibility", "num_attention_heads (3)"),
    ("query-groups-vs-tp", dict(num_query_groups=3, tensor_model_parallel_size=2), "MB-CFG-008",
     "config_divisibility", "num_query_groups (3)"),
    ("ep-on-dense-model", dict(expert_model_parallel_size=2), "MB-CFG-009", "config_other",
     "non None to use expert-parallel"),
    ("negative-experts", dict(num_moe_experts=-1), "MB-CFG-010", "config_other", "non-negative"),
    ("pad-to-capacity-without-factor", dict(num_moe_experts=4, moe_pad_expert_input_to_capacity=True),
     "MB-CFG-011", "config_other", "moe_expert_capacity_factor"),
    ("topk1-without-pre-softmax", dict(num_moe_experts=4, moe_router_topk=1), "MB-CFG-012", "config_other",
     "pre-softmax"),
    ("group-topk-without-groups", dict(num_moe_experts=4, moe_router_group_topk=2), "MB-CFG-013", "config_other",
     "moe_router_num_groups must be specified"),
    ("experts-not-divisible-by-groups", dict(num_moe_experts=6, moe_router_group_topk=2, moe_router_num_groups=4),
     "MB-CFG-014", "config_divisibility", "should be divisible by moe_router_num_groups"),
    ("recompute-granularity-invalid", dict(recompute_granularity="bogus"), "MB-CFG-015", "config_other",
     "recompute_granuarlity"),
    ("recompute-full-without-method", dict(recompute_granularity="full"), "MB-CFG-016", "config_other",
     "recompute_method must be"),
    ("recompute-method-invalid", dict(recompute_granularity="full", recompute_method="bogus"), "MB-CFG-016",
     "config_other", "recompute_method: bogus"),
    ("recompute-full-without-num-layers", dict(recompute_granularity="full", recompute_method="uniform"),
     "MB-CFG-017", "config_other", "recompute_num_layers must be between"),
    ("recompute-selective-with-num-layers", dict(recompute_granularity="selective", recompute_num_layers=1),
     "MB-CFG-018", "config_other", "recompute_num_layers must be None"),
    ("distribute-saved-activations-with-sp", dict(recompute_granularity="full", recompute_method="uniform",
                                                  recompute_num_layers=1, distribute_saved_activations=True,
                                                  sequence_parallel=True, tensor_model_parallel_size=2),
     "MB-CFG-019", "config_other", "distribute_saved_activations"),
    ("full-recompute-with-scoped-cuda-graph", dict(recompute_granularity="full", recompute_method="uniform",
                                                   recompute_num_layers=1, cuda_graph_impl="transformer_engine"),
     "MB-CFG-020", "config_other", "full iteration CUDA graph"),
    ("invalid-cuda-graph-impl", dict(cuda_graph_impl="bogus"), before_0_18("MB-CFG-052", "MB-CFG-022"), "config_other",
     "Invalid cuda graph implementation"),
    ("a2a-overlap-without-ep", dict(num_moe_experts=4, overlap_moe_expert_parallel_comm=True), "MB-CFG-028",
     "config_other", "overlap_moe_expert_parallel_comm"),
    ("uneven-pp-middle-stages", dict(num_layers=5, pipeline_model_parallel_size=4, num_layers_in_first_pipeline_stage=1,
                                     **F32),
     "MB-CFG-031", "config_divisibility", "middle pipeline model parallel size"),
    ("pp-layout-with-uneven-args", dict(pipeline_model_parallel_layout="E|t*4|L", num_layers_in_first_pipeline_stage=1,
                                        pipeline_model_parallel_size=2, **F32),
     "MB-CFG-033", "config_other", "pipeline_model_parallel_layout cannot be set"),
]

OPTIMIZER = [
    ("precision-aware-without-distopt", dict(use_precision_aware_optimizer=True, use_distributed_optimizer=False),
     "MB-CFG-070", "config_other", "only supported with distributed optimizer"),
    ("precision-aware-with-sgd", dict(optimizer="sgd", use_precision_aware_optimizer=True,
                                      use_distributed_optimizer=True),
     "MB-CFG-070", "config_other", "only supported with adam"),
    ("bf16-main-grads-without-precision-aware", dict(main_grads_dtype=torch.bfloat16), "MB-CFG-071", "config_other",
     "main_grads_dtype can only be fp32"),
    ("bf16-exp-avg-without-precision-aware", dict(exp_avg_dtype=torch.bfloat16), "MB-CFG-071", "config_other",
     "exp_avg_dtype can only be fp32"),
]


def _check(exc: BaseException, expected_id: str, expected_cat: str, part: str, ranks=(1, 0)):
    # "" = MCore's assertion carries no message (the signature matches the asserted source line)
    assert (part in str(exc)) if part else str(exc) == "", f"MCore {MCORE_VERSION} raised {type(exc).__name__}: {exc}"
    text, exc_line = torchrun_log(exc, ranks)
    report = diagnose_text(text, name="run.out", versions=VERSIONS)
    rc = report.root_cause
    assert rc is not None, f"no root cause for real message {type(exc).__name__}: {exc}"
    got = rc.finding.signature
    assert (got.id, got.category) == (expected_id, expected_cat), (
        f"real message {type(exc).__name__}: {str(exc)[:200]!r} -> {got.id} {got.category}")
    first = ranks[0]
    assert rc.hit.rank == first
    assert rc.hit.line == exc_line[first], (rc.hit.line, exc_line, text)
    # every rank's copy is recognised, and nothing is left as an unexplained exception
    f = next(x for x in report.findings if x.signature.id == got.id) if got.scope != "refine" else None
    if f is not None and got.scope == "line":
        assert set(f.ranks) == set(ranks)
    assert not any(x.signature.id == "MB-GEN-001" for x in report.findings), [x.first.text for x in report.findings]
    return rc


@pytest.mark.parametrize("case,kw,sig,cat,part", [pytest.param(*c, id=c[0]) for c in OFFLOAD])
def test_activation_offload_violation(case, kw, sig, cat, part):
    _check(raised(transformer_config, **kw), sig, cat, part)


@pytest.mark.parametrize("case,kw,sig,cat,part", [pytest.param(*c, id=c[0]) for c in CONFIG])
def test_transformer_config_error(case, kw, sig, cat, part):
    _check(raised(transformer_config, **kw), sig, cat, part)


@pytest.mark.parametrize("case,kw,sig,cat,part", [pytest.param(*c, id=c[0]) for c in OPTIMIZER])
def test_optimizer_config_error(case, kw, sig, cat, part):
    _check(raised(optimizer_config, **kw), sig, cat, part)


def test_optimizer_offload_fraction_is_not_validated_by_mcore():
    """MCore accepts any fraction; the tool's own config-trap signatures are what catch it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for frac in (1.5, -0.5, 0.0):
            optimizer_config(optimizer_cpu_offload=True, optimizer_offload_fraction=frac,
                             use_distributed_optimizer=True)
    # what catches them is the tool's own config traps, on the same settings
    from diagnose.config.runconfig import RunConfig

    for frac, want in ((1.5, "MB-OFF-051"), (-0.5, "MB-OFF-051"), (0.0, "MB-OFF-050")):
        cfg = RunConfig({"optimizer": {"optimizer_cpu_offload": True, "optimizer_offload_fraction": frac,
                                       "use_distributed_optimizer": True}}, "<test>")
        ids = {f.signature.id for f in diagnose_text("", config=cfg).findings}
        assert want in ids, (frac, ids)


def test_microbatch_calculator_divisibility():
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    exc = raised(ConstantNumMicroBatchesCalculator, global_batch_size=10, micro_batch_size=4,
                 data_parallel_size=1, decrease_batch_size_if_needed=False, rank=0)
    _check(exc, "MB-CFG-038", "config_divisibility", "global batch size (10) is not divisible")


def test_num_layers_not_divisible_by_pp():
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    cfg = transformer_config(num_layers=5, pipeline_model_parallel_size=2, **F32)
    exc = raised(get_num_layers_to_build, cfg, pp_rank=0)
    _check(exc, "MB-CFG-029", "config_divisibility", "num_layers should be divisible")


def test_layers_per_stage_not_divisible_by_vp():
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    cfg = transformer_config(num_layers=6, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, **F32)
    exc = raised(get_num_layers_to_build, cfg, vp_stage=0, pp_rank=0)
    _check(exc, "MB-CFG-030", "config_divisibility", "should be divisible by vp_size")


# --------------------------------------------------------------------------- with a process group

@pytest.fixture
def gloo_world_1(tmp_path):
    """A real gloo process group of one rank, torn down afterwards."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield parallel_state
    finally:
        with contextlib.suppress(Exception):
            parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def test_world_size_not_divisible_by_model_size(gloo_world_1):
    exc = raised(gloo_world_1.initialize_model_parallel, tensor_model_parallel_size=2)
    _check(exc, "MB-CFG-035", "config_divisibility", "world_size (1) is not divisible by 2")


def test_model_build_with_cpu_offloading_on_local_spec(gloo_world_1, monkeypatch):
    """The real model-build assertion: cpu_offloading without Transformer Engine."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import random as mrandom

    gloo_world_1.initialize_model_parallel()
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # CPU shims (cpu-probe.md §4)
    monkeypatch.setattr(mrandom.get_cuda_rng_tracker(), "fork", lambda *a, **k: contextlib.nullcontext())
    cfg = transformer_config(num_layers=2, cpu_offloading=True, cpu_offloading_num_layers=1,
                             use_cpu_initialization=True)
    exc = raised(GPTModel, config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=256,
                 max_sequence_length=64, position_embedding_type="learned_absolute")
    assert isinstance(exc, AssertionError)
    rc = _check(exc, "MB-OFF-010", "cpu_offload_runtime", "CPU Offloading is enabled when TE is not present")
    assert "transformer_block.py" in "\n".join(traceback.format_tb(exc.__traceback__))
    assert rc.finding.signature.fixes


def test_single_rank_log_and_first_rank_wins():
    """Rank order follows the log: rank 0 printing first is the evidence rank."""
    exc = raised(transformer_config, cpu_offloading=True, pipeline_model_parallel_size=2, **F32)
    _check(exc, "MB-OFF-002", "config_pp_cpu_offload", "Pipeline parallelism", ranks=(0,))
    _check(exc, "MB-OFF-002", "config_pp_cpu_offload", "Pipeline parallelism", ranks=(0, 1, 2, 3))
