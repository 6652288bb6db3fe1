"""The reader's chunks: whole lines, the whole input, line numbers right, whichever way it reads
(a regular file looks ahead with os.pread so that a block ends at a newline; a gzip stream or
a pipe carries the start of a line over to the next chunk)."""
from __future__ import annotations

import gzip

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.logs import read as R

LINES = st.lists(st.one_of(st.text(alphabet="ab \t|:", max_size=30), st.text(alphabet="xy", min_size=200, max_size=900)),
                 max_size=60)


def _chunks(path, size):
    notes: list = []
    out = list(R.read_chunks(R.Source(str(path), path), notes, chunk_size=size))
    return out, notes


def _check(chunks, data: bytes):
    assert b"".join(c.data for c in chunks) == data
    line, offset = 1, 0
    for c in chunks:
        assert (c.first_line, c.offset) == (line, offset)
        line += c.data.count(b"\n")
        offset += len(c.data)


@settings(max_examples=150, deadline=None)
@given(LINES, st.booleans(), st.sampled_from([300, 1000, 4096]))
def test_regular_file_and_gzip_give_the_same_chunks_of_whole_lines(tmp_path_factory, lines, trailing, size):
    tmp = tmp_path_factory.mktemp("r")
    data = "\n".join(lines).encode() + (b"\n" if trailing and lines else b"")
    plain, gz = tmp / "a.log", tmp / "a.log.gz"
    plain.write_bytes(data)
    gz.write_bytes(gzip.compress(data))
    old = R.PROBE
    R.PROBE = 128  # the look-ahead smaller than some lines: both of its branches run
    try:
        a, notes_a = _chunks(plain, size)
    finally:
        R.PROBE = old
    b, notes_b = _chunks(gz, size)
    assert notes_a == notes_b == []
    _check(a, data)
    _check(b, data)
    for c in a[:-1]:  # every chunk but the last ends a line (or is a piece of an over-long one)
        assert c.data.endswith(b"\n") or len(c.data) >= R.MAX_LINE


def test_a_regular_file_is_read_without_copying_blocks(tmp_path, monkeypatch):
    """The look-ahead sizes each read to end at a newline: the block read is the chunk."""
    data = b"".join(b"line %06d of a log\n" % i for i in range(20000))
    p = tmp_path / "x.log"
    p.write_bytes(data)
    seen = []
    real = R._whole_lines

    def spy(fd, raw, size):
        n = real(fd, raw, size)
        seen.append(n)
        return n

    monkeypatch.setattr(R, "_whole_lines", spy)
    chunks, _ = _chunks(p, 64 << 10)
    _check(chunks, data)
    assert len(chunks) > 3 and all(c.data.endswith(b"\n") for c in chunks)
    assert [len(c.data) for c in chunks[:-1]] == seen[:len(chunks) - 1]
