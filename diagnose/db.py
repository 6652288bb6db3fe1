"""Load and validate the signature database: the one place signature files are read.

The database is a folder of YAML files (``signatures/*.yaml``), one family each, with a
file-level ``schema_version``. The schema is documented in ``signatures/README.md``. Loading
refuses, with a message naming the file and the id:
  * a signature without examples (``tests.match``) or with an unknown field or value;
  * a duplicate id or slug;
  * a regex that does not compile, or one with a nested unbounded quantifier (``(a+)+``);
  * an example that does not behave (checked by ``diagnose signatures test``, not at load).
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import regex
import yaml

from . import predicate
from .errors import DiagnoseError
from .model import CATEGORIES, ROLES, SAFETY, SCOPES, SEVERITIES, Edit, Fix, Scope, Signature
from .regex_safety import RegexSafetyError, check_regex_safety

SCHEMA_VERSION = 1
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available: 10x faster

_SIG_FIELDS = {
    "id", "slug", "title", "category", "severity", "role", "scope", "match", "cause", "confirm",
    "fixes", "references", "applies", "tests", "priority", "supersedes", "demoted_by", "refines", "metric",
    "preflight", "version", "last_verified", "aliases", "tags",
}
_MATCH_FIELDS = {"anchors", "regex", "captures_when"}
_EDIT_OPS = {"set", "scale", "add", "delete"}


class DatabaseError(DiagnoseError):
    """A database file is invalid. The message names the file and the signature id."""


@dataclass
class Database:
    signatures: list[Signature]
    by_id: dict[str, Signature] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    root: str = ""  # the folder it was loaded from (its layers/ tables: layer_tables.py)

    def __post_init__(self):
        self.by_id = {s.id: s for s in self.signatures}
        for s in self.signatures:
            for alias in s.aliases:
                self.by_id.setdefault(alias, s)

    def get(self, key: str) -> Signature | None:
        if key in self.by_id:
            return self.by_id[key]
        for s in self.signatures:
            if s.slug == key:
                return s
        return None

    def line_signatures(self) -> list[Signature]:
        return [s for s in self.signatures if s.scope in ("line", "refine") and s.anchors]

    def of_scope(self, scope: str) -> list[Signature]:
        return [s for s in self.signatures if s.scope == scope]

    def refiners_of(self, sig: Signature) -> list[Signature]:
        return [
            r for r in self.signatures
            if r.scope == Scope.REFINE and (sig.id in r.refines or f"category:{sig.category}" in r.refines)
        ]


def default_path() -> Path:
    """``$DIAGNOSE_SIGNATURES``, else the repo's ``signatures/``, else the copy in the wheel."""
    env = os.environ.get("DIAGNOSE_SIGNATURES")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parent.parent / "signatures"
    if repo.is_dir():
        return repo
    return Path(__file__).resolve().parent / "_db"


def load(path: str | None = None) -> Database:
    """The database in ``path`` (default: default_path()), loaded once per folder."""
    return _load(str(Path(path) if path else default_path()))


@lru_cache(maxsize=8)
def _load(path: str) -> Database:
    root = Path(path)
    if not root.is_dir():
        raise DatabaseError(f"{root}: signature database folder not found")
    files = sorted(p for p in root.glob("*.yaml"))
    if not files:
        raise DatabaseError(f"{root}: no signature files (*.yaml)")
    sigs: list[Signature] = []
    seen: dict[str, str] = {}
    for f in files:
        for sig in _load_file(f):
            for key in (sig.id, sig.slug, *sig.aliases):
                if key in seen:
                    raise DatabaseError(f"{f.name}: {sig.id}: duplicate id/slug {key!r} (also in {seen[key]})")
                seen[key] = f.name
            sigs.append(sig)
    db = Database(sigs, files=[f.name for f in files], root=str(root))
    for s in sigs:
        for ref in (*s.supersedes, *s.demoted_by, *[r for r in s.refines if not r.startswith("category:")]):
            if ref not in db.by_id:
                raise DatabaseError(f"{s.file}: {s.id}: refers to unknown signature {ref!r}")
    from . import layer_tables as layers

    try:
        layers.check_against(layers.load_tables(str(root)), db)
    except layers.LayerError as exc:
        raise DatabaseError(str(exc)) from None
    return db


def _names(raw: dict, key: str) -> tuple:
    """A list of strings (ids, tags): empty where absent."""
    v = raw.get(key)
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise DatabaseError(f"{key!r} must be a list of strings, got {v!r:.60}")
    return tuple(v)


def _version(v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 10**6:
        raise DatabaseError(f"version: expected a positive integer, got {v!r:.60}")
    return v


def _priority(v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not -1000 <= v <= 1000:
        raise DatabaseError(f"priority: expected an integer in [-1000, 1000], got {v!r}")
    return v


def _load_file(path: Path) -> Iterable[Signature]:
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except yaml.YAMLError as exc:  # its message spans lines (the mark, a caret): one line here
        raise DatabaseError(f"{path.name}: invalid YAML: {' '.join(str(exc).split())}") from None
    except UnicodeDecodeError:
        raise DatabaseError(f"{path.name}: not UTF-8 text") from None
    except OSError as exc:
        raise DatabaseError(f"{path.name}: cannot read ({exc.strerror or exc})") from None
    if not isinstance(doc, dict) or "signatures" not in doc:
        raise DatabaseError(f"{path.name}: expected a mapping with 'schema_version' and 'signatures'")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise DatabaseError(
            f"{path.name}: schema_version {doc.get('schema_version')!r} is not supported (expected {SCHEMA_VERSION})"
        )
    entries = doc["signatures"]
    if not isinstance(entries, list):
        raise DatabaseError(f"{path.name}: 'signatures' must be a list")
    for i, raw in enumerate(entries):
        sid = raw.get("id", f"#{i}") if isinstance(raw, dict) else f"#{i}"
        try:
            yield _build(raw, path.name)
        except DatabaseError as exc:
            raise DatabaseError(f"{path.name}: {sid}: {exc}") from None


def _need(raw: dict, key: str, kind=str):
    if key not in raw:
        raise DatabaseError(f"missing required field {key!r}")
    val = raw[key]
    if kind is not None and not isinstance(val, kind):
        raise DatabaseError(f"field {key!r} must be {kind.__name__}")
    return val


def _choice(raw: dict, key: str, choices, default=None):
    val = raw.get(key, default)
    if val not in choices:
        raise DatabaseError(f"{key} {val!r} is not one of {', '.join(choices)}")
    return next((c for c in choices if c == val), val)  # the vocabulary's member (a StrEnum where it is one)


def _fix(raw, where) -> Fix:
    if isinstance(raw, str):
        return Fix(text=raw, safety="display-only")
    if not isinstance(raw, dict) or "text" not in raw:
        raise DatabaseError(f"{where}: a fix needs 'text'")
    edits = []
    for e in raw.get("edits", []) or []:
        if not isinstance(e, dict) or "key" not in e:
            raise DatabaseError(f"{where}: an edit needs 'key'")
        op = e.get("op", "set")
        if op not in _EDIT_OPS:
            raise DatabaseError(f"{where}: edit op {op!r} is not one of {sorted(_EDIT_OPS)}")
        edits.append(Edit(key=e["key"], op=op, value=e.get("value"), max=e.get("max"), min=e.get("min")))
    safety = raw.get("safety", "safe" if edits else "display-only")
    if safety not in SAFETY:
        raise DatabaseError(f"{where}: safety {safety!r} is not one of {', '.join(SAFETY)}")
    when = raw.get("when")
    if when:
        try:
            predicate.compile_predicate(when)
        except predicate.PredicateError as exc:
            raise DatabaseError(f"{where}: {exc}") from None
    return Fix(text=raw["text"].strip(), safety=safety, edits=tuple(edits), compute=raw.get("compute"),
               when=when, effect=raw.get("effect"))


def _tests(raw, scope) -> tuple[tuple, tuple]:
    tests = raw.get("tests")
    if not isinstance(tests, dict) or not tests.get("match"):
        raise DatabaseError("has no examples: 'tests.match' must list at least one case")
    match, no_match = tests.get("match") or [], tests.get("no_match") or []
    for case in (*match, *no_match):
        if not isinstance(case, (str, dict)):
            raise DatabaseError("a test case is a line (string) or a mapping {line|log, config}")
        if isinstance(case, dict) and not ({"line", "log"} & set(case)) and not (
            scope == Scope.CONFIG and "config" in case
        ):
            raise DatabaseError("a test case mapping needs 'line' or 'log' (or 'config' for a config rule)")
        if isinstance(case, dict) and set(case) - {"line", "log", "config", "baseline_ms"}:
            raise DatabaseError("a test case mapping takes only line|log, config and baseline_ms")
    return tuple(match), tuple(no_match)


def _build(raw: dict, fname: str) -> Signature:
    if not isinstance(raw, dict):
        raise DatabaseError("a signature must be a mapping")
    unknown = set(raw) - _SIG_FIELDS
    if unknown:
        raise DatabaseError(f"unknown field(s) {sorted(unknown)}")
    sid = _need(raw, "id")
    if not regex.fullmatch(r"MB-[A-Z]+-\d{3}", sid):
        raise DatabaseError(f"id {sid!r} must look like MB-FAMILY-123")
    slug = _need(raw, "slug")
    if not regex.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", slug):
        raise DatabaseError(f"slug {slug!r} must be kebab-case")
    category = _choice(raw, "category", CATEGORIES)
    severity = _choice(raw, "severity", SEVERITIES)
    role = _choice(raw, "role", ROLES)
    scope = _choice(raw, "scope", SCOPES, "line")
    match = raw.get("match") or {}
    if not isinstance(match, dict) or set(match) - _MATCH_FIELDS:
        raise DatabaseError(f"'match' accepts only {sorted(_MATCH_FIELDS)}")
    anchors = match.get("anchors") or []
    if isinstance(anchors, str):
        anchors = [anchors]
    if not all(isinstance(a, str) and a for a in anchors):
        raise DatabaseError("anchors must be non-empty strings")
    pattern = match.get("regex")
    if pattern is not None and not isinstance(pattern, str):
        raise DatabaseError(f"regex must be a string, got {pattern!r}")
    if scope == Scope.LINE and not anchors:
        raise DatabaseError("a line signature needs at least one literal anchor")
    if pattern is not None:
        try:
            regex.compile(pattern)
        except regex.error as exc:
            raise DatabaseError(f"regex does not compile: {exc}") from None
        try:
            check_regex_safety(pattern)
        except RegexSafetyError as exc:
            raise DatabaseError(str(exc)) from None
    for key in ("metric",):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise DatabaseError(f"{key!r} must be a string, got {raw[key]!r:.60}")
    if match.get("captures_when") is not None and not isinstance(match["captures_when"], str):
        raise DatabaseError("'match.captures_when' must be a predicate string")
    refines = _names(raw, "refines")
    if scope == Scope.REFINE and not refines:
        raise DatabaseError("a refine signature needs 'refines'")
    if scope == Scope.CONFIG and not (raw.get("confirm") or {}).get("when"):
        raise DatabaseError("a config signature needs a 'confirm.when' predicate")
    if scope == Scope.METRIC and not raw.get("metric"):
        raise DatabaseError("a metric signature needs a 'metric' predicate")
    confirm = raw.get("confirm") or {}
    if isinstance(confirm, str):
        confirm = {"text": confirm}
    if not isinstance(confirm, dict) or set(confirm) - {"text", "when"} or not all(
            isinstance(v, str) for v in confirm.values() if v is not None):
        raise DatabaseError("'confirm' is a text, or a mapping of 'text' and 'when' strings")
    for expr in (confirm.get("when"), raw.get("metric"), match.get("captures_when")):
        if expr:
            try:
                predicate.compile_predicate(expr)
            except predicate.PredicateError as exc:
                raise DatabaseError(str(exc)) from None
    applies = raw.get("applies") or {}
    if not isinstance(applies, dict):
        raise DatabaseError("'applies' maps a framework to a PEP 440 specifier")
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    for fw, spec in applies.items():
        try:
            SpecifierSet(str(spec))
        except InvalidSpecifier:
            raise DatabaseError(f"applies[{fw}]: {spec!r} is not a version specifier") from None
    if not isinstance(raw.get("fixes") or [], list):
        raise DatabaseError("'fixes' must be a list")
    fixes = tuple(_fix(f, f"fix #{i}") for i, f in enumerate(raw.get("fixes") or []))
    tm, tn = _tests(raw, scope)
    for k in ("cause", "title"):
        _need(raw, k)
    refs = raw.get("references") or []
    if not isinstance(refs, list):
        raise DatabaseError("'references' must be a list")
    return Signature(
        id=sid, slug=slug, title=raw["title"].strip(), category=category, severity=severity,
        role=role, scope=scope, anchors=tuple(anchors), regex=pattern,
        cause=raw["cause"].strip(), confirm_text=(confirm.get("text") or "").strip(),
        confirm_when=confirm.get("when"), fixes=fixes,
        references=tuple(r if isinstance(r, dict) else {"path": str(r)} for r in refs),
        applies={k: str(v) for k, v in applies.items()}, tests_match=tm, tests_no_match=tn,
        file=fname, priority=_priority(raw.get("priority", 50)),
        supersedes=_names(raw, "supersedes"), demoted_by=_names(raw, "demoted_by"),
        refines=refines,
        metric=raw.get("metric"), when_captures=match.get("captures_when"),
        preflight=bool(raw.get("preflight", False)),
        version=_version(raw.get("version", 1)), last_verified=str(raw.get("last_verified") or "") or None,
        aliases=_names(raw, "aliases"), tags=_names(raw, "tags"),
    )


def applies_to(sig: Signature, versions: dict) -> bool:
    """Does ``sig`` apply to the framework ``versions`` ({"megatron-core": "0.16.1"})?

    A framework whose version is not known does not exclude the signature.
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    for fw, spec in sig.applies.items():
        v = versions.get(fw)
        if not v:
            continue
        try:
            if Version(str(v)) not in SpecifierSet(spec, prereleases=True):
                return False
        except InvalidVersion:
            continue
    return True
