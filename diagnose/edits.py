"""Config edits as data, shared by the diagnosis (a root cause's overrides), the preflight checks
and the remedy: apply one signature Edit to a value, render a ``key=value`` override, and the
one marker of a key to delete."""
from __future__ import annotations

import re
from typing import Any

from .model import Edit


class _Delete:
    """The value of a change that removes the key (one object: compared with ``is``)."""

    def __repr__(self):
        return "DELETE"

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):  # pickled (a worker's result) as the module's own object
        return "DELETE"


DELETE = _Delete()

_SPECIAL = set(" ,[]{}()='\"\\:$*?")
_PLAIN = re.compile(r"[\w.\-/+@%]+", re.ASCII)  # what Hydra reads unquoted as the same string


def apply_edit(current: Any, edit: Edit) -> tuple[bool, Any]:
    """(changed?, new value). ``delete`` returns (True, None) and the caller removes the key."""
    if edit.op == "set":
        new = edit.value
    elif edit.op == "delete":
        return current is not None, None
    elif edit.op in ("scale", "add"):
        if not isinstance(current, (int, float)) or isinstance(current, bool):
            return False, current
        new = current * edit.value if edit.op == "scale" else current + edit.value
        if edit.max is not None:
            new = min(new, edit.max)
        if edit.min is not None:
            new = max(new, edit.min)
        if isinstance(current, int) and float(new).is_integer() and edit.op == "scale":
            new = int(new)
        if isinstance(new, float):
            new = round(new, 6)
    else:  # pragma: no cover - the loader refuses other ops
        raise ValueError(edit.op)
    return new != current, new


def format_value(v: Any) -> str:
    """A value in Hydra's override grammar (what Bridge's run_recipe.py parses)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(format_value(x) for x in v) + "]"
    s = str(v)
    if not s or any(c in _SPECIAL for c in s) or not _PLAIN.fullmatch(s) or s.lower() in ("null", "true", "false"):
        # Hydra's quoted string: \' is a quote; backslashes are literal except a run of them
        # right before a quote (or the closing quote), which is halved. Round-trips any text.
        return "'" + re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, s).replace("'", "\\'") + "'"
    return s


def override(key: str, value: Any, op: str | None = None) -> str:
    if op == "delete":
        return f"~{key}"
    return f"{key}={format_value(value)}"
