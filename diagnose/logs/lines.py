"""One line's framing: ANSI colour codes, launcher rank prefixes, timestamps.

Only lines that matter (anchor hits, structure blocks) go through here, never every line.
"""
from __future__ import annotations

import calendar
import datetime as _dt
import re
from functools import lru_cache

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

# Launcher prefixes, outermost first. Each strips one layer and may name a rank.
_PREFIXES = [
    # a log viewer's table copied row by row (Grafana / Loki, Kibana): empty cells, then the
    # time cell: "  |   | 2026-03-11 16:42:19.492 | [rank1]: ..."
    (re.compile(r"^\s*(?:\|\s*)*\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s*\|\s?"), "time"),
    # a timestamp (and host) a log shipper or `ts` put in front: "2026-01-09 17:40:31.169 master-0 >> "
    (
        re.compile(r"^\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?\s+(?:[\w.\-]+ >> )?"),
        "time",
    ),
    # a colour code whose ESC byte a paste lost: "[36m(WorkerDict pid=1) ..."
    (re.compile(r"^\[\d{1,3}(?:;\d{1,3})*m"), "time"),
    # a clock alone: "21:39:56.349 "
    (re.compile(r"^\d\d:\d\d:\d\d\.\d{3} (?=\()"), "time"),
    # glog's level, date, time and thread id (torch c10d, NCCL): "[W1130 10:58:34.718000123 4242 " /
    # "E1130 10:58:34.718000 4242 ": they change on every line; the source location after them
    # ("ProcessGroupNCCL.cpp:1234] ...") stays, it is part of what the line says
    (re.compile(r"^\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{1,9}(?: +\d+)? +(?=\S+:\d+\] )"), "time"),
    # srun -l / NeMo-Run multi-node:   " 2: [rank2]: ..." or "15: ..."
    (re.compile(r"^\s{0,3}(\d{1,5}): "), "task"),
    # NeMo-Run / torchx:                "i.pretrain/0 [default2]:"
    (re.compile(r"^[\w.\-]+/\d+ (?=\[default\d+\]:)"), None),
    # torchrun --tee / --log-dir:       "[default0]:"
    (re.compile(r"^\[default(\d{1,9})\]: ?"), "local"),
    # torch >= 2.3 per-rank prefix:     "[rank3]:"
    (re.compile(r"^\[rank(\d{1,9})\]: ?"), "rank"),
    # Ray workers:                      "(RayWorker pid=1234) ", and actors named by their repr:
    # "(ActorWorker(actor_train-1) pid=18175, ip=10.0.0.2) ", "(MegatronPolicyWorker[rank=0] pid=7) "
    (re.compile(r"^\((?:[\w.\-]+(?:\([\w.\-=, ]{0,80}\)|\[[\w.\-=, ]{0,80}\])? )?pid=\d+(?:, ip=[\d.]+)?\)(?:\[0m)? "),
     None),
    # vLLM's logger, which repeats its header on every line of a message (a logged traceback):
    # "ERROR 04-07 00:57:46 ray_utils.py:45] " / "INFO 01-10 12:00:00 [engine.py:123] "
    (re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})? "
                r"(?:\[[\w.\-]+:\d+\]|[\w.\-]+:\d+\]) "), "time"),
    # a worker label that names the rank: "(worker1, rank=1, pid=4242, ip=10.0.0.2) "; a rank
    # prefix inside it ("[rank13]:") is read after it and wins (the innermost, explicit rank)
    (re.compile(r"^\([\w.\-]+, rank=(\d{1,9})(?:, [\w.\-]+=[\w.\-]+)*\) "), "rank"),
]
# Ranks named inside the message (NCCL watchdog "[Rank 2]", MLM/Bridge "[Rank 0] (after ...",
# NaN asserts "Rank 3:", the rerun state machine "Rank 3, node ...").
# (digits bounded everywhere: a number no log holds is no rank, and Python refuses >4,300 digits)
_RANK_IN_TEXT = re.compile(r"\[Rank (\d{1,9})\]|\bRank (\d{1,9})[:,]|\brank[:=] ?(\d{1,9})\b")

_TS = [
    # "[2026-08-22 15:22:22]" / " [2026-08-22 15:22:22.123456]" / "2026-08-22 15:22:22,123"
    (re.compile(r"(\d{4}-\d\d-\d\d)[ T_](\d\d:\d\d:\d\d)(?:[.,](\d{1,9}))?"), "iso"),
    # glog: "E1130 10:58:34.718000" / "[E810 03:04:11.061727749"
    (re.compile(r"\b[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?"), "glog"),
]


# a line that starts a C++ (glog-style) log record: "[E ProcessGroupNCCL.cpp:456] ", or
# "[E1130 10:58:34.718000 4242 ProcessGroupNCCL.cpp:1234] " once its date is taken off (_PREFIXES)
_CPP_RECORD = re.compile(r"^(?:\[?[IWEF] )?\w+\.(?:cpp|cc|h|hpp):\d+\] ")


def starts_cpp_record(line: str) -> bool:
    """Does ``line`` (launcher prefixes and all) start a C++ log record of its own? (Asked of
    every consequence's hit: a line without a source location "file.cpp:N] " is answered without
    splitting its prefixes.)"""
    if "] " not in line or not any(ext in line for ext in (".cpp:", ".cc:", ".h:", ".hpp:")):
        return False
    return _CPP_RECORD.match(split_prefix(line)[1]) is not None


def strip_ansi(s: str) -> str:
    return ANSI.sub("", s) if "\x1b" in s else s


def clean(raw: bytes) -> str:
    """Decode a raw line: invalid UTF-8 replaced, CR and ANSI codes dropped, NULs removed."""
    s = raw.decode("utf-8", "replace")
    if "\r" in s:
        s = s.rstrip("\r\n")
        if "\r" in s:  # progress bars rewrite the line: keep what was written last
            s = s.rsplit("\r", 1)[-1] or s.replace("\r", "")
    if "\x00" in s:
        s = s.replace("\x00", "")
    return strip_ansi(s.rstrip("\n"))


def _one_of(prefixes):
    """All prefix patterns as one ordered alternation (the first that matches wins, as in a loop
    over them): one regex call per prefix layer instead of one per pattern. Returns the pattern
    and, per alternative's group index, (kind, index of its number group or None)."""
    parts, kinds, idx = [], {}, 0
    for pat, kind in prefixes:
        idx += 1
        kinds[idx] = (kind, idx + 1 if pat.groups else None)
        parts.append(f"({pat.pattern.lstrip('^')})")
        idx += pat.groups
    return re.compile("|".join(parts)), kinds


_ANY_PREFIX, _PREFIX_KIND = _one_of(_PREFIXES)


def split_prefix(line: str) -> tuple[int | None, str]:
    """(rank or None, message without the launcher prefixes)."""
    rank = task = local = None
    rest = line
    match = _ANY_PREFIX.match
    for _ in range(5):
        m = match(rest)
        if m is None:
            break
        kind, g = _PREFIX_KIND[m.lastindex]
        if kind == "rank":
            rank = int(m.group(g))
        elif kind == "task":
            task = int(m.group(g))
        elif kind == "local":
            local = int(m.group(g))
        # the text after a label keeps its own indentation (YAML dumps, traceback frames)
        rest = rest[m.end():]
    if rank is None and "ank" in rest:  # every _RANK_IN_TEXT form holds "Rank" or "rank": skip the search
        m = _RANK_IN_TEXT.search(rest)
        if m:
            rank = int(next(g for g in m.groups() if g is not None))
    if rank is None:
        rank = task if task is not None else local
    return rank, rest


@lru_cache(maxsize=1 << 14)
def prefix_key(line: str) -> str:
    """The launcher prefix of a line, used to follow one rank's traceback through interleaving
    (remembered: every open traceback reader asks it of the same lines)."""
    return key_and_cut(line)[0]


def key_and_cut(line: str) -> tuple[str, int]:
    """(prefix_key, where the message starts): ``line[cut:]`` is split_prefix's message, in one
    pass (the block readers' line table asks both of every line)."""
    key = []
    cut = 0
    match = _ANY_PREFIX.match
    for _ in range(5):
        m = match(line, cut)
        if m is None:
            break
        if _PREFIX_KIND[m.lastindex][0] != "time":  # a timestamp changes on every line
            key.append(m.group(0).strip())
        cut = m.end()
    return " ".join(key), cut


def timestamp(line: str, year: int | None = None) -> float | None:
    """Seconds since the epoch (UTC, naive) for the first timestamp in ``line``, if any."""
    for pat, kind in _TS:
        m = pat.search(line)
        if not m:
            continue
        try:
            if kind == "iso":
                date, clock, frac = m.groups()
                y, mo, d = date.split("-")
                hh, mm, ss = clock.split(":")
            else:
                mo, d, hh, mm, ss, frac = m.groups()
                y = year or _this_year()
            if not (1 <= int(mo) <= 12 and 1 <= int(d) <= 31 and int(hh) < 24 and int(mm) < 60 and int(ss) < 62):
                continue
            secs = calendar.timegm((int(y), int(mo), int(d), int(hh), int(mm), int(ss), 0, 0, 0))
            return secs + (float("0." + frac) if frac else 0.0)
        except (ValueError, OverflowError):
            continue
    return None


@lru_cache(maxsize=1)
def _this_year() -> int:
    return _dt.datetime.now(_dt.timezone.utc).year
