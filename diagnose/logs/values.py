"""Values as a log prints them: numbers (nan, inf, 1.2E+03), config literals, NaN / Inf checks."""
from __future__ import annotations

import ast
import re

_INT = re.compile(r"-?\d{1,18}")
_FLOAT = re.compile(r"-?(?:\d{1,300}\.\d{0,300}|\.\d{1,300})(?:[eE][-+]?\d{1,3})?|-?\d{1,300}[eE][-+]?\d{1,3}")


def num(s: str):
    s = s.strip()
    try:
        if _INT.fullmatch(s):
            return int(s)
        return float(s)
    except ValueError:
        low = s.lower()
        if low in ("nan", "-nan", "+nan"):
            return float("nan")
        if low in ("inf", "+inf", "infinity"):
            return float("inf")
        if low in ("-inf", "-infinity"):
            return float("-inf")
        return None


def literal(s: str):
    """Best-effort value of a printed config value: True/False/None/numbers/lists, else the string."""
    s = s.strip()
    if s in ("True", "true"):
        return True
    if s in ("False", "false"):
        return False
    if s in ("None", "null", "~"):
        return None
    if _INT.fullmatch(s):
        return int(s)
    if _FLOAT.fullmatch(s):
        return float(s)
    if not s or s[0] not in "[({'\"" or len(s) > 10_000:
        return s  # a plain word (ast.literal_eval leaves a reference cycle per call: no need here)
    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return s


def is_bad(v: str) -> bool:
    """A printed value that is NaN or infinite (nan, -nan, NAN, inf, -INF, +inf...)."""
    return str(v).strip().lower().lstrip("+-") in ("nan", "inf")

