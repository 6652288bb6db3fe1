"""Differential tests: the pure-Python and the Hyperscan engine give identical results.

At three levels: the engines' line/key output against a brute-force reference (random buffers,
literals with newlines and self-overlaps included); whole scans (findings, structure, root
cause) of every fixture log; and a scan of a generated multi-rank log large enough for the
regex engine's planned sweeps to be used.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.diagnosis import analyze
from diagnose.logs import structure as S
from diagnose.match.engines import available_engines, make_engine
from diagnose.match.regex_engine import RegexEngine
from diagnose.scan import Scanner

REPO = Path(__file__).resolve().parents[2]
HAVE_HS = "hyperscan" in available_engines()
needs_hs = pytest.mark.skipif(not HAVE_HS, reason="hyperscan extra not installed (pip install 'diagnose[fast]')")

ANCHORS = {
    "A": ("CUDA out of memory", "OutOfMemoryError"),
    "B": ("Error: ", "Error:\n", "Error\n"),
    "C": ("aa", "aaa"),  # self-overlapping occurrences
    "D": ("x\ny",),  # an anchor across a line break belongs to the line it starts on
    "E": ("Q",),
    "F": ("CUDA",),  # a prefix of another key's anchor
}


def reference(anchors: dict, buf: bytes) -> list:
    """Brute force: for every occurrence of every literal, its line; keys per line."""
    lines: dict = {}
    for key, lits in anchors.items():
        for lit in lits:
            b = lit.encode()
            i = buf.find(b)
            while i >= 0:
                start = buf.rfind(b"\n", 0, i) + 1
                end = buf.find(b"\n", i)
                end = len(buf) if end < 0 else end
                lines.setdefault((start, end), set()).add(key)
                i = buf.find(b, i + 1)
    return [(s, e, k) for (s, e), k in sorted(lines.items())]


def engines(anchors):
    out = [RegexEngine(anchors)]
    planned = RegexEngine(anchors)
    planned.PLAN_MIN = 0  # force the planned sweeps even on small buffers
    out.append(planned)
    swept = RegexEngine(anchors)
    swept.PLAN_MIN, swept.C_STOP = 0, 1.0  # the re pass priced out: every anchor through bytes.find
    out.append(swept)
    if HAVE_HS:
        out.append(make_engine(anchors, "hyperscan"))
    return out


PIECES = ["CUDA out of memory", "OutOfMemoryError", "Error: ", "Error:", "Error", "\n", "a", "aa", "x", "y",
          "Q", "CUDA", " ", "NCCL INFO ", "[rank3]: ", "Err", "\u00e9", "\x00"]


# the planned re pass builds one alternation of every anchor's rest with a lookbehind for the
# whole anchor: regex metacharacters, anchors that are suffixes / prefixes / infixes of others,
# shared pivots, and a lookbehind reaching the buffer's start
ANCHORS_RE = {
    "M": ("(ms):", "[rank", "a|b", "\\d+", "$x^", "(?<=z)"),
    "S": ("rror", "Error", "ror: ", "r"),
    "P": ("ab", "abc", "bca", "cab"),
    "N": ("\n\n", "q\nq"),
}
PIECES_RE = ["(ms):", "[rank", "a|b", "\\d+", "$x^", "(?<=z)", "Error", "rror: ", "ror", "abc", "ab", "ca", "b",
             "\n", "q", " ", "z"]


@pytest.mark.parametrize("anchors,pieces", [(ANCHORS, PIECES), (ANCHORS_RE, PIECES_RE)], ids=["anchors", "re-pass"])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_engines_match_brute_force(anchors, pieces, data):
    buf = "".join(data.draw(st.lists(st.sampled_from(pieces), max_size=60))).encode("utf-8")
    want = reference(anchors, buf)
    for eng in engines(anchors):
        assert eng.scan(buf) == want, eng.name


def test_planned_sweeps_on_a_large_buffer(db):
    """The regex engine's plan (rare-byte pivots, shared substrings) against the reference."""
    from diagnose.scan import Scanner

    sc = Scanner(db, "regex")
    anchors = sc.engine.anchors
    rng = random.Random(7)
    lits = [lit for lits in anchors.values() for lit in lits]
    filler = [b"node0001:12345:12399 [3] NCCL INFO Channel 03/0 : 3[3] -> 4[4] via P2P/CUMEM/read\n",
              b" [2026-08-22 15:22:22] iteration 10/100 | lm loss: 1.0E+01 |\n", b"plain text line\n"]
    parts = []
    size = 0
    while size < (2 << 20):
        p = rng.choice(filler) if rng.random() < 0.97 else (rng.choice(lits).encode() + b" tail\n")
        parts.append(p)
        size += len(p)
    buf = b"".join(parts)
    eng = RegexEngine(anchors)
    assert len(buf) >= eng.PLAN_MIN
    got = eng.scan(buf)
    assert eng.planned_buffers == 1  # the planned path ran
    assert got == reference(anchors, buf)


def _summary(db, sc: Scanner, paths: list) -> dict:
    res = sc.scan_paths([str(p) for p in paths])
    report = analyze(db, res)
    rc = report.root_cause
    return {
        "findings": {f.signature.id: (f.count, sorted(f.ranks.items(), key=str), (f.first.file, f.first.line),
                                      [(h.file, h.line) for h in f.samples]) for f in report.findings},
        "root": (rc.finding.signature.id, rc.hit.file, rc.hit.line) if rc else None,
        "iterations": [(p.file, p.line, p.iteration) for p in res.structure.iterations],
        "memory": [(m["file"], m["line"]) for m in res.structure.memory],
        "tracebacks": [(t.file, t.line, t.exc_type) for t in res.structure.tracebacks],
        "exceptions": [e[:4] for e in res.structure.exceptions],
        "torchrun": [(t.file, t.line, t.rank) for t in res.structure.torchrun],
        "timers": res.structure.timer_blocks,
        "lines": res.lines_read,
        "bytes": res.bytes_read,
    }


def fixture_logs() -> list:
    root = REPO / "fixtures"
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".log", ".out", ".txt", ".gz", ".err"))


@needs_hs
def test_same_findings_on_every_fixture_log(db):
    logs = fixture_logs()
    assert logs, "no fixture logs found"
    rx, hs = Scanner(db, "regex"), Scanner(db, "hyperscan")
    for log in logs:
        assert _summary(db, rx, [log]) == _summary(db, hs, [log]), log.relative_to(REPO)


@needs_hs
def test_same_findings_on_a_generated_log(db, tmp_path):
    sys.path.insert(0, str(REPO))
    try:
        from bench.gen_log import generate
    finally:
        sys.path.remove(str(REPO))
    log = tmp_path / "big.log"
    generate(log, 3 << 20, ranks=64, seed=3)
    rx, hs = Scanner(db, "regex"), Scanner(db, "hyperscan")
    want = _summary(db, rx, [log])
    assert want["root"] is not None and want["iterations"]
    assert want == _summary(db, hs, [log])
    assert rx.engine.planned_buffers > 0  # chunks were large enough for the planned sweeps


def test_structure_anchors_are_registered_with_the_engine(db):
    sc = Scanner(db, "regex")
    for key in S.ANCHORS:
        assert key in sc.engine.anchors


def test_auto_picks_an_available_engine():
    eng = make_engine({"k": ("x",)})
    assert eng.name == ("hyperscan" if HAVE_HS else "regex")
    with pytest.raises(ValueError):
        make_engine({"k": ("x",)}, "no-such-engine")


@needs_hs
def test_hyperscan_engine_survives_pickling():
    import pickle

    eng = make_engine(ANCHORS, "hyperscan")
    again = pickle.loads(pickle.dumps(eng))
    buf = b"x\ny CUDA out of memory\nError\n"
    assert again.scan(buf) == eng.scan(buf) == reference(ANCHORS, buf)


def test_empty_anchor_set_and_empty_buffer():
    for eng in engines({}):
        assert eng.scan(b"anything\n") == []
    for eng in engines(ANCHORS):
        assert eng.scan(b"") == []


def test_exported_patterns_match_what_the_engine_matches(run_cli, tmp_path):
    """``signatures export --patterns``: one escaped pattern per anchor; grep -E and rg accept them all
    and select exactly the lines that hold an anchor (the line the anchor starts on)."""
    import shutil
    import subprocess

    from diagnose import db as DB
    from diagnose.match.anchors import scan_anchors

    code, out, _ = run_cli("signatures", "export", "--patterns")
    assert code == 0
    pats = out.splitlines()
    anchors = scan_anchors(DB.load())
    lits = sorted({a for v in anchors.values() for a in v})
    assert len(pats) == len(set(pats)) == len({a.split("\n")[0] + ("$" if "\n" in a else "") for a in lits})
    pf = tmp_path / "p.txt"
    pf.write_text(out)
    lines = [f"x {a}" for a in lits] + ["nothing to see here", "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"]
    log = tmp_path / "l.log"
    log.write_text("\n".join(lines) + "\n")
    for tool in (["grep", "-c", "-E", "-f"], ["rg", "-c", "-f"]):
        if shutil.which(tool[0]) is None:
            continue
        p = subprocess.run(tool + [str(pf), str(log)], capture_output=True, text=True, env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"})
        assert p.stderr == "", (tool[0], p.stderr[:300])
        assert int(p.stdout.strip()) == len(lits), tool[0]


def _split_prefix_reference(line):
    """The pattern-by-pattern loop that logs/lines.py's single alternation replaces (the oracle)."""
    from diagnose.logs.lines import _PREFIXES, _RANK_IN_TEXT

    rank = task = local = None
    rest, key = line, []
    for _ in range(5):
        for pat, kind in _PREFIXES:
            m = pat.match(rest)
            if m:
                if kind == "rank":
                    rank = int(m.group(1))
                elif kind == "task":
                    task = int(m.group(1))
                elif kind == "local":
                    local = int(m.group(1))
                if kind != "time":  # timestamps are stripped but do not tell ranks apart
                    key.append(m.group(0).strip())
                rest = rest[m.end():]
                break
        else:
            break
    if rank is None:
        m = _RANK_IN_TEXT.search(rest)
        if m:
            rank = int(next(g for g in m.groups() if g is not None))
    if rank is None:
        rank = task if task is not None else local
    return (rank, rest), " ".join(key)


PREFIX_PIECES = [" 2: ", "15: ", "  7:", "i.pretrain/0 ", "[default3]:", "[default3]: ", "[rank12]:", "[rank12]: ",
                 "(RayWorker pid=1234) ", "(pid=9, ip=10.0.0.1) ", "x", " ", "[Rank 4] ", "Rank 5: ", "rank=6 ",
                 "msg", ":", "[", "]", "1", "/", "2026-01-09 17:40:31.169 ", "2026-01-09 17:40:31.169 node-0 >> ",
                 "21:39:56.349 ", "(worker1, rank=1, pid=42, ip=10.0.0.2) ",
                 "(ActorWorker(actor_train-1) pid=18175, ip=33.199.184.82) ", "(DTensorPolicyWorker[rank=0] pid=7) ",
                 "ERROR 04-07 00:57:46 ray_utils.py:45] ", "INFO 01-10 12:00:00 [engine.py:123] "]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(PREFIX_PIECES), max_size=8))
def test_split_prefix_equals_the_reference_loop(pieces):
    from diagnose.logs.lines import prefix_key, split_prefix

    line = "".join(pieces)
    want_split, want_key = _split_prefix_reference(line)
    assert split_prefix(line) == want_split
    assert prefix_key(line) == want_key


def test_a_plan_that_stops_fitting_the_data_is_made_again(db):
    """A plan made from a buffer without iteration lines meets buffers full of them (one file per
    rank: only the last rank prints them): such a buffer costs more per byte, and the engine plans
    again from the next large one; the results never change."""
    from diagnose.match.anchors import scan_anchors

    anchors = scan_anchors(db)
    quiet = b"".join(b"node0001:12345:12399 [3] NCCL INFO Channel %02d/0 : 3[3] -> 4[4] via P2P/CUMEM/read\n" % (i % 32)
                     for i in range(30000))
    busy = b"".join(b" [2026-08-22 15:22:22] iteration %d/100000 | lm loss: 1.0E+01 | loss scale: 1.0 | grad norm:"
                    b" 1.0 | number of nan iterations:   0 |\n" % i for i in range(30000))
    eng = RegexEngine(anchors)
    eng.REPLAN = 0.0  # any buffer counts as slower: the replanning path runs on every one
    for buf in (quiet, busy, busy, quiet):
        assert eng.scan(buf) == reference(anchors, buf)
    assert eng.replans >= 1 and eng.planned_buffers == 4
    # without the clock: a bytes.find needle that the quiet sample found rare hits every line
    swept = RegexEngine(anchors)
    swept.REPLAN, swept.C_STOP = float("inf"), 1.0  # sweeps only, judged by their hits alone
    assert swept.scan(quiet) == reference(anchors, quiet) and swept.replans == 0
    assert swept.scan(busy) == reference(anchors, busy)
    assert swept.replans == 1 and swept.plan is None  # the next large buffer is planned again


def test_glog_time_and_thread_do_not_defeat_the_verify_cache(monkeypatch):
    """A warning storm: the same c10d warning on 512 ranks, each line with its own glog time and
    thread id. The regex runs once per distinct message, not once per line (issue 14)."""
    import diagnose.scan as SC
    from diagnose.diagnosis import scan_text

    calls = []
    real = SC.verify
    monkeypatch.setattr(SC, "verify", lambda sig, msg: calls.append(msg) or real(sig, msg))
    lines = [f"[rank{r}]:[W1130 10:58:{r % 60:02d}.{r * 7919:09d} {40000 + r} torch/csrc/distributed/c10d/"
             f"ProcessGroupNCCL.cpp:1234] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS is deprecated "
             "(function ProcessGroupNCCL)" for r in range(512)]
    scan_text("\n".join(lines) + "\n")
    assert 0 < len(calls) <= 8, len(calls)
    assert all(not c.startswith("[W1130") for c in calls)  # the glog time and thread are framing


def test_glog_framing_keeps_rank_and_source_location():
    from diagnose.logs.lines import split_prefix

    rank, msg = split_prefix("[rank3]:[E1130 10:58:34.718000123 4242 ProcessGroupNCCL.cpp:683] [Rank 3] Watchdog caught")
    assert rank == 3 and msg.startswith("ProcessGroupNCCL.cpp:683] [Rank 3] Watchdog caught")
    rank, msg = split_prefix("E1130 10:58:34.718000 4242 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1534] x")
    assert msg.startswith("torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1534] x")
