"""What the next run will load, and which config changes that checkpoint cannot take.

A fix is only safe if the relaunched run can still load what the failed run loaded. Facts used
(Megatron-Bridge ``training/checkpointing.py`` and ``training/optim.py``; Megatron-LM behaves the
same for the first two):

- **Layout.** Model weights in a distributed checkpoint reshard to any (TP, PP). The
  distributed optimizer's state does so only when it was saved ``fully_reshardable``
  (``checkpoint.dist_ckpt_optim_fully_reshardable: true``); Bridge saves it ``dp_reshardable``
  by default, which follows a change of DP only. Resuming it with another (TP, PP) raises
  ``(TP, PP) mismatch after resume ... not supported for DistributedOptimizer with sharding type
  dp_reshardable`` (MB-CKPT-008). The optimizer state is not read when ``finetune`` is true or
  ``load_optim`` is false, or when the checkpoint was saved without it (``save_optim: false``).
- **Distributed optimizer.** A checkpoint saved without the distributed optimizer has no
  sharded optimizer state to load into one: turning it on while resuming that state fails.
- **Optimizer offload on a fine-tune.** Before Megatron-Bridge 0.6.0 (commit 4a03c498f,
  "Sync HybridDeviceOptimizer FP32 master copies after checkpoint load"), loading weights
  without their optimizer state and stepping a HybridDeviceOptimizer (optimizer offload with
  the distributed optimizer) runs Adam on FP32 masters that kept their random init and writes
  them back: the loaded model is reverted at the first step (MB-OFF-039).

Where the checkpoint's facts come from: its own ``run_config.yaml`` when the load folder is
reachable from here (the newest ``iter_*``), else the failed run's config (the job that saved it
is usually the job that resumes it), and the log's "successfully loaded checkpoint ... at
iteration N" or "will start from random" lines say whether anything was loaded at all.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..config.runconfig import RunConfig

HDO_SYNC_BRIDGE = (0, 6, 0)  # the first Megatron-Bridge release with the HybridDeviceOptimizer sync


def parse_version(text: str | None) -> tuple | None:
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text or ""))
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


@dataclass
class Resume:
    loads: bool | None  # the next run loads a checkpoint of this job (None: cannot tell)
    optimizer_state: bool  # ... and its optimizer state
    weights_only: bool  # weights are loaded without their optimizer state (a fine-tune)
    ckpt_distopt: bool | None  # the checkpoint was saved with the distributed optimizer
    ckpt_fully_reshardable: bool | None  # ... in a format that takes a (TP, PP) change
    ckpt_layout: tuple | None  # (TP, PP, EP) of the checkpoint, where its run_config.yaml says
    bridge_version: tuple | None
    source: str  # where the checkpoint facts come from
    evidence: str = ""  # the log line that says whether a checkpoint was loaded
    bridge_version_from: str = ""  # "--bridge-version", or the log line that printed it

    def describe(self) -> str:
        if self.loads is False:
            return "the run starts from scratch (nothing to resume)"
        what = "weights only" if self.weights_only else ("weights and optimizer state" if self.optimizer_state
                                                         else "weights")
        how = ("fully reshardable" if self.ckpt_fully_reshardable else "dp_reshardable"
               if self.ckpt_distopt else "without the distributed optimizer")
        return f"resumes {what} from a checkpoint saved {how} ({self.source})"


def _newest_run_config(load: str, base: Path | None) -> Path | None:
    root = Path(load)
    if not root.is_absolute() and base is not None:
        root = base / root
    try:
        tracker = root / "latest_checkpointed_iteration.txt"
        if tracker.is_file():
            it = tracker.read_text().strip()
            cand = root / (f"iter_{int(it):07d}" if it.isdigit() else it) / "run_config.yaml"
            if cand.is_file():
                return cand
        iters = sorted(p for p in root.glob("iter_*") if (p / "run_config.yaml").is_file())
        return iters[-1] / "run_config.yaml" if iters else None
    except OSError:
        return None


def _loaded_lines(structure) -> tuple[bool | None, bool | None, str]:
    """(the run resumed a checkpoint of this job, it saved one, the line that says so) from the
    log: "successfully loaded checkpoint ... at iteration N", "will start from random",
    "Starting training loop at iteration N", "successfully saved checkpoint"."""
    resumed, saved, where = None, False, ""
    for file, line, kind, iteration in getattr(structure, "resume", []) or []:
        if kind == "saved":
            saved, where = True, f"{file}:{line} (a checkpoint was saved)"
        elif resumed is None and kind == "fresh":
            resumed, where = False, where or f"{file}:{line} (nothing loaded)"
        elif resumed is None and kind in ("loaded", "start") and iteration is not None:
            resumed = iteration > 0
            where = where or f"{file}:{line} (iteration {iteration})"
    return resumed, saved, where


def read(cfg: RunConfig, structure=None, bridge_version: str | None = None,
         base: Path | None = None) -> Resume:
    """The resume facts of the run ``cfg`` describes (the failed run's config)."""
    def get(key, default=None):
        v = cfg.get(key)
        return default if v is None else v

    load, pretrained = get("checkpoint.load"), get("checkpoint.pretrained_checkpoint")
    finetune = get("checkpoint.finetune") is True
    load_optim = get("checkpoint.load_optim", True) is not False
    ckpt = cfg
    source = "the failed run's config"
    rc_path = _newest_run_config(str(load), base) if load else None
    if rc_path is not None:
        try:
            from ..config.load import ConfigError, load_config

            ckpt = load_config(str(rc_path))
            source = f"the checkpoint's {rc_path}"
        except ConfigError:  # an unreadable checkpoint config: fall back to the run's
            ckpt = cfg
    resumed, saved, evidence = _loaded_lines(structure)
    last = getattr(structure, "peaks", {}).get("last_iteration") if structure is not None else None
    interval = get("checkpoint.save_interval")
    if isinstance(last, int) and isinstance(interval, int) and interval > 0 and last >= interval:
        saved = True  # it ran past a save interval: a checkpoint was (probably) written
    loads: bool | None
    if not load:
        loads = False  # nothing of this job is loaded (a pretrained checkpoint is weights only)
    elif resumed or saved:
        loads = True  # it resumed one, or saved one the next run will resume
    elif resumed is False:
        loads = False  # it started from scratch and died before saving: so will the next run
    else:
        loads = None  # a load folder is set; whether it holds a checkpoint, the log does not say
    weights_only = bool(pretrained) or (bool(load) and loads is not False and (finetune or not load_optim))
    saved_optim = ckpt.get("checkpoint.save_optim") is not False
    distopt = ckpt.get("optimizer.use_distributed_optimizer")
    if distopt is None:
        distopt = ckpt.get("ddp.use_distributed_optimizer")
    version_from = "--bridge-version" if bridge_version else ""
    if not bridge_version:  # the version the log printed (pip list, an environment dump)
        from ..logs.structure import version_of

        found = version_of(structure)
        if found is not None:
            bridge_version, version_from = found[0], f"{found[1]}:{found[2]}"
    return Resume(
        loads=loads,
        optimizer_state=bool(load) and load_optim and not finetune and saved_optim and loads is not False,
        weights_only=weights_only,
        ckpt_distopt=None if distopt is None else distopt is True,
        ckpt_fully_reshardable=ckpt.get("checkpoint.dist_ckpt_optim_fully_reshardable") is True,
        ckpt_layout=_layout(ckpt) if rc_path is not None else None,
        bridge_version=parse_version(bridge_version),
        source=source,
        evidence=evidence,
        bridge_version_from=version_from if parse_version(bridge_version) else "",
    )


def _layout(cfg: RunConfig) -> tuple:
    """(TP, PP, EP): MCore compares (TP, PP) on resume; an EP change moves experts (and their
    slice of the flat optimizer buffers) to other ranks, which dp_reshardable does not follow
    either (the planner treats it as the same kind of change)."""
    return (
        int(cfg.get("model.tensor_model_parallel_size") or 1),
        int(cfg.get("model.pipeline_model_parallel_size") or 1),
        int(cfg.get("model.expert_model_parallel_size") or 1),
    )


def blocks(r: Resume, before: RunConfig, after: RunConfig) -> str | None:
    """Why the run ``after`` cannot load what ``before`` would have loaded (None: it can)."""
    if not r.optimizer_state:
        return None
    old, new = r.ckpt_layout or _layout(before), _layout(after)
    distopt_after = after.get("optimizer.use_distributed_optimizer") is True or \
        after.get("ddp.use_distributed_optimizer") is True
    may = "" if r.loads else " (if the load folder holds a checkpoint by then)"
    if distopt_after and r.ckpt_distopt is False:
        return (f"the run {r.describe()}{may}: turning the distributed optimizer on cannot load that optimizer "
                "state; set checkpoint.load_optim=false (fresh Adam moments) or keep the optimizer as it is")
    if new != old and r.ckpt_distopt and not r.ckpt_fully_reshardable:
        change = (f"(TP, PP) {old[:2]} -> {new[:2]} is 'not supported for DistributedOptimizer with sharding type "
                  "dp_reshardable'" if old[:2] != new[:2] else
                  f"EP{old[2]} -> EP{new[2]} moves the experts' optimizer state to other ranks, which the "
                  "'dp_reshardable' optimizer checkpoint does not follow")
        return (f"the run {r.describe()}{may}: {change}. Either resume once with the old layout and "
                "checkpoint.dist_ckpt_optim_fully_reshardable=true, save, then change the layout; or set "
                "checkpoint.load_optim=false (the weights reshard; Adam's moments restart from zero, expect a "
                "loss bump for a few hundred steps while they rebuild)")
    return None


def blocks_offload(r: Resume, after: RunConfig) -> str | None:
    """Why optimizer offload must not be turned on for this run (None: it may)."""
    if after.get("optimizer.optimizer_cpu_offload") is not True or not r.weights_only:
        return None
    if r.bridge_version is not None and r.bridge_version >= HDO_SYNC_BRIDGE:
        return None
    ver = (".".join(map(str, r.bridge_version)) + (f" (from {r.bridge_version_from})" if r.bridge_version_from else "")
           if r.bridge_version else "unknown (give --bridge-version, or print `pip list` in the job's log)")
    return ("optimizer offload on a run that loads weights without their optimizer state (a fine-tune): before "
            f"Megatron-Bridge 0.6.0 the HybridDeviceOptimizer keeps its FP32 masters at their random init and the "
            f"first step reverts the loaded model (MB-OFF-039); Megatron-Bridge here: {ver}")
