"""A signature's regex on one decoded line, after an engine found its anchor there."""
from __future__ import annotations

import regex

from ..model import Signature

_compiled: dict[str, regex.Pattern] = {}


def compiled(pattern: str):
    pat = _compiled.get(pattern)
    if pat is None:
        pat = _compiled[pattern] = regex.compile(pattern)
    return pat


def verify(sig: Signature, line: str) -> dict | None:
    """Does ``line`` match ``sig``? Returns its captures ({} without a regex) or None."""
    if not any(a in line for a in sig.anchors):
        return None
    if not sig.regex:
        return {}
    m = compiled(sig.regex).search(line, timeout=0.25)
    if m is None:
        return None
    return {k: v for k, v in m.groupdict().items() if v is not None}


def line_matches(sig: Signature, line: str) -> bool:
    try:
        return verify(sig, line) is not None
    except TimeoutError:
        return False


_FLAGS = regex.compile(r"\(\?[a-zA-Z]+\)")
_exclusions: dict[str, regex.Pattern | None] = {}


def _leading_exclusion(pattern: str) -> str | None:
    """The body X of a pattern that starts with ``^(?!X)`` (after inline flags), or None."""
    flags = ""
    m = _FLAGS.match(pattern)
    while m:
        flags += m.group(0)
        pattern = pattern[m.end():]
        m = _FLAGS.match(pattern)
    if not pattern.startswith("^(?!"):
        return None
    depth, i, in_class = 1, 4, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "]":
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return flags + "^(?:" + pattern[4:i] + ")"
        i += 1
    return None


def excluded(pattern: str, text: str) -> bool:
    """Does ``text`` hold what the pattern's leading ``^(?!X)`` excludes? A partial match (a line
    cut at the end of a log, scan._recover) does not test lookaheads: the exclusion is asked
    apart, so a line the pattern excludes is never read as a cut copy of one it matches."""
    if pattern not in _exclusions:
        body = _leading_exclusion(pattern)
        _exclusions[pattern] = regex.compile(body) if body else None
    rx = _exclusions[pattern]
    if rx is None:
        return False
    try:
        return rx.search(text, timeout=0.25) is not None
    except TimeoutError:
        return True
