"""Regex safety: refuse a signature's regex whose shape backtracks catastrophically.

The database (db.py) runs every signature's regex on every line an anchor hit, often on
hostile input (a log is untrusted), so a regex must never need exponential time. This module
reads the pattern's structure (groups, alternations, quantifiers, classes) without running it
and refuses the shapes known to blow up: nested unbounded quantifiers, nested variable repeats
whose counts multiply past a limit, a repeated group that can match the empty string, and a
repeated alternation whose branches can split one string two ways.
"""
from __future__ import annotations

from functools import lru_cache

import regex

from .errors import DiagnoseError


class RegexSafetyError(DiagnoseError):
    """A regex shape that backtracks catastrophically (one line: which shape, near what)."""


_QUANT = regex.compile(r"[*+?]|\{\d*(?:,\d*)?\}")
_GROUP_HEAD = regex.compile(r"\?(?:P?<[^>]*>|[:>=!]|<[=!]|[a-zA-Z]+:|P=\w+\))?")


def _skip_class(body: str, i: int) -> int:
    """Index just past the character class that opens at ``body[i] == "["``."""
    n = len(body)
    i += 1
    if i < n and body[i] == "^":
        i += 1
    if i < n and body[i] == "]":
        i += 1
    while i < n and body[i] != "]":
        i += 2 if body[i] == "\\" else 1
    return i + 1


def _atoms(body: str):
    """Top-level atoms of a regex fragment: (text, quantifier or "") pairs and "|" separators."""
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c == "|":
            yield "|", ""
            i += 1
            continue
        start = i
        if c == "\\":
            i += 2
        elif c == "[":
            i = _skip_class(body, i)
        elif c == "(":
            depth = 0
            while i < n:
                if body[i] == "\\":
                    i += 2
                    continue
                if body[i] == "[":  # skip a class inside the group
                    i = _skip_class(body, i)
                    continue
                depth += body[i] == "("
                depth -= body[i] == ")"
                i += 1
                if depth == 0:
                    break
        else:
            i += 1
        atom_end = i
        m = _QUANT.match(body, i)
        q = ""
        if m:
            q, i = m.group(0), m.end()
            if i < n and body[i] in "?+":  # lazy / possessive
                i += 1
        yield body[start:atom_end], q


def _alternatives(body: str) -> list:
    alts: list = []
    cur: list = []
    for atom, q in _atoms(body):
        if atom == "|":
            alts.append(cur)
            cur = []
        else:
            cur.append((atom, q))
    alts.append(cur)
    return alts


def _nullable(alt: list) -> bool:
    """Can this sequence of atoms match the empty string?"""
    for atom, q in alt:
        if q in ("?", "*") or q.startswith(("{0", "{,")):
            continue
        if atom in ("^", "$") or atom.startswith(("\\b", "\\B", "\\A", "\\Z", "(?=", "(?!", "(?<")):
            continue  # zero-width
        if atom.startswith("(") and atom.endswith(")"):
            inner = atom[1:-1]
            head = _GROUP_HEAD.match(inner)
            inner = inner[head.end():] if head else inner
            if any(_nullable(a) for a in _alternatives(inner)):
                continue
        return False
    return True


def _literal(alt: list):
    """The literal text of an alternative made only of plain characters (else None)."""
    out = []
    for atom, q in alt:
        if q or not atom:
            return None
        if atom.startswith("\\") and len(atom) == 2 and not atom[1].isalnum():
            out.append(atom[1])
        elif len(atom) == 1 and atom not in ".^$[]()|":
            out.append(atom)
        else:
            return None
    return "".join(out)


def _repeated_group_hazard(body: str):
    """Why repeating this group without bound can backtrack exponentially (or None)."""
    head = _GROUP_HEAD.match(body)
    if head and head.group(0).startswith("?") and head.group(0) in ("?=", "?!", "?<=", "?<!"):
        return None
    inner = body[head.end():] if head else body
    alts = _alternatives(inner)
    if any(_nullable(a) for a in alts):
        return "a repeated group that can match the empty string"
    lits = [w for w in (_literal(a) for a in alts) if w]
    if len(lits) != len(set(lits)) or _not_uniquely_decodable(set(lits)):
        return "a repeated alternation whose branches overlap"
    singles = [a[0][0] for a in alts if len(a) == 1 and not a[0][1] and _one_char(a[0][0])]
    for i, x in enumerate(singles):
        for y in singles[i + 1:]:
            if _chars(x) & _chars(y):  # (\s|\s)+, (.|a)+, ([a-z]|a)+: one character, two ways
                return "a repeated alternation whose branches overlap"
    return None


# characters the single-character branches of an alternation are compared on: ASCII, a few
# Latin-1 / Unicode letters, digits and spaces (enough to see two classes overlap)
_PROBE_CHARS = [chr(c) for c in range(128)] + list("\u00a0\u00e9\u0101\u03b1\u0436\u4e2d\u0660\u2003\u2028")


def _one_char(atom: str) -> bool:
    """Does this atom match exactly one character (a literal, an escape class, '.', a [class])?"""
    if atom.startswith("["):
        return True
    if atom == ".":
        return True
    if atom.startswith("\\") and len(atom) == 2:
        return atom[1] not in "bBAZzG" and not atom[1].isdigit()
    return len(atom) == 1 and atom not in "^$|()"


@lru_cache(maxsize=512)
def _chars(atom: str) -> frozenset:
    try:
        pat = regex.compile(atom, regex.DOTALL)
    except regex.error:
        return frozenset()
    return frozenset(c for c in _PROBE_CHARS if pat.fullmatch(c))


def _not_uniquely_decodable(words: set) -> bool:
    """Sardinas-Patterson: can some string be split into these words in two ways? Then a
    repetition of their alternation backtracks exponentially, ``(a|aa)+`` or ``(a|ab|b)+``."""
    def dangling(xs, ys):
        return {y[len(x):] for x in xs for y in ys if len(y) > len(x) and y.startswith(x)}

    s = dangling(words, words)
    seen = set()
    while s:
        if s & words:
            return True
        key = frozenset(s)
        if key in seen:
            return False
        seen.add(key)
        s = dangling(s, words) | dangling(words, s)
    return False


NESTED_REPEAT_LIMIT = 1000  # (a{1,1000}){1,1000}: a variable repeat inside a variable repeat
UNBOUNDED = 10**9


def _repeat_bound(pattern: str, j: int) -> int:
    """The upper count of a variable quantifier at pattern[j] ('*', '+', '{m,}', '{m,n}' with
    n > m): UNBOUNDED or n; 0 for none or a fixed count ('{3}', '?' counts 1)."""
    c = pattern[j:j + 1]
    if c in ("*", "+"):
        return UNBOUNDED
    if c == "?":
        return 1
    m = regex.match(r"\{(\d*),(\d*)\}", pattern[j:])
    if not m:
        return 0
    lo, hi = int(m.group(1) or 0), m.group(2)
    if not hi:
        return UNBOUNDED
    return int(hi) if int(hi) > lo else 0


def check_regex_safety(pattern: str) -> None:
    """Reject the shapes of catastrophic backtracking: nested unbounded quantifiers ``(a+)+``,
    ``(.*a)*``, ``(\\s*)*``; nested variable quantifiers whose counts multiply past
    NESTED_REPEAT_LIMIT ``(a{1,1000}){1,1000}``; a repeated group that can match the empty
    string ``(a?)+``; a repeated alternation whose branches can split one string two ways:
    literals ``(a|aa)+``, ``(a|ab|b)*``, or one-character branches that share a character
    ``(\\s|\\s)+``, ``(.|a)+``, ``([a-z]|a)+``."""
    depth_unbounded = []  # for each open group: does it contain an unbounded quantifier?
    bounds = []  # for each open group: the largest repeat count of a variable quantifier inside
    opens = []  # index of each open group's "("
    i, n = 0, len(pattern)
    escaped = False
    in_class = False
    while i < n:
        c = pattern[i]
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif in_class:
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "^":
                i += 1
            if pattern[i + 1:i + 2] == "]":  # a literal "]" first in the class
                i += 1
        elif c == "(":
            depth_unbounded.append(False)
            bounds.append(0)
            opens.append(i)
        elif c == ")":
            inner = depth_unbounded.pop() if depth_unbounded else False
            start = opens.pop() if opens else None
            nxt = pattern[i + 1] if i + 1 < n else ""
            quant_unbounded = (nxt != "" and nxt in "*+") or (nxt == "{" and regex.match(r"\{\d*,\}", pattern[i + 1:]))
            if inner and quant_unbounded:
                near = pattern[max(0, i - 20):i + 2]
                raise RegexSafetyError(f"regex has a nested unbounded quantifier near {near!r}")
            outer = _repeat_bound(pattern, i + 1)
            inside = bounds.pop() if bounds else 0
            if outer > 1 and inside and outer * inside > NESTED_REPEAT_LIMIT:
                raise RegexSafetyError(f"regex has nested quantifiers whose counts multiply past {NESTED_REPEAT_LIMIT} "
                                    f"(catastrophic backtracking) near {pattern[max(0, i - 20):i + 2]!r}")
            if bounds:
                bounds[-1] = max(bounds[-1], inside * max(outer, 1) if inside else outer)
            if quant_unbounded and start is not None:
                why = _repeated_group_hazard(pattern[start + 1:i])
                if why:
                    raise RegexSafetyError(f"regex has {why} (catastrophic backtracking) near "
                                        f"{pattern[max(0, start - 10):i + 2]!r}")
            if depth_unbounded and (inner or quant_unbounded):
                depth_unbounded[-1] = True
        elif (c in "*+" or (c == "{" and regex.match(r"\{\d*,\}", pattern[i:]))) and depth_unbounded:
            depth_unbounded[-1] = True
        if not escaped and not in_class and c != ")" and bounds and pattern[i + 1:i + 2] in ("{", "*", "+"):
            bounds[-1] = max(bounds[-1], _repeat_bound(pattern, i + 1))  # an atom's own variable repeat
        i += 1
