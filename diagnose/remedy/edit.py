"""Write a plan into the user's YAML: round trip, backup, atomic replace, diff.

``snapshot(path)`` reads the file once (text + sha256). ``render(snap, changes)`` applies
concrete ``(key, value | DELETE)`` changes with ruamel.yaml's round-trip mode, so comments, key
order, ``_target_`` entries and quoting survive; only the edited lines change. ``write(snap,
new_text)`` then, under a lock file against a second concurrent ``--fix``:

1. refuses if the file changed since the snapshot (someone edited it between plan and write);
2. keeps the original beside it as ``NAME.bak`` (then ``NAME.bak.1``, ``.2`` ...: an older backup
   is never overwritten);
3. writes a temporary file in the same folder, fsyncs it and ``os.replace``s the original (the
   file is at every moment either the old or the new version).
"""
from __future__ import annotations

import difflib
import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError

from .. import atomic


class EditError(Exception):
    """The config cannot be rewritten (one line for the user)."""


class _Delete:
    def __repr__(self):
        return "DELETE"


DELETE = _Delete()
LOCK_SUFFIX = ".diagnose.lock"


@dataclass(frozen=True)
class Snapshot:
    path: Path
    text: str
    sha256: str


def snapshot(path: str | os.PathLike) -> Snapshot:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise EditError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise EditError(f"{path}: is a directory, expected a YAML file") from None
    except OSError as exc:
        raise EditError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise EditError(f"{path}: not UTF-8 text") from None
    return Snapshot(p, text, hashlib.sha256(raw).hexdigest())


def guess_indent(text: str) -> tuple[int, int]:
    """(mapping indent, dash offset of block sequences under their key), as the file writes them."""
    mapping = offset = None
    prev_indent, prev_is_key = None, False
    for line in text.splitlines():
        body = line.lstrip(" ")
        if not body or body.startswith("#"):
            continue
        ind = len(line) - len(body)
        if prev_is_key and prev_indent is not None and ind > prev_indent or (prev_is_key and body.startswith("- ")):
            if body.startswith("- ") or body == "-":
                if offset is None:
                    offset = ind - prev_indent
            elif mapping is None:
                mapping = ind - prev_indent
        stripped = body.split(" #")[0].rstrip()
        prev_is_key = stripped.endswith(":") and not body.startswith("- ")
        prev_indent = ind
        if mapping is not None and offset is not None:
            break
    return mapping or 2, max(offset or 0, 0)


def _yaml(text: str) -> tuple[YAML, Any]:
    indent, offset = guess_indent(text)
    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.width = 1 << 16  # never re-wrap long lines
    y.indent(mapping=indent, sequence=offset + 2, offset=offset)
    # ruamel writes None as an empty value; Bridge's dumps (PyYAML) and humans write null
    y.representer.add_representer(type(None), lambda r, d: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    try:
        doc = y.load(text)
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise EditError(f"invalid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    return y, doc


def _resolve(doc: CommentedMap, dotted: str, create: bool) -> tuple[Optional[CommentedMap], str]:
    """The mapping that holds ``dotted``'s last part (Bridge's newer GPTModelConfig nests the
    transformer fields under model.transformer: edit them where they already live)."""
    parts = dotted.split(".")
    cur = doc
    for i, part in enumerate(parts[:-1]):
        nxt = cur.get(part) if isinstance(cur, dict) else None
        if not isinstance(nxt, dict):
            if not create:
                return None, parts[-1]
            if nxt is not None:
                raise EditError(f"{'.'.join(parts[:i + 1])} is not a section (it holds {nxt!r})")
            nxt = CommentedMap()
            if part in cur:  # "env_vars: null" -> a section
                cur[part] = nxt
            else:
                _insert_sorted(cur, part, nxt)
        cur = nxt
    last = parts[-1]
    if last not in cur and isinstance(cur.get("transformer"), dict) and last in cur["transformer"]:
        return cur["transformer"], last
    return cur, last


def _insert_sorted(m: CommentedMap, key: str, value: Any):
    """Add a new key where an alphabetically sorted file (Bridge's to_yaml) would have it."""
    keys = [k for k in m.keys()]
    if keys == sorted(keys, key=str) and keys:
        pos = len([k for k in keys if str(k) < key])
        m.insert(pos, key, value)
    else:
        m[key] = value


def _plain(v: Any) -> Any:
    if hasattr(v, "items"):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def current_value(snap: Snapshot, dotted: str, default: Any = None) -> Any:
    _, doc = _yaml(snap.text)
    if not isinstance(doc, dict):
        return default
    holder, last = _resolve(doc, dotted, create=False)
    if holder is None or last not in holder:
        return default
    return _plain(holder[last])


def render(snap: Snapshot, changes: Iterable[tuple[str, Any]]) -> str:
    """The file's text with ``changes`` applied (value ``DELETE`` removes the key)."""
    y, doc = _yaml(snap.text)
    if not isinstance(doc, dict):
        raise EditError(f"{snap.path}: the top level must be a mapping of sections (model:, optimizer:, ...)")
    changed = False
    for key, value in changes:
        if value is DELETE:
            holder, last = _resolve(doc, key, create=False)
            if holder is not None and last in holder:
                del holder[last]
                changed = True
            continue
        holder, last = _resolve(doc, key, create=True)
        if last in holder:
            old = holder[last]
            if _plain(old) == value and type(_plain(old)) is type(value):
                continue
            if isinstance(old, dict) and not isinstance(value, dict):
                raise EditError(f"{key} is a section in {snap.path.name}; refusing to replace it by {value!r}")
            holder[last] = value
        else:
            _insert_sorted(holder, last, value)
        changed = True
    if not changed:
        return snap.text
    buf = io.StringIO()
    y.dump(doc, buf)
    out = buf.getvalue()
    if snap.text.startswith("---") and not out.startswith("---"):
        out = "---\n" + out
    return out


def unified_diff(old: str, new: str, path: str | os.PathLike) -> str:
    name = str(path).lstrip("/")  # git's a/ b/ prefixes, also for an absolute path
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"a/{name}", tofile=f"b/{name}"))


def backup_path(path: Path) -> Path:
    """``NAME.bak``, else ``NAME.bak.1``, ``NAME.bak.2``...: the first name not taken."""
    cand = path.with_name(path.name + ".bak")
    n = 0
    while cand.exists() or cand.is_symlink():
        n += 1
        cand = path.with_name(f"{path.name}.bak.{n}")
    return cand


class FileLock:
    """An exclusive lock file beside the config (O_CREAT|O_EXCL; a stale one is taken over)."""

    def __init__(self, path: Path):
        self.path = path.with_name(path.name + LOCK_SUFFIX)
        self.held = False

    def __enter__(self):
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if self._stale():
                    try:
                        self.path.unlink()
                    except FileNotFoundError:
                        pass
                    continue
                raise EditError(f"{self.path.name[:-len(LOCK_SUFFIX)]} is being edited by another diagnose --fix "
                                f"(lock {self.path}, pid {self._owner()}); try again when it has finished") from None
            except OSError as exc:
                raise EditError(f"cannot create the lock file {self.path}: {exc.strerror or exc}") from None
            with os.fdopen(fd, "w") as fh:
                fh.write(f"{os.getpid()}\n")
            self.held = True
            return self
        raise EditError(f"cannot take the lock {self.path}")

    def _owner(self) -> Optional[int]:
        try:
            return int(self.path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _stale(self) -> bool:
        pid = self._owner()
        if pid is None:
            return False  # being written right now, or not ours to judge
        if pid == os.getpid():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def __exit__(self, *exc):
        if self.held:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            self.held = False
        return False


def _write_backup(path: Path, text: str) -> Path:
    """The old text as ``NAME.bak[.N]``, complete or not at all: written to a temporary file,
    fsynced, then hard-linked to the first free backup name (a link never replaces a file, so an
    older backup is never overwritten, and a kill -9 leaves no half-written backup)."""
    try:
        tmp = atomic.durable_temp(path, text, ".bak.tmp", 0o644)
    except OSError as exc:
        raise EditError(f"cannot write a backup beside {path}: {exc.strerror or exc}") from None
    try:
        for _ in range(1000):
            bak = backup_path(path)
            try:
                os.link(tmp, bak)
                return bak
            except FileExistsError:
                continue  # taken a moment ago by someone else: the next name
        raise EditError(f"cannot find a free backup name beside {path}")
    except OSError as exc:
        raise EditError(f"cannot write a backup beside {path}: {exc.strerror or exc}") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


@dataclass
class WriteResult:
    path: Path
    backup: Optional[Path]
    diff: str
    changed: bool


def write(snap: Snapshot, new_text: str) -> WriteResult:
    """Replace ``snap.path`` by ``new_text`` atomically, keeping a backup (see module doc)."""
    path = snap.path
    diff = unified_diff(snap.text, new_text, path)
    if new_text == snap.text:
        return WriteResult(path, None, "", False)
    with FileLock(path):
        now = snapshot(path)
        if now.sha256 != snap.sha256:
            raise EditError(f"{path} changed since the fix was planned; not overwriting it (run --fix again)")
        mode = None
        try:
            mode = os.stat(path).st_mode & 0o7777
        except OSError:
            pass
        if mode is not None and not mode & 0o222:
            raise EditError(f"{path} is read-only (no write permission bit); not editing it "
                            "(chmod u+w it to let --fix write, or use --overrides)")
        bak = _write_backup(path, snap.text)
        try:
            atomic.replace(path, new_text, mode)
        except OSError as exc:
            raise EditError(f"cannot write the new config beside {path}: {exc.strerror or exc}") from None
    return WriteResult(path, bak, diff, True)
