"""The anchors a scan compiles, and their export as line patterns for grep and ripgrep."""
from __future__ import annotations

_ERE_SPECIAL = set("\\.[()*+?{|^$")


def line_pattern(literal: str) -> str:
    """One anchor as a line pattern for ``grep -E`` and ``rg`` (POSIX ERE and Rust regex alike).

    Only the characters special to both dialects are escaped (``\\ . [ ( ) * + ? { | ^ $``;
    escaping others makes GNU grep warn of stray backslashes). Line tools cannot see across a
    newline: an anchor that ends with one becomes ``...$``; one that spans lines keeps its first
    line, anchored at the line end (a slightly wider pattern, never a narrower one).
    """
    head, nl, _rest = literal.partition("\n")
    out = "".join("\\" + c if c in _ERE_SPECIAL else c for c in head)
    return out + "$" if nl else out


def scan_anchors(db, versions: dict | None = None, structure: bool = True) -> dict[str, tuple[str, ...]]:
    """key -> anchors, exactly what a Scanner compiles: line-scope signatures (+ structure parsers)."""
    from ..db import applies_to
    from ..logs.structure import ANCHORS

    out = {s.id: s.anchors for s in db.line_signatures() if applies_to(s, versions or {})}
    if structure:
        out.update(ANCHORS)
    return out
