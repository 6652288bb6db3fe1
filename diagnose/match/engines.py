"""The engines installed, and the fastest one for a scan (match/engine.py has the interface).

A module of its own so that the interface never imports an implementation: the Hyperscan engine
(an optional extra) builds on match/engine.py, and only this registry knows both.
"""
from __future__ import annotations

from collections.abc import Iterable

from .engine import Engine
from .regex_engine import RegexEngine


def available_engines() -> dict[str, type]:
    engines: dict[str, type] = {"regex": RegexEngine}
    try:
        from .hyperscan_engine import HyperscanEngine

        if HyperscanEngine.available():
            engines["hyperscan"] = HyperscanEngine
    except ImportError:
        pass
    return engines


def make_engine(anchors: dict[str, tuple[str, ...]], name: str | None = None, dense: Iterable[str] = ()) -> Engine:
    engines = available_engines()
    if name is None or name == "auto":
        name = "hyperscan" if "hyperscan" in engines else "regex"
    if name not in engines:
        raise ValueError(f"engine {name!r} is not available (have: {', '.join(sorted(engines))})")
    return engines[name](anchors, dense)
