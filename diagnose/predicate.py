"""Config predicates: the small, safe expression language of the signature database.

A predicate is a Python-like boolean expression over dotted names::

    model.cpu_offloading and model.pipeline_model_parallel_size > 1
    optimizer.optimizer_cpu_offload and optimizer.optimizer_offload_fraction < 1
    captures.tried_bytes > 4 * captures.capacity_bytes

Names resolve against a mapping of roots (``model``, ``optimizer``, ``metrics``, ``captures``...).
Evaluation is three-valued: a name that the config does not hold is UNKNOWN, and UNKNOWN
propagates (``False and UNKNOWN`` is False, ``True and UNKNOWN`` is UNKNOWN). Nothing else than
the node types below is accepted, so a database file can never run code.
"""
from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any


class _Unknown:
    _inst = None

    def __new__(cls):
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __repr__(self) -> str:
        return "UNKNOWN"

    def __bool__(self) -> bool:  # pragma: no cover - guard against accidental truthiness
        raise TypeError("UNKNOWN has no truth value; use predicate.is_true()")


UNKNOWN = _Unknown()

_CMP = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not,
}
_BIN = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Mod: operator.mod, ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}


def _divides(a, b):
    return b % a == 0


_FUNCS: dict[str, Callable[..., Any]] = {
    "abs": abs, "min": min, "max": max, "len": len, "divides": _divides, "bool": bool,
    "int": int, "float": float, "str": str, "lower": lambda s: str(s).lower()}

_ALLOWED = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.Compare,
    ast.Name, ast.Attribute, ast.Constant, ast.Load, ast.BinOp, ast.Call, ast.List, ast.Tuple,
    *tuple(_CMP), *tuple(_BIN),
)


class PredicateError(ValueError):
    pass


@lru_cache(maxsize=1024)
def compile_predicate(expr: str) -> ast.Expression:
    """Parse and vet ``expr``; raises PredicateError for anything outside the language."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as exc:
        raise PredicateError(f"invalid predicate {expr!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise PredicateError(f"predicate {expr!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Call) and (
                not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS or node.keywords):
            raise PredicateError(f"predicate {expr!r}: only {sorted(_FUNCS)} may be called")
    return tree


def names(expr: str | None) -> set[str]:
    """The dotted names a predicate reads (``model.cpu_offloading`` ...); none for no predicate."""
    out: set[str] = set()
    if not expr:
        return out
    for node in ast.walk(compile_predicate(expr)):
        if isinstance(node, (ast.Attribute, ast.Name)):
            dotted = _dotted(node)
            if dotted and not (isinstance(node, ast.Name) and node.id in _FUNCS):
                out.add(dotted)
    # keep only maximal names (drop "model" when "model.x" is present)
    return {n for n in out if not any(o.startswith(n + ".") for o in out)}


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def lookup(roots: Mapping[str, Any], dotted: str, default: Any = UNKNOWN):
    """The value at ``a.b.c`` in nested mappings, else ``default`` (UNKNOWN for predicates)."""
    cur: Any = roots
    for part in dotted.split("."):
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        else:
            return default
    return cur


def evaluate(expr: str | None, roots: Mapping[str, Any]):
    """True, False or UNKNOWN (no predicate: UNKNOWN)."""
    if not expr:
        return UNKNOWN
    return _eval(compile_predicate(expr).body, roots)


def is_true(value) -> bool:
    return value is not UNKNOWN and bool(value)


def _eval(node, roots):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Name, ast.Attribute)):
        dotted = _dotted(node)
        if dotted is None:
            raise PredicateError("unsupported attribute access")
        return lookup(roots, dotted)
    if isinstance(node, (ast.List, ast.Tuple)):
        vals = [_eval(e, roots) for e in node.elts]
        return UNKNOWN if any(v is UNKNOWN for v in vals) else vals
    if isinstance(node, ast.BoolOp):
        vals = [_eval(v, roots) for v in node.values]
        if isinstance(node.op, ast.And):
            if any(v is not UNKNOWN and not v for v in vals):
                return False
            return UNKNOWN if any(v is UNKNOWN for v in vals) else True
        if any(v is not UNKNOWN and v for v in vals):
            return True
        return UNKNOWN if any(v is UNKNOWN for v in vals) else False
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, roots)
        if v is UNKNOWN:
            return UNKNOWN
        return (not v) if isinstance(node.op, ast.Not) else -v
    if isinstance(node, ast.Compare):
        left = _eval(node.left, roots)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, roots)
            if isinstance(op, (ast.Is, ast.IsNot)):
                # "x is None" is answerable for a key that is present with a null value only
                if left is UNKNOWN or right is UNKNOWN:
                    return UNKNOWN
            elif left is UNKNOWN or right is UNKNOWN or left is None or right is None:
                if isinstance(op, (ast.Eq, ast.NotEq)) and left is not UNKNOWN and right is not UNKNOWN:
                    pass
                else:
                    return UNKNOWN
            try:
                ok = _CMP[type(op)](left, right)
            except TypeError:
                return UNKNOWN
            if not ok:
                return False
            left = right
        return True
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, roots), _eval(node.right, roots)
        if a is UNKNOWN or b is UNKNOWN or a is None or b is None:
            return UNKNOWN
        try:
            return _BIN[type(node.op)](a, b)
        except (TypeError, ZeroDivisionError, OverflowError):
            return UNKNOWN
    if isinstance(node, ast.Call):
        args = [_eval(a, roots) for a in node.args]
        if any(a is UNKNOWN for a in args):
            return UNKNOWN
        assert isinstance(node.func, ast.Name)  # compile_predicate allows nothing else
        try:
            return _FUNCS[node.func.id](*args)
        except (TypeError, ValueError, ZeroDivisionError):
            return UNKNOWN
    raise PredicateError(f"unsupported node {type(node).__name__}")
