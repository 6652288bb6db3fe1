"""Metric series -> the numbers metric signatures test (``metrics.*`` in predicates).

Names (a metric that cannot be computed is absent, i.e. UNKNOWN to predicates):
  iterations             iteration lines seen (with no Megatron iteration line: the points of the
                         longest series of another framework's step times, paced_series)
  last_iteration         highest iteration number; train_iters: the planned total
  iter_ms_median         median elapsed time per iteration (ms)
  iter_ms_first          median of the first iterations after the first (warm-up) one
  iter_ms_last           median of the last three iterations (with 3 to 5 iterations: the
                         first and the last, and the trend over all of them)
  iter_time_growth       iter_ms_last / iter_ms_first
  iter_time_trend        Kendall's tau of the iteration time against the iteration, past the
                         first (warm-up) one: near 1 when the run slows steadily, near 0 for noise
  slowdown               iter_ms_median / the baseline's (``--baseline-ms``), or the steady-state
                         median / a good run's (``--baseline-run LOG``: compare.slowdown_against,
                         which also gives slowdown_since, the iteration the run stays slower from)
  loss_missing_iters     iteration lines without any loss field (Megatron drops a NaN loss)
  loss_nan_iters         iteration lines whose loss is nan/inf
  grad_norm_nan_iters    iteration lines whose grad norm is nan/inf
  nan_iters_reported     the largest "number of nan iterations"
  loss_jump              the largest rise of the loss between two iteration lines of one file, as
                         a ratio (new / old), counted only where it rose by 2 nats or more
  grad_norm_nan_run      other frameworks' metrics lines (HF / ms-swift dicts, mmengine, verl): the
                         longest run of NaN / Inf grad norms in a row in one file;
                         grad_norm_nan_last: 1 where a file's last grad norm is NaN / Inf (no
                         finite one after it: not a step the loss scaler skipped)
  optimizer_share        optimizer / (forward-backward + optimizer) of the median timer record (a
                         block or line), in any format (MLM/Bridge blocks, DeepSpeed / older
                         Megatron "time (ms) |" lines)
  timer_spread           the slowest rank's forward-backward over the fastest's (MLM (min, max))
  cpu_optimizer          1 where the log shows a CPU optimizer (DeepSpeed CPU Adam, ZeRO-Offload)
  iter_time_step         the largest step change in iteration time (median after / before, past
                         the warm-up, 3+ iterations each side); iter_time_step_at: where;
                         iter_time_step_separation: the share of (before, after) pairs in which
                         the iteration after is the slower (1: every one; 0.5: noise)
  mem_max_allocated_gb   largest (max) allocated memory reported, GB = 1e9 bytes
  alloc_retries_growth   growth of Bridge's mem-alloc-retires over the run
  unexplained_exceptions Python exceptions that no signature recognised
  error_findings         error-level findings of the lines and exceptions (diagnosis.analyze)
  overflow_steps         fp16 steps skipped for a gradient overflow (apex, fairseq, DeepSpeed)
  skipped_steps          DeepSpeed's count of fp16 steps skipped for an overflow, in its latest
                         "step=N, skipped=K" report; skipped_step_share: K / N
  loss_scale_min         the smallest loss scale those lines set or a metrics line printed
                         ("loss_scale 128", "loss_scale : 3.7e-09"); loss_scale_drops: the longest
                         run of those values each lower than the one before
  ends_in_init           1 where every file's output stops inside start-up (process
                         group, NCCL communicator, DDP / pipeline set-up, the lines before a first
                         step, a training bar at step 0: the startup_lines table of
                         signatures/layers/startup.yaml; warnings after it skipped) with no
                         iteration, step, exception or failed worker anywhere: a start-up hang
  ends_in_rollout_sync   1 where every file's output stops in an RL job's weight hand-over to its
                         rollout engine (the engine put to sleep or woken, its prefix cache reset,
                         weights posted to its server: the rollout_sync_lines table of
                         signatures/layers/rollout.yaml; warnings and finished progress bars after
                         it skipped), with no exception or failed worker anywhere: a hang there
  ends_in_connect_retry  1 where every file's output stops while NCCL retries a connection to a
                         peer (connect_retry_lines of signatures/layers/startup.yaml): the peer
                         never answers
  offload_fraction       the config's optimizer-offload fraction, where offload is on and more
                         is offloaded than fits needs (analyze/expected.py); offload_fraction_fits:
                         the lowest that fits; offload_factor / offload_factor_fits: their
                         iteration-time factors; offload_saving: the share of an iteration saved
"""
from __future__ import annotations

import math
import re
from statistics import median

from ..logs.structure import Structure


def paced_series(s: Structure) -> list:
    """Where the log has no Megatron iteration line: the longest series of another framework's
    time per step (logs/structure.py PACE: tqdm, verl, NeMo, mmengine ...), one bar or format."""
    if s.iterations or not s.paced:
        return []
    best = max(s.paced.values(), key=len)
    ev = max(best, key=lambda p: p.elapsed_ms or 0.0)
    s.note("slowest_iteration", ev.file, ev.line, ev.fields.get("_line", ""), replace=True)
    return best


def compute(s: Structure, baseline_ms: float | None = None, startup_line=None, stops: dict | None = None) -> dict:
    """The metrics of ``s``. ``startup_line``: a predicate for distributed start-up lines (the
    layer tables' ``startup_lines``); without it, ``ends_in_init`` is not computed. ``stops``:
    {metric: predicate} of the other kinds of line output can stop on (``Tables.stops``: the
    weight hand-over to a rollout engine, NCCL retrying a connection); each metric is 1 where
    every file of the log stops on its kind."""
    m: dict = {}
    pts = s.iterations or paced_series(s)
    t, peaks = s.tally, s.peaks
    if pts:
        m["iterations"] = s.iteration_count() or len(pts)
        m["last_iteration"] = peaks.get("last_iteration", pts[-1].iteration)  # over every line read
        m["train_iters"] = peaks.get("train_iters", pts[-1].train_iters)
        times = [p.elapsed_ms for p in pts if p.elapsed_ms is not None and math.isfinite(p.elapsed_ms)]
        if times:
            m["iter_ms_median"] = median(times)
            if len(times) >= 6:
                head = times[1:4]
                m["iter_ms_first"] = median(head)
                m["iter_ms_last"] = median(times[-3:])
                if m["iter_ms_first"] > 0:
                    m["iter_time_growth"] = m["iter_ms_last"] / m["iter_ms_first"]
                m["iter_time_trend"] = round(kendall_tau(times[1:]), 3)
            elif len(times) >= 3:  # a short paste: each logged point is already an average
                m["iter_ms_first"], m["iter_ms_last"] = times[0], times[-1]
                if times[0] > 0:
                    m["iter_time_growth"] = times[-1] / times[0]
                m["iter_time_trend"] = round(kendall_tau(times), 3)
            if baseline_ms:
                m["slowdown"] = m["iter_ms_median"] / baseline_ms
        # counted on every iteration line read (structure.Structure._iteration_evidence)
        m["loss_missing_iters"] = t.get("loss_missing", 0)
        m["loss_nan_iters"] = t.get("loss_nan", 0)
        m["grad_norm_nan_iters"] = t.get("grad_norm_nan", 0)
        m["nan_iters_reported"] = peaks.get("nan_reported", 0)
        if peaks.get("loss_jump") is not None:
            m["loss_jump"] = peaks["loss_jump"]
    elif s.step_times:
        m["iter_ms_median"] = median(s.step_times)
        if baseline_ms:
            m["slowdown"] = m["iter_ms_median"] / baseline_ms
    if s.grad_norm_runs:
        m["grad_norm_nan_run"] = max(r.longest for r in s.grad_norm_runs.values())
        open_runs = [r for r in s.grad_norm_runs.values() if r.cur > 0]
        m["grad_norm_nan_last"] = 1 if open_runs else 0
        first = max(open_runs, key=lambda r: r.cur).first if open_runs else None  # the longest open run
        if first is not None:
            s.note("grad_norm_nan_run", *first)
    m.update(timer_shares(s))
    if startup_line is not None and not pts and not s.step_times and ends_on(s, startup_line, "ends_in_init"):
        m["ends_in_init"] = 1
    for name, kind in (stops or {}).items():
        if ends_on(s, kind, name):
            m[name] = 1
    if pts:
        m.update(change_point(pts, s))
    if t.get("overflow_steps"):
        m["overflow_steps"] = t["overflow_steps"]
    if peaks.get("ds_steps"):
        m["skipped_steps"] = peaks["ds_skipped"]
        m["skipped_step_share"] = round(peaks["ds_skipped"] / peaks["ds_steps"], 4)
    if peaks.get("loss_scale_min") is not None:  # set by overflow lines or printed as a metric
        m["loss_scale_min"] = -peaks["loss_scale_min"]
        m["loss_scale_drops"] = max((r.longest for r in s.scale_runs.values()), default=0)
    if peaks.get("mem_max_gb") is not None:
        m["mem_max_allocated_gb"] = peaks["mem_max_gb"]
    first = next((r["values"]["alloc_retries"] for r in s.memory if r["values"].get("alloc_retries") is not None), None)
    if t.get("memory_retries_reports", 0) >= 2 and first is not None:
        m["alloc_retries_growth"] = peaks["alloc_retries"] - first
    return m


# The timers of every format we parse, by the part of the iteration they measure (the max
# across ranks where a format gives min and max). Sub-timers (backward_inner, allreduce inside
# backward) are not listed: they are already inside their parent.
COMPONENTS = {
    "optimizer step": ("optimizer", "step", "optimizer_step", "step_microstep", "optimizer-step"),
    "forward-backward": ("forward-backward",),
    "forward": ("forward", "fwd", "forward_microstep", "fwd_microstep", "forward-compute"),
    "backward": ("backward", "bwd", "backward_microstep", "bwd_microstep", "backward-compute"),
}


def component_times(s: Structure) -> dict:
    """{component: ms} of the last timers (the slowest rank's where a format gives both)."""
    out = {}
    for comp, names in COMPONENTS.items():
        v = next((s.timers[n] for n in names if n in s.timers), None)
        if v is not None:
            out[comp] = v[1]
    return out


def _split(vals: dict) -> dict:
    """{component: ms} of one timer record (the first of each component's names it holds)."""
    got = {}
    for comp, names in COMPONENTS.items():
        v = next((vals[n] for n in names if n in vals), None)
        if v is not None:
            got[comp] = v
    return got


_WORDS = re.compile(r"[A-Za-z]{2}")


def ends_on(s: Structure, kind, name: str) -> bool:
    """Every file read to its end stops on a line of one kind (``kind``: a predicate, e.g. the
    ``startup_lines`` table of signatures/layers/startup.yaml), and the log shows no exception,
    traceback or failed worker (those name the failure instead). The last such line is noted as
    ``name``'s evidence."""
    if not s.tails or s.tracebacks or s.exceptions or s.torchrun:
        return False
    last = None
    for file, tail in s.tails.items():
        words = [(line, text) for line, text in tail if _WORDS.search(text)]  # not "-----"
        end = last_progress(words, kind)
        if end is None:
            return False
        last = (file, *words[end])
    if last is not None:
        s.note(name, *last)
    return True


# Lines printed while a job waits that say nothing of its progress: Python warnings (the
# "file.py:N: SomeWarning: ..." line and the source line Python prints under it), logging and
# glog warning lines, and progress bars that finished (a short loop such as a data
# preprocessing map at "100%| N/N"). Output that ends on them after a start-up line still ends
# in start-up.
_WARNING = re.compile(r"\b\w*Warning\b:|^warnings\.warn\(|\[NeMo W |^W\d{4} |\bWARNING\b")
_PY_WARNING = re.compile(r"\.py:\d+: \w*Warning:")
_FINISHED_BAR = re.compile(r"^[^|]{0,80}\b100%\s*\|[^|]*\|\s*(\d+)/\1\s*\[[^\]]*\]\s*$")


def last_progress(words: list, kind):
    """The index in ``words`` ((line, text) of a file's end) of the line of one kind (``kind``: a
    predicate) the file stops on, warnings and finished bars after it skipped; None where the
    file stops on anything else."""
    i = len(words) - 1
    if i > 0 and _cut_copy(words[i][1], [t for _, t in words[max(0, i - 3):i]]):
        i -= 1  # a paste cut in the middle of its last line: the line it was a copy of tells
    while i >= 0:
        text = words[i][1]
        if kind(text):
            return i
        # a warning, or the source line Python prints under one, or a finished bar
        if not (_WARNING.search(text) or _FINISHED_BAR.match(text)
                or (i > 0 and _PY_WARNING.search(words[i - 1][1]))):
            return None
        i -= 1
    return None


def _cut_copy(last: str, before: list) -> bool:
    """A file's last line cut short: a strict beginning of one of the lines just above it (the
    same logger's prefix, cut before its message), at least 8 characters long."""
    return len(last) >= 8 and any(len(b) > len(last) and b.startswith(last) for b in before)


def timer_shares(s: Structure) -> dict:
    """optimizer_share (optimizer / (forward + backward + optimizer)), timer_spread (the slowest
    rank's forward-backward over the fastest's, where a format gives both) and cpu_optimizer
    (the log shows a CPU optimizer); the attribution line is noted as evidence.

    The share is read per timer record (one block or line: one iteration's split), never from
    fields of different lines mixed, and the median record speaks for the run: lines of several
    runs pasted together, or a microstep line beside a step line, each keep their own split."""
    out: dict = {}
    if not s.timers:
        return out
    out["cpu_optimizer"] = 1 if s.tally.get("cpu_optimizer") else 0
    shares = []
    for file, line, vals in s.timer_records:
        got = _split(vals)
        opt, fb = got.get("optimizer step"), got.get("forward-backward")
        if fb is None and ("forward" in got or "backward" in got):
            fb = got.get("forward", 0.0) + got.get("backward", 0.0)
        if opt is not None and fb is not None and opt + fb > 0:
            shares.append((opt / (opt + fb), file, line, got, opt + fb))
    if shares:
        share, file, line, got, total = sorted(shares, key=lambda r: r[0])[(len(shares) - 1) // 2]
        out["optimizer_share"] = share
        parts = {k: v for k, v in got.items() if k != "forward-backward" or "forward" not in got}
        top = max(parts, key=lambda k: parts[k])
        s.note("timer_attribution", file, line, f"{top} {parts[top]:.1f} ms = {parts[top] / total:.0%} of the "
               "timed iteration (" + ", ".join(f"{k} {v:.1f} ms" for k, v in parts.items() if k != top) + ")"
               + (f"; the median of {len(shares)} timer records" if len(shares) > 1 else ""), replace=True)
    fb = next((s.timers[n] for n in COMPONENTS["forward-backward"] if n in s.timers), None)
    if fb is None:
        f = next((s.timers[n] for n in COMPONENTS["forward"] if n in s.timers), None)
        b = next((s.timers[n] for n in COMPONENTS["backward"] if n in s.timers), None)
        if f is not None or b is not None:
            f, b = f or (0.0, 0.0), b or (0.0, 0.0)
            fb = (f[0] + b[0], f[1] + b[1])
    if fb and fb[0] > 0 and fb[1] > fb[0]:
        out["timer_spread"] = fb[1] / fb[0]
    return out


WARMUP = 2  # iterations left out of the change point: compilation, allocator growth, first data
TREND_POINTS = 256  # Kendall's tau is O(n^2): an even subset of a longer series


def kendall_tau(xs: list) -> float:
    """Kendall's tau-a of the values against their order: +1 when every later value is larger,
    about 0 for noise. A toy run on a loaded CPU whose last three iterations happen to be 30 %
    slower than its first three is noise, not a run that is getting steadily slower."""
    if len(xs) > TREND_POINTS:
        step = len(xs) / TREND_POINTS
        xs = [xs[int(i * step)] for i in range(TREND_POINTS)]
    n = len(xs)
    if n < 2:
        return 0.0
    s = sum((xs[j] > xs[i]) - (xs[j] < xs[i]) for i in range(n) for j in range(i + 1, n))
    return s / (n * (n - 1) / 2)


def separation(before: list, after: list) -> float:
    """The share of (before, after) pairs in which the value after is the larger (ties count
    half): the Mann-Whitney U over its maximum. 1.0: every iteration after the split is slower
    than every one before it."""
    if not before or not after:
        return 0.0
    u = sum((a > b) + 0.5 * (a == b) for b in before for a in after)
    return u / (len(before) * len(after))


CHANGE_POINTS = 512  # at most this many iteration times are split (an even subset of a longer series)
CHANGE_SPLITS = 64  # and at most this many split points are tried: O(points x splits) on any log


def change_point(pts: list, s: Structure) -> dict:
    """A step change in the iteration time: the split (3+ iterations on each side, after the
    warm-up) whose medians differ most. A single slow iteration (checkpoint save, evaluation)
    moves no median, so it is no step."""
    series = [p for p in pts if p.elapsed_ms is not None and math.isfinite(p.elapsed_ms)][WARMUP:]
    if len(series) < 6:
        return {}
    if len(series) > CHANGE_POINTS:  # bounded work on any log: an evenly spread subset of the points
        step = len(series) / CHANGE_POINTS
        series = [series[int(i * step)] for i in range(CHANGE_POINTS)]
    xs = [p.elapsed_ms for p in series]
    splits = list(range(3, len(xs) - 2))
    if len(splits) > CHANGE_SPLITS:
        splits = sorted({3 + int(i * (len(xs) - 5) / CHANGE_SPLITS) for i in range(CHANGE_SPLITS)})
    best = None  # the split that fits two levels best: least absolute deviation from each median
    for k in splits:
        before, after = median(xs[:k]), median(xs[k:])
        cost = sum(abs(x - before) for x in xs[:k]) + sum(abs(x - after) for x in xs[k:])
        if before > 0 and (best is None or cost < best[0]):
            best = (cost, k, before, after)
    if best is None:
        return {}
    _, k, before, after = best
    factor = after / before
    p = series[k]
    s.note("iter_time_step", p.file, p.line, f"from iteration {p.iteration}: median {after:.0f} ms per iteration, "
           f"{factor:.1f}x the {before:.0f} ms before it (iterations {series[0].iteration}-{series[k - 1].iteration})",
           replace=True)
    return {"iter_time_step": round(factor, 3), "iter_time_step_at": p.iteration,
            "iter_time_step_separation": round(separation(xs[:k], xs[k:]), 3)}


# which evidence line (logs/structure.py Structure.evidence) stands for which metric
EVIDENCE_FOR = {
    "loss_missing_iters": "loss_missing",
    "grad_norm_nan_iters": "grad_norm_nan",
    "loss_nan_iters": "loss_nan",
    "iter_time_growth": "slowest_iteration",
    "slowdown": ("baseline", "slowest_iteration"),  # a key, or keys in order of preference
    "iter_ms_median": "slowest_iteration",
    "optimizer_share": "timer_attribution",
    "timer_spread": "timers",
    "iter_time_step": "iter_time_step",
    "slowdown_since": "baseline",
    "nan_iters_reported": "loss_nan",
    "mem_max_allocated_gb": "memory",
    "alloc_retries_growth": "memory_retries",
    "unexplained_exceptions": "exception",
    "loss_scale_min": "loss_scale_min",
    "offload_fraction_fits": "offload_cost",
    "offload_fraction": "offload_cost",
    "overflow_steps": "loss_scale_min",
    "ends_in_init": "ends_in_init",
    "ends_in_rollout_sync": "ends_in_rollout_sync",
    "ends_in_connect_retry": "ends_in_connect_retry",
    "grad_norm_nan_last": "grad_norm_nan_run",
    "grad_norm_nan_run": "grad_norm_nan_run",
    "loss_jump": "loss_jump",
    "skipped_steps": "ds_skipped",
    "skipped_step_share": "ds_skipped",
}
