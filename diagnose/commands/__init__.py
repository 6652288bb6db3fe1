"""Subcommands, one module each, registered here (name -> click command)."""
from __future__ import annotations

from .scan import scan
from .signatures import signatures

REGISTRY = {
    "scan": scan,
    "signatures": signatures,
}
