"""Sampling of dense lines (Engine.scan_sampled): the same on every engine, exact counts, and a
line that anything else puts in the result keeps its dense keys; the structure's counts and the
metrics built on them cover every line, sampled or not."""
from __future__ import annotations

import random

import pytest

from diagnose.analyze import symptoms
from diagnose.logs import structure as S
from diagnose.match.engine import Engine
from diagnose.match.engines import available_engines, make_engine
from diagnose.match.regex_engine import RegexEngine
from diagnose.scan import Scanner

ANCHORS = {"@iteration": ("elapsed time per iteration (ms):",), "@memory": (" memory (MB) | ", " memory (GB) | "),
           "ERR": ("CUDA out of memory",), "@anomaly": ("nan iterations:   1",)}
DENSE = ("@iteration", "@memory")


def _engines():
    out = [make_engine(ANCHORS, "regex", DENSE)]
    planned = RegexEngine(ANCHORS, DENSE)
    planned.PLAN_MIN = 0
    out.append(planned)
    if "hyperscan" in available_engines():
        out.append(make_engine(ANCHORS, "hyperscan", DENSE))
    return out


def _log(n_lines: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        r = rng.random()
        if r < 0.4:
            nan = 1 if rng.random() < 0.01 else 0
            lines.append(f" iteration {i}/100000 | elapsed time per iteration (ms): {rng.uniform(900, 1100):.1f} |"
                         f" lm loss: 1.0E+01 | number of nan iterations:   {nan} |")
        elif r < 0.6:
            lines.append(f"[Rank {i % 8}] (after {i} iterations) memory (MB) | allocated: 1000.0 | max allocated: 2000.0")
        elif r < 0.601:
            lines.append("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
        else:
            lines.append(f"node0001:1:2 [3] NCCL INFO Channel {i % 32:02d}/0 : 3[3] -> 4[4] via P2P/CUMEM/read")
    return ("\n".join(lines) + "\n").encode()


def _occurrences(buf: bytes, lits) -> int:
    n = 0
    for lit in lits:
        i = buf.find(lit.encode())
        while i >= 0:
            n += 1
            i = buf.find(lit.encode(), i + 1)
    return n


@pytest.mark.parametrize("n_lines", [50, 3000, 20000])
def test_sampled_lines_are_the_same_on_every_engine_and_counts_are_exact(n_lines):
    buf = _log(n_lines, seed=n_lines)
    results = [eng.scan_sampled(buf) for eng in _engines()]
    assert all(r == results[0] for r in results[1:])
    lines, counts = results[0]
    for key in DENSE:
        assert counts.get(key, 0) == _occurrences(buf, ANCHORS[key])
    full = Engine.scan(_engines()[0], buf)
    by_span = {(a, b): k for a, b, k in lines}
    for start, end, keys in full:
        if keys - set(DENSE):  # a line another key wants keeps all its keys
            assert by_span[(start, end)] == keys
    if all(counts.get(k, 0) <= Engine.EXACT for k in DENSE):
        assert lines == full  # few dense lines: nothing is skipped
    else:
        assert len(lines) < len(full)
        last = max(a for a, _b, k in full if "@iteration" in k)
        assert any(a == last for a, _b, _k in lines)  # the buffer's last iteration line is read


def test_scan_counts_every_iteration_line_and_every_anomaly(db):
    """A dense log: iteration lines are sampled, but the count of iteration lines, the NaN
    iterations Megatron reports and the last iteration cover every line."""
    buf = _log(40000, seed=5)
    n_iter = buf.count(b"elapsed time per iteration (ms):")
    n_nan = buf.count(b"number of nan iterations:   1")
    last = max(int(x.split(b"/")[0].split()[-1]) for x in buf.split(b"\n") if b"elapsed time" in x)
    from diagnose.analyze.findings import Findings
    from diagnose.logs.read import Chunk
    from diagnose.scan import ScanResult

    sampled, full = Scanner(db), Scanner(db, sample=False)
    out = {}
    for name, sc in (("sampled", sampled), ("full", full)):
        res = ScanResult(Findings(), S.Structure(), [])
        sc.scan_chunk(Chunk(buf, 1, 0), "x.log", 0, res)
        out[name] = res
        st = res.structure
        m = symptoms.compute(st)
        assert m["iterations"] == n_iter
        assert m["last_iteration"] == last
        assert m["loss_missing_iters"] == 0
        assert st.tally["memory"] + st.skipped.get("@memory", 0) == buf.count(b" memory (MB) | ")
    assert n_nan > 0
    # every NaN line is read (an anomaly anchor), sampled or not; the signature sees each one
    for res in out.values():
        assert res.findings.get("MB-NAN-007").count == n_nan
    assert len(out["sampled"].structure.iterations) < len(out["full"].structure.iterations) == n_iter
