"""The anchors of the log's structure: literal strings that start a parser (logs/parsers.py) or
a block reader (logs/blocks.py). They are registered with the match engine next to the
signatures' anchors, so structure costs nothing on lines that have none of them."""
from __future__ import annotations

# structure key -> anchors. Keys start with "@" so they never collide with signature ids.
ANCHORS: dict[str, tuple[str, ...]] = {
    "@iteration": ("elapsed time per iteration (ms):",),
    "@memory": (" memory (MB) | ", " memory (GB) | "),
    "@timers": ("time across ranks (ms):", "times across ranks (ms):"),
    # one-line timer breakdowns: DeepSpeed's wall_clock_breakdown, older Megatron(-DeepSpeed)
    # "time (ms) | forward-compute: ... | optimizer: ..."
    "@timer_line": ("time (ms) | ",),
    # the optimizer runs on the CPU: DeepSpeed's CPU Adam / ZeRO-Offload
    "@cpu_optimizer": ("DeepSpeedCPUAdam", "Adam Optimizer #0 is created with", "cpu_adam", "ZeRO-Offload"),
    # Python's header, and IPython's ("KeyError    Traceback (most recent call last)") and rich's
    # ("╭──── Traceback (most recent call last) ────╮"), which have no colon
    "@traceback": ("Traceback (most recent call last)",),
    # a frame line outside any traceback: a paste that starts inside a traceback (no header)
    "@frame": ('", line ',),
    "@exception": ("Error: ", "Exception: ", "Error:\n", "Exception:\n", "Error\n", "Error): ", "Exception): "),
    "@torchrun": ("ChildFailedError", "Root Cause (first observed failure):"),
    "@mlm_args": ("------------------------ arguments ------------------------",),
    "@bridge_yaml": ("Final configuration:",),
    "@bridge_summary": ("Configuration Summary (Non-Default Values",),
    "@step_time": ("Step Time : ",),
    # other frameworks' gradient norm in their metrics lines (HF / ms-swift dicts, mmengine, verl):
    # a NaN that the next record does not clear is a diverged run, an isolated one a skipped step
    "@grad_norm": ("'grad_norm': ", "grad_norm: ", "grad_norm:", "\"grad_norm\": ", "grad_norm="),
    # other frameworks' time per step (PACE below): tqdm bars, verl, NeMo / Lightning, mmengine,
    # NeMo-RL, ms-swift
    "@pace": ("s/it]", "it/s]", "s/it, ", "it/s, ", "timing_s/step:", "train_step_timing in s=",
              "train_step_timing=", "  data_time: ", "Total step time:", "'train_speed(iter/s)':"),
    # what the job was doing: a failure right after one of these lines happened while doing it
    # (analyze/layers.py by_context): checkpoint and weight I/O in progress
    "@activity": ("saving checkpoint", "Saving checkpoint", "Saving latest checkpoint", "saving model to",
                  "loading checkpoint", "Loading checkpoint", "loading distributed checkpoint",
                  "Loading distributed checkpoint", "load checkpoint from", "Loading weights",
                  "loading weights", "Loading model weights", "Converting checkpoint", "converting checkpoint",
                  "loading release checkpoint", "Loading release checkpoint"),
    # fp16 dynamic loss scaling skipped a step (apex amp, fairseq, DeepSpeed, Megatron's scaler)
    "@overflow": ("Gradient overflow.", "overflow detected, setting loss scale to", "OVERFLOW! Rank",
                  "reducing loss scale to"),
    # a loss scale printed as a metric (fairseq's "loss_scale 128", DLLogger's "loss_scale : 3.7e-09",
    # a metrics dict): its smallest value, beside the ones overflow lines set (MB-SYM-004)
    "@loss_scale": ("loss_scale",),
    # DeepSpeed's step report ("[Rank 0] step=2000, skipped=1995, lr=..."): fp16 steps it skipped
    # for an overflow, out of all (MB-SYM-013)
    "@ds_skipped": (", skipped=",),
    # whether the run resumed from a checkpoint (Megatron-LM and Bridge print the same lines):
    # the planner must not change the layout under a checkpoint that cannot be resharded
    "@resume": ("successfully loaded checkpoint from", "will not load any checkpoints and will start from random",
                "Starting training loop at iteration", "successfully saved checkpoint"),
    # a package's version where the log prints one (pip list / freeze, an environment dump, a
    # dist-info path): fixes that depend on the Megatron-Bridge version read it (remedy/resume.py)
    "@versions": ("megatron-bridge", "megatron_bridge", "Megatron-Bridge"),
    # no parser: a line with one of these is never skipped by the sampling of dense lines (a NaN
    # or Inf field value as Megatron prints it, a non-zero NaN-iteration count, allocator retries)
    "@anomaly": tuple(f": {v} |" for v in ("nan", "NAN", "NaN", "-nan", "-NAN", "inf", "INF", "Inf",
                                           "-inf", "-INF", "-Inf", "+inf", "+INF"))
    + tuple(f"nan iterations:{' ' * (p + 1)}{d}" for p in range(3) for d in range(1, 10))
    + tuple(f"mem-alloc-retires: {d}" for d in range(1, 10)),
}
# lines that come every few hundred bytes in a big log: the scan may sample them (match/engine.py
# Engine.scan_sampled); every count and largest value still covers all of them, see Structure
DENSE = ("@iteration", "@memory", "@step_time", "@pace")
