"""The structure of a training log: what a line-by-line grep cannot see.

Each parser is keyed by literal anchors (registered with the match engine next to the
signatures, so structure costs nothing on lines that have none) and reads either the one line
that hit (iteration and memory lines) or a block that starts there (timer blocks, tracebacks,
torchrun's ChildFailedError summary, the MLM ``arguments`` dump, Bridge's ``Final configuration:``
YAML and its non-default summary). Everything kept is bounded in size.
"""
from __future__ import annotations

import ast
import math
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .lines import clean, prefix_key, split_prefix, timestamp

MAX_SERIES = 50_000  # iteration points kept (then decimated by 2): ~1.2 KB each, so <= 60 MB
MAX_RECORDS = 200  # tracebacks, exceptions, memory reports kept
MAX_TIMER_RECORDS = 64  # the latest timer blocks / lines kept whole (analyze/symptoms.timer_shares)
MAX_TIMER_NAMES = 256  # distinct timer names kept (MLM's level-2 block has about 40), and per record
MAX_ACTIVITY = 64  # activity lines kept (the latest)

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
    "@traceback": ("Traceback (most recent call last):",),
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
                  "loading weights", "Loading model weights", "Converting checkpoint", "converting checkpoint"),
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

_ITER = re.compile(r"\biteration\s+(\d{1,18})\s*/\s*(\d{1,18})\s*\|")  # bounded: no log counts past 10**18
_FIELD = re.compile(r"\s*([A-Za-z][\w ()/\-.]*?):\s+([^|]*?)\s*(?=\||$)")
_MEM_HEAD = re.compile(r"\(after (\d{1,18}) iterations\) memory \((MB|GB)\)")
_MEM_FIELD = re.compile(r"\|\s*([\w\- ]+?):\s*([\d.eE+\-]+)")
_TIMER_LINE = re.compile(r"^\s{2,}([\w\-/ ]+?)\s*\.{2,}\s*:\s*(?:\(\s*([\d.]+),\s*([\d.]+)\)|([\d.]+))\s*$")
_EXC_LINE = re.compile(
    r"^(?:\s*)((?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning|Failure)"
    r"(?:\((?:[A-Za-z_][\w]*\.)*[A-Z]\w*\))?)(?::\s?(.*))?$"  # Ray: RayTaskError(OutOfMemoryError)
)
# the line that ends a traceback may name any class: one without an Error-like suffix counts
# there when it is dotted (triton.runtime.errors.OutOfResources, queue.Empty) or a builtin one
_TB_EXC_LINE = re.compile(
    r"^((?:[a-z_][\w]*\.)+[A-Z][a-z]\w*|StopIteration|StopAsyncIteration)(?::\s?(.*))?$")
_LOADED_AT = re.compile(r"(?:at|from) iteration\s+(\d{1,18})\b")
_TORCHRUN_FIELD = re.compile(r"^\s+(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_ARGS_LINE = re.compile(r"^\s+(\S+) \.{3,} (.*)$")
_SUMMARY_SECTION = re.compile(r"^\[(\w+)\](?: Non-default values.*:|:)\s*$")
_SUMMARY_FIELD = re.compile(r"^\s{2}(\w+): (.*?)(?:\s{2}\(Mcore default: .*\))?\s*$")
_YAML_LINE = re.compile(r"^(\s*)(?:- |[\w.\-]+:(?:\s|$)|-$)")
_STEP_TIME = re.compile(r"Step Time : ([\d.]+)s")
# the time per step in other frameworks' progress lines: (kind, regex with a "v" group and
# optionally "n" (the step) and "of" (the steps in all), seconds per step = v or 1 / v)
_NUM = r"(?P<v>\d{1,9}(?:\.\d{1,9})?)"
PACE = (
    # tqdm: " 75/6249 [08:38<11:33:05,  6.74s/it]" or "..., 3.21it/s]" (a bar's own total keys it)
    ("tqdm", re.compile(r"\b(?P<n>\d{1,12})/(?P<of>\d{1,12}) \[[\d:]{1,12}<[\d:?]{1,12}, {0,3}" + _NUM
                        + r"(?P<unit>s/it|it/s)[\],]"), None),
    ("verl", re.compile(r"\bstep:(?P<n>\d{1,12})\b.{0,4000}?timing_s/step:" + _NUM), "s"),
    ("nemo", re.compile(r"train_step_timing(?: in s)?=" + _NUM), "s"),
    ("mmengine", re.compile(r"\[(?P<n>\d{1,12})/(?P<of>\d{1,12})\].{0,400}?\btime: " + _NUM + r"\s+data_time: "), "s"),
    ("nemo-rl", re.compile(r"Total step time: " + _NUM + r"\s?s\b"), "s"),
    ("swift", re.compile(r"'train_speed\(iter/s\)': " + _NUM), "it/s"),
)
_TIMER_FIELD = re.compile(r"\|\s*([A-Za-z][\w\-/ ]{0,60}?)\s*:\s*([\d.]+)")
_NEW_SCALE = re.compile(r"(?:loss scale to:?|reducing to:?)\s*([\d.]+(?:[eE][+-]?\d+)?)")
_DS_SKIPPED = re.compile(r"\bstep=(\d{1,12}), skipped=(\d{1,12})\b")
# "loss_scale" and its value (not min_loss_scale, loss_scale_window, a config's 0 = dynamic)
_LOSS_SCALE = re.compile(r"(?<![\w.])loss_scale['\"]?\s{0,3}[:=]?\s{0,3}['\"]?"
                         r"(\d{1,30}(?:\.\d{0,30})?(?:[eE][-+]?\d{1,4})?)(?![\w.])")


_INT = re.compile(r"[+-]?\d+")


def _num(s: str):
    s = s.strip()
    try:
        if _INT.fullmatch(s):
            return int(s)
        return float(s)
    except ValueError:
        low = s.lower()
        if low in ("nan", "-nan", "+nan"):
            return float("nan")
        if low in ("inf", "+inf", "infinity"):
            return float("inf")
        if low in ("-inf", "-infinity"):
            return float("-inf")
        return None


def literal(s: str):
    """Best-effort value of a printed config value: True/False/None/numbers/lists, else the string."""
    s = s.strip()
    if s in ("True", "true"):
        return True
    if s in ("False", "false"):
        return False
    if s in ("None", "null", "~"):
        return None
    if _INT.fullmatch(s):
        return int(s)
    if _FLOAT.fullmatch(s):
        return float(s)
    if not s or s[0] not in "[({'\"" or len(s) > 10_000:
        return s  # a plain word (ast.literal_eval leaves a reference cycle per call: no need here)
    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return s


_INT = re.compile(r"-?\d{1,18}")
_FLOAT = re.compile(r"-?(?:\d{1,300}\.\d{0,300}|\.\d{1,300})(?:[eE][-+]?\d{1,3})?|-?\d{1,300}[eE][-+]?\d{1,3}")


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
        if _is_bad(f.get("grad norm", "")):
            self.count("grad_norm_nan")
            self.note("grad_norm_nan", p.file, p.line, text)
        if not losses:
            self.count("loss_missing")
            self.note("loss_missing", p.file, p.line, text)
        elif any(_is_bad(v) for v in losses):
            self.count("loss_nan")
            self.note("loss_nan", p.file, p.line, text)
        else:
            main = next((v for k, v in f.items() if k.lower() in ("lm loss", "lm_loss", "loss")), None)
            if main is not None:
                self._loss_jump(p, _num(main), text)
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


LOSS_JUMP_NATS = 2.0  # a rise smaller than this between two iteration lines is never a jump
MAX_TAIL = 6  # lines of each file's end kept in Structure.tails


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


def _is_bad(v: str) -> bool:
    """A printed value that is NaN or infinite (nan, -nan, NAN, inf, -INF, +inf...)."""
    return str(v).strip().lower().lstrip("+-") in ("nan", "inf")


# --------------------------------------------------------------------------- single-line parsers

@dataclass(frozen=True)
class _Fields:
    """How one kind of line spells its ``| key: value`` fields (iteration or memory lines)."""

    regex: re.Pattern  # the field regex: what the split below must give, on any input
    key: re.Pattern  # a well-formed field name
    value_ok: Callable[[str], bool]  # a well-formed value (the text after the colon)
    skip: int  # parts before the first field (memory fields follow a "|")
    names: dict = field(default_factory=dict)  # raw name -> the interned name, or None (not a name)


_ITER_FIELDS = _Fields(_FIELD, re.compile(r"[A-Za-z][\w ()/\-.]*"), lambda v: v[:1] in (" ", "\t"), 0)
_NUMERIC = frozenset("0123456789.eE+-")
_MEM_FIELDS = _Fields(_MEM_FIELD, re.compile(r"[\w\- ]+"),
                      lambda v: bool(v.strip()) and _NUMERIC.issuperset(v.strip()), 1)


def _split_fields(rest: str, spec: _Fields) -> list:
    """(name, value) pairs of the ``key: value`` fields between ``|`` separators, as ``spec.regex``
    finds them. The common case, a well-formed field per part, costs one split and one partition
    per field; a part that is not one goes to the regex, so the result is the regex's on every
    input (tests/test_structure.py)."""
    out = []
    names = spec.names
    for part in rest.split("|")[spec.skip:]:
        k, sep, v = part.partition(":")
        if not sep:
            continue
        name = names.get(k, names)
        if name is names:  # the same few names on every line: checked and interned once
            name = names[k] = sys.intern(k.strip()) if spec.key.fullmatch(k.lstrip()) and len(names) < 4096 else None
        if name is not None and spec.value_ok(v):
            out.append((name, v.strip()))
        else:
            out.extend((fm.group(1).strip(), fm.group(2).strip()) for fm in spec.regex.finditer("|" + part))
    return out


def parse_iteration(text: str, file: str, line: int, want_time: bool = True) -> IterationPoint | None:
    """An iteration line (MLM and Bridge formats). ``want_time=False`` skips the timestamp, which
    only dates glog lines (Structure.year): the first dated iteration line is enough."""
    m = _ITER.search(text)
    if not m:
        return None
    fields = dict(_split_fields(text[m.end():], _ITER_FIELDS))
    elapsed = _num(fields.get("elapsed time per iteration (ms)", "")) if fields else None
    return IterationPoint(int(m.group(1)), int(m.group(2)), elapsed, fields, file, line,
                          timestamp(text) if want_time else None)


def iteration_year(p: IterationPoint | None) -> int | None:
    """The year an iteration line is dated in (it dates the glog lines after it), if any."""
    return time.gmtime(p.time).tm_year if p is not None and p.time is not None else None


def parse_memory(text: str) -> dict | None:
    m = _MEM_HEAD.search(text)
    if not m:
        return None
    scale = 2**20 / 1e9 if m.group(2) == "MB" else 1.0  # MLM MB are MiB; Bridge GB are 1e9 bytes
    vals = {}
    for key, raw in _split_fields(text[m.end():], _MEM_FIELDS):
        v = _num(raw)
        if v is None:
            continue
        vals[key] = v if ("count" in key or "retires" in key or "retries" in key) else v * scale
    # one vocabulary for both formats (GB = 1e9 bytes)
    norm = {
        "allocated": vals.get("allocated", vals.get("mem-allocated-gigabytes")),
        "max_allocated": vals.get("max allocated", vals.get("mem-max-allocated-gigabytes")),
        "reserved": vals.get("reserved", vals.get("mem-reserved-gigabytes")),
        "max_reserved": vals.get("max reserved", vals.get("mem-max-reserved-gigabytes")),
        "alloc_retries": vals.get("mem-alloc-retires"),
    }
    return {"iteration": int(m.group(1)), "unit": m.group(2), "values": norm, "raw": vals}


# --------------------------------------------------------------------------- block readers

MAX_CONFIG_BLOCKS = 4  # per kind: a job restarted 4,000 times printed its config 4,000 times


def add_config_block(s: Structure, block: tuple):
    """Keep the config block; of each kind only the last MAX_CONFIG_BLOCKS (runconfig.from_log_blocks
    reads the last one), so memory does not grow with the restarts."""
    s.config_blocks.append(block)
    same = [b for b in s.config_blocks if b[0] == block[0]]
    if len(same) > MAX_CONFIG_BLOCKS:
        s.config_blocks.remove(same[0])


class Block:
    """Reads lines after a start anchor until it is done (``feed`` returns False)."""

    max_lines = 2000

    @staticmethod
    def wanted(structure: Structure, file: str, line: int, first: str) -> bool:
        """Does a hit of the start anchor on this line start a block? (default: always)"""
        return True

    def __init__(self, structure: Structure, file: str, line: int, first: str):
        self.s, self.file, self.start_line = structure, file, line
        self.n = 0
        self.start(first)

    def start(self, first: str):
        pass

    def feed(self, raw: bytes, line: int) -> bool:
        return self.feed_text(clean(raw), line)

    def feed_text(self, text: str, line: int) -> bool:
        """The next line, decoded (``feed`` decodes it); False when the block is done."""
        self.n += 1
        if self.n > self.max_lines:
            self.finish()
            return False
        if not self.line(text, line):
            self.finish()
            return False
        return True

    def line(self, text: str, line: int) -> bool:
        return False

    def finish(self):
        pass


class TimerBlock(Block):
    max_lines = 200

    def start(self, first):
        self.values = {}

    def line(self, text, line):
        _, msg = split_prefix(text)
        m = _TIMER_LINE.match(msg)
        if not m:
            return False
        name = m.group(1).strip()
        if m.group(4) is not None:
            self.values[name] = (float(m.group(4)), float(m.group(4)))
        else:
            self.values[name] = (float(m.group(2)), float(m.group(3)))
        return True

    def finish(self):
        if self.values:
            self.s.note("timers", self.file, self.start_line, "timers: " + ", ".join(
                f"{k} {v[1]:.1f} ms" for k, v in list(self.values.items())[:6]), replace=True)
            self.s.timer_blocks += 1
            add_timers(self.s, self.values)
            add_timer_record(self.s, self.file, self.start_line, {k: v[1] for k, v in self.values.items()})


class TracebackBlock(Block):
    """One rank's traceback, followed through other ranks' interleaved lines by its prefix.

    Keeps the frames and their source lines (bounded: the outermost few and the innermost many)
    so that a traceback whose exception line the log lost (a cut paste, a killed process) still
    says where it failed (analyze/layers.py reads them)."""

    max_lines = 600
    MAX_FRAMES = 48
    # other prefixes' lines passed before the traceback is taken as ended: 512 ranks crashing at
    # once interleave their tracebacks line by line, so one rank's 60 lines can span 30,000 (the
    # scan passes over them in bulk: scan._LineTable)
    MAX_OTHERS = 50_000

    def other_lines(self, count: int) -> bool:
        """``count`` lines of other prefixes passed (what ``line`` says of each; the scan's fast
        path counts them without reading them): False when the block is done."""
        if count <= 0:
            return True
        self.others += count  # max_lines bounds the block's own lines
        if self.others >= self.MAX_OTHERS:
            self.finish()
            return False
        return True

    def start(self, first):
        self.key = prefix_key(first)
        self.rank, msg = split_prefix(first)
        self.frames: list = []
        self.source: list = []
        self.others = 0
        self.last = self.start_line
        self.done = False
        self.s.tb_until[(self.file, self.key)] = self.start_line
        if msg.strip().startswith("File "):  # headless: the paste starts at a frame
            self._keep(msg.strip(), "")

    def _keep(self, frame: str, src: str):
        self.frames.append(frame)
        self.source.append(src)
        if len(self.frames) > self.MAX_FRAMES:  # drop from the middle: outermost 8, innermost 40
            del self.frames[8], self.source[8]

    def line(self, text, line):
        if prefix_key(text) != self.key:
            self.others += 1
            return self.others < self.MAX_OTHERS
        _, msg = split_prefix(text)
        stripped = msg.strip()
        self.s.tb_until[(self.file, self.key)] = line
        indent = len(msg) - len(msg.lstrip())
        exc = (_EXC_LINE.match(stripped) or _TB_EXC_LINE.match(stripped)) if stripped and indent <= 1 else None
        if exc:  # a paste may indent it by one
            indent = 0
        if not stripped or stripped.startswith(("File ", "^", "~")) or indent:
            if stripped.startswith("File "):
                self._keep(stripped, "")
                self.last = line
            elif stripped and self.frames and not self.source[-1] and not stripped.startswith(("^", "~")):
                self.source[-1] = stripped
            return True
        m = exc
        if m:
            self.done = True
            self.s.traceback_count += 1
            if len(self.s.tracebacks) < MAX_RECORDS:
                self.s.tracebacks.append(Traceback(self.file, line, self.rank, m.group(1), (m.group(2) or "").strip(),
                                                   msg, list(self.frames), list(self.source), self._headless(),
                                                   self.start_line))
            return False
        return bool(stripped.startswith(("During handling", "The above exception")))

    def finish(self):
        # the traceback ended without an exception line: the log was cut, or the process died
        if self.done or not self.frames:
            return
        self.done = True
        self.s.traceback_count += 1
        if len(self.s.tracebacks) < MAX_RECORDS:
            self.s.tracebacks.append(Traceback(self.file, self.last, self.rank, None, "", self.frames[-1],
                                               list(self.frames), list(self.source), self._headless(),
                                               self.start_line))

    def _headless(self) -> tuple | None:
        return None


class FrameBlock(TracebackBlock):
    """A traceback whose header the paste lost: it starts at a frame line that no traceback
    reader has taken."""

    def _headless(self) -> tuple | None:
        return (self.key, self.start_line)

    @staticmethod
    def wanted(structure, file, line, first):
        _, msg = split_prefix(first)
        if not msg.lstrip().startswith('File "'):
            return False
        return structure.tb_until.get((file, prefix_key(first)), 0) < line


class TorchrunBlock(Block):
    """torchrun's ChildFailedError summary: Failures and Root Cause (first observed failure)."""

    max_lines = 3000

    def start(self, first):
        self.section = "root" if "Root Cause" in first else None
        self.cur: TorchrunFailure | None = None
        self.in_tb = False
        self.rules = 0

    def _close(self):
        if self.cur is not None:
            add_torchrun(self.s, self.cur)
        self.cur = None

    def line(self, text, line):
        _, msg = split_prefix(text)
        st = msg.strip()
        if st.startswith("====="):
            self.rules += 1
            return not self.rules >= 2
        if st.startswith("Failures:"):
            self.section, self.in_tb = "failure", False
            return True
        if st.startswith("Root Cause (first observed failure)"):
            self._close()
            self.section, self.in_tb = "root", False
            return True
        if st.startswith("-----"):
            self._close()
            self.in_tb = False
            return True
        if re.fullmatch(r"\[\d+\]:", st):
            self._close()
            if self.section:
                self.cur = TorchrunFailure(self.section, file=self.file, line=line)
            self.in_tb = False
            return True
        m = _TORCHRUN_FIELD.match(msg)
        if m and self.cur is not None and not (self.in_tb and msg.startswith("    ")):
            k, v = m.group(1), m.group(2).strip()
            if k == "rank":
                rm = re.match(r"(\d{1,9})(?: \(local_rank: (\d{1,9})\))?", v)
                if rm:
                    self.cur.rank = int(rm.group(1))
                    self.cur.local_rank = int(rm.group(2)) if rm.group(2) else None
            elif k == "exitcode":
                em = re.match(r"(-?\d+)", v)
                self.cur.exitcode = int(em.group(1)) if em else None
            elif k == "traceback":
                self.cur.traceback = v
                self.in_tb = True
            else:
                setattr(self.cur, k, v)
            return True
        if self.in_tb and self.cur is not None:
            if len(self.cur.traceback) < 20000:
                self.cur.traceback += "\n" + msg
            return True
        return self.section is not None or self.n < 40  # before "Failures:" the header lines

    def finish(self):
        self._close()


class ArgsBlock(Block):
    """Megatron-LM's ``arguments`` dump."""

    max_lines = 3000

    def start(self, first):
        self.args = {}

    def line(self, text, line):
        _, msg = split_prefix(text)
        if "end of arguments" in msg:
            return False
        m = _ARGS_LINE.match(msg)
        if m:
            self.args[m.group(1)] = literal(m.group(2))
            return True
        return not msg.strip() or self.n < 3

    def finish(self):
        if self.args:
            add_config_block(self.s, ("mlm_args", self.file, self.start_line, self.args))


class BridgeYamlBlock(Block):
    """Bridge's ``Final configuration:`` followed by the ConfigContainer YAML (pre-validation)."""

    max_lines = 5000

    def start(self, first):
        self.lines = []
        self.key = None

    def line(self, text, line):
        _, msg = split_prefix(text)
        if self.key is None:
            if not msg.strip():
                return self.n < 3
            self.key = prefix_key(text)
        if _YAML_LINE.match(msg) or (msg.startswith("  ") and self.lines):
            self.lines.append(msg)
            return True
        return False

    def finish(self):
        import yaml

        if not self.lines:
            return
        from ..yamlsafe import check_expansion

        try:
            doc = yaml.safe_load("\n".join(self.lines))
            check_expansion(doc, f"{self.file}:{self.start_line}")  # an alias bomb inside a log, too
        except (yaml.YAMLError, RecursionError, ValueError):
            self.s.note("config_block_refused", self.file, self.start_line,
                        "a 'Final configuration:' block that is not a config (invalid YAML or an alias bomb)")
            return
        if isinstance(doc, dict):
            add_config_block(self.s, ("bridge_yaml", self.file, self.start_line, doc))


class BridgeSummaryBlock(Block):
    """Bridge's post-validation ``Configuration Summary (Non-Default Values vs Megatron Core)``."""

    max_lines = 3000

    def start(self, first):
        self.doc: dict = {}
        self.section = None
        self.rules = 0

    def line(self, text, line):
        _, msg = split_prefix(text)
        st = msg.strip()
        if st.startswith("=" * 10):
            self.rules += 1
            return self.rules < 2
        if not st or st.startswith(("-" * 10, "Other Configuration Values")):
            return True
        m = _SUMMARY_SECTION.match(st)
        if m:
            self.section = m.group(1)
            self.doc.setdefault(self.section, {})
            return True
        m = _SUMMARY_FIELD.match(msg)
        if m and self.section:
            self.doc[self.section][m.group(1)] = literal(m.group(2))
            return True
        return False

    def finish(self):
        if self.doc:
            add_config_block(self.s, ("bridge_summary", self.file, self.start_line, self.doc))


BLOCKS = {
    "@timers": TimerBlock,
    "@traceback": TracebackBlock,
    "@frame": FrameBlock,
    "@torchrun": TorchrunBlock,
    "@mlm_args": ArgsBlock,
    "@bridge_yaml": BridgeYamlBlock,
    "@bridge_summary": BridgeSummaryBlock,
}


CONFIG_KEYS = ("@mlm_args", "@bridge_yaml", "@bridge_summary")


def config_blocks_of_text(text: str, name: str) -> list:
    """The config blocks a log's text holds (Megatron-LM's arguments dump, Bridge's "Final
    configuration:" YAML and its configuration summary), read line by line as the scan reads
    them, without the signature scan: what ``--config LOG`` needs (config/load.py)."""
    s = Structure()
    open_blocks: list = []
    for no, raw in enumerate(text.encode("utf-8", "surrogateescape").split(b"\n"), start=1):
        line = clean(raw)  # as the scan decodes a line (a progress bar's CR, ANSI codes, NULs)
        open_blocks = [b for b in open_blocks if b.feed_text(line, no)]
        for key in CONFIG_KEYS:
            block = BLOCKS[key]
            if any(a in line for a in ANCHORS[key]) and block.wanted(s, name, no, line):
                open_blocks.append(block(s, name, no, line))
    for b in open_blocks:
        b.finish()
    return s.config_blocks


def on_line(s: Structure, key: str, text: str, file: str, line: int):
    """Single-line structure: iteration, memory, exception, step time lines."""
    if key == "@iteration":
        p = parse_iteration(text, file, line, want_time=s.year is None)
        if p:
            if s.year is None:
                s.year = iteration_year(p)
            s.add_iteration(p, text)
    elif key == "@memory":
        m = parse_memory(text)
        if m:
            v = m["values"]
            s.count("memory")
            mem = v.get("max_allocated") or v.get("allocated")
            s.peak("mem_max_gb", mem)
            if v.get("alloc_retries") is not None:
                s.count("memory_retries_reports")
                s.peak("alloc_retries", v["alloc_retries"])
                if v["alloc_retries"]:
                    s.note("memory_retries", file, line, text)  # the first report with retries
            if len(s.memory) < 4 * MAX_RECORDS:
                rank, _ = split_prefix(text)
                m.update(file=file, line=line, rank=rank)
                s.memory.append(m)
                s.note("memory", file, line, text)
    elif key == "@exception":
        rank, msg = split_prefix(text)
        em = _EXC_LINE.match(msg.strip())
        if em and not em.group(1).endswith("Warning") and len(s.exceptions) < MAX_RECORDS:
            s.exceptions.append((file, line, rank, em.group(1), (em.group(2) or "").strip(), text))
    elif key == "@timer_line":
        vals = {k.strip(): float(v) for k, v in _TIMER_FIELD.findall(text.split("time (ms)", 1)[1])}
        if vals:
            s.timer_blocks += 1
            add_timers(s, {k: (v, v) for k, v in vals.items()})
            add_timer_record(s, file, line, vals)
            s.note("timers", file, line, text, replace=True)
    elif key == "@cpu_optimizer":
        s.count("cpu_optimizer")
    elif key == "@activity":
        s.activity.append((file, line, text[:300]))
        if len(s.activity) > 2 * MAX_ACTIVITY:
            del s.activity[:-MAX_ACTIVITY]
    elif key == "@resume" and len(s.resume) < 16:
        kind = ("fresh" if "will start from random" in text else "start" if "Starting training loop" in text
                else "saved" if "successfully saved" in text else "loaded")
        at = _LOADED_AT.search(text)
        if kind != "saved" or not any(k == "saved" for _, _, k, _ in s.resume):
            s.resume.append((file, line, kind, int(at.group(1)) if at else None))
    elif key == "@overflow":
        s.count("overflow_steps")
        sm = _NEW_SCALE.search(text)
        if sm:
            scale = _num(sm.group(1))
            if scale is not None:
                _lowest_scale(s, scale, file, line, text)
            if scale is not None:  # consecutive cuts, each lower than the last: the scale collapsing
                runs = s.scale_runs.get(file)
                if runs is None and len(s.scale_runs) < MAX_GRAD_NORM_FILES:
                    runs = s.scale_runs[file] = ScaleRuns()
                if runs is not None:
                    add_scale(runs, scale)
    elif key == "@loss_scale":
        lm = _LOSS_SCALE.search(text[:20000])
        scale = _num(lm.group(1)) if lm else None
        if scale == 0 and lm and "." in lm.group(1):
            scale = 0.0005 * 10 ** -(len(lm.group(1).split(".")[1]) - 3)  # "0.000": below what it prints
        if scale:  # a bare 0 is a config's "dynamic", not a scale
            _lowest_scale(s, scale, file, line, text)
            runs = s.scale_runs.get(file)
            if runs is None and len(s.scale_runs) < MAX_GRAD_NORM_FILES:
                runs = s.scale_runs[file] = ScaleRuns()
            if runs is not None and scale != runs.last:  # a scale printed again unchanged is no cut
                add_scale(runs, scale)
    elif key == "@ds_skipped":
        dm = _DS_SKIPPED.search(text[:20000])
        if dm and int(dm.group(1)) >= s.peaks.get("ds_steps", -1):  # the latest report counts all
            s.peaks["ds_steps"], s.peaks["ds_skipped"] = int(dm.group(1)), int(dm.group(2))
            s.note("ds_skipped", file, line, text, replace=True)
    elif key == "@step_time":
        tm = _STEP_TIME.search(text)
        if tm and len(s.step_times) < MAX_SERIES:
            s.step_times.append(float(tm.group(1)) * 1000.0)
    elif key == "@pace":
        add_pace(s, text, file, line)
    elif key == "@grad_norm":
        add_grad_norm(s, text, file, line)
    elif key == "@versions" and _VERSION.search(text):
        s.note("version:megatron-bridge", file, line, text[:300], replace=True)  # the latest printed


# "megatron-bridge 0.5.0" (pip list), "megatron-bridge==0.6.0rc0", "megatron_bridge-0.5.0.dist-info",
# "megatron-bridge: 0.6.0", "Megatron-Bridge version 0.5.1"
_VERSION = re.compile(r"(?i)\bmegatron[-_]bridge(?:\s{0,40}(?:==|=|:|version:?)?\s{0,40}|-)v?"
                      r"(\d{1,4}\.\d{1,4}(?:\.\d{1,4})?(?:(?:rc|a|b|\.dev|\.post)\d{1,6})?)\b")


def version_of(structure, package: str = "megatron-bridge") -> tuple[str, str, int] | None:
    """(version, file, line) of ``package`` where the log printed it, or None."""
    ev = getattr(structure, "evidence", {}).get(f"version:{package}")
    if not ev:
        return None
    m = _VERSION.search(ev[2])
    return (m.group(1), ev[0], ev[1]) if m else None


_GRAD_NORM = re.compile(r"grad_norm['\"]?\s{0,3}[:=]\s{0,3}['\"]?(?P<v>[-+]?(?:nan|inf)\b|[-+]?\d{1,30}(?:\.\d{0,30})?"
                        r"(?:[eE][-+]?\d{1,4})?)", re.I)
MAX_GRAD_NORM_FILES = 4096  # files whose grad-norm runs (and loss-scale runs) are kept


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


def add_grad_norm(s: Structure, text: str, file: str, line: int) -> None:
    """Another framework's grad norm (``@grad_norm``) into the file's NanRuns."""
    m = _GRAD_NORM.search(text[:20000])
    if not m:
        return
    runs = s.grad_norm_runs.get(file)
    if runs is None:
        if len(s.grad_norm_runs) >= MAX_GRAD_NORM_FILES:
            return
        runs = s.grad_norm_runs[file] = NanRuns()
    if _is_bad(m.group("v")):
        if runs.cur == 0:
            runs.first = (file, line, text[:2000])
        runs.cur += 1
        runs.longest = max(runs.longest, runs.cur)
        if not runs.finite:
            runs.lead += 1
            if runs.lead_first is None:
                runs.lead_first = runs.first
    else:
        runs.cur = 0
        runs.finite = True


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


def _lowest_scale(s: Structure, scale: float, file: str, line: int, text: str) -> None:
    if "loss_scale_min" not in s.peaks or scale < -s.peaks["loss_scale_min"]:
        s.peaks["loss_scale_min"] = -scale  # peaks keep the largest: the smallest scale, negated
        s.note("loss_scale_min", file, line, text, replace=True)


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


MAX_PACE_SERIES = 16  # distinct (kind, total) series kept: a log of many progress bars stays bounded


def add_pace(s: Structure, text: str, file: str, line: int) -> None:
    """A step time from another framework's progress line (PACE), into its series."""
    for kind, rx, unit in PACE:
        m = rx.search(text[:20000])
        if not m:
            continue
        v = float(m.group("v"))
        unit = unit or m.group("unit")
        if v <= 0:
            return
        ms = 1000.0 * (1.0 / v if unit == "it/s" else v)
        gd = m.groupdict()
        key = (kind, int(gd["of"]) if gd.get("of") else 0)
        series = s.paced.get(key)
        if series is None:
            if len(s.paced) >= MAX_PACE_SERIES:
                return
            series = s.paced[key] = []
        n = int(gd["n"]) if gd.get("n") else (series[-1].iteration + 1 if series else 1)
        if series and series[-1].iteration == n:  # a bar redrawn at the same step
            return
        series.append(IterationPoint(n, key[1], ms, {"_line": text[:2000]}, file, line, None))
        if len(series) > MAX_SERIES:
            del series[::2]
        return


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
