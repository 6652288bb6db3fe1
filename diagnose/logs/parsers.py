"""Single-line parsers: what one line that hit an anchor says (logs/anchors.py).

Iteration and memory lines (Megatron-LM and Bridge formats), exceptions, one-line timer
breakdowns, checkpoint resume lines, fp16 overflow and loss-scale lines, DeepSpeed's skipped
steps, other frameworks' step times (PACE) and grad norms, package versions. ``on_line`` is the
dispatcher the scan calls for each hit; everything goes into the Structure (logs/records.py).
"""
from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .lines import split_prefix, timestamp
from .records import (
    MAX_ACTIVITY,
    MAX_GRAD_NORM_FILES,
    MAX_PACE_SERIES,
    MAX_RECORDS,
    MAX_SERIES,
    IterationPoint,
    NanRuns,
    Structure,
    add_timer_record,
    add_timers,
    scale_seen,
)
from .values import is_bad, num

_ITER = re.compile(r"\biteration\s+(\d{1,18})\s*/\s*(\d{1,18})\s*\|")  # bounded: no log counts past 10**18
_FIELD = re.compile(r"\s*([A-Za-z][\w ()/\-.]*?):\s+([^|]*?)\s*(?=\||$)")
_MEM_HEAD = re.compile(r"\(after (\d{1,18}) iterations\) memory \((MB|GB)\)")
_MEM_FIELD = re.compile(r"\|\s*([\w\- ]+?):\s*([\d.eE+\-]+)")
_EXC_LINE = re.compile(
    r"^(?:\s*)((?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning|Failure)"
    r"(?:\((?:[A-Za-z_][\w]*\.)*[A-Z]\w*\))?)(?::\s?(.*))?$"  # Ray: RayTaskError(OutOfMemoryError)
)
_LOADED_AT = re.compile(r"(?:at|from) iteration\s+(\d{1,18})\b")
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
    input (tests/logs/test_structure.py)."""
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
    elapsed = num(fields.get("elapsed time per iteration (ms)", "")) if fields else None
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
        v = num(raw)
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
        scale = num(sm.group(1)) if sm else None
        if scale is not None:  # consecutive cuts, each lower than the last: the scale collapsing
            scale_seen(s, scale, file, line, text)
    elif key == "@loss_scale":
        lm = _LOSS_SCALE.search(text[:20000])
        scale = num(lm.group(1)) if lm else None
        if scale == 0 and lm and "." in lm.group(1):
            scale = 0.0005 * 10 ** -(len(lm.group(1).split(".")[1]) - 3)  # "0.000": below what it prints
        if scale:  # a bare 0 is a config's "dynamic", not a scale
            scale_seen(s, scale, file, line, text, printed=True)
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
    if is_bad(m.group("v")):
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

