"""Regex safety: every signature's regex stays fast on adversarial long lines, and the loader
refuses the shapes of catastrophic backtracking.

``verify`` runs a regex with a 0.25 s timeout and treats a timeout as "no match": a regex that
needs that long on one line would silently lose a finding (and cost 0.25 s per hostile line).
So each signature's regex must finish well inside that on 100 kB lines built from its own
anchors (repeated anchors, the anchor then 100 kB of spaces / digits / junk, ...), and its worst
such line must still finish inside the timeout at 1 MB (``MAX_LINE``: longer lines are split).
"""
from __future__ import annotations

import random
import time

import pytest

from diagnose import db as DB
from diagnose import regex_safety as RS
from diagnose.logs.read import MAX_LINE
from diagnose.match.verify import compiled, verify

N = 100_000
LINE_BUDGET_S = 0.1  # CPU seconds per 100 kB line (verify's wall-clock timeout is 0.25 s)
SIG_BUDGET_S = 2.0  # CPU seconds for all adversarial lines of one signature together

_DB = DB.load()
REGEX_SIGS = [s for s in _DB.line_signatures() if s.regex]
_JUNK = {}

KINDS = ("anchor repeated", "anchor+space repeated", "anchor then spaces", "anchor then digits",
         "anchor then dotted digits", "anchor then junk", "spaces then anchor", "half anchors then anchor",
         "anchor then half anchors")


def junk(n: int) -> str:
    if n not in _JUNK:
        _JUNK[n] = "".join(random.Random(n).choices("aZ0 :.,=-_/()[]{}'\"\t|", k=n))
    return _JUNK[n]


def adversarial(kind: str, a: str, n: int = N) -> str:
    """A long line made of the anchor ``a`` and junk around it."""
    half = a[: max(1, len(a) // 2)]
    return {
        "anchor repeated": lambda: (a * (n // len(a) + 1))[:n],
        "anchor+space repeated": lambda: ((a + " ") * (n // (len(a) + 1) + 1))[:n],
        "anchor then spaces": lambda: a + " " * n,
        "anchor then digits": lambda: a + "9" * n,
        "anchor then dotted digits": lambda: a + "1." * (n // 2),
        "anchor then junk": lambda: a + junk(n),
        "spaces then anchor": lambda: " " * n + a,
        "half anchors then anchor": lambda: (half + " ") * (n // (len(half) + 1)) + a,
        "anchor then half anchors": lambda: a + (half + " ") * (n // (len(half) + 1)),
    }[kind]()


def _cpu(sig, line: str) -> float:
    """CPU seconds of the signature's regex search on ``line`` (CPU time: robust to a busy machine)."""
    pat = compiled(sig.regex)
    t = time.process_time()
    try:
        pat.search(line, timeout=20)
    except TimeoutError:
        return float("inf")
    return time.process_time() - t


def test_there_are_regexes_to_check():
    assert len(REGEX_SIGS) >= 50


@pytest.mark.parametrize("sig", REGEX_SIGS, ids=[s.id for s in REGEX_SIGS])
def test_signature_regex_on_adversarial_lines(sig):
    total, worst = 0.0, (0.0, "", "")
    for a in sig.anchors:
        for kind in KINDS:
            line = adversarial(kind, a)
            dt = _cpu(sig, line)
            assert dt < LINE_BUDGET_S, f"{sig.id}: {kind} {a!r} ({len(line)} chars) took {dt:.3f} s: {sig.regex}"
            total += dt
            worst = max(worst, (dt, kind, a))
        verify(sig, adversarial("anchor then junk", a))  # through the real entry point too (no exception)
    assert total < SIG_BUDGET_S, f"{sig.id}: {total:.2f} s over its adversarial lines (worst: {worst})"
    # the worst shape again at the longest line the reader hands on whole (10x longer): linear
    # time grows ~10x, quadratic ~100x
    _, kind, a = worst
    small = min(_cpu(sig, adversarial(kind, a)) for _ in range(2))
    big = min(_cpu(sig, adversarial(kind, a, MAX_LINE)) for _ in range(2))
    assert big < max(0.05, 35 * small), (f"{sig.id}: {kind} {a!r}: {small:.4f} s at {N} chars but {big:.3f} s "
                                         f"at {MAX_LINE} (super-linear): {sig.regex}")


def test_a_regex_timeout_costs_one_line_not_the_scan():
    """Should a regex still be slow somewhere, verify times out and the line simply does not match."""
    import dataclasses

    from diagnose.match.verify import line_matches

    slow = dataclasses.replace(REGEX_SIGS[0], regex=r"^(?:x+x+)+y", anchors=("x",))
    with pytest.raises(TimeoutError):
        verify(slow, "x" * 5000)
    t = time.perf_counter()
    assert line_matches(slow, "x" * 5000) is False
    assert time.perf_counter() - t < 5


# --------------------------------------------------------------------------- the loader's checker

CATASTROPHIC = [
    r"(a+)+",
    r"(.*a)*",
    r"(\s*)*",
    r"(?:\d+\.?)+",
    r"((a|b)*)+",
    r"(a{1,}b?)+",
    r"(a|aa)+",
    r"(?:a|ab|b)*",
    r"(x|x)+",
    r"(?P<n>a|aa){2,}",
    r"(a?)+",
    r"(?:a|)+",
    r"(a|a?)+",
    r"(?:(?:a)?)*",
    r"(?:\b)+x",
    r"^foo (?:[^\]]+ ?)+$",
    # issue 16, item 9: user signatures that loaded before
    r"(\s|\s)+!",
    r"(.|a)+!",
    r"(?:[a-z]|a)+!",
    r"(a{1,1000}){1,1000}!",
    r"(?:\d|[0-9a-f])+x",
    r"(?:x{2,40}y?){2,100}",
]

SAFE = [
    r"(?:ab|cd)+",
    r"(?:a|b)+",
    r"(\d+)x",
    r"(?:foo|bar)\s+\d+",
    r"[(]+",
    r"\(+",
    r"[()]*",
    r"[\]()]+x",
    r"(?:[ab]c)+",
    r"(?:ab)+",
    r"(?:ab|a)*",
    r"(?:a|ba|bb)+",
    r"(?=.*x)y",
    r"(?:\d{1,3}\.){3}\d{1,3}",
    r"(?>.*?UserWarning:).*deprecat",
    r"CUDA out of memory\. Tried to allocate (?P<req_size>[\d.]+ [KMG]iB)",
    r"(?:\s|\S)+",  # one-character branches with no character in common
    r"(?:[a-f]|[0-9])+",
    r"(?:\d{1,3}[.,]?){1,4}",  # nested, but 3 x 4 repeats
    r"(?:\.|,|;)+",
]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_checker_rejects_catastrophic_shapes(pattern):
    with pytest.raises(RS.RegexSafetyError, match=r"catastrophic backtracking|nested unbounded quantifier"):
        RS.check_regex_safety(pattern)


@pytest.mark.parametrize("pattern", SAFE)
def test_checker_accepts_safe_shapes(pattern):
    RS.check_regex_safety(pattern)


SLOW_PROBES = {  # shapes the checker refuses, and a probe on which `regex` really does blow up
    r"(a|aa)+": "a" * 40 + "!",
    r"(x|x)+": "x" * 40 + "!",
    r"(?:a|ab|b)*": "ab" * 30 + "!",
    r"(\s*)*": " " * 5000 + "!",
    r"(?P<n>a|aa){2,}": "a" * 40 + "!",
    r"(\s|\s)+": " " * 40 + "!",
    r"(.|a)+": "a" * 40 + "!",
    r"(?:[a-z]|a)+": "a" * 40 + "!",
    r"(a{1,1000}){1,1000}": "a" * 3000 + "!",
}


@pytest.mark.parametrize("pattern", sorted(SLOW_PROBES))
def test_rejected_shapes_really_are_slow(pattern):
    """The checker is not refusing for nothing: these shapes time out on a 40-character probe."""
    import regex

    with pytest.raises(RS.RegexSafetyError):
        RS.check_regex_safety(pattern)
    pat = regex.compile(pattern + r"(?!)")  # never matches: the engine must try every split
    t = time.process_time()
    try:
        pat.search(SLOW_PROBES[pattern], timeout=0.5)
    except TimeoutError:
        return
    assert time.process_time() - t > 0.2, f"{pattern} was fast"


def test_loader_refuses_a_signature_file_with_a_catastrophic_regex(tmp_path):
    import shutil
    from pathlib import Path

    src = Path(DB.__file__).resolve().parent.parent / "signatures"
    dst = tmp_path / "signatures"
    shutil.copytree(src, dst)
    f = next(p for p in sorted(dst.glob("*.yaml")) if "regex: " in p.read_text())
    text = f.read_text()
    i = text.index("regex: ")
    j = text.index("\n", i)
    f.write_text(text[:i] + "regex: '(?:ab|a|b)+$'" + text[j:])
    with pytest.raises(DB.DatabaseError, match="overlap"):
        DB.load(str(dst))
