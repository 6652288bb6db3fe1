"""Subcommands, one module each, registered here: name -> the module that defines it (a click
command of the same name). A module is imported when its command runs or help lists it, so
``diagnose LOG`` does not pay for ``check``'s or ``compare``'s imports."""
from __future__ import annotations

import importlib

REGISTRY = {
    "scan": "scan",
    "signatures": "signatures",
    "compare": "compare",
    "check": "check",
    "merge": "merge",
}


def load(name: str):
    """The click command ``name`` (KeyError for an unknown one)."""
    return getattr(importlib.import_module(f"{__name__}.{REGISTRY[name]}"), name)
