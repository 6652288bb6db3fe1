"""Matching: literal anchors over large buffers first, regexes only on lines an anchor hit.

One interface, several engines. An engine is compiled once from the database's line-scope
signatures (plus the structure parsers' anchors) and then scans byte buffers that hold whole
lines. It returns, per matching line, the line's byte span and the ids whose anchors occur in it;
``verify`` then runs each signature's regex on that one decoded line.

Engines: ``regex`` (pure Python: one ``bytes.find`` sweep per distinct anchor key, C speed) and
``hyperscan`` (optional extra: all anchors in one pass). ``best_engine()`` picks hyperscan when it
is installed. Both must give identical results (tests/test_engines.py).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from typing import Iterable, Optional

import regex

from ..model import Signature


class Engine(ABC):
    name = "abstract"

    def __init__(self, anchors: dict[str, tuple[str, ...]]):
        """``anchors`` maps a key (signature id or structure name) to its literal anchors."""
        self.anchors = anchors
        self.by_literal: dict[bytes, list[str]] = defaultdict(list)
        for key, lits in anchors.items():
            for lit in lits:
                b = lit.encode("utf-8")
                if key not in self.by_literal[b]:
                    self.by_literal[b].append(key)

    @abstractmethod
    def find(self, buf: bytes) -> Iterable[tuple[int, bytes]]:
        """Yield (offset, literal) for every occurrence of every anchor literal in ``buf``."""

    def scan(self, buf: bytes) -> list[tuple[int, int, set]]:
        """Lines of ``buf`` containing an anchor: sorted [(line_start, line_end, {keys})]."""
        lines: dict[int, list] = {}
        rfind, find = buf.rfind, buf.find
        for off, lit in self.find(buf):
            start = rfind(b"\n", 0, off) + 1
            entry = lines.get(start)
            if entry is None:
                end = find(b"\n", off)
                if end < 0:
                    end = len(buf)
                entry = lines[start] = [end, set()]
            entry[1].update(self.by_literal[lit])
        return [(s, e[0], e[1]) for s, e in sorted(lines.items())]


class RegexEngine(Engine):
    """Pure-Python engine: one C-level ``bytes.find`` sweep per distinct literal."""

    name = "regex"

    def find(self, buf: bytes):
        find = buf.find
        for lit in self.by_literal:
            i = find(lit)
            n = len(lit)
            while i >= 0:
                yield i, lit
                i = find(lit, i + n)


def available_engines() -> dict[str, type]:
    engines = {"regex": RegexEngine}
    try:
        from .hyperscan_engine import HyperscanEngine  # noqa: F401

        if HyperscanEngine.available():
            engines["hyperscan"] = HyperscanEngine
    except ImportError:
        pass
    return engines


def make_engine(anchors: dict[str, tuple[str, ...]], name: Optional[str] = None) -> Engine:
    engines = available_engines()
    if name is None or name == "auto":
        name = "hyperscan" if "hyperscan" in engines else "regex"
    if name not in engines:
        raise ValueError(f"engine {name!r} is not available (have: {', '.join(sorted(engines))})")
    return engines[name](anchors)


_compiled: dict[str, "regex.Pattern"] = {}


def compiled(pattern: str):
    pat = _compiled.get(pattern)
    if pat is None:
        pat = _compiled[pattern] = regex.compile(pattern)
    return pat


def verify(sig: Signature, line: str) -> Optional[dict]:
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
