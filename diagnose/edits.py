"""Config edits as data, shared by the diagnosis (a root cause's overrides), the preflight checks
and the remedy: apply one signature Edit to a value, render a ``key=value`` override, and the
one marker of a key to delete."""
from __future__ import annotations

import re
from typing import Any

from .model import Edit, Signature


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


def fix_overrides(sig: Signature, cfg: Any, roots: dict, preflight: bool = False) -> list[str]:
    """``key=value`` overrides of the first applicable fix with structured edits (what
    run_recipe.py takes), for the diagnosis and for the preflight checks alike.

    ``preflight``: the whole config is known (``diagnose check``): a fix applies when its
    ``when`` holds, and edits that change nothing are left out. In a diagnosis the config is often
    partial or absent: a fix applies unless its ``when`` is false, and an edit whose current value
    is unknown is shown as the operation (``key=x2``)."""
    from . import predicate as P

    for fix in sig.fixes:
        if not fix.edits:
            continue
        if fix.when:
            verdict = P.evaluate(fix.when, roots)
            if (not P.is_true(verdict)) if preflight else verdict is False:
                continue
        out = []
        for e in fix.edits:
            cur = cfg.get(e.key) if cfg is not None else None
            if not preflight and e.op in ("scale", "add") and not isinstance(cur, (int, float)):
                out.append(f"{e.key}={'x' if e.op == 'scale' else '+'}{e.value}")
                continue
            changed, new = apply_edit(cur, e)
            if changed or not preflight:
                out.append(override(e.key, new, e.op))
        if out or not preflight:
            return out
    return []
