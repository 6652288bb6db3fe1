"""YAML documents that must not be walked: alias bombs and self-referencing aliases.

Used wherever YAML from a user or a log is read (config/load.py, a "Final configuration:" block
inside a log in logs/structure.py), before anything walks the document.
"""
from __future__ import annotations

MAX_VALUES = 1_000_000  # values in the document once aliases are expanded (a real config has ~1,000)


class YamlBomb(ValueError):
    """The document expands to too many values, refers to itself, or nests too deeply."""


def check_expansion(doc, path: str) -> None:
    """Refuse alias bombs ("billion laughs") and self-referencing aliases before anything walks
    the document: each distinct node is sized once, so this is linear in the YAML text."""
    memo: dict = {}
    active: set = set()

    def size(o) -> int:
        if not isinstance(o, (dict, list)):
            return 1
        k = id(o)
        if k in memo:
            return memo[k]
        if k in active:
            raise YamlBomb(f"{path}: a YAML alias refers to itself (a recursive structure)")
        active.add(k)
        total = 1
        for v in (o.values() if isinstance(o, dict) else o):
            total += size(v)
            if total > MAX_VALUES:
                raise YamlBomb(f"{path}: YAML aliases expand to more than {MAX_VALUES:,} values (an alias bomb?)")
        active.discard(k)
        memo[k] = total
        return total

    try:
        size(doc)
    except RecursionError:
        raise YamlBomb(f"{path}: YAML nested too deeply") from None
