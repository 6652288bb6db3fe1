"""Subcommands, one module each, registered here (name -> click command)."""
from __future__ import annotations

from .check import check
from .compare import compare
from .scan import scan
from .signatures import signatures

REGISTRY = {
    "scan": scan,
    "signatures": signatures,
    "compare": compare,
    "check": check,
}
