"""The Hyperscan engine: every anchor in one pass over the buffer (optional extra ``diagnose[fast]``).

All anchors are compiled as literals (Hyperscan >= 5.2's literal compiler; regex-escaped
expressions where that compiler is missing) into one block-mode database; ids index the literal
table, so a match's end offset gives its start (no start-of-match tracking needed). Results are
those of :class:`~diagnose.match.regex_engine.RegexEngine` exactly: every occurrence of every literal.
"""
from __future__ import annotations

from typing import Any

from .engine import Engine

_hs: Any
try:  # the optional extra; available() says whether it can be used
    import hyperscan as _hs
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    _hs = None


def _escape(lit: bytes) -> bytes:
    """A literal as a Hyperscan expression: every byte that is not a letter or digit as \\xHH."""
    return b"".join(bytes([c]) if (48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122) else b"\\x%02x" % c
                    for c in lit)


class HyperscanEngine(Engine):
    name = "hyperscan"

    _ok = None

    @classmethod
    def available(cls) -> bool:
        """Is the hyperscan module importable and able to compile and scan on this CPU?"""
        if cls._ok is None:
            try:
                cls._compile([b"ok"]).scan(b"ok", match_event_handler=lambda *a: None)
                cls._ok = True
            except Exception:  # noqa: BLE001 - ImportError, ArchitectureError (no SSSE3), a broken build
                cls._ok = False
        return cls._ok

    @staticmethod
    def _compile(lits: list):
        if _hs is None:
            raise ImportError("hyperscan is not installed (pip install 'diagnose[fast]')")
        db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        ids = list(range(len(lits)))
        try:
            db.compile(expressions=lits, ids=ids, elements=len(lits), flags=0, literal=True)
        except (TypeError, _hs.error):  # Hyperscan < 5.2: no literal compiler
            db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
            db.compile(expressions=[_escape(x) for x in lits], ids=ids, elements=len(lits), flags=0)
        return db

    def __init__(self, anchors: dict[str, tuple[str, ...]], dense=()):
        super().__init__(anchors, dense)
        self.dense_keys = tuple(dense)
        self.lits = list(self.by_literal)
        self.lens = [len(x) for x in self.lits]
        self.db = self._compile(self.lits) if self.lits else None

    def occurrences(self, buf: bytes) -> dict:
        """One pass; the match callback only appends an offset to its literal's list."""
        if self.db is None or not buf:
            return {}
        lists: list[list[int]] = [[] for _ in self.lits]
        push = [x.append for x in lists]
        lens = self.lens
        self.db.scan(buf, match_event_handler=lambda i, _s, end, _f, _c: push[i](end - lens[i]))
        return {lit: offs for lit, offs in zip(self.lits, lists) if offs}

    def __getstate__(self):  # the compiled database is rebuilt in a worker process, never pickled
        return {"anchors": self.anchors, "dense": self.dense_keys}

    def __setstate__(self, state):
        HyperscanEngine.__init__(self, state["anchors"], state.get("dense", ()))
