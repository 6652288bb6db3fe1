"""Run vs baseline: the design documents' success criteria for an offloaded run.

``compare_logs.compare(baseline_log, run_log)`` scans both logs with the normal pipeline (diagnosis.py: the
iteration series, memory reports, findings and the config the job printed all come from the
scanner; nothing here parses a log line) and checks, for the offloaded run against its
non-offloaded baseline:

1. ``config``     the run has no configuration error (a config_* root signature of severity error);
2. ``completed``  no OOM or NCCL error, and the run reached its last iteration (train_iters);
3. ``loss``       the loss matches the baseline at every common iteration (max |delta| < 0.001);
4. ``memory``     peak allocated memory dropped in proportion to the offload fraction, as the memory
                  model (diagnose.config.memory) predicts; without it, the measured rule of the
                  design documents (3.8 GB saved per 25 % of optimizer offload fraction) only for the
                  reference job it was measured on (Qwen3-30B-A3B, TP2 PP2 EP4, 16 GPUs);
5. ``speed``      the iteration-time factor against the expected penalty of that fraction (1.9x at
                  25 %, 2.5x at 50 %, 3.2x at 75 %, 4.2x at 100 %, 3.9x at 100 % with
                  overlap_cpu_optimizer_d2h_h2d; interpolated), failing above a tolerance.

A criterion that cannot be checked says so and why ("not checked"); it never guesses.
"""
from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from .config import memory as mm
from .config.runconfig import RunConfig
from .errors import DiagnoseError
from .model import Report, Role, Severity

PASS, FAIL, NOT_CHECKED = "pass", "fail", "not checked"

# The measured penalty curve: config/offload_curve.py (one source for the planner and here).
# The measured memory rule, valid only for the reference job.
GB_PER_QUARTER = 3.8
REFERENCE = {  # Bridge path -> value of the measured reference job
    "model.num_layers": 48, "model.hidden_size": 2048, "model.num_moe_experts": 128,
    "model.moe_ffn_hidden_size": 768, "model.tensor_model_parallel_size": 2,
    "model.pipeline_model_parallel_size": 2, "model.expert_model_parallel_size": 4,
}
REFERENCE_WORLD = 16
REFERENCE_NAME = "Qwen3-30B-A3B, TP2 PP2 EP4, 16 GPUs"
FAILURE_CATEGORIES = ("cuda_oom", "host_oom", "nccl_timeout", "nccl_error")


class CompareError(DiagnoseError):
    """The inputs cannot be compared (bad input: exit 2)."""


@dataclass
class Criterion:
    name: str
    title: str
    status: str
    detail: str
    measured: Any = None
    expected: Any = None
    evidence: list = field(default_factory=list)  # "file:line" strings

    def as_dict(self) -> dict:
        return {"name": self.name, "title": self.title, "status": self.status, "detail": self.detail,
                "measured": _finite(self.measured), "expected": _finite(self.expected), "evidence": self.evidence}


@dataclass
class Side:
    """One run as the scanner saw it."""

    label: str
    paths: list
    report: Report
    loss_key: str | None = None
    points: dict = field(default_factory=dict)  # iteration -> (loss or None, elapsed ms or None)
    train_iters: int | None = None
    last_iteration: int | None = None
    log_interval: int | None = None
    iter_ms: float | None = None  # steady-state median (first logged iteration left out)
    peak_gb: float | None = None
    peak_where: str = ""
    config: RunConfig | None = None

    def as_dict(self) -> dict:
        rc = self.report.root_cause
        return {
            "logs": self.paths, "loss_key": self.loss_key, "iterations_logged": len(self.points),
            "last_iteration": self.last_iteration, "train_iters": self.train_iters, "log_interval": self.log_interval,
            "iter_ms_median": _finite(self.iter_ms), "peak_allocated_gb": _finite(self.peak_gb),
            "peak_where": self.peak_where or None,
            "root_cause": None if rc is None else {"signature": rc.finding.signature.id,
                                                   "title": rc.finding.signature.title,
                                                   "file": rc.hit.file, "line": rc.hit.line},
            "config": self.config.source if self.config is not None else None,
        }


@dataclass
class Offload:
    optimizer: bool | None = None
    fraction: float | None = None  # as configured
    overlap: bool = False
    activation: bool | None = None
    source: str = ""

    @property
    def effective(self) -> float | None:
        """The share of optimizer state actually offloaded (HDO: >1 is everything, <=0 nothing)."""
        if self.optimizer is None:
            return None
        if not self.optimizer:
            return 0.0
        if self.fraction is None:
            return None
        return min(1.0, max(0.0, float(self.fraction)))

    def as_dict(self) -> dict:
        return {"optimizer_cpu_offload": self.optimizer, "optimizer_offload_fraction": self.fraction,
                "effective_fraction": self.effective, "overlap_cpu_optimizer_d2h_h2d": self.overlap,
                "activation_offload": self.activation, "source": self.source or None}


@dataclass
class Comparison:
    baseline: Side
    run: Side
    offload: Offload
    criteria: list
    max_loss_delta: float
    notes: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not any(c.status == FAIL for c in self.criteria)

    def criterion(self, name: str) -> Criterion:
        return next(c for c in self.criteria if c.name == name)

    def as_dict(self) -> dict:
        def series(side: Side):
            return [[it, _finite(v[0]), _finite(v[1])] for it, v in sorted(side.points.items())]

        return {
            "schema_version": 1, "passed": self.passed,
            "summary": {s: sum(1 for c in self.criteria if c.status == s) for s in (PASS, FAIL, NOT_CHECKED)},
            "criteria": [c.as_dict() for c in self.criteria],
            "offload": self.offload.as_dict(), "max_loss_delta": self.max_loss_delta,
            "baseline": self.baseline.as_dict(), "run": self.run.as_dict(), "notes": self.notes,
            "series": {"columns": ["iteration", "loss", "elapsed_ms"], "baseline": series(self.baseline),
                       "run": series(self.run)},
        }


def _finite(v):
    if isinstance(v, float):
        return round(v, 6) if math.isfinite(v) else str(v)
    return v


def _num(s) -> float | None:
    if s is None:
        return None
    try:
        return float(str(s).strip())
    except ValueError:
        return None


# --------------------------------------------------------------------------- reading one side

def side_from_report(label: str, paths: list, report: Report) -> Side:
    st = report.structure
    side = Side(label, list(paths), report, config=report.config)
    pts = list(st.iterations) if st is not None else []
    keys = Counter(k for p in pts for k in p.fields if k.lower().endswith("loss"))
    if "lm loss" in keys:
        side.loss_key = "lm loss"
    elif keys:
        side.loss_key = keys.most_common(1)[0][0]
    for p in pts:  # a restarted job logs an iteration again: the last one wins
        loss = _num(p.fields.get(side.loss_key)) if side.loss_key else None
        side.points[p.iteration] = (loss, p.elapsed_ms)
    if pts:
        side.train_iters = max(p.train_iters for p in pts)
        side.last_iteration = max(side.points)
        its = sorted(side.points)
        steps = Counter(b - a for a, b in itertools.pairwise(its) if b > a)
        side.log_interval = steps.most_common(1)[0][0] if steps else None
        times = [side.points[i][1] for i in its[1:] if side.points[i][1] is not None
                 and math.isfinite(side.points[i][1])]
        if not times and side.points[its[0]][1] is not None:
            times = [side.points[its[0]][1]]
        side.iter_ms = median(times) if times else None
    best = None
    for m in (st.memory if st is not None else []):
        v = m["values"].get("max_allocated")
        if v is None:
            v = m["values"].get("allocated")
        if v is not None and (best is None or v > best[0]):
            best = (v, m)
    if best is not None:
        side.peak_gb = best[0]
        rank = best[1].get("rank")
        side.peak_where = f"{best[1]['file']}:{best[1]['line']}" + (f" (rank {rank})" if rank is not None else "")
    return side


def offload_of(cfg: RunConfig | None) -> Offload:
    if cfg is None:
        return Offload()
    o = Offload(source=cfg.source or "")
    v = cfg.get("optimizer.optimizer_cpu_offload")
    o.optimizer = bool(v) if v is not None else None
    frac = cfg.get("optimizer.optimizer_offload_fraction")
    o.fraction = _num(frac) if frac is not None else None
    if o.optimizer and o.fraction is None:
        o.fraction = 0.0  # Bridge / MCore default (MLM's CLI default 1.0 is printed in its arguments dump)
    o.overlap = bool(cfg.get("optimizer.overlap_cpu_optimizer_d2h_h2d") or False)
    act = cfg.get("model.cpu_offloading")
    o.activation = bool(act) if act is not None else None
    return o


# --------------------------------------------------------------------------- expectations

def expected_penalty(fraction: float, overlap: bool = False) -> float:
    """The expected iteration-time factor of an optimizer-offload fraction (interpolated)."""
    from .config.offload_curve import factor

    return factor(fraction, overlap)


def _world_size(cfg: RunConfig | None) -> int | None:
    if cfg is None:
        return None
    for key in ("mlm.world_size", "dist.world_size", "world_size"):
        v = cfg.get(key)
        if isinstance(v, int) and v > 0:
            return v
    return None


def baseline_config(run_cfg: RunConfig, base_cfg: RunConfig | None) -> RunConfig:
    """The baseline's config: what its log printed, else the run's with every offload turned off."""
    if base_cfg is not None and base_cfg.get("model.num_layers") is not None:
        return base_cfg
    c = run_cfg.copy()
    c.set("optimizer.optimizer_cpu_offload", False)
    c.set("optimizer.optimizer_offload_fraction", 0.0)
    if c.get("model.cpu_offloading"):
        c.set("model.cpu_offloading", False)
    return c


def matches_reference(cfg: RunConfig, world_size: int | None) -> tuple[bool, str]:
    diffs = [f"{k}={cfg.get(k)!r} (reference {v})" for k, v in REFERENCE.items() if cfg.get(k) != v]
    if world_size is None:
        diffs.append(f"world size unknown (reference {REFERENCE_WORLD}; give --world-size)")
    elif world_size != REFERENCE_WORLD:
        diffs.append(f"world size {world_size} (reference {REFERENCE_WORLD})")
    return (not diffs, "; ".join(diffs[:4]))


def expected_drop(run_cfg: RunConfig | None, base_cfg: RunConfig | None, off: Offload,
                  world_size: int | None = None) -> tuple:
    """(expected drop in GB or None, where it comes from / why it is unknown).

    The drop depends on how the optimizer states are sharded, i.e. on the world size: it comes from
    ``--world-size`` or the config the job printed (MLM's ``world_size``), never from a guess."""
    if run_cfg is None:
        return None, "no config for the run (give --config, or a log that prints its config)"
    ws = world_size or _world_size(run_cfg)
    if ws is None:
        model_reason = ("the world size is unknown (give --world-size: the memory model's optimizer sharding "
                        "depends on it)")
    else:
        try:
            after = mm.estimate(run_cfg, world_size=ws)
            before = mm.estimate(baseline_config(run_cfg, base_cfg), world_size=ws)
            drop = float(before.per_gpu_gb) - float(after.per_gpu_gb)
            if math.isfinite(drop):
                return drop, (f"memory model: {float(before.per_gpu_gb):.1f} GB -> {float(after.per_gpu_gb):.1f} GB "
                              "per GPU")
            model_reason = "the memory model gave no finite estimate"
        except mm.MemoryModelError as exc:  # the model refuses configs it cannot size; say so, do not guess
            model_reason = f"the memory model could not size this config ({type(exc).__name__}: {exc})"
    if off.activation:
        return None, f"{model_reason}, and no measured rule covers activation offloading"
    ok, why = matches_reference(run_cfg, ws)
    if not ok:
        return None, f"{model_reason}, and the measured rule holds only for {REFERENCE_NAME} (this run: {why})"
    f = off.effective or 0.0
    return GB_PER_QUARTER * f / 0.25, (f"measured rule for {REFERENCE_NAME}: {GB_PER_QUARTER} GB per 25 % of "
                                        f"optimizer offload fraction; {model_reason}")


# --------------------------------------------------------------------------- the criteria

def _where(h) -> str:
    return f"{h.file}:{h.line}"


def check_config(run: Side) -> Criterion:
    bad = [f for f in run.report.findings if f.signature.category.startswith("config_")
           and f.signature.severity == Severity.ERROR and f.signature.role == Role.ROOT]
    warn = [f for f in run.report.findings if f.signature.category.startswith("config_") and f not in bad
            and f.signature.role != Role.ADVICE]
    if bad:
        return Criterion("config", "Config valid", FAIL,
                         "; ".join(f"{f.signature.id} {f.signature.title}" for f in bad),
                         evidence=[_where(f.first) for f in bad])
    if run.config is None and not run.report.findings:
        detail = "no config error in the run log (no config printed or given to check further)"
    else:
        detail = "no config error"
    if warn:
        detail += "; warnings: " + "; ".join(f"{f.signature.id} {f.signature.title}" for f in warn)
    return Criterion("config", "Config valid", PASS, detail, evidence=[_where(f.first) for f in warn])


def check_completed(run: Side) -> Criterion:
    fails = [f for f in run.report.findings if f.signature.category in FAILURE_CATEGORIES
             and f.signature.role != Role.ADVICE and f.signature.severity == Severity.ERROR]
    problems, evidence = [], []
    for f in fails:
        problems.append(f"{f.signature.id} {f.signature.title} ({f.count}x)")
        evidence.append(_where(f.first))
    if run.last_iteration is None:
        problems.append("no iteration line: the run never logged a training iteration")
    elif run.train_iters and run.last_iteration < run.train_iters:
        problems.append(f"stopped at iteration {run.last_iteration} of {run.train_iters}")
    rc = run.report.root_cause
    if problems and rc is not None and not any(f is rc.finding for f in fails):
        problems.append(f"root cause: {rc.finding.signature.id} {rc.finding.signature.title} at {_where(rc.hit)}")
        evidence.append(_where(rc.hit))
    measured = f"{run.last_iteration}/{run.train_iters}" if run.last_iteration is not None else None
    if problems:
        return Criterion(
            "completed",
            "Completed without OOM / NCCL error",
            FAIL,
            "; ".join(problems),
            measured=measured,
            expected=f"{run.train_iters}/{run.train_iters}" if run.train_iters else None,
            evidence=evidence,
        )
    return Criterion("completed", "Completed without OOM / NCCL error", PASS,
                     f"reached iteration {run.last_iteration} of {run.train_iters}; no OOM or NCCL error",
                     measured=measured, expected=measured)


def check_loss(base: Side, run: Side, max_delta: float) -> Criterion:
    title = f"Loss matches (max |delta| < {max_delta:g})"
    if base.loss_key is None:
        return Criterion("loss", title, NOT_CHECKED, "the baseline log has no loss field")
    if base.log_interval and run.log_interval and base.log_interval != run.log_interval:
        return Criterion("loss", title, NOT_CHECKED,
                         f"the logs average the loss over different intervals (baseline every {base.log_interval}, "
                         f"run every {run.log_interval} iterations): rerun with the same logger.log_interval")
    common = sorted(set(base.points) & set(run.points))
    if not common:
        return Criterion("loss", title, NOT_CHECKED, "no common iteration between the two logs", expected=max_delta)
    key = base.loss_key
    worst, worst_it, bad = 0.0, None, []
    for it in common:
        b = base.points[it][0]
        r = run.points[it][0]
        if b is None or not math.isfinite(b):
            continue
        if r is None or not math.isfinite(r):
            bad.append(it)
            continue
        d = abs(r - b)
        if d > worst or worst_it is None:
            worst, worst_it = d, it
    if bad:
        return Criterion(
            "loss",
            title,
            FAIL,
            f"'{key}' is missing or not finite in the run at iteration(s) "
            f"{', '.join(map(str, bad[:8]))}{'...' if len(bad) > 8 else ''} (NaN/Inf; Megatron drops a NaN loss)",
            measured=float("nan"),
            expected=max_delta,
        )
    if worst_it is None:
        return Criterion("loss", title, NOT_CHECKED, f"no finite '{key}' at the common iterations")
    detail = (f"max |delta| {worst:.3g} at iteration {worst_it} over {len(common)} common iterations "
              f"(baseline {base.points[worst_it][0]:.6g}, run {run.points[worst_it][0]:.6g})")
    return Criterion("loss", title, PASS if worst < max_delta else FAIL, detail, measured=worst, expected=max_delta)


def check_memory(base: Side, run: Side, off: Offload, run_cfg, base_cfg, tolerance: float,
                 world_size: int | None = None) -> Criterion:
    title = "Memory dropped with the offload fraction"
    if base.peak_gb is None or run.peak_gb is None:
        which = "baseline" if base.peak_gb is None else "run"
        return Criterion("memory", title, NOT_CHECKED, f"no memory report line in the {which} log "
                         "(MLM 'memory (MB)' / Bridge 'memory (GB)' lines)")
    measured = base.peak_gb - run.peak_gb
    ev = [w for w in (base.peak_where, run.peak_where) if w]
    head = f"peak allocated {base.peak_gb:.2f} GB -> {run.peak_gb:.2f} GB (drop {measured:.2f} GB)"
    if off.effective is None and not off.activation:
        return Criterion("memory", title, NOT_CHECKED,
                         f"{head}; the offload settings are unknown (give --config, or a log that prints its config)",
                         measured=measured, evidence=ev)
    if not off.activation and (off.effective or 0.0) == 0.0:
        return Criterion(
            "memory",
            title,
            NOT_CHECKED,
            f"{head}; the run offloads no optimizer state (optimizer_cpu_offload={off.optimizer}, "
            f"optimizer_offload_fraction={off.fraction}): no drop to expect",
            measured=measured,
            evidence=ev,
        )
    exp, why = expected_drop(run_cfg, base_cfg, off, world_size)
    if exp is None:
        return Criterion("memory", title, NOT_CHECKED, f"{head}; expected drop unknown: {why}",
                         measured=measured, evidence=ev)
    need = exp * (1.0 - tolerance)
    ok = measured >= need
    detail = (f"{head}; expected {exp:.2f} GB ({why}); at least {need:.2f} GB needed "
              f"({round(tolerance * 100)} % tolerance)")
    return Criterion("memory", title, PASS if ok else FAIL, detail, measured=measured, expected=exp, evidence=ev)


def check_speed(base: Side, run: Side, off: Offload, tolerance: float) -> Criterion:
    title = "Iteration time within the expected penalty"
    if base.iter_ms is None or run.iter_ms is None or base.iter_ms <= 0:
        which = "baseline" if base.iter_ms is None or base.iter_ms <= 0 else "run"
        return Criterion("speed", title, NOT_CHECKED, f"no iteration time in the {which} log")
    factor = run.iter_ms / base.iter_ms
    head = f"{base.iter_ms:.1f} ms -> {run.iter_ms:.1f} ms per iteration ({factor:.2f}x)"
    if off.activation:
        return Criterion("speed", title, NOT_CHECKED,
                         f"{head}; no measured penalty for activation offloading to compare with", measured=factor)
    f = off.effective
    if f is None:
        return Criterion("speed", title, NOT_CHECKED,
                         f"{head}; the offload fraction is unknown (give --config, or a log that prints its config)",
                         measured=factor)
    exp = expected_penalty(f, off.overlap)
    limit = exp * (1.0 + tolerance)
    where = (f"{round(f * 100)} % optimizer offload" + (" with overlap_cpu_optimizer_d2h_h2d" if off.overlap else "")
             if f > 0 else "no optimizer offload")
    detail = (f"{head}; expected {exp:.2f}x for {where} (measured curve, {REFERENCE_NAME} on H100), "
              f"limit {limit:.2f}x ({round(tolerance * 100)} % tolerance)")
    return Criterion("speed", title, PASS if factor <= limit else FAIL, detail, measured=factor, expected=exp)


def slowdown_against(base: Side, run: Side, base_label: str) -> dict | None:
    """The run against a good run of the same job: the slowdown of the steady-state medians,
    the iteration from which the run stays slower, and which timed components grew. Returns the
    metrics (``slowdown``, ``slowdown_since``) and the evidence (file, line, text), or None."""
    from .analyze.symptoms import component_times

    if not base.iter_ms or not run.iter_ms or base.iter_ms <= 0:
        return None
    factor = run.iter_ms / base.iter_ms
    slow = base.iter_ms * (1 + (factor - 1) / 2) if factor > 1 else None
    its = [i for i in sorted(run.points)[1:] if run.points[i][1] is not None and math.isfinite(run.points[i][1])]
    since = None
    if slow is not None:  # the first slow iteration after which the median stays slow (64 medians at most)
        stride = max(1, len(its) // 64)
        for k in range(0, len(its), 1):
            i = its[k]
            if run.points[i][1] < slow:
                continue
            if k % stride and k != len(its) - 1:
                continue
            if median(run.points[j][1] for j in its[k:]) >= slow:
                since = i
                break
    deltas = []
    a, b = component_times(base.report.structure), component_times(run.report.structure)
    for comp in b:
        if comp in a and abs(b[comp] - a[comp]) >= 0.05 * base.iter_ms:
            deltas.append(f"{comp} {b[comp] - a[comp]:+.0f} ms ({a[comp]:.0f} -> {b[comp]:.0f})")
    text = (f"{factor:.2f}x the iteration time of {base_label} ({base.iter_ms:.0f} -> {run.iter_ms:.0f} ms, "
            f"steady-state medians)" + (f" since iteration {since}" if since is not None else "")
            + ("; " + ", ".join(deltas) if deltas else
               "; the logs' timers do not say which part of the iteration grew (slow, cause not in the log)"
               if not (a and b) else "; no timed component grew by 5 % of an iteration"))
    pts = run.report.structure.iterations
    at = next((p for p in pts if p.iteration == since), None) or (pts[-1] if pts else None)
    out = {"slowdown": round(factor, 3)}
    if since is not None:
        out["slowdown_since"] = since
    return {"metrics": out, "evidence": (at.file if at else "", at.line if at else 0, text)}
