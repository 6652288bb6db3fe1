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
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError

from .. import atomic
from ..edits import DELETE
from ..errors import DiagnoseError


class EditError(DiagnoseError):
    """The config cannot be rewritten (one line for the user)."""


LOCK_SUFFIX = ".diagnose.lock"


@dataclass(frozen=True)
class Snapshot:
    path: Path  # the file itself: a symbolic link is followed to its target, which is edited
    text: str  # with LF line ends and no BOM (what the YAML parser reads)
    sha256: str
    crlf: bool = False  # the file ends its lines with CR LF: written back so
    bom: bool = False  # the file starts with a UTF-8 byte-order mark: written back so

    def encode(self, text: str) -> bytes:
        """``text`` in the file's own line ends and BOM."""
        if self.crlf:
            text = text.replace("\r\n", "\n").replace("\n", "\r\n")
        return (b"\xef\xbb\xbf" if self.bom else b"") + text.encode("utf-8")


def snapshot(path: str | os.PathLike) -> Snapshot:
    p = Path(path)
    if p.is_symlink():
        try:
            p = p.resolve(strict=True)
        except (OSError, RuntimeError):
            raise EditError(f"{path}: a symbolic link to nothing (or a loop)") from None
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise EditError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise EditError(f"{path}: is a directory, expected a YAML file") from None
    except OSError as exc:
        raise EditError(f"{path}: cannot read ({exc.strerror or exc})") from None
    bom = raw.startswith(b"\xef\xbb\xbf")
    try:
        text = raw[3 if bom else 0:].decode("utf-8")
    except UnicodeDecodeError:
        raise EditError(f"{path}: not UTF-8 text") from None
    crlf = "\r\n" in text and text.count("\r\n") == text.count("\n")
    if crlf:
        text = text.replace("\r\n", "\n")
    return Snapshot(p, text, hashlib.sha256(raw).hexdigest(), crlf, bom)


def guess_indent(text: str) -> tuple[int, int]:
    """(mapping indent, dash offset of block sequences under their key), as the file writes them."""
    mapping: int | None = None
    offset: int | None = None
    prev_indent: int | None = None
    prev_is_key = False
    for line in text.splitlines():
        body = line.lstrip(" ")
        if not body or body.startswith("#"):
            continue
        ind = len(line) - len(body)
        if prev_is_key and prev_indent is not None and (ind > prev_indent or body.startswith("- ")):
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


def _resolve(doc: dict, dotted: str, create: bool) -> tuple[dict | None, str]:
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


def _insert_sorted(m: Any, key: str, value: Any):  # a ruamel CommentedMap (it has .insert)
    """Add a new key where an alphabetically sorted file (Bridge's to_yaml) would have it."""
    keys = [k for k in m]
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
        assert holder is not None  # create=True makes the sections on the way
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


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat): with the PID, who it is (a PID
    alone is reused). None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return stat[stat.rfind(b")") + 2:].split()[19].decode()
    except (OSError, IndexError, ValueError):
        return None


LOCK_GRACE_S = 10.0  # a lock file still empty (or unreadable) after this long was left by a crash


class FileLock:
    """An exclusive lock file beside the config (O_CREAT|O_EXCL), holding the owner's PID and
    process start time. A lock whose process is gone, whose PID now belongs to another process
    (another start time), or that is still empty or unreadable after LOCK_GRACE_S (a crash
    between create and write, a full disk) is stale: it is taken over and said so."""

    def __init__(self, path: Path):
        self.path = path.with_name(path.name + LOCK_SUFFIX)
        self.held = False
        self.took_over: str | None = None  # why a stale lock was taken over

    def __enter__(self):
        # the lock is born complete: its content goes to a temporary file that is then hard-linked
        # to the lock name (a link never replaces an existing file), so a kill -9 can leave no
        # empty lock behind
        try:
            tmp = atomic.durable_temp(self.path, f"{os.getpid()} {_start_time(os.getpid()) or '-'}\n", ".tmp", 0o644)
        except OSError as exc:
            raise EditError(f"cannot create the lock file {self.path}: {exc.strerror or exc}") from None
        try:
            for _ in range(3):
                try:
                    os.link(tmp, self.path)
                except FileExistsError:
                    why = self._stale()
                    if why:
                        try:
                            self.path.unlink()
                        except FileNotFoundError:
                            pass
                        self.took_over = why
                        continue
                    raise EditError(f"{self.path.name[:-len(LOCK_SUFFIX)]} is being edited by another diagnose "
                                    f"--fix (lock {self.path}, pid {self._owner()[0]}); try again when it has "
                                    "finished") from None
                except OSError as exc:
                    raise EditError(f"cannot create the lock file {self.path}: {exc.strerror or exc}") from None
                self.held = True
                return self
            raise EditError(f"cannot take the lock {self.path}")
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _owner(self) -> tuple:
        try:
            parts = self.path.read_text().split()
            return int(parts[0]), (parts[1] if len(parts) > 1 and parts[1] != "-" else None)
        except (OSError, ValueError, IndexError, UnicodeDecodeError):
            return None, None

    def _stale(self) -> str | None:
        pid, started = self._owner()
        if pid is None:
            try:
                age = time.time() - os.stat(self.path).st_mtime
            except FileNotFoundError:
                return "gone"
            except OSError:
                return None
            return f"empty or unreadable for {age:.0f} s" if age > LOCK_GRACE_S else None
        if pid == os.getpid():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"pid {pid} is gone"
        except PermissionError:
            pass  # alive, another user's
        now = _start_time(pid)
        if started and now and now != started:
            return f"pid {pid} is another process now"
        return None

    def __exit__(self, *exc):
        if self.held:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            self.held = False
        return False


def _write_backup(path: Path, text, mode: int = 0o600, owner: tuple | None = None) -> Path:
    """The old text as ``NAME.bak[.N]``, complete or not at all: written to a temporary file,
    fsynced, then hard-linked to the first free backup name (a link never replaces a file, so an
    older backup is never overwritten, and a kill -9 leaves no half-written backup)."""
    try:
        tmp = atomic.durable_temp(path, text, ".bak.tmp", mode, owner)
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
    backup: Path | None
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
        mode, owner = None, None
        try:
            st = os.stat(path)
            mode, owner = st.st_mode & 0o7777, (st.st_uid, st.st_gid)
        except OSError:
            pass
        if mode is not None and not mode & 0o222:
            raise EditError(f"{path} is read-only (no write permission bit); not editing it "
                            "(chmod u+w it to let --fix write, or use --overrides)")
        # the backup and the new file keep the original's mode, owner and group: a 0600 config
        # stays private, and one owned by its user stays theirs
        bak = _write_backup(path, snap.encode(snap.text), mode if mode is not None else 0o600, owner)
        try:
            atomic.replace(path, snap.encode(new_text), mode, owner)
        except OSError as exc:
            raise EditError(f"cannot write the new config beside {path}: {exc.strerror or exc}") from None
    return WriteResult(path, bak, diff, True)
