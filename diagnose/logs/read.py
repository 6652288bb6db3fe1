"""From paths to byte chunks of whole lines, at constant memory.

``iter_sources(paths)`` expands folders (recursively, sorted, symlink loops skipped) and ``-``
(stdin). ``read_chunks(source)`` streams a file, a ``.gz`` (by magic bytes, not by name) or
stdin as chunks that end on a newline, each with the number of the first line it holds. A line
longer than ``MAX_LINE`` is cut into pieces so that memory stays bounded whatever the input.
"""
from __future__ import annotations

import gzip
import os
import stat
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

CHUNK = 8 << 20  # bytes read at a time
MAX_LINE = 1 << 20  # a line longer than this is split (a 100 MB line without newline is not held whole)


class InputError(Exception):
    """An input path cannot be read at all (the message is one line, for the user)."""


@dataclass(frozen=True)
class Source:
    name: str  # what reports show: the path as given (or "-")
    path: Optional[Path]  # None for stdin


@dataclass
class Chunk:
    data: bytes  # whole lines (the last one may lack its newline at end of input)
    first_line: int  # 1-based number of data's first line in the source
    offset: int  # byte offset of data in the (decompressed) source


def iter_sources(paths, notes: list) -> Iterator[Source]:
    """Expand the user's paths. Problems that leave other inputs readable go to ``notes``."""
    for raw in paths:
        if raw == "-":
            yield Source("-", None)
            continue
        p = Path(raw)
        try:
            st = p.stat()
        except FileNotFoundError:
            notes.append(f"{raw}: no such file or directory")
            continue
        except OSError as exc:
            notes.append(f"{raw}: cannot read ({exc.strerror or exc})")
            continue
        if stat.S_ISDIR(st.st_mode):
            yield from _walk(p, notes)
        elif stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            yield Source(str(raw), p)
        else:
            notes.append(f"{raw}: not a regular file, skipped")


def _walk(root: Path, notes: list) -> Iterator[Source]:
    seen = set()
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            real = d.resolve()
        except (OSError, RuntimeError):
            notes.append(f"{d}: cannot resolve (symlink loop?), skipped")
            continue
        if real in seen:
            notes.append(f"{d}: directory loop, skipped")
            continue
        seen.add(real)
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as exc:
            notes.append(f"{d}: cannot list ({exc.strerror or exc})")
            continue
        subdirs = []
        for e in entries:
            try:
                if e.is_dir():
                    subdirs.append(Path(e.path))
                elif e.is_file():
                    yield Source(e.path, Path(e.path))
            except OSError as exc:
                notes.append(f"{e.path}: cannot read ({exc.strerror or exc})")
        stack.extend(reversed(subdirs))


def _open(source: Source):
    if source.path is None:
        raw = sys.stdin.buffer
    else:
        raw = open(source.path, "rb")  # noqa: SIM115 - closed by read_chunks
    head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    if head == b"\x1f\x8b":
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")
    return raw, raw


def read_chunks(source: Source, notes: list, chunk_size: int = CHUNK) -> Iterator[Chunk]:
    """Stream ``source`` as chunks of whole lines; read errors end the file with a note."""
    try:
        raw, stream = _open(source)
    except OSError as exc:
        notes.append(f"{source.name}: cannot read ({exc.strerror or exc})")
        return
    carry = b""
    line_no = 1
    offset = 0
    try:
        while True:
            try:
                block = stream.read(chunk_size)
            except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
                kind = "truncated or corrupt gzip" if stream is not raw else "read error"
                notes.append(f"{source.name}: {kind} after {offset + len(carry)} bytes ({exc}); scanned what was readable")
                block = b""
            if not block:
                break
            data = carry + block
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                if len(data) < MAX_LINE:
                    carry = data
                    continue
                cut = len(data)  # an over-long line: hand it on in pieces
            out, carry = data[:cut], data[cut:]
            yield Chunk(out, line_no, offset)
            line_no += out.count(b"\n") + (0 if out.endswith(b"\n") else 1)
            offset += len(out)
        if carry:
            yield Chunk(carry, line_no, offset)
    finally:
        if source.path is not None:
            try:
                raw.close()
            except OSError:
                pass
