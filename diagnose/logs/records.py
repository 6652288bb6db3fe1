"""What the scan keeps of a log's structure, bounded: the Structure record and its stores.

``Structure`` holds the iteration series, memory reports, timers, tracebacks, exceptions,
torchrun failures, config blocks, other frameworks' step times and NaN runs, and the counts and
largest values over every line read (even the lines the sampling skipped). The ``add_*`` and
``merge_*`` functions keep each store bounded and let two pieces of one file join
(diagnose/parallel.py). Parsers (logs/parsers.py) and block readers (logs/blocks.py) fill it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .lines import clean, split_prefix
from .values import is_bad, num

MAX_SERIES = 50_000  # iteration points kept (then decimated by 2): ~1.2 KB each, so <= 60 MB
MAX_RECORDS = 200  # tracebacks, exceptions, memory reports kept
MAX_TIMER_RECORDS = 64  # the latest timer blocks / lines kept whole (analyze/symptoms.timer_shares)
MAX_TIMER_NAMES = 256  # distinct timer names kept (MLM's level-2 block has about 40), and per record
MAX_ACTIVITY = 64  # activity lines kept (the latest)
LOSS_JUMP_NATS = 2.0  # a rise smaller than this between two iteration lines is never a jump
MAX_TAIL = 6  # lines of each file's end kept in Structure.tails
MAX_GRAD_NORM_FILES = 4096  # files whose grad-norm runs (and loss-scale runs) are kept
MAX_PACE_SERIES = 16  # distinct (kind, total) series kept: a log of many progress bars stays bounded
MAX_CONFIG_BLOCKS = 4  # per kind: a job restarted 4,000 times printed its config 4,000 times


@dataclass
class IterationPoint:
    iteration: int
    train_iters: int
    elapsed_ms: float | None
    fields: dict
    file: str
    line: int
    time: float | None


@dataclass
class Traceback:
    file: str
    line: int  # line of the exception; of the last frame when the log cut it before the exception
    rank: int | None
    exc_type: str | None = None  # None: the traceback lost its exception line (cut log)
    message: str = ""
    text: str = ""
    frames: list = field(default_factory=list)  # "File ..., line N, in func" lines, outermost first
    source: list = field(default_factory=list)  # the source lines under the frames (same order)
    headless: tuple | None = None  # (prefix key, first line) of one that began at a frame line
    start: int = 0  # the line it starts at (its header, or its first frame)


@dataclass
class TorchrunFailure:
    section: str  # "failure" | "root"
    rank: int | None = None
    local_rank: int | None = None
    exitcode: int | None = None
    host: str = ""
    time: str = ""
    error_file: str = ""
    traceback: str = ""
    file: str = ""
    line: int = 0


@dataclass
class Structure:
    """What the scan learnt about the log's structure (bounded)."""

    iterations: list = field(default_factory=list)
    decimation: int = 1
    memory: list = field(default_factory=list)  # dicts: file,line,rank,iteration,unit,values (GB)
    timers: dict = field(default_factory=dict)  # name -> (min, max) of the last block
    # (file, line, {name: max ms}) of each timer block or line, the latest few: one record is
    # one iteration's coherent split (lines of different runs or steps are not mixed)
    timer_records: list = field(default_factory=list)
    timer_blocks: int = 0
    tracebacks: list = field(default_factory=list)
    traceback_count: int = 0
    exceptions: list = field(default_factory=list)  # (file, line, rank, type, message, text)
    torchrun: list = field(default_factory=list)  # TorchrunFailure
    config_blocks: list = field(default_factory=list)  # (kind, file, line, dict)
    step_times: list = field(default_factory=list)
    # (kind, steps in all) -> IterationPoints of another framework's time per step (PACE): used
    # where the log has no Megatron iteration line (analyze/symptoms.py)
    paced: dict = field(default_factory=dict)
    # file -> the runs of NaN grad norms in other frameworks' metrics lines (add_grad_norm)
    grad_norm_runs: dict = field(default_factory=dict)
    # file -> the runs of fp16 loss-scale cuts, each lower than the one before (add_scale)
    scale_runs: dict = field(default_factory=dict)
    year: int | None = None  # from the first dated line: glog timestamps (E1130 ...) carry none

    evidence: dict = field(default_factory=dict)  # name -> (file, line, text) of notable lines
    # (file, prefix key) -> the last line a traceback reader took: a frame line up to there is
    # inside a traceback already; after it, a frame line starts a headless one
    tb_until: dict = field(default_factory=dict)
    activity: list = field(default_factory=list)  # (file, line, text) of @activity lines, the last few
    # (file, line, kind, iteration or None), the first few: kind "loaded" | "fresh" (nothing to
    # load) | "start" (the training loop's first iteration) | "saved" (a checkpoint was written)
    resume: list = field(default_factory=list)
    # over every line read, stored in the bounded lists above or not (scan.py's sampling, the
    # decimation of ``iterations``): counts (summed across files) and largest values
    tally: dict = field(default_factory=dict)  # iterations, loss_missing, loss_nan, grad_norm_nan, memory
    peaks: dict = field(default_factory=dict)  # last_iteration, train_iters, nan_reported, mem_max_gb, ...
    skipped: dict = field(default_factory=dict)  # dense key -> lines the sampling did not read
    # file -> [(line, text)]: the last few non-blank lines of each file read to its end, launcher
    # prefix split off (what the job was doing when its output stopped: symptoms.ends_in)
    tails: dict = field(default_factory=dict)
    # file -> the loss of its last iteration line, and (loss, line, text) of its first: the loss
    # jump (_loss_jump); a file read in pieces is joined at each piece's end (parallel.py)
    last_loss: dict = field(default_factory=dict)
    first_loss: dict = field(default_factory=dict)

    def count(self, name: str, n: int = 1):
        self.tally[name] = self.tally.get(name, 0) + n

    def peak(self, name: str, value):
        if value is not None and (name not in self.peaks or value > self.peaks[name]):
            self.peaks[name] = value

    def iteration_count(self) -> int:
        """Iteration lines in the log: parsed ones plus those the sampling skipped."""
        return self.tally.get("iterations", 0) + self.skipped.get("@iteration", 0)

    def memory_count(self) -> int:
        """Memory reports in the log: parsed ones plus those the sampling skipped."""
        return self.tally.get("memory", 0) + self.skipped.get("@memory", 0)

    def note(self, name: str, file: str, line: int, text: str, replace: bool = False):
        if replace or name not in self.evidence:
            self.evidence[name] = (file, line, text[:2000])

    def add_iteration(self, p: IterationPoint, text: str = ""):
        self._iteration_evidence(p, text)
        self.iterations.append(p)
        if len(self.iterations) > MAX_SERIES:
            self.iterations = self.iterations[::2]
            self.decimation *= 2


    def _iteration_evidence(self, p: IterationPoint, text: str):
        f = p.fields
        self.count("iterations")
        self.peak("last_iteration", p.iteration)
        self.peak("train_iters", p.train_iters)
        losses = [v for k, v in f.items() if k.lower().endswith("loss")]
        if is_bad(f.get("grad norm", "")):
            self.count("grad_norm_nan")
            self.note("grad_norm_nan", p.file, p.line, text)
        if not losses:
            self.count("loss_missing")
            self.note("loss_missing", p.file, p.line, text)
        elif any(is_bad(v) for v in losses):
            self.count("loss_nan")
            self.note("loss_nan", p.file, p.line, text)
        else:
            main = next((v for k, v in f.items() if k.lower() in ("lm loss", "lm_loss", "loss")), None)
            if main is not None:
                self._loss_jump(p, num(main), text)
        nan = f.get("number of nan iterations")
        if nan is not None:
            nan = nan.strip()
            if nan.isdigit():
                self.peak("nan_reported", int(nan))
        if p.elapsed_ms is not None:
            best = self.evidence.get("_max_elapsed")
            if best is None or p.elapsed_ms > best[0]:
                self.evidence["_max_elapsed"] = (p.elapsed_ms,)
                self.note("slowest_iteration", p.file, p.line, text, replace=True)
        self.note("last_iteration", p.file, p.line, text, replace=True)


    def _loss_jump(self, p: IterationPoint, loss: float | None, text: str):
        """The loss of one iteration line over the one before it in the same file, where it rose
        by at least LOSS_JUMP_NATS: the largest such ratio is the peak "loss_jump" (its line the
        evidence)."""
        if loss is None or not math.isfinite(loss):
            return
        before = self.last_loss.get(p.file)
        if before is None:
            if len(self.last_loss) >= MAX_GRAD_NORM_FILES:
                return
            self.first_loss[p.file] = (loss, p.line, text[:2000])
        self.last_loss[p.file] = loss
        self.loss_rise(before, loss, p.file, p.line, text)

    def loss_rise(self, before: float | None, loss: float, file: str, line: int, text: str):
        """A loss ``before`` followed by ``loss`` (at ``file:line``): a jump where it rose enough."""
        if before is not None and before > 0 and loss - before >= LOSS_JUMP_NATS:
            ratio = loss / before
            best = self.evidence.get("_loss_jump")
            if best is None or ratio > best[0]:
                self.evidence["_loss_jump"] = (ratio,)
                self.peaks["loss_jump"] = ratio
                self.note("loss_jump", file, line, text, replace=True)


def set_tail(s: Structure, file: str, data: bytes, last_line: int):
    """Keep the last MAX_TAIL non-blank lines of ``data`` (the end of ``file``, whose last line
    is ``last_line``) in ``s.tails``, prefix split off."""
    out: list = []
    end = len(data)
    line = last_line
    if data.endswith(b"\n"):
        end -= 1
    while end > 0 and len(out) < MAX_TAIL:
        start = data.rfind(b"\n", 0, end) + 1
        text = clean(data[start:end])
        if text.strip():
            out.append((line, split_prefix(text)[1].strip()[:2000]))
        if start == 0:
            break
        end, line = start - 1, line - 1
    s.tails[file] = out[::-1]


@dataclass
class NanRuns:
    """The NaN / Inf grad norms of one file's metrics lines, in runs (add_grad_norm). ``lead``,
    ``finite`` and ``lead_first`` let two parts of a file merge (merge_grad_norm_runs)."""

    cur: int = 0  # NaN values in a row now
    longest: int = 0  # the longest such run
    first: tuple | None = None  # (file, line, text) of the current (or last) run's first value
    lead: int = 0  # NaN values before the first finite one
    finite: bool = False  # a finite value was seen
    lead_first: tuple | None = None  # (file, line, text) of the first of those leading values


def merge_grad_norm_runs(a: NanRuns, b: NanRuns) -> NanRuns:
    """The runs of one file read in two parts, ``a`` then ``b``, as add_grad_norm counts them."""
    first = a.first
    if b.first is not None:  # b's last run began in b, unless it is b's leading run continuing a's
        first = a.first if (a.cur and b.first == b.lead_first) else b.first
    return NanRuns(cur=b.cur if b.finite else a.cur + b.cur,  # b NaN end to end: a's open run goes on
                   longest=max(a.longest, b.longest, a.cur + b.lead), first=first,
                   lead=a.lead if a.finite else a.lead + b.lead, finite=a.finite or b.finite,
                   lead_first=a.lead_first if (a.finite or a.lead_first is not None) else b.lead_first)


@dataclass
class ScaleRuns:
    """The fp16 loss scales one file's overflow lines set, in runs of cuts each lower than the
    one before (add_scale). ``lead``, ``lead_done`` and ``first`` let two parts of a file merge
    (merge_scale_runs)."""

    cur: int = 0  # cuts in a row now
    longest: int = 0  # the longest such run
    last: float | None = None  # the last scale set
    lead: int = 0  # the run the file starts with
    lead_done: bool = False  # whether that first run has ended
    first: float | None = None  # the first scale set


def scale_seen(s: Structure, scale: float, file: str, line: int, text: str, printed: bool = False) -> None:
    """A loss scale one line of ``file`` sets (an overflow line's cut) or, ``printed``, shows as a
    metric: the smallest one, and the file's runs of cuts (a printed scale repeated unchanged is
    no cut)."""
    if "loss_scale_min" not in s.peaks or scale < -s.peaks["loss_scale_min"]:
        s.peaks["loss_scale_min"] = -scale  # peaks keep the largest: the smallest scale, negated
        s.note("loss_scale_min", file, line, text, replace=True)
    runs = s.scale_runs.get(file)
    if runs is None and len(s.scale_runs) < MAX_GRAD_NORM_FILES:
        runs = s.scale_runs[file] = ScaleRuns()
    if runs is not None and not (printed and scale == runs.last):
        add_scale(runs, scale)


def add_scale(runs: ScaleRuns, scale: float) -> None:
    """One more loss scale set by an overflow line of a file."""
    goes_on = runs.last is not None and scale < runs.last
    runs.cur = runs.cur + 1 if goes_on else 1
    runs.longest = max(runs.longest, runs.cur)
    if not runs.lead_done:
        if runs.last is None or goes_on:
            runs.lead += 1
        else:
            runs.lead_done = True
    if runs.first is None:
        runs.first = scale
    runs.last = scale


def merge_scale_runs(a: ScaleRuns, b: ScaleRuns) -> ScaleRuns:
    """The loss-scale runs of one file read in two parts, ``a`` then ``b``, as add_scale counts them."""
    goes_on = a.last is not None and b.first is not None and b.first < a.last  # b's first cut continues a's run
    joined = a.cur + b.lead if goes_on else b.lead
    lead, lead_done = a.lead, a.lead_done
    if not lead_done:
        lead, lead_done = (lead + b.lead, b.lead_done) if goes_on else (lead, True)
    return ScaleRuns(cur=joined if not b.lead_done else b.cur, longest=max(a.longest, b.longest, joined),
                     last=b.last, lead=lead, lead_done=lead_done, first=a.first)


def add_timers(s: Structure, values: dict) -> None:
    """The latest (min, max) of each timer name; at most MAX_TIMER_NAMES names (a log that makes
    up a new name on every line does not grow the memory)."""
    tm = s.timers
    for k, v in values.items():
        if k in tm or len(tm) < MAX_TIMER_NAMES:
            tm[k] = v


def add_timer_record(s: Structure, file: str, line: int, vals: dict) -> None:
    """One timer block or line, kept whole (its first MAX_TIMER_NAMES names); the latest
    MAX_TIMER_RECORDS (trimmed in batches)."""
    if len(vals) > MAX_TIMER_NAMES:
        vals = dict(list(vals.items())[:MAX_TIMER_NAMES])
    s.timer_records.append((file, line, vals))
    if len(s.timer_records) > 2 * MAX_TIMER_RECORDS:
        del s.timer_records[:-MAX_TIMER_RECORDS]


def add_torchrun(s: Structure, c: TorchrunFailure) -> None:
    """One torchrun failure record, once (torchrun prints its summary on every node), bounded."""
    key = (c.section, c.rank, c.exitcode, c.time, c.file)
    if len(s.torchrun) < MAX_RECORDS and not any((t.section, t.rank, t.exitcode, t.time, t.file) == key
                                                 for t in s.torchrun):
        s.torchrun.append(c)


def add_config_block(s: Structure, block: tuple):
    """Keep the config block; of each kind only the last MAX_CONFIG_BLOCKS (runconfig.from_log_blocks
    reads the last one), so memory does not grow with the restarts."""
    s.config_blocks.append(block)
    same = [b for b in s.config_blocks if b[0] == block[0]]
    if len(same) > MAX_CONFIG_BLOCKS:
        s.config_blocks.remove(same[0])

