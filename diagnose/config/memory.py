"""Memory model: bytes per GPU for the most-loaded pipeline stage, and the verdict against a GPU.

Everything is derived, nothing is fitted (megatron-facts.md §6):

Parameters (per layer, by component)
  attention  q, k, v, o = h·n·d + 2·h·g·d + n·d·h (GQA; d = kv_channels); MLA: the q/kv LoRA
             down- and up-projections. Tensor-parallel (÷TP), except MLA's down-projections.
  dense MLP  h·ffn·(3 if SwiGLU else 2), ÷TP.
  MoE        experts E·h·ffn_moe·(3|2) ÷(EP·ETP); shared experts ÷TP; router h·E replicated.
  norms      2·h per layer (+ q/k norms), replicated.
  embedding  V·h on the first stage, output layer V·h on the last (PP=1: only if untied), ÷TP,
             V padded to a multiple of make_vocab_size_divisible_by·TP.

Bytes per parameter (bf16 params, fp32 grads, fp32 master + Adam m, v; FP8 parameters 1 B, bf16 grads
without ddp.grad_reduce_in_fp32, the precision-aware optimizer's dtypes; CUDA-graph pools not counted)
  GPU   6 + (4 + 8·(1−f))/shard   (18 without the distributed optimizer, f = 0: 6 + 12/1)
        f = optimizer_offload_fraction when optimizer_cpu_offload is on (clamped to [0, 1]):
        the HybridDeviceOptimizer keeps the FP32 master shard on the GPU and moves Adam m, v of
        the offloaded fraction to the host. shard = DP·CP for dense parameters and
        DP·TP·CP/(EP·ETP) = world/(PP·EP·ETP) for experts (Bridge's _bytes_per_parameter).
  host  16·f per sharded parameter (FP32 clone 4 + m, v 8 + grad 4), × GPUs/node. Pinned of it:
        the FP32 clone always (MCore 0.16.1 hybrid_optimizer.py: ``.cpu().pin_memory()`` whatever
        pin_cpu_params says) and the grad when pin_cpu_grads (default true); torch's CPU Adam keeps
        m and v in pageable memory.

Activations (Korthikanti et al. 2022, flash attention so no s² term; bf16)
  per layer and microbatch, tokens T = s·b/CP:
    with SP   T·(18·h + mlp)/TP       without SP   T·(10·h + (8·h + mlp)/TP)
    mlp = (6 if SwiGLU else 4)·ffn for a dense layer (fc1 output is 2·ffn wide with SwiGLU);
          k·((6|4)·ffn_moe + 4·h) + 4·E for a MoE layer (k routed copies, dispatch/combine
          buffers, fp32 router probabilities) + the shared expert's term.
  full recompute keeps only each chunk's input (2·T·h, ÷TP with SP) plus one chunk being
  recomputed; activation offload of N layers keeps L−N layers plus one in transit;
  microbatches in flight on the first stage: min(m, PP), × (1 + (PP−1)/(PP·v)) interleaved;
  the last stage holds the logits and the loss in fp32: 4·T·(h + V)/TP.

Steady state (``per_gpu_gb``, Bridge's ``mem-allocated-gigabytes`` after an iteration) is
weights + grads + GPU optimizer states; ``peak_gb`` adds the activations. ``fits`` is
``peak_gb + margin <= capacity_gb``, the margin being 2 GB (CUDA context, cuBLAS/TE workspaces,
NCCL communicator buffers) plus 5% of the capacity (the caching allocator's fragmentation).
GB = 1e9 bytes, as Bridge logs it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from . import layout
from .runconfig import RunConfig

GB = 1e9
GIB = 1 << 30
MARGIN_FIXED_GB = 2.0  # CUDA context + cuBLAS/TE workspaces + NCCL communicator buffers
MARGIN_FRACTION = 0.05  # caching-allocator fragmentation (reserved but unallocated)
HOST_BYTES_PER_OFFLOADED_PARAM = 16  # FP32 clone 4 + Adam m, v 8 + grad 4
PINNED_BYTES_PER_OFFLOADED_PARAM = 4  # the FP32 clone, always pinned; + 4 for the grad with pin_cpu_grads
DATA = Path(__file__).resolve().parent.parent / "data"


_DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
                "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1}


def _dtype_bytes(v, default: int) -> int:
    """Bytes of a dtype as a config holds it: "torch.bfloat16", "bf16", or Bridge's dumped
    {_target_: torch.bfloat16, _call_: false}."""
    if isinstance(v, dict):
        v = v.get("_target_")
    if not isinstance(v, str):
        return default
    return _DTYPE_BYTES.get(v.rsplit(".", 1)[-1].lower(), default)


class MemoryModelError(ValueError):
    """The estimate cannot be made (a shape key is missing, the world size does not fit the layout)."""


@dataclass
class MemoryEstimate:
    per_gpu_gb: float  # steady-state allocated (what Bridge logs as mem-allocated-gigabytes), GB = 1e9
    peak_gb: float  # peak allocated
    capacity_gb: float  # the GPU's usable capacity
    fits: bool  # peak_gb + margin <= capacity_gb
    host_gb: float  # host memory for offloaded optimizer states, per node
    breakdown: dict  # name -> GB (weights, grads, optimizer_gpu, activations, margin, ...)
    world_size: int
    notes: list = field(default_factory=list)  # assumptions stated in words
    stage: str = ""  # which pipeline stage is the most loaded
    gpu: str = ""
    margin_gb: float = 0.0
    pinned_gb: float = 0.0  # of host_gb, pinned (page-locked), per node

    def as_dict(self) -> dict:
        r = lambda x: round(x, 3)  # noqa: E731
        return {
            "per_gpu_gb": r(self.per_gpu_gb),
            "peak_gb": r(self.peak_gb),
            "capacity_gb": r(self.capacity_gb),
            "margin_gb": r(self.margin_gb),
            "fits": self.fits,
            "host_gb": r(self.host_gb),
            "pinned_gb": r(self.pinned_gb),
            "breakdown": {k: r(v) for k, v in self.breakdown.items()},
            "world_size": self.world_size,
            "stage": self.stage,
            "gpu": self.gpu,
            "notes": list(self.notes),
        }

    def metrics(self) -> dict:
        """The names predicates read as ``metrics.*`` (MB-OFF-054, MB-OFF-055)."""
        return {"per_gpu_gb": self.per_gpu_gb, "peak_gb": self.peak_gb, "capacity_gb": self.capacity_gb,
                "margin_gb": self.margin_gb, "host_gb": self.host_gb, "world_size": self.world_size}


# --- data ----------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def gpus() -> dict:
    raw = yaml.safe_load((DATA / "gpus.yaml").read_text(encoding="utf-8"))["gpus"]
    out = {}
    for name, g in raw.items():
        out[name] = g
        for a in g.get("aliases", []) or []:
            out.setdefault(a, g)
    return out


def gpu_capacity_gb(name: str) -> float:
    g = gpus().get(str(name).strip().lower())
    if g is None:
        raise MemoryModelError(f"unknown GPU {name!r} (known: {', '.join(sorted(gpus()))}; or give --gpu-memory GB)")
    return g["total_gib"] * GIB / GB


@lru_cache(maxsize=1)
def presets() -> dict:
    return yaml.safe_load((DATA / "models.yaml").read_text(encoding="utf-8"))["models"]


def find_preset(name: str) -> dict | None:
    key = str(name).strip().lower()
    ps = presets()
    if key in ps:
        return ps[key]
    for p in ps.values():
        if str(p.get("hf", "")).lower() == key or str(p.get("hf", "")).lower().split("/")[-1] == key:
            return p
    return None


def fill_from_preset(cfg: RunConfig, name: str | None = None) -> tuple[RunConfig, str | None, list]:
    """Shape keys the config leaves out (or null), from a preset (``name``, else model.hf_model_id).

    Returns (config, the preset's name or None, the keys filled in)."""
    name = name or cfg.get("model.hf_model_id")
    p = find_preset(name) if name else None
    if p is None:
        return cfg, None, []
    out = cfg.copy()
    filled = []
    for k, v in p["model"].items():
        if out.get(f"model.{k}") is None:
            out.set(f"model.{k}", v)
            filled.append(f"model.{k}")
    return out, name, filled


# --- helpers -------------------------------------------------------------------------------------
def _int(cfg: RunConfig, key: str, default=None):
    v = cfg.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise MemoryModelError(f"{key} = {v!r} is not a number")
    return int(v)


def _need(cfg: RunConfig, key: str) -> int:
    v = _int(cfg, key)
    if v is None or v <= 0:
        raise MemoryModelError(f"the memory model needs {key} (a positive integer); give it in the config "
                               f"or name a model preset")
    return v


@dataclass
class _Layout:
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    vpp: int
    sp: bool
    world: int
    dp: int
    edp: int


def _layout(cfg: RunConfig, world_size: int | None, notes: list) -> _Layout:
    try:
        lay = layout.of(cfg)  # ETP defaults to TP, as in MCore
    except layout.LayoutError as exc:
        raise MemoryModelError(str(exc)) from None
    tp, pp, cp, ep, etp, vpp = lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.vpp
    sp = bool(cfg.get("model.sequence_parallel")) and tp > 1
    if world_size is None:
        world = lay.smallest_world()
        notes.append(f"world size {world}: the smallest the layout allows (TP·PP·CP = {tp * pp * cp}, "
                     f"ETP·EP·PP = {etp * ep * pp}); give --world-size for the real job")
    else:
        world = int(world_size)
        if not lay.fits(world):
            raise MemoryModelError(f"world size {world} is not divisible by TP·PP·CP = {tp * pp * cp} "
                                   f"and ETP·EP·PP = {etp * ep * pp}")
    return _Layout(tp, pp, cp, ep, etp, vpp, sp, world, world // (tp * pp * cp), world // (etp * ep * pp))


def _moe_pattern(cfg: RunConfig, L: int, E: int) -> list:
    if not E:
        return [0] * L
    freq = cfg.get("model.moe_layer_freq", 1)
    if isinstance(freq, (list, tuple)):
        pat = [1 if x else 0 for x in freq]
        if len(pat) != L:
            raise MemoryModelError(f"model.moe_layer_freq has {len(pat)} entries for {L} layers")
        return pat
    if isinstance(freq, bool) or not isinstance(freq, int) or freq < 1:
        freq = 1
    return [1 if i % freq == 0 else 0 for i in range(L)]


def _stage_layers(L: int, pp: int, vpp: int, stage: int, first: int | None, last: int | None) -> list:
    """Layer indices held by pipeline ``stage`` (interleaved chunks with VPP; uneven first/last)."""
    if pp == 1:
        return list(range(L))
    if first or last:
        first = first or 0
        last = last or 0
        middle = L - first - last
        mids = pp - (1 if first else 0) - (1 if last else 0)
        per = middle // mids if mids else 0
        bounds = []
        start = 0
        for p in range(pp):
            n = first if (p == 0 and first) else last if (p == pp - 1 and last) else per
            bounds.append((start, start + n))
            start += n
        a, b = bounds[stage]
        return list(range(a, b))
    chunk = L // (pp * vpp) if pp * vpp <= L else 0
    if chunk == 0:
        per = L // pp
        return list(range(stage * per, (stage + 1) * per))
    out: list[int] = []
    for v in range(vpp):
        start = (v * pp + stage) * chunk
        out.extend(range(start, start + chunk))
    return out


def _attention_params(cfg: RunConfig, h: int, n: int, g: int, d: int, notes: list) -> tuple[int, int]:
    """One layer's attention parameters: (tensor-parallel sharded, replicated). GQA's q, k, v, o
    (and their biases; q/k norms replicated), or multi-latent attention's LoRA projections, whose
    down-projections are replicated."""
    if cfg.get("model.multi_latent_attention"):
        ql = _int(cfg, "model.q_lora_rank")
        kvl = _need(cfg, "model.kv_lora_rank")
        qk = _int(cfg, "model.qk_head_dim", 128) or 128
        rope = _int(cfg, "model.qk_pos_emb_head_dim", 64) or 64
        vd = _int(cfg, "model.v_head_dim", 128) or 128
        q_up = (ql * n * (qk + rope)) if ql else h * n * (qk + rope)
        notes.append("multi-latent attention: the q/kv down-projections are counted as replicated")
        return q_up + kvl * n * (qk + vd) + n * vd * h, (h * ql + ql if ql else 0) + h * (kvl + rope) + kvl
    attn_tp = h * n * d + 2 * h * g * d + n * d * h
    if cfg.get("model.add_qkv_bias"):
        attn_tp += (n + 2 * g) * d
    return attn_tp, 2 * d if cfg.get("model.qk_layernorm") else 0


@dataclass
class _Bytes:
    """Bytes per parameter on the GPU, and how the optimizer state is sharded."""

    param: int  # the weight (bf16 2, FP8 1, fp32 4)
    grad: int  # the gradient buffer
    master: int  # the optimizer's FP32 master copy (0 for fp32 weights)
    moments: int  # Adam's m and v
    f: float  # optimizer-offload fraction (0 without offload), clamped to [0, 1]
    shard_dense: int  # ranks one dense parameter's optimizer state is split over (1: no distributed optimizer)
    shard_exp: int  # ... one expert parameter's


def _bytes_per_param(cfg: RunConfig, lay: _Layout, notes: list) -> _Bytes:
    """The dtypes of weights, grads and optimizer states, the offloaded fraction and the
    distributed optimizer's sharding (the notes say what was assumed)."""
    param_bytes = 2 if (cfg.get("model.bf16") is not False or cfg.get("model.fp16")) else 4
    if cfg.get("model.bf16") is False and not cfg.get("model.fp16"):
        notes.append("fp32 parameters: no separate FP32 master copy")
    distopt = bool(cfg.get("optimizer.use_distributed_optimizer") or cfg.get("ddp.use_distributed_optimizer"))
    offload = bool(cfg.get("optimizer.optimizer_cpu_offload"))
    frac_raw = cfg.get("optimizer.optimizer_offload_fraction", 0.0)
    frac = float(frac_raw) if isinstance(frac_raw, (int, float)) and not isinstance(frac_raw, bool) else 0.0
    f = min(max(frac, 0.0), 1.0) if offload else 0.0
    if param_bytes == 2 and (cfg.get("model.fp8_param") or cfg.get("model.fp8_param_gather")) and cfg.get("model.fp8"):
        param_bytes = 1  # FP8 parameters (the bf16 copy lives in the optimizer's master)
        notes.append("FP8 parameters: 1 byte per weight")
    master = 4 if param_bytes <= 2 else 0
    moments = 8
    if cfg.get("optimizer.use_precision_aware_optimizer"):
        # MCore OptimizerConfig: main_params_dtype, exp_avg_dtype, exp_avg_sq_dtype (fp32 by default)
        master = _dtype_bytes(cfg.get("optimizer.main_params_dtype"), 4) if param_bytes <= 2 else 0
        moments = _dtype_bytes(cfg.get("optimizer.exp_avg_dtype"), 4) + _dtype_bytes(
            cfg.get("optimizer.exp_avg_sq_dtype"), 4
        )
        notes.append(f"precision-aware optimizer: master {master} B, Adam moments {moments} B per parameter")
    # the gradient buffer: fp32 with ddp.grad_reduce_in_fp32 (Bridge's recipes set it), else the
    # parameters' dtype (MCore's default); not given: fp32, the larger
    grad_bytes = 2 if (cfg.get("ddp.grad_reduce_in_fp32") is False and param_bytes <= 2) else 4
    if not distopt:
        notes.append(f"no distributed optimizer: every GPU holds the full optimizer state "
                     f"({param_bytes + grad_bytes + master + moments} B/param)")
    if cfg.get("model.cuda_graph_impl") not in (None, "none") or cfg.get("model.enable_cuda_graph"):
        notes.append("CUDA graphs: their private memory pools are not counted (measure them)")
    return _Bytes(param_bytes, grad_bytes, master, moments, f, lay.dp * lay.cp if distopt else 1,
                  lay.edp if distopt else 1)


# --- the estimate --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Shape:
    """The model's dimensions, as the memory model reads them from the config."""

    L: int  # layers
    h: int  # hidden size
    E: int  # routed experts (0: dense)
    pattern: list  # 1 where layer i is a MoE layer
    ffn: int
    ffn_moe: int
    k: int  # experts per token
    shared: int  # shared-expert width
    Vp: int  # padded vocabulary
    s: int  # sequence length
    b: int  # micro-batch size
    gbs: int | None
    gated: bool
    tied: bool


def _shape(cfg: RunConfig, lay: _Layout) -> _Shape:
    L = _need(cfg, "model.num_layers")
    h = _need(cfg, "model.hidden_size")
    E = _int(cfg, "model.num_moe_experts", 0) or 0
    pattern = _moe_pattern(cfg, L, E)
    ffn = _int(cfg, "model.ffn_hidden_size") or (4 * h if 0 in pattern else 0)
    if 0 in pattern and not ffn:
        raise MemoryModelError("the memory model needs model.ffn_hidden_size")
    V = _need(cfg, "model.vocab_size")
    s = _int(cfg, "model.seq_length") or _int(cfg, "dataset.sequence_length") or _int(cfg, "dataset.seq_length")
    if not s:
        raise MemoryModelError("the memory model needs model.seq_length (or dataset.sequence_length)")
    gated = cfg.get("model.gated_linear_unit")
    div = (_int(cfg, "model.make_vocab_size_divisible_by", 128) or 128) * lay.tp
    return _Shape(
        L=L, h=h, E=E, pattern=pattern, ffn=ffn,
        ffn_moe=(_int(cfg, "model.moe_ffn_hidden_size") or ffn) if E else 0,
        k=(_int(cfg, "model.moe_router_topk", 2) or 2) if E else 0,
        shared=_int(cfg, "model.moe_shared_expert_intermediate_size", 0) or 0,
        Vp=int(math.ceil(V / div) * div), s=s, b=_int(cfg, "train.micro_batch_size", 1) or 1,
        gbs=_int(cfg, "train.global_batch_size"), gated=True if gated is None else bool(gated),
        tied=bool(cfg.get("model.share_embeddings_and_output_weights", False)),
    )


@dataclass(frozen=True)
class _Activations:
    """How the run keeps its activations: recompute, activation offload."""

    gran: str | None  # recompute granularity: full, selective or None
    method: str | None  # full recompute: uniform or block
    r_layers: int  # layers per recompute chunk (uniform) or recomputed layers (block)
    modules: list  # selective recompute's modules
    n_off: int  # layers whose activations are offloaded
    double_buffering: bool


def _activations(cfg: RunConfig, notes: list) -> _Activations:
    act_offload = (
        bool(cfg.get("model.cpu_offloading")) and cfg.get("model.cpu_offloading_activations", True) is not False
    )
    modules = cfg.get("model.recompute_modules") or ["core_attn"]
    gran = cfg.get("model.recompute_granularity")
    if gran == "selective":
        notes.append(f"selective recompute of {', '.join(map(str, modules))}: core attention is not stored "
                     "in any case (flash attention)")
    if cfg.get("model.fine_grained_activation_offloading"):
        notes.append("fine-grained activation offloading is not modelled (activations counted on the GPU)")
    if cfg.get("model.cpu_offloading") and cfg.get("model.cpu_offloading_weights"):
        notes.append("weight offloading: no effect on the estimate (parameters stay on the GPU for the optimizer)")
    return _Activations(
        gran=gran, method=cfg.get("model.recompute_method"),
        r_layers=_int(cfg, "model.recompute_num_layers", 1) or 1, modules=modules,
        n_off=max(0, _int(cfg, "model.cpu_offloading_num_layers", 0) or 0) if act_offload else 0,
        double_buffering=bool(cfg.get("model.cpu_offloading_double_buffering")),
    )


def _layer_activation(sh: _Shape, lay: _Layout, is_moe: bool) -> float:
    """Bytes of one layer's activations for one micro-batch (Korthikanti et al., flash attention)."""
    T = sh.s * sh.b / lay.cp
    act_mult = 6 if sh.gated else 4
    if is_moe:
        mlp = sh.k * (act_mult * sh.ffn_moe + 4 * sh.h) + 4 * sh.E + act_mult * sh.shared
    else:
        mlp = act_mult * sh.ffn
    if lay.sp:
        return T * (18 * sh.h + mlp) / lay.tp
    return T * (10 * sh.h + (8 * sh.h + mlp) / lay.tp)


def _kept(per_layer: list, act: _Activations, ckpt_input: float) -> tuple[float, float]:
    """(stored, working): the bytes a micro-batch keeps between its forward and backward passes
    on one stage, and the bytes of the chunk being recomputed in its backward pass."""
    nl = len(per_layer)
    if act.gran == "full":
        r = max(1, min(act.r_layers, nl)) if nl else 1
        if act.method == "block":
            return r * ckpt_input + sum(per_layer[r:]), max(per_layer[:r], default=0.0)
        # uniform: chunks of r layers, only each chunk's input is kept
        return math.ceil(nl / r) * ckpt_input, sum(sorted(per_layer, reverse=True)[:r])
    stored = sum(per_layer)
    if act.gran == "selective" and any(x in ("mlp", "moe") for x in act.modules):
        stored -= sum(per_layer) * 0.5  # the MLP half is recomputed
    if act.n_off:
        kept = per_layer[act.n_off:] if act.n_off < nl else []
        stored = sum(kept) + (per_layer[0] if nl else 0.0)  # + one layer in transit
        if act.double_buffering:
            stored += per_layer[0] if nl else 0.0
    return stored, 0.0


def _micro_batches(sh: _Shape, lay: _Layout) -> int | None:
    """Micro-batches per iteration on one data-parallel rank (None: global batch size unknown)."""
    return (sh.gbs // (sh.b * lay.dp)) if sh.gbs and sh.gbs >= sh.b * lay.dp else None


@dataclass(frozen=True)
class _Stage:
    """One pipeline stage's bytes per GPU."""

    name: str
    weights: float
    grads: float
    optim: float
    acts: float
    host_per_gpu: float  # offloaded optimizer state on the host, per GPU
    in_flight: float  # micro-batches in flight

    @property
    def steady(self) -> float:
        return self.weights + self.grads + self.optim

    @property
    def peak(self) -> float:
        return self.steady + self.acts


def _stage(cfg: RunConfig, lay: _Layout, sh: _Shape, attn: tuple[int, int], by: _Bytes, act: _Activations,
           st: int) -> _Stage:
    """Parameters, optimizer state and activations of pipeline stage ``st`` on one GPU."""
    h, E = sh.h, sh.E
    attn_tp, attn_rep = attn
    mlp_mats = 3 if sh.gated else 2
    norms = 2 * h
    dense_mlp = h * sh.ffn * mlp_mats
    experts = E * h * sh.ffn_moe * mlp_mats
    shared_mlp = h * sh.shared * mlp_mats

    layers = _stage_layers(sh.L, lay.pp, lay.vpp, st, _int(cfg, "model.num_layers_in_first_pipeline_stage"),
                           _int(cfg, "model.num_layers_in_last_pipeline_stage"))
    n_moe = sum(sh.pattern[i] for i in layers if i < sh.L)
    n_dense = len(layers) - n_moe
    p_tp = len(layers) * attn_tp + n_dense * dense_mlp + n_moe * shared_mlp
    p_rep = len(layers) * (norms + attn_rep) + n_moe * h * E
    p_exp = n_moe * experts
    first, last = st == 0, st == lay.pp - 1
    if first:
        p_tp += sh.Vp * h
    if last:
        p_rep += h  # final norm
        if not (sh.tied and lay.pp == 1):
            p_tp += sh.Vp * h
        mtp = _int(cfg, "model.mtp_num_layers", 0) or 0
        if mtp:
            p_tp += mtp * (attn_tp + (shared_mlp if E else dense_mlp) + 2 * h * h)
            p_rep += mtp * (norms + attn_rep + 2 * h + (h * E if E else 0))
            p_exp += mtp * (experts if E else 0)
    dense_local = p_tp / lay.tp + p_rep
    exp_local = p_exp / (lay.ep * lay.etp)

    def opt_gpu(shard: float) -> float:
        return (by.master + by.moments * (1 - by.f)) / shard

    # activations: what each micro-batch keeps, times the micro-batches in flight
    T = sh.s * sh.b / lay.cp
    per_layer = [_layer_activation(sh, lay, bool(sh.pattern[i])) for i in layers if i < sh.L]
    stored, working = _kept(per_layer, act, 2 * T * h / (lay.tp if lay.sp else 1))
    m = _micro_batches(sh, lay)
    if lay.pp == 1:
        in_flight = 1.0
    else:
        in_flight = float(min(m, lay.pp - st) if m else lay.pp - st)
        if lay.vpp > 1:
            in_flight *= 1 + (lay.pp - 1) / (lay.pp * lay.vpp)
    acts = stored * in_flight + working
    if first:
        acts += in_flight * (8 * T + 2 * T * h / (lay.tp if lay.sp else 1))  # input ids + embedding output
    if last:
        acts += 4 * T * (h + sh.Vp) / lay.tp  # fp32 logits and loss
    return _Stage(
        name="only stage (PP=1)" if lay.pp == 1 else ("first stage" if first else "last stage"),
        weights=by.param * (dense_local + exp_local),
        grads=by.grad * (dense_local + exp_local),
        optim=dense_local * opt_gpu(by.shard_dense) + exp_local * opt_gpu(by.shard_exp),
        acts=acts,
        host_per_gpu=HOST_BYTES_PER_OFFLOADED_PARAM * by.f * (dense_local / by.shard_dense + exp_local / by.shard_exp),
        in_flight=in_flight,
    )


def estimate(cfg: RunConfig, world_size: int | None = None, gpu: str | None = None,
             gpu_memory_gb: float | None = None, gpus_per_node: int = 8) -> MemoryEstimate:
    """The most-loaded pipeline stage's memory per GPU, and the verdict against ``gpu``."""
    notes: list = []
    lay = _layout(cfg, world_size, notes)
    sh = _shape(cfg, lay)
    n = _need(cfg, "model.num_attention_heads")
    g = _int(cfg, "model.num_query_groups") or n
    d = _int(cfg, "model.kv_channels") or sh.h // n
    attn = _attention_params(cfg, sh.h, n, g, d, notes)
    by = _bytes_per_param(cfg, lay, notes)
    act = _activations(cfg, notes)
    # the first and the last stage: the embedding, the output layer and the most micro-batches
    stages = [_stage(cfg, lay, sh, attn, by, act, st) for st in ([0] if lay.pp == 1 else [0, lay.pp - 1])]
    worst = max(stages, key=lambda x: x.peak)

    if gpu_memory_gb is not None:
        capacity = float(gpu_memory_gb)
        gpu_name = f"{capacity:g} GB"
    else:
        gpu_name = (gpu or "h100").lower()
        capacity = gpu_capacity_gb(gpu_name)
        if gpu is None:
            notes.append("GPU: H100 80GB assumed (give --gpu or --gpu-memory)")
    margin = MARGIN_FIXED_GB + MARGIN_FRACTION * capacity
    per_node = min(gpus_per_node, lay.world)
    host_gb = worst.host_per_gpu * per_node / GB
    pinned_bytes = PINNED_BYTES_PER_OFFLOADED_PARAM + (4 if cfg.get("optimizer.pin_cpu_grads") is not False else 0)
    pinned_gb = host_gb * pinned_bytes / HOST_BYTES_PER_OFFLOADED_PARAM
    breakdown = {
        "weights": worst.weights / GB, "grads": worst.grads / GB, "optimizer_gpu": worst.optim / GB,
        "activations": worst.acts / GB, "margin": margin,
    }
    if by.f:
        breakdown["optimizer_host_per_gpu"] = worst.host_per_gpu / GB
    if lay.pp > 1:
        notes.append(f"most-loaded stage: {worst.name}; {worst.in_flight:g} microbatch(es) in flight")
    if _micro_batches(sh, lay) is None and lay.pp > 1:
        notes.append("global batch size unknown: as many microbatches in flight as pipeline stages")
    if sh.E:
        notes.append("MoE: tokens assumed balanced across experts (no dispatcher workspace, no imbalance)")
    peak_gb = worst.peak / GB
    return MemoryEstimate(
        per_gpu_gb=worst.steady / GB, peak_gb=peak_gb, capacity_gb=capacity, fits=peak_gb + margin <= capacity,
        host_gb=host_gb, breakdown=breakdown, world_size=lay.world, notes=notes, stage=worst.name, gpu=gpu_name,
        margin_gb=margin, pinned_gb=pinned_gb,
    )
