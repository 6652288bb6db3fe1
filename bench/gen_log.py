"""Generate a realistic multi-rank Megatron-Bridge / MCore training log of a given size.

    python bench/gen_log.py /tmp/big.log --size 500M               # one interleaved log
    python bench/gen_log.py /tmp/ranks --size 500M --per-rank 64   # a folder, one file per rank

What a large job writes (see shared/spec/megatron-facts.md for every format): launcher rank
prefixes (srun ``-l`` task ids, torchrun ``[defaultN]:``, torch ``[rankN]:``), NCCL INFO init
lines from every rank for every communicator (the bulk of a big log with ``NCCL_DEBUG=INFO``),
c10d / ProcessGroupNCCL warnings in glog framing, Python warnings, the Bridge
``Final configuration:`` dump and non-default summary, iteration lines (last rank), memory
reports (DP-rank-0 ranks, MiB or GB format), timer blocks, ``Step Time`` lines, checkpoint saves,
rare transient error lines, and at the end one failure with its cascade: a CUDA OOM traceback on
one rank, NCCL watchdog timeouts on the others, torchrun's ChildFailedError block.

The output is deterministic for a given ``--seed``; the size is reached to within one block of
lines (a few KiB). Nothing here is copied from a real log: every line is built from the format
strings in the facts file.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

GPUS_PER_NODE = 8
OPS = ["ALLREDUCE", "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE", "BROADCAST", "SEND", "RECV"]
TIMERS = ["forward-backward", "layernorm-grads-all-reduce", "embedding-grads-all-reduce", "all-grads-sync",
          "params-all-gather", "optimizer-copy-to-main-grad", "optimizer-unscale-and-check-inf",
          "optimizer-clip-main-grad", "optimizer-count-zeros", "optimizer-inner-step",
          "optimizer-copy-main-to-model-params", "optimizer"]


def parse_size(text: str) -> int:
    t = text.strip().upper().rstrip("B")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    try:
        n = int(float(t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 500M, 2G, 4096)") from None
    if n <= 0:
        raise argparse.ArgumentTypeError("size must be positive")
    return n


class Job:
    """The job being logged: ranks, hosts, pids, the clock, and how lines are framed."""

    def __init__(self, ranks: int, seed: int, prefix: str, fmt: str):
        self.rng = random.Random(seed)
        self.ranks = ranks
        self.nodes = max(1, (ranks + GPUS_PER_NODE - 1) // GPUS_PER_NODE)
        self.prefix = prefix
        self.fmt = fmt  # "bridge" (GB memory lines, no microseconds) or "mlm"
        self.host = [f"node{n:04d}" for n in range(self.nodes)]
        self.pid = [20000 + self.rng.randrange(40000) for _ in range(ranks)]
        self.t = 1_787_000_000.0  # 2026-08-17, seconds since the epoch
        self.iteration = 0
        self.train_iters = 500_000
        self.tp, self.pp = 8, 4
        self.dp = max(1, ranks // (self.tp * self.pp))
        self.comm = 0

    # ---------------------------------------------------------------- framing
    def pre(self, rank: int, torch_rank: bool = False) -> str:
        """The launcher prefix of one line of ``rank``."""
        local = rank % GPUS_PER_NODE
        tr = f"[rank{rank}]:" if torch_rank else ""
        if self.prefix == "srun":
            return f"{rank // GPUS_PER_NODE:>2}: [default{local}]:{tr}"
        if self.prefix == "torchrun":
            return f"[default{local}]:{tr}"
        if self.prefix == "nemo":
            return f"i.pretrain/{rank // GPUS_PER_NODE} [default{local}]:{tr}"
        if self.prefix == "rank":
            return tr or f"[rank{rank}]:"
        return tr  # "none": one file per rank

    def stamp(self, micro: bool = True) -> str:
        import time as _time

        tm = _time.gmtime(self.t)
        base = _time.strftime("%Y-%m-%d %H:%M:%S", tm)
        return f"{base}.{int((self.t % 1) * 1e6):06d}" if micro else base

    def glog(self, level: str = "W") -> str:
        import time as _time

        tm = _time.gmtime(self.t)
        return f"{level}{tm.tm_mon:02d}{tm.tm_mday:02d} {_time.strftime('%H:%M:%S', tm)}.{int((self.t % 1) * 1e9):09d}"

    def tick(self, s: float):
        self.t += s

    # ---------------------------------------------------------------- content
    def nccl_init(self, rank: int, nranks: int, channels: int) -> list[str]:
        """NCCL INFO lines of one rank joining one communicator (NCCL_DEBUG=INFO)."""
        r, local = rank, rank % GPUS_PER_NODE
        h, pid = self.host[rank // GPUS_PER_NODE], self.pid[rank]
        tid = pid + 40 + self.comm % 50
        p = self.pre(rank)
        head = f"{p}{h}:{pid}:{tid} [{local}] NCCL INFO "
        self.comm += 1
        comm = 0x55D0_0000_0000 + self.rng.randrange(1 << 32)
        cid = self.rng.randrange(1 << 60)
        bus = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"][local]
        nxt, prv = (r + 1) % nranks, (r - 1) % nranks
        out = [
            f"{head}ncclCommInitRank comm {comm:#x} rank {r % nranks} nranks {nranks} cudaDev {local} nvmlDev {local}"
            f" busId {bus}000 commId {cid:#x} - Init START",
            f"{head}Setting affinity for GPU {local} to ffffffff,ffffffff,00000000,00000000",
            f"{head}NVLS multicast support is not available on dev {local}",
            f"{head}comm {comm:#x} rank {r % nranks} nRanks {nranks} nNodes {max(1, nranks // GPUS_PER_NODE)}"
            f" localRanks {min(nranks, GPUS_PER_NODE)} localRank {local} MNNVL 0",
            f"{head}Trees [0] {nxt}/-1/-1->{r % nranks}->{prv} [1] {nxt}/-1/-1->{r % nranks}->{prv}",
            f"{head}P2P Chunksize set to 131072",
        ]
        for ch in range(channels):
            if (r + 1) % GPUS_PER_NODE == 0 and nranks > GPUS_PER_NODE:
                out.append(f"{head}Channel {ch:02d}/0 : {r % nranks}[{local}] -> {nxt}[{nxt % GPUS_PER_NODE}]"
                           f" [send] via NET/IB/{ch % 8}/GDRDMA")
            else:
                out.append(f"{head}Channel {ch:02d}/0 : {r % nranks}[{local}] -> {nxt}[{nxt % GPUS_PER_NODE}]"
                           f" via P2P/CUMEM/read")
        out += [
            f"{head}Connected all rings",
            f"{head}Connected all trees",
            f"{head}threadThresholds 8/8/64 | {8 * nranks}/8/64 | 512 | 512",
            f"{head}{channels} coll channels, {channels} collnet channels, 0 nvls channels, {channels} p2p channels,"
            f" {max(1, channels // 16)} p2p channels per peer",
            f"{head}ncclCommInitRank comm {comm:#x} rank {r % nranks} nranks {nranks} cudaDev {local} nvmlDev {local}"
            f" busId {bus}000 commId {cid:#x} - Init COMPLETE",
            f"{head}Init timings - ncclCommInitRank: rank {r % nranks} nranks {nranks} total"
            f" {self.rng.uniform(0.2, 3):.2f} (kernels 0.12, alloc 0.05, bootstrap {self.rng.uniform(0.01, 2):.2f},"
            f" allgathers 0.01, topo 0.20, graphs 0.01, connections 0.30, rest 0.04)",
        ]
        return out

    def nccl_startup(self, rank: int) -> list[str]:
        local = rank % GPUS_PER_NODE
        h, pid = self.host[rank // GPUS_PER_NODE], self.pid[rank]
        p = self.pre(rank)
        head = f"{p}{h}:{pid}:{pid} [{local}] NCCL INFO "
        out = [
            f"{head}cudaDriverVersion 12080",
            f"{head}Bootstrap: Using ibp12s0:10.{rank // 65536 % 256}.{rank // 256 % 256}.{rank % 256}<0>",
            f"{head}NCCL version 2.26.3+cuda12.8" if rank == 0 else f"{head}Comm config Blocking set to 1",
            f"{head}NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.",
            f"{head}NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB [2]mlx5_4:1/IB [3]mlx5_5:1/IB [4]mlx5_6:1/IB"
            f" [5]mlx5_9:1/IB [6]mlx5_10:1/IB [7]mlx5_11:1/IB [RO]; OOB ibp12s0:10.0.{rank // 256 % 256}.{rank % 256}<0>",
            f"{head}PROFILER/Plugin: Could not find: libnccl-profiler.so.",
            f"{head}Using network IB",
        ]
        return out

    def c10d_warning(self, rank: int, kind: int) -> str:
        p = self.pre(rank, torch_rank=True)
        g = self.glog("W")
        pid = self.pid[rank]
        if kind == 0:
            return (f"{p}[{g} {pid} torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:4715] [PG ID 0 PG GUID 0 Rank {rank}]"
                    f"  using GPU {rank % GPUS_PER_NODE} as device used by this process is currently unknown. This can"
                    " potentially cause a hang if this rank to GPU mapping is incorrect. You can specify device_id in"
                    " init_process_group() to force use of a particular device.")
        if kind == 1:
            return (f"{p}[{g} {pid} torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1015] Warning:"
                    " TORCH_NCCL_AVOID_RECORD_STREAMS is the default now, this environment variable is thus"
                    " deprecated. (function operator())")
        if kind == 2:
            return (f"{p}[{g} {pid} torch/csrc/distributed/c10d/Utils.hpp:136] Warning: Environment variable"
                    " NCCL_ASYNC_ERROR_HANDLING is deprecated; use TORCH_NCCL_ASYNC_ERROR_HANDLING instead"
                    " (function operator())")
        return (f"{p}[{g} {pid} torch/csrc/distributed/c10d/socket.cpp:752] [c10d] The client socket has failed to"
                f" connect to [{self.host[0]}]:29500 (errno: 111 - Connection refused).")

    def python_warning(self, rank: int) -> str:
        return (f"{self.pre(rank)}/opt/venv/lib/python3.12/site-packages/megatron/core/transformer/transformer_config.py:"
                "1247: UserWarning: full scope is deprecated. Use empty cuda_graph_scope to capture the whole layer.")

    def iteration_line(self, elapsed_ms: float) -> str:
        it = self.iteration
        stamp = self.stamp(micro=self.fmt == "mlm")
        loss = 10.5 * (0.9993 ** it) + 1.8 + self.rng.uniform(-0.05, 0.05)
        return (f"{self.pre(self.ranks - 1)} [{stamp}] iteration {it:8d}/{self.train_iters:8d} |"
                f" consumed samples: {it * 1024:12d} | elapsed time per iteration (ms): {elapsed_ms:.1f} |"
                f" throughput per GPU (TFLOP/s/GPU): {415000 / elapsed_ms:.1f} | learning rate: {3e-4 * min(1, it / 2000):.6E} |"
                f" global batch size:  1024 | lm loss: {loss:.6E} | load_balancing_loss: {1.01 + self.rng.uniform(0, 0.02):.6E} |"
                f" loss scale: 1.0 | grad norm: {self.rng.uniform(0.3, 2.5):.3f} | number of skipped iterations:   0 |"
                " number of nan iterations:   0 |")

    def memory_lines(self) -> list[tuple[int, str]]:
        out = []
        per_stage = self.ranks // self.pp
        for stage in range(self.pp):
            for t in range(self.tp):
                rank = stage * per_stage + t
                a = 40 + 8 * (self.pp - stage) + self.rng.uniform(0, 1)
                if self.fmt == "mlm":
                    mb = a * 1e9 / 2**20
                    out.append((rank, f"{self.pre(rank)}[Rank {rank}] (after {self.iteration} iterations) memory (MB) |"
                               f" allocated: {mb:.2f} | max allocated: {mb * 1.3:.2f} | reserved: {mb * 1.4:.2f} |"
                               f" max reserved: {mb * 1.4:.2f}"))
                else:
                    out.append((rank, f"{self.pre(rank)}[Rank {rank}] (after {self.iteration} iterations) memory (GB) |"
                               f" mem-allocated-gigabytes: {a:.5g} | mem-active-gigabytes: {a:.5g} |"
                               f" mem-inactive-gigabytes: 1.2346 | mem-reserved-gigabytes: {a * 1.2:.5g} |"
                               f" mem-max-allocated-gigabytes: {a * 1.3:.5g} | mem-max-active-gigabytes: {a * 1.3:.5g} |"
                               f" mem-max-inactive-gigabytes: 5.1235 | mem-max-reserved-gigabytes: {a * 1.4:.5g} |"
                               f" mem-alloc-retires: 0 | mem-allocated-count: {12000 + stage}"))
        return out

    def timer_block(self) -> list[str]:
        p = self.pre(self.ranks - 1)
        out = [f"{p}(min, max) time across ranks (ms):"]
        for name in TIMERS:
            base = 950.0 if name == "forward-backward" else self.rng.uniform(0.05, 40)
            out.append(f"{p}    {(name + ' ').ljust(48, '.')}: ({base:.2f}, {base * 1.01:.2f})")
        return out

    def startup(self, emit):
        for r in range(self.ranks):
            emit(r, [self.python_warning(r)])
        p0 = self.pre(0)
        emit(0, [f"{p0}INFO:recipe_runner:Final configuration:"]
             + [f"{p0}{line}" for line in CONFIG_YAML.strip("\n").splitlines()])
        for r in range(self.ranks):
            emit(r, self.nccl_startup(r) + [self.c10d_warning(r, 0), self.c10d_warning(r, 1)])
        emit(0, [f"{p0}[after megatron is initialized] datetime: {self.stamp(False)} "]
             + [f"{p0}{line}" for line in SUMMARY.strip("\n").splitlines()]
             + [f"{p0}Theoretical memory footprints: weight and optimizer=45123.45 MB",
                f"{p0}Starting training loop at iteration 0"])


CONFIG_YAML = """
_target_: megatron.bridge.training.config.ConfigContainer
model:
  _target_: megatron.bridge.models.qwen.qwen_provider.Qwen3MoEModelProvider30B_A3B
  cpu_offloading: false
  cpu_offloading_num_layers: 0
  num_layers: 48
  pipeline_model_parallel_size: 4
  tensor_model_parallel_size: 8
  sequence_parallel: true
optimizer:
  _target_: megatron.core.optimizer.optimizer_config.OptimizerConfig
  optimizer_cpu_offload: false
  optimizer_offload_fraction: 0.0
  use_distributed_optimizer: true
train:
  _target_: megatron.bridge.training.config.TrainingConfig
  global_batch_size: 1024
  micro_batch_size: 1
  train_iters: 500000
"""

SUMMARY = """
======================================================================
Configuration Summary (Non-Default Values vs Megatron Core)
======================================================================

[model] Non-default values (vs Mcore TransformerConfig):
  num_layers: 48  (Mcore default: 0)
  tensor_model_parallel_size: 8  (Mcore default: 1)
  pipeline_model_parallel_size: 4  (Mcore default: 1)
  sequence_parallel: True  (Mcore default: False)

[optimizer] Non-default values (vs Mcore OptimizerConfig):
  use_distributed_optimizer: True  (Mcore default: False)
======================================================================
"""


def rare_error(job: Job, emit):
    """A transient, non-fatal error line of the kind long jobs print now and then."""
    r = job.rng.randrange(job.ranks)
    k = job.rng.randrange(3)
    p = job.pre(r)
    if k == 0:
        h, pid, local = job.host[r // GPUS_PER_NODE], job.pid[r], r % GPUS_PER_NODE
        line = (f"{p}{h}:{pid}:{pid + 77} [{local}] NCCL INFO NET/IB: IbvPoll: Got completion with error 12,"
                " retrying (attempt 1)")
    elif k == 1:
        line = (f"{p}WARNING:megatron.core.datasets.blended_megatron_dataset_builder:Unable to save the"
                " BlendedDataset indexes because path_to_cache is None")
    else:
        line = (f"{p}[{job.stamp(False)}] WARNING: straggler detected: rank {r} is 1.{job.rng.randrange(10, 99)}x"
                " slower than the median")
    emit(r, [line])


def failure(job: Job, kind: str, emit):
    """The end of the run: one failure and its cascade."""
    if kind == "none":
        emit(0, [f"{job.pre(0)}[after training is done] datetime: {job.stamp(False)} "])
        return
    bad = job.rng.randrange(job.ranks)
    p = job.pre(bad, torch_rank=True)
    if kind == "oom":
        emit(bad, [
            f"{p}Traceback (most recent call last):",
            f'{p}  File "/opt/Megatron-Bridge/scripts/training/run_recipe.py", line 201, in <module>',
            f"{p}    main()",
            f'{p}  File "/opt/Megatron-Bridge/src/megatron/bridge/training/train.py", line 412, in train',
            f"{p}    ) = train_step(",
            f'{p}  File "/opt/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", line 2040, in'
            " forward_backward_pipelining_without_interleaving",
            f"{p}    output_tensor, num_tokens = forward_step(",
            f"{p}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {bad % GPUS_PER_NODE} has"
            " a total capacity of 79.11 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process has"
            " 77.87 GiB memory in use. Of the allocated memory 70.30 GiB is allocated by PyTorch, and 6.12 GiB is"
            " reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting"
            " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory"
            " Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        ])
    job.tick(600)
    seq = 1000 + job.iteration * 7
    for r in range(job.ranks):
        if r == bad and kind == "oom":
            continue
        q = job.pre(r, torch_rank=True)
        emit(r, [f"{q}[{job.glog('E')} {job.pid[r]} ProcessGroupNCCL.cpp:683] [Rank {r}] Watchdog caught"
                 f" collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={OPS[r % 3]}, NumelIn=65536000,"
                 f" NumelOut=65536000, Timeout(ms)=600000) ran for 600012 milliseconds before timing out."])
        job.tick(0.0003)
    h = job.host[bad // GPUS_PER_NODE]
    emit(0, [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "scripts/training/run_recipe.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-08-17_03:41:12",
        f"  host      : {h}",
        f"  rank      : {bad} (local_rank: {bad % GPUS_PER_NODE})",
        f"  exitcode  : 1 (pid: {job.pid[bad]})",
        "  error_file: <N/A>",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        "============================================================",
    ])


class Sink:
    """Writes lines to one file, or to one file per rank (``--per-rank N``: rank r goes to file r % N).

    Lines are buffered and written in blocks of about 4 MiB; every generated line is ASCII.
    """

    BLOCK = 4 << 20

    def __init__(self, out: Path, per_rank: int):
        self.written = 0
        self.per_rank = per_rank
        if per_rank:
            out.mkdir(parents=True, exist_ok=True)
            self.files = [open(out / f"rank{r:05d}.log", "w", encoding="ascii") for r in range(per_rank)]
        else:
            if out.parent:
                out.parent.mkdir(parents=True, exist_ok=True)
            self.files = [open(out, "w", encoding="ascii")]
        self.bufs = [[] for _ in self.files]
        self.pending = [0] * len(self.files)

    def emit(self, rank: int, lines: list):
        i = rank % self.per_rank if self.per_rank else 0
        text = "\n".join(lines) + "\n"
        self.written += len(text)
        self.bufs[i].append(text)
        self.pending[i] += len(text)
        if self.pending[i] >= self.BLOCK:
            self.files[i].write("".join(self.bufs[i]))
            self.bufs[i], self.pending[i] = [], 0

    def close(self):
        for f, b in zip(self.files, self.bufs):
            f.write("".join(b))
            f.close()


CHATTER = [
    "INFO:megatron.core.datasets.indexed_dataset:\tExtract the sequence lengths",
    "INFO:megatron.core.datasets.gpt_dataset:Load the document index from 7f3c2a9e_doc.npy",
    "INFO:megatron.bridge.training.checkpointing:  load_checkpoint: rank {r} reading shard {n} of 64",
    "[NeMo I {stamp} nvrx:211] Straggler report: rank {r} relative GPU performance 0.9{n}, individual 0.9{n}",
    "INFO:nvidia_resiliency_ext.inprocess:rank {r} heartbeat ok (iteration {it})",
    "WARNING:megatron.core.rerun_state_machine:Result validation enabled",
    "/opt/venv/lib/python3.12/site-packages/torch/autograd/graph.py:824: UserWarning: c10d::broadcast_: an autograd"
    " kernel was not registered to the Autograd key(s) but we are trying to backprop through it.",
    "DEBUG:fsspec.local:open file: /data/shards/train-{n:05d}.bin",
]


def generate(out: Path, size: int, ranks: int = 512, seed: int = 0, prefix: str = "srun", fmt: str = "bridge",
             failure_kind: str = "oom", per_rank: int = 0, nccl_share: float = 0.6, chatter: int = 6,
             timers: bool | None = None) -> int:
    """Write the log (or ``per_rank`` files); returns the number of bytes written.

    Each step of the loop is one *logged* iteration (Bridge's default ``log_interval`` is 10):
    the iteration line, ``Step Time``, a timer block (``timers``; default: MLM logs only, as
    Bridge's default ``timing_log_level=0`` prints none), memory reports now and then, ``chatter``
    info/warning lines from random ranks, a c10d warning now and then, rare transient errors;
    and whenever NCCL INFO has fallen below ``nccl_share`` of the bytes, every rank joins one
    more communicator (process groups, lazily initialised P2P and checkpoint groups).
    """
    if per_rank:
        ranks = per_rank  # one file per rank: the world size is the number of files
        prefix = "none"
    job = Job(ranks, seed, prefix, fmt)
    if timers is None:
        timers = fmt == "mlm"
    sink = Sink(out, per_rank)
    emit = sink.emit
    last = job.ranks - 1
    rng = job.rng
    try:
        job.startup(emit)
        comm_sizes = [job.ranks, job.tp, job.pp, job.dp]
        tail_reserve = 300 * ranks + 4096
        nccl = 0
        ci = 0
        while sink.written < size - tail_reserve:
            job.iteration += 10
            it = job.iteration
            elapsed = 950 + rng.uniform(-30, 30) + (2500 if it % 1000 == 0 else 0)
            job.tick(elapsed / 100)
            if nccl < nccl_share * sink.written:
                n = comm_sizes[ci % len(comm_sizes)]
                ci += 1
                channels = 16 if n > 8 else 24
                before = sink.written
                for r in range(job.ranks):
                    emit(r, job.nccl_init(r, n, channels))
                nccl += sink.written - before
            if it <= 20 or it % 500 == 0:
                for rank, line in job.memory_lines():
                    emit(rank, [line])
            emit(last, [job.iteration_line(elapsed)])
            emit(0, [f"{job.pre(0)}Step Time : {elapsed / 1000:.2f}s GPU utilization:"
                     f" {415000 / elapsed:.1f}MODEL_TFLOP/s/GPU"])
            if timers:
                emit(last, job.timer_block())
            for _ in range(chatter):
                r = rng.randrange(job.ranks)
                t = CHATTER[rng.randrange(len(CHATTER))]
                emit(r, [job.pre(r) + t.format(r=r, n=rng.randrange(100), it=it, stamp=job.stamp(False))])
            if it % 970 == 0:
                r = rng.randrange(job.ranks)
                emit(r, [job.c10d_warning(r, 2 + (it // 970) % 2)])
            if it % 10000 == 0:
                emit(0, [f"{job.pre(0)}saving checkpoint at iteration {it:7d} to /ckpt/qwen3 in torch_dist format",
                         f"{job.pre(0)}  successfully saved checkpoint from iteration {it:7d} to /ckpt/qwen3 "
                         f"[ t 1/{job.tp}, p 1/{job.pp} ]"])
            if rng.random() < 0.02:
                rare_error(job, emit)
        failure(job, failure_kind, emit)
    finally:
        sink.close()
    return sink.written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the log file to write (a folder with --per-rank)")
    ap.add_argument("--size", type=parse_size, default=parse_size("100M"), help="target size (e.g. 500M, 2G)")
    ap.add_argument("--ranks", type=int, default=512, help="world size (default 512)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefix", choices=["srun", "torchrun", "rank", "nemo"], default="srun",
                    help="launcher line prefix (default: srun -l + torchrun --tee)")
    ap.add_argument("--format", dest="fmt", choices=["bridge", "mlm"], default="bridge")
    ap.add_argument("--failure", choices=["oom", "nccl", "none"], default="oom",
                    help="how the run ends (default: a CUDA OOM on one rank, watchdog timeouts on the others)")
    ap.add_argument("--per-rank", type=int, default=0, metavar="N",
                    help="write N files into the folder OUT, one per rank of an N-rank job (no launcher prefix)")
    ap.add_argument("--nccl-share", type=float, default=0.6,
                    help="fraction of the bytes that are NCCL INFO lines (default 0.6)")
    ap.add_argument("--timers", action=argparse.BooleanOptionalAction, default=None,
                    help="timer blocks at every logged iteration (default: with --format mlm only)")
    a = ap.parse_args(argv)
    if a.ranks < 1:
        ap.error("--ranks must be at least 1")
    if not 0 <= a.nccl_share < 1:
        ap.error("--nccl-share must be in [0, 1)")
    if a.per_rank < 0:
        ap.error("--per-rank must be positive")
    n = generate(a.out, a.size, a.ranks, a.seed, a.prefix, a.fmt, a.failure, a.per_rank, a.nccl_share,
                 timers=a.timers)
    print(f"wrote {n / 1e6:.1f} MB to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
