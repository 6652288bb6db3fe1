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
