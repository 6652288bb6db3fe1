"""The evidence-layer tables of the signature database (``signatures/layers/*.yaml``).

Data, loaded and checked with the database (db.py): the rows that read an exception by its type
and message (``by_exception``), a traceback by its frames and source lines (``by_traceback``),
what the job was doing just before a failure (``by_context``), and the line tables: kinds of
line that output can stop on (the lines a job prints while it sets up its process groups,
``startup_lines``; while an RL job hands its weights to the rollout engine,
``rollout_sync_lines``; while NCCL retries a connection, ``connect_retry_lines``).
analyze/layers.py applies the rows; analyze/symptoms.py reads the line tables.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path

import regex
import yaml

from .errors import DiagnoseError
from .model import Scope

BASES = ("signature", "anchor", "exception", "traceback", "context", "wrapper", "symptom", "cascade", "failure")
_ROW_FIELDS = {"id", "signature", "types", "message", "frames", "source", "innermost", "before", "within", "cut"}
_TIMEOUT = 0.25
_NAME = regex.compile(r"[A-Za-z_]\w*")


class LayerError(DiagnoseError):
    """A layer table is invalid. The message names the file and the row."""


@dataclass(frozen=True)
class Row:
    id: str
    signature: str
    types: frozenset = frozenset()
    message: regex.Pattern | None = None
    frames: regex.Pattern | None = None
    source: regex.Pattern | None = None
    innermost: int | None = None
    before: regex.Pattern | None = None  # by_context: an activity line just before
    within: int = 0  # by_context: at most this many lines before the traceback
    cut: bool = False  # by_traceback: holds only for a traceback that lost its exception line

    @property
    def basis(self) -> str:
        if self.before is not None:
            return "context"
        return "traceback" if (self.frames or self.source) else "exception"

    def holds(self, etype: str | None, message: str, frames: list, source: list) -> bool:
        # every class name the type names: ray.exceptions.RayTaskError(OutOfMemoryError) is both
        if self.types and not self.types.intersection(_NAME.findall(etype or "")):
            return False
        if self.cut and etype:
            return False
        try:
            if self.message is not None and not self.message.search(message or "", timeout=_TIMEOUT):
                return False
            n = self.innermost
            if self.frames is not None:
                fr = frames[-n:] if n else frames
                if not any(self.frames.search(f, timeout=_TIMEOUT) for f in fr):
                    return False
            if self.source is not None:
                src = source[-n:] if n else source
                if not any(s and self.source.search(s, timeout=_TIMEOUT) for s in src):
                    return False
        except TimeoutError:
            return False
        return True


@dataclass(frozen=True)
class Tables:
    by_exception: tuple
    by_traceback: tuple
    by_context: tuple = ()
    # line table name (LINE_TABLES) -> its (id, regex) rows
    lines: dict = field(default_factory=dict)

    @property
    def startup(self) -> tuple:
        """The rows of the lines a job prints while it sets up its process groups (startup.yaml)."""
        return self.lines.get("startup_lines", ())

    def startup_line(self, text: str) -> bool:
        """Is ``text`` a distributed start-up line (``startup_lines``)?"""
        return _any(self.startup, text)

    def rollout_sync_line(self, text: str) -> bool:
        """Is ``text`` a line of the weight hand-over to a rollout engine (``rollout_sync_lines``)?"""
        return _any(self.lines.get("rollout_sync_lines", ()), text)

    def stops(self) -> dict:
        """{metric: predicate} for the line tables read at the end of any log, progress or not
        (LINE_TABLES): the start-up table is read apart, only where no step was made."""
        return {metric: partial(_any, self.lines[name])
                for name, metric in LINE_TABLES.items() if metric and self.lines.get(name)}

    def rows(self):
        return self.by_exception + self.by_traceback + self.by_context


def _any(table: tuple, text: str) -> bool:
    for _, rx in table:
        try:
            if rx.search(text, timeout=_TIMEOUT):
                return True
        except TimeoutError:
            continue
    return False


# sections of {id, regex} rows, and the metric (analyze/symptoms.py) set where every file of a
# log stops on one of their lines; the start-up table's (ends_in_init) also needs a log without
# a step, so symptoms.compute reads it apart
LINE_TABLES = {
    "startup_lines": None,
    "rollout_sync_lines": "ends_in_rollout_sync",
    "connect_retry_lines": "ends_in_connect_retry",
}


def _row(raw, fname: str, section: str) -> Row:
    if not isinstance(raw, dict):
        raise LayerError(f"{fname}: {section}: a row must be a mapping")
    rid = raw.get("id", "?")
    unknown = set(raw) - _ROW_FIELDS
    if unknown:
        raise LayerError(f"{fname}: {rid}: unknown field(s) {sorted(unknown)}")
    if not isinstance(raw.get("id"), str) or not isinstance(raw.get("signature"), str):
        raise LayerError(f"{fname}: {rid}: 'id' and 'signature' are required strings")
    pats = {}
    for key in ("message", "frames", "source", "before"):
        if key in raw:
            try:
                pats[key] = regex.compile(raw[key], regex.IGNORECASE if key == "message" else 0)
            except (regex.error, TypeError) as exc:
                raise LayerError(f"{fname}: {rid}: {key} does not compile: {exc}") from None
    types = raw.get("types") or []
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise LayerError(f"{fname}: {rid}: 'types' must be a list of class names")
    if section == "by_exception" and ("frames" in pats or "source" in pats):
        raise LayerError(f"{fname}: {rid}: by_exception rows read the type and message only")
    if section == "by_traceback" and not ("frames" in pats or "source" in pats):
        raise LayerError(f"{fname}: {rid}: a by_traceback row needs 'frames' or 'source'")
    if (section == "by_context") != ("before" in pats):
        raise LayerError(f"{fname}: {rid}: 'before' (with 'within') is for by_context rows, and they need it")
    within = raw.get("within", 0)
    if "before" in pats and (not isinstance(within, int) or within < 1):
        raise LayerError(f"{fname}: {rid}: 'within' must be a positive number of lines")
    if not (types or pats):
        raise LayerError(f"{fname}: {rid}: a row needs 'types', 'message', 'frames' or 'source'")
    cut = raw.get("cut", False)
    if not isinstance(cut, bool) or (cut and section != "by_traceback"):
        raise LayerError(f"{fname}: {rid}: 'cut' is true or false, and only for by_traceback rows")
    inner = raw.get("innermost")
    if inner is not None and (not isinstance(inner, int) or inner < 1):
        raise LayerError(f"{fname}: {rid}: 'innermost' must be a positive integer")
    return Row(raw["id"], raw["signature"], frozenset(types), pats.get("message"), pats.get("frames"),
               pats.get("source"), inner, pats.get("before"), within if "before" in pats else 0, cut)


def load_tables(db_root: str) -> Tables:
    """The tables in ``<database>/layers/*.yaml`` (none: empty tables)."""
    return _load(str(db_root))


@lru_cache(maxsize=8)
def _load(db_root: str) -> Tables:
    exc: list[Row] = []
    tb: list[Row] = []
    ctx: list[Row] = []
    lines: dict[str, list[tuple]] = {name: [] for name in LINE_TABLES}
    seen: set[str] = set()
    for path in sorted(Path(db_root, "layers").glob("*.yaml")):
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise LayerError(f"{path.name}: invalid YAML: {e}") from None
        if not isinstance(doc, dict) or doc.get("schema_version") != 1:
            raise LayerError(f"{path.name}: expected a mapping with schema_version: 1")
        extra = set(doc) - {"schema_version", "by_exception", "by_traceback", "by_context", *LINE_TABLES}
        if extra:
            raise LayerError(f"{path.name}: unknown section(s) {sorted(extra)}")
        for name in LINE_TABLES:
            for raw in doc.get(name) or []:
                if not isinstance(raw, dict) or set(raw) != {"id", "regex"} or not all(
                        isinstance(raw[k], str) for k in ("id", "regex")):
                    raise LayerError(f"{path.name}: {name}: each row is {{id, regex}} (strings)")
                if raw["id"] in seen:
                    raise LayerError(f"{path.name}: {raw['id']}: duplicate row id")
                seen.add(raw["id"])
                try:
                    lines[name].append((raw["id"], regex.compile(raw["regex"])))
                except regex.error as exc_:
                    raise LayerError(f"{path.name}: {raw['id']}: regex does not compile: {exc_}") from None
        for section, out in (("by_exception", exc), ("by_traceback", tb), ("by_context", ctx)):
            for raw in doc.get(section) or []:
                row = _row(raw, path.name, section)
                if row.id in seen:
                    raise LayerError(f"{path.name}: {row.id}: duplicate row id")
                seen.add(row.id)
                out.append(row)
    return Tables(tuple(exc), tuple(tb), tuple(ctx), {name: tuple(rows) for name, rows in lines.items()})


def check_against(tables: Tables, db) -> None:
    """Every row must name a ``scope: layer`` signature of the database."""
    for row in tables.rows():
        sig = db.get(row.signature)
        if sig is None or sig.scope != Scope.LAYER:
            raise LayerError(f"layers: {row.id}: {row.signature!r} is not a scope: layer signature")
