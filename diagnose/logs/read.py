"""From paths to byte chunks of whole lines, at constant memory.

``iter_sources(paths)`` expands folders (recursively, sorted, symlink loops skipped) and ``-``
(stdin). ``read_chunks(source)`` streams a file, a ``.gz``, ``.xz``, ``.bz2`` or ``.zst`` (by magic bytes,
not by name; zstd with the optional ``zstandard``), a UTF-16/32 text (by its BOM, read as UTF-8)
or stdin as chunks that end on a newline (a lone CR is a line end; ANSI codes and NULs are
dropped: ``normalize``), each with the number of the first line it holds. A line
longer than ``MAX_LINE`` is cut into pieces so that memory stays bounded whatever the input.

Hostile inputs: a truncated or corrupt ``.gz`` yields everything decompressed before the damage
(then a note); a named pipe (FIFO) given explicitly is read only if data arrives within
``DIAGNOSE_FIFO_TIMEOUT`` seconds (default 10), else it is skipped with a note; FIFOs, sockets,
devices and broken symlinks inside a folder are skipped with a note; a symlink to a folder that
is already being walked (or to one of its parents) is a loop and skipped.
"""
from __future__ import annotations

import bz2
import codecs
import gzip
import lzma
import os
import re
import select
import stat
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DiagnoseError

CHUNK = 8 << 20  # bytes read at a time
GZIP_MAGIC = b"\x1f\x8b"  # a compressed stream is detected by content, not by name
XZ_MAGIC = b"\xfd7zXZ\x00"
BZ2_MAGIC = b"BZh"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# text in UTF-16/32 (a log written by PowerShell's redirection, some Windows tools): by its BOM
BOMS = ((b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"),
        (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")  # colour codes: never part of a message
_LONE_CR = re.compile(rb"\r(?!\n)")
MAX_LINE = 1 << 20  # a line longer than this is split (a 100 MB line without newline is not held whole)
FIFO_TIMEOUT = 10.0  # seconds to wait for the first data from a named pipe (env DIAGNOSE_FIFO_TIMEOUT)


class InputError(DiagnoseError):
    """An input path cannot be read at all (the message is one line, for the user)."""


@dataclass(frozen=True)
class Source:
    name: str  # what reports show: the path as given (or "-")
    path: Path | None  # None for stdin


@dataclass
class Chunk:
    data: bytes  # whole lines (the last one may lack its newline at end of input)
    first_line: int  # 1-based number of data's first line in the source
    offset: int  # byte offset of data in the (decompressed) source
    # the newlines in data, when the consumer counted them on its way (the scan does): the
    # reader then need not count them again for the next chunk's first_line
    newlines: int | None = None
    size: int | None = None  # bytes of the source this chunk stands for (data may be shorter: normalize)


BINARY_PROBE = 8192  # bytes looked at to tell a binary file (a checkpoint, an image) from a log


def is_binary(path: Path) -> bool:
    """A binary file, as ripgrep decides it (a NUL in the first block) but kinder to logs with
    stray NULs: NULs *and* bytes that are not UTF-8 text. Compressed streams and UTF-16/32 text
    (by their magic bytes / BOM) are logs."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(BINARY_PROBE)
    except OSError:
        return False
    if head[:2] == GZIP_MAGIC or head[:6] == XZ_MAGIC or head[:4] == ZSTD_MAGIC or \
            (head[:3] == BZ2_MAGIC and head[3:4].isdigit()) or any(head.startswith(b) for b, _ in BOMS):
        return False
    if b"\x00" not in head:
        return False
    text = head.replace(b"\x00", b"")
    if len(head) == BINARY_PROBE:
        text = text[:-4]  # a multi-byte character cut by the probe is not binary
    try:
        text.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def iter_sources(paths, notes: list) -> Iterator[Source]:
    """Expand the user's paths. Problems that leave other inputs readable go to ``notes``.
    Binary files (``is_binary``: checkpoints, images, core dumps) are not logs: in a folder they
    are skipped with one note that counts them; named explicitly, with a note of their own."""
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
            binary: list = []
            for src in _walk(p, notes):
                assert src.path is not None  # a folder's files, never stdin
                if is_binary(src.path):
                    binary.append(src.path.name)
                else:
                    yield src
            if binary:
                notes.append(f"{raw}: {len(binary)} binary file(s) skipped (not logs: " + ", ".join(binary[:3])
                             + (", ..." if len(binary) > 3 else "") + ")")
        elif stat.S_ISREG(st.st_mode) and is_binary(p):
            notes.append(f"{raw}: a binary file (NUL bytes and no UTF-8 text in its first {BINARY_PROBE} bytes), "
                         "not a log: skipped")
        elif stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            yield Source(str(raw), p)
        else:
            notes.append(f"{raw}: not a regular file, skipped")


def _walk(root: Path, notes: list) -> Iterator[Source]:
    seen = set()
    stack = [root]
    try:
        top = root.resolve()
    except (OSError, RuntimeError):
        top = None
    while stack:
        d = stack.pop()
        try:
            real = d.resolve()
        except (OSError, RuntimeError):
            notes.append(f"{d}: cannot resolve (symlink loop?), skipped")
            continue
        if real in seen or (d is not root and top is not None and real in top.parents):
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
                elif e.is_symlink() and not os.path.exists(e.path):
                    notes.append(f"{e.path}: broken symlink, skipped")
                else:
                    notes.append(f"{e.path}: not a regular file (FIFO, socket or device), skipped")
            except OSError as exc:
                notes.append(f"{e.path}: cannot read ({exc.strerror or exc})")
        stack.extend(reversed(subdirs))


def fifo_timeout() -> float:
    try:
        return max(0.0, float(os.environ.get("DIAGNOSE_FIFO_TIMEOUT", FIFO_TIMEOUT)))
    except ValueError:
        return FIFO_TIMEOUT


def _open_fifo(path: Path):
    """A named pipe: never block in open(); wait up to fifo_timeout() for the first data."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP)
        wait = fifo_timeout()
        if not poller.poll(int(wait * 1000)):
            raise InputError(f"named pipe (FIFO) sent no data within {wait:g} s (no writer?), skipped; "
                             "set DIAGNOSE_FIFO_TIMEOUT to wait longer")
        os.set_blocking(fd, True)
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class _Gunzip:
    """Incremental gzip reader (multi-member) that keeps the data before a defect.

    ``gzip.GzipFile.read(n)`` drops everything it decompressed in a call that then hits a
    truncated or corrupt stream. Here a slice that fails is decompressed again from a copy of the
    decompressor's state, in small steps, so everything before the defect comes out; it is
    returned first and the error is raised by the next ``read``. Output per call is bounded by
    about ``n`` (a gzip bomb streams like a big log).
    """

    IN = 256 << 10  # compressed bytes read at a time
    SLICE = 256 << 10  # compressed bytes per decompress call
    STEP = 256  # compressed bytes per step when salvaging a slice that failed

    def __init__(self, raw):
        self.raw = raw
        self.d: Any = None  # zlib's decompressor of the current member
        self.buf, self.pos = b"", 0
        self.in_member = False
        self.done = False
        self.err: Exception | None = None

    def read(self, n: int) -> bytes:
        out, got = [], 0
        while got < n and not self.done:
            if self.pos >= len(self.buf):
                self.buf, self.pos = self.raw.read(self.IN), 0
                if not self.buf:
                    self.done = True
                    if self.in_member:
                        try:
                            out.append(self.d.flush())
                        except zlib.error:
                            pass
                        self.err = EOFError("compressed file ended before the end-of-stream marker was reached")
                    break
            if not self.in_member:
                head = self.buf[self.pos:self.pos + 2]
                if head == b"\x1f":  # a member's magic split across two reads
                    self.buf, self.pos = head + self.raw.read(self.IN), 0
                    head = self.buf[:2]
                if head[:1] == b"\x00" and self.buf.count(b"\x00", self.pos) == len(self.buf) - self.pos:
                    self.pos = len(self.buf)  # zero padding after a member
                    continue
                if head != GZIP_MAGIC:
                    self.err = gzip.BadGzipFile("trailing data after the end of the gzip stream")
                    self.done = True
                    break
                self.d = zlib.decompressobj(31)
                self.in_member = True
            piece_in = self.buf[self.pos:self.pos + self.SLICE]
            before = self.d.copy()
            try:
                piece = self.d.decompress(piece_in, n - got)
            except zlib.error as exc:
                out.append(self._salvage(before, piece_in, n - got))
                self.err, self.done = exc, True
                break
            out.append(piece)
            got += len(piece)
            if self.d.eof:
                self.pos += len(piece_in) - len(self.d.unused_data)
                self.in_member = False
            else:
                self.pos += len(piece_in) - len(self.d.unconsumed_tail)
        data = b"".join(out)
        if not data and self.err is not None:
            err, self.err = self.err, None
            raise err
        return data

    def _salvage(self, d, data: bytes, limit: int) -> bytes:
        """What ``d`` yields from ``data`` before the defect, fed in small steps."""
        out, total = [], 0
        for i in range(0, len(data), self.STEP):
            prev = d.copy()
            try:
                piece = d.decompress(data[i:i + self.STEP])
            except zlib.error:
                for j in range(i, min(i + self.STEP, len(data))):  # the last step, byte by byte
                    try:
                        out.append(prev.decompress(data[j:j + 1]))
                    except zlib.error:
                        break
                break
            out.append(piece)
            total += len(piece)
            if total >= limit or d.eof:
                break
        return b"".join(out)


def _open(source: Source):
    if source.path is None:
        raw = sys.stdin.buffer
    elif stat.S_ISFIFO(os.stat(source.path).st_mode):
        raw = _open_fifo(source.path)
    else:
        raw = open(source.path, "rb")  # noqa: SIM115 - closed by read_chunks
    head = raw.peek(8)[:8] if hasattr(raw, "peek") else b""
    if head[:2] == GZIP_MAGIC:
        return raw, _Gunzip(raw)
    if head[:6] == XZ_MAGIC:
        return raw, lzma.LZMAFile(raw)
    if head[:3] == BZ2_MAGIC and head[3:4].isdigit():
        return raw, bz2.BZ2File(raw)
    if head[:4] == ZSTD_MAGIC:
        try:
            import zstandard
        except ImportError:
            raise InputError("a zstd-compressed file: install the optional extra (pip install 'diagnose[zstd]') "
                             "or decompress it first") from None
        return raw, zstandard.ZstdDecompressor().stream_reader(raw)
    for bom, enc in BOMS:
        if head.startswith(bom):
            raw.read(len(bom))
            return raw, _Transcode(raw, enc)
    return raw, raw


class _Transcode:
    """A UTF-16/32 stream read as UTF-8 bytes, incrementally (bounded memory)."""

    def __init__(self, raw, encoding: str):
        self.raw = raw
        self.dec = codecs.getincrementaldecoder(encoding)("replace")

    def read(self, n: int) -> bytes:
        data = self.raw.read(max(4, n // 2))
        return self.dec.decode(data, final=not data).encode("utf-8")


def normalize(data: bytes) -> bytes:
    """Line framing the matchers must not see: a lone CR is a line end (a progress bar that
    rewrote an error line leaves both lines), ANSI colour codes and NULs go (an anchor with a
    colour code inside it still matches). Cheap when there is nothing to do."""
    if b"\r" in data:
        data = _LONE_CR.sub(b"\n", data)
    if b"\x00" in data:
        data = data.replace(b"\x00", b"")
    esc = data.count(b"\x1b")
    if esc:
        # colour codes: a few per line; a block dense with escapes (binary, hostile) only loses the
        # ESC bytes, so that the work stays linear and small whatever the input
        data = _ANSI.sub(b"", data) if (esc <= 64 or esc < len(data) // 16) else data.replace(b"\x1b", b"")
    return data


PROBE = 64 << 10  # bytes looked at, before a chunk's planned end, for the last newline


def _regular_fd(raw) -> int | None:
    """The descriptor of a regular, uncompressed file (one that ``os.pread`` can look ahead in)."""
    try:
        fd = raw.fileno()
        return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except (OSError, AttributeError, ValueError):
        return None


def _whole_lines(fd: int, pos: int, size: int) -> int:
    """How much to read at ``pos`` for a block that ends at a newline: the block is then the
    chunk itself, with no copy. The last newline before ``size`` is found in a small look-ahead
    (``os.pread``, which leaves the file position alone); near the end of the file, or in a
    line longer than the look-ahead, ``size`` (the reader then carries the rest as usual)."""
    try:
        at = pos + size - PROBE
        probe = os.pread(fd, PROBE, at) if at >= 0 else b""
    except OSError:
        return size
    if len(probe) < PROBE:
        return size
    k = probe.rfind(b"\n")
    return size if k < 0 else size - PROBE + k + 1


def splittable(path: Path) -> int | None:
    """The size of ``path`` when pieces of it can be scanned apart (a regular, uncompressed
    file), else None."""
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode) or f.read(2) == GZIP_MAGIC:
                return None
            return os.fstat(f.fileno()).st_size
    except OSError:
        return None


def split_points(path: Path, pieces: int, chunk_size: int | None = None) -> list:
    """Offsets that cut ``path`` into about ``pieces`` parts of whole chunks: each is where a
    chunk of a serial read ends at a newline, so a reader that starts there reads the very
    chunks a serial read gives (the same lines, the same sampling). Walks the serial reads with
    the look-ahead alone: one ``pread`` per chunk."""
    chunk_size = chunk_size or CHUNK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return []
    try:
        size = os.fstat(fd).st_size
        clean, pos = [], 0
        while True:
            want = _whole_lines(fd, pos, chunk_size)
            if pos + want >= size:
                break
            pos += want
            if os.pread(fd, 1, pos - 1) == b"\n":
                clean.append(pos)
    except OSError:
        return []
    finally:
        os.close(fd)
    out: list = []
    for k in range(1, pieces):  # the clean end nearest each even cut, in order, no repeats
        target = size * k // pieces
        best = min((c for c in clean if not out or c > out[-1]), key=lambda c: abs(c - target), default=None)
        if best is not None:
            out.append(best)
    return out


def count_newlines(path: Path, start: int, end: int, block: int = 8 << 20) -> int:
    n = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while start < end:
            data = os.pread(fd, min(block, end - start), start)
            if not data:
                break
            n += data.count(b"\n")
            if b"\r" in data:  # a lone CR is a line end too (normalize)
                n += data.count(b"\r") - data.count(b"\r\n")
                if data.endswith(b"\r") and os.pread(fd, 1, start + len(data)) == b"\n":
                    n -= 1  # a CR LF cut between two blocks
            start += len(data)
    finally:
        os.close(fd)
    return n


def read_chunks(source: Source, notes: list, chunk_size: int | None = None, start: int = 0,
                end: int | None = None, first_line: int = 1) -> Iterator[Chunk]:
    """Stream ``source`` as chunks of whole lines; read errors end the file with a note.

    ``start`` / ``end`` / ``first_line``: a piece of a regular, uncompressed file, from one of
    its ``split_points`` (the reader then gives the chunks a serial read gives there)."""
    try:
        raw, stream = _open(source)
    except InputError as exc:
        notes.append(f"{source.name}: {exc}")
        return
    except OSError as exc:
        notes.append(f"{source.name}: cannot read ({exc.strerror or exc})")
        return
    chunk_size = chunk_size or CHUNK
    carry = b""
    line_no = first_line
    offset = start
    fd = _regular_fd(raw) if stream is raw else None
    if start:
        raw.seek(start)
    try:
        while True:
            want = chunk_size if fd is None else _whole_lines(fd, raw.tell(), chunk_size)
            if end is not None:
                want = min(want, end - offset - len(carry))
                if want <= 0:
                    break
            try:
                block = stream.read(want)
            except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
                kind = "truncated or corrupt gzip" if stream is not raw else "read error"
                done = offset + len(carry)
                notes.append(f"{source.name}: {kind} after {done} bytes ({exc}); "
                             + ("scanned what was readable" if done else "nothing readable"))
                block = b""
            if not block:
                break
            cut = block.rfind(b"\n") + 1
            if cut == 0:
                data = carry + block
                if len(data) < MAX_LINE:
                    carry = data
                    continue
                out, carry = data, b""  # an over-long line: hand it on in pieces
            else:
                # one copy: the carried start of a line, then the block up to its last newline
                out = b"".join((carry, memoryview(block)[:cut])) if (carry or cut < len(block)) else block
                carry = block[cut:]
            chunk = Chunk(normalize(out), line_no, offset, size=len(out))
            yield chunk
            # a piece of an over-long line: the next chunk goes on with it
            line_no += chunk.newlines if chunk.newlines is not None else chunk.data.count(b"\n")
            offset += len(out)
            if len(carry) >= MAX_LINE:  # the start of an over-long line: hand it on now, hold little
                piece = Chunk(normalize(carry), line_no, offset, size=len(carry))
                yield piece
                line_no += piece.data.count(b"\n")
                offset += len(carry)
                carry = b""
        if carry:
            yield Chunk(normalize(carry), line_no, offset, size=len(carry))
    finally:
        if source.path is not None:
            try:
                raw.close()
            except OSError:
                pass
