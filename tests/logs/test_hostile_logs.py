"""Hostile logs: the scan never crashes, never hangs, and never drops what it could read.

Each case goes through the real CLI (``diagnose.cli.main``, in-process) or, where the case is
about the process itself (FIFOs, dropped privileges, peak memory), through a subprocess. The
rules under test: a clear one-line note per unreadable input, the report covers everything that
could be read, exit 2 only when nothing could be read, never a traceback.
"""
from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import random
import subprocess
import sys
import threading
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest

from diagnose.logs import read as R

REPO = Path(__file__).resolve().parents[2]

TRACEBACK = (b"Traceback (most recent call last):\n"
             b'  File "pretrain_gpt.py", line 12, in <module>\n'
             b"RuntimeError: hostile input survived\n")
OOM = (b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
       b"of 79.15 GiB of which 1.02 GiB is free.\n")


def _scan(run_cli, *paths, extra=()):
    """Run the scan with the JSON report; returns (exit code, report dict or None, stderr)."""
    code, out, err = run_cli(*[str(p) for p in paths], "--format", "json", "-q", *extra)
    assert "Traceback (most recent call last)" not in err
    assert "internal error" not in err, err
    assert code in (0, 1, 2), (code, err)
    report = json.loads(out) if out.strip() else None
    if code == 2:
        assert report is None and "nothing could be read" in err
    return code, report, err


def _ids(report):
    return {f["signature"] for f in report["findings"]}


def _cli_subprocess(args, timeout, env=None, preexec_fn=None):
    code = "import sys; from diagnose.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=str(REPO), env={**os.environ, **(env or {})}, preexec_fn=preexec_fn)


# ----------------------------------------------------------------------------- content

def test_empty_file_is_read_and_healthy(run_cli, tmp_path):
    p = tmp_path / "empty.log"
    p.write_bytes(b"")
    code, report, _ = _scan(run_cli, p)
    assert code == 0 and report["inputs"] == [str(p)] and report["findings"] == []


def test_binary_file(run_cli, tmp_path):
    """Named explicitly, a binary file is not a log: a note and exit 2 (issue 13), never a
    'healthy' verdict on random bytes."""
    p = tmp_path / "core.bin"
    p.write_bytes(random.Random(6).randbytes(2_000_000))
    code, _out, err = run_cli(str(p), "--format", "json")
    assert code == 2 and "binary file" in err and "nothing could be read" in err


def test_binary_files_in_a_folder_are_skipped_and_counted(run_cli, tmp_path):
    (tmp_path / "model.pt").write_bytes(b"PK\x03\x04" + random.Random(1).randbytes(100_000))
    (tmp_path / "loss.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + random.Random(2).randbytes(5000))
    (tmp_path / "rank0.log").write_bytes(OOM + b"\n")
    code, report, _ = _scan(run_cli, tmp_path)
    assert code == 1 and report["inputs"] == [str(tmp_path / "rank0.log")]
    assert any("2 binary file(s) skipped" in n for n in report["notes"]), report["notes"]


def test_nul_bytes_do_not_hide_a_failure(run_cli, tmp_path):
    p = tmp_path / "nul.log"
    p.write_bytes(b"\x00" * 5000 + b"\n" + OOM.replace(b"CUDA", b"\x00CUDA") + b"\x00" * 100)
    code, report, _ = _scan(run_cli, p)
    assert code == 1
    assert any(s.startswith("MB-OOM") for s in _ids(report)), _ids(report)
    assert all("\x00" not in f["first"]["text"] for f in report["findings"])


def test_invalid_utf8(run_cli, tmp_path):
    p = tmp_path / "latin1.log"
    p.write_bytes(b"caf\xe9 \xff\xfe\xc3(\n" * 1000 + TRACEBACK + b"\xed\xa0\x80 surrogate\n")
    code, report, _ = _scan(run_cli, p)
    assert code == 1 and "MB-GEN-001" in _ids(report)
    assert report["findings"][0]["first"]["line"] == 1003


def test_crlf_line_endings(run_cli, tmp_path):
    p = tmp_path / "windows.log"
    p.write_bytes(b"start\r\n" + TRACEBACK.replace(b"\n", b"\r\n"))
    code, report, _ = _scan(run_cli, p)
    assert code == 1
    first = next(f for f in report["findings"] if f["signature"] == "MB-GEN-001")["first"]
    assert first["text"] == "RuntimeError: hostile input survived" and first["line"] == 4


def test_ansi_colour_codes(run_cli, tmp_path):
    p = tmp_path / "colour.log"
    p.write_bytes(b"\x1b[1m\x1b[31m" + TRACEBACK.replace(b"RuntimeError", b"\x1b[31mRuntimeError\x1b[0m") + b"\x1b[0m\n")
    code, report, _ = _scan(run_cli, p)
    assert code == 1
    texts = [f["first"]["text"] for f in report["findings"]]
    assert texts and all("\x1b" not in t for t in texts)
    assert "RuntimeError: hostile input survived" in texts


# ----------------------------------------------------------------------------- gzip

def _gz_log(lines=20_000):
    body = b"".join(b"iteration line %d of a healthy run\n" % i for i in range(lines)) + TRACEBACK
    return body, gzip.compress(body + b"".join(b"tail line %d\n" % i for i in range(lines)))


def test_truncated_gzip_keeps_what_was_readable(run_cli, tmp_path):
    _body, gz = _gz_log()
    p = tmp_path / "run.log.gz"
    p.write_bytes(gz[: int(len(gz) * 0.8)])  # the traceback is in the first half of the stream
    code, report, _ = _scan(run_cli, p)
    assert code == 1 and "MB-GEN-001" in _ids(report)
    (note,) = [n for n in report["notes"] if "gzip" in n]
    assert "truncated or corrupt gzip after" in note and "scanned what was readable" in note
    assert "\n" not in note


def test_gzip_corrupt_in_the_middle(run_cli, tmp_path):
    _body, gz = _gz_log()
    bad = bytearray(gz)
    mid = len(bad) * 3 // 4
    bad[mid:mid + 64] = bytes(64)  # zeroed block: invalid deflate data
    p = tmp_path / "run.gz"
    p.write_bytes(bytes(bad))
    code, report, _ = _scan(run_cli, p)
    assert code == 1 and "MB-GEN-001" in _ids(report)
    assert any("truncated or corrupt gzip" in n for n in report["notes"])


def test_gzip_reader_returns_every_byte_before_the_damage(tmp_path):
    _body, gz = _gz_log(50_000)
    p = tmp_path / "t.gz"
    p.write_bytes(gz[: len(gz) // 2])
    notes = []
    got = b"".join(c.data for c in R.read_chunks(R.Source(str(p), p), notes, chunk_size=1 << 16))
    full = zlib.decompressobj(31).decompress(gz[: len(gz) // 2])  # what zlib itself can recover
    assert got == full and len(got) > 0
    assert len(notes) == 1 and f"after {len(got)} bytes" in notes[0]


def test_gzip_corruption_loses_nothing_before_the_defect(tmp_path):
    """A defect in the middle: the reader yields exactly what zlib, fed byte by byte, can decode
    before it (the whole failed slice is salvaged, not dropped)."""
    body, gz = _gz_log(200_000)
    bad = bytearray(gz)
    mid = int(len(bad) * 0.6)
    bad[mid:mid + 32] = b"\xff" * 32
    p = tmp_path / "mid.gz"
    p.write_bytes(bytes(bad))
    d, ref = zlib.decompressobj(31), []
    for i in range(len(bad)):
        try:
            ref.append(d.decompress(bytes(bad[i:i + 1])))
        except zlib.error:
            break
    ref = b"".join(ref)
    notes = []
    got = b"".join(c.data for c in R.read_chunks(R.Source(str(p), p), notes))
    assert len(ref) > len(body) // 3
    assert got == ref and len(notes) == 1 and f"after {len(ref)} bytes" in notes[0]


def test_gzip_corrupt_from_the_start_is_unreadable(run_cli, tmp_path):
    p = tmp_path / "bad.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00" + b"\xff" * 300)
    code, _, err = _scan(run_cli, p)
    assert code == 2 and "bad.gz: truncated or corrupt gzip after 0 bytes" in err and "nothing readable" in err


def test_gzip_multi_member_padding_and_trailing_garbage(run_cli, tmp_path):
    a, b = b"part one\n", TRACEBACK
    p = tmp_path / "multi.gz"
    p.write_bytes(gzip.compress(a) + gzip.compress(b) + b"\x00" * 512)
    code, report, _ = _scan(run_cli, p)
    assert code == 1 and "MB-GEN-001" in _ids(report) and report["notes"] == []
    q = tmp_path / "garbage.gz"
    q.write_bytes(gzip.compress(a + b) + b"this is not gzip")
    code, report, _ = _scan(run_cli, q)
    assert code == 1 and "MB-GEN-001" in _ids(report)
    assert any("trailing data" in n for n in report["notes"])


def test_gzip_bomb_streams_at_bounded_memory(tmp_path):
    p = tmp_path / "bomb.gz"
    zeros = bytes(1 << 20)
    with gzip.open(p, "wb", compresslevel=9) as fh:
        for _ in range(200):  # 200 MB of NULs, no newline, ~200 kB on disk
            fh.write(zeros)
    assert p.stat().st_size < 1 << 20
    notes = []
    tracemalloc.start()
    total = 0
    try:
        for c in R.read_chunks(R.Source(str(p), p), notes):
            total += c.size  # the NULs themselves are dropped (normalize): count what was read
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert total == 200 << 20 and notes == []
    assert peak < 4 * R.CHUNK, peak


# ----------------------------------------------------------------------------- huge lines

def test_huge_line_reader_memory_and_line_numbers(tmp_path):
    """A 100 MB line without a newline: pieces of bounded size, later line numbers still right."""
    p = tmp_path / "huge.log"
    block = b"x" * (1 << 20)
    with open(p, "wb") as fh:
        fh.write(b"first\n")
        for _ in range(100):
            fh.write(block)
        fh.write(b"\nafter the long line\nlast line without newline")
    notes = []
    tracemalloc.start()
    chunks = 0
    where = {}
    try:
        for c in R.read_chunks(R.Source(str(p), p), notes):
            chunks += 1
            assert len(c.data) <= R.CHUNK + R.MAX_LINE  # a carried partial line (< MAX_LINE) + one read
            for i, line in enumerate(c.data.split(b"\n")):
                if line in (b"after the long line", b"last line without newline"):
                    where[line] = c.first_line + i
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert chunks > 10 and notes == []
    assert where == {b"after the long line": 3, b"last line without newline": 4}
    assert peak < 5 * R.CHUNK, peak


def test_long_line_split_keeps_line_numbers_small_chunks(tmp_path):
    p = tmp_path / "long.log"
    p.write_bytes(b"a\n" + b"y" * (3 * R.MAX_LINE + 17) + b"\n" + TRACEBACK)
    firsts = []
    for c in R.read_chunks(R.Source(str(p), p), [], chunk_size=1 << 16):
        if b"RuntimeError" in c.data:
            before = c.data[: c.data.index(b"RuntimeError")]
            firsts.append(c.first_line + before.count(b"\n"))
    assert firsts == [5]


@pytest.mark.slow
def test_huge_line_cli_peak_memory(tmp_path):
    """The whole CLI on a 100 MB single-line log: completes, reports it, stays under 400 MB RSS."""
    p = tmp_path / "huge.log"
    block = b"z" * (1 << 20)
    with open(p, "wb") as fh:
        for _ in range(100):
            fh.write(block)
        fh.write(b"\n" + TRACEBACK)
    # The child reports its own high-water RSS (VmHWM of its post-exec address space); the
    # rusage of a child would include the pytest parent's memory copied at fork.
    code = ("import sys; from diagnose.cli import main; rc = main(sys.argv[1:]); "
            "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')] "
            "if sys.platform.startswith('linux') else []; "
            "sys.stderr.write('HWM_KB %s\\n' % (hwm[0] if hwm else -1)); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, str(p), "--format", "json", "-q"], capture_output=True,
                       text=True, timeout=300, cwd=str(REPO))
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    report = json.loads(r.stdout)
    assert report["findings"][0]["first"]["line"] == 4  # the traceback's exception line, after the long one
    hwm_kb = int(r.stderr.split("HWM_KB ")[1].split()[0])
    if hwm_kb >= 0:
        assert hwm_kb < 400 * 1024, f"peak RSS {hwm_kb} kB"


# ----------------------------------------------------------------------------- the file system

def test_missing_and_path_inside_a_file(run_cli, tmp_path):
    f = tmp_path / "run.log"
    f.write_bytes(TRACEBACK)
    code, _, err = _scan(run_cli, tmp_path / "nope.log", f / "inside")
    assert code == 2
    assert "nope.log: no such file or directory" in err
    assert "inside: cannot read (Not a directory)" in err


def test_unreadable_next_to_readable_reports_both(run_cli, tmp_path):
    good = tmp_path / "good.log"
    good.write_bytes(TRACEBACK)
    code, report, _ = _scan(run_cli, tmp_path / "gone.log", good)
    assert code == 1 and report["inputs"] == [str(good)]
    assert report["notes"] == [f"{tmp_path / 'gone.log'}: no such file or directory"]


_AS_NOBODY = """
import os, sys
from diagnose.cli import main
warm, args = sys.argv[1], sys.argv[2:]
main([warm, "--format", "json", "-q", "-o", os.devnull])  # import everything while still root
os.setgid(65534)
os.setuid(65534)
sys.exit(main(args))
"""


@pytest.mark.skipif(not hasattr(os, "setuid"), reason="needs POSIX setuid")
def test_permission_denied_in_a_subprocess(tmp_path):
    """chmod 000 does not stop root, so the scan drops to uid 65534 (nobody) after start-up."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="diagnose-perm-"))
    try:
        d.chmod(0o755)
        secret = d / "secret.log"
        secret.write_bytes(TRACEBACK)
        secret.chmod(0o000)
        good = d / "good.log"
        good.write_bytes(b"hello\n")
        good.chmod(0o644)
        warm = d / "warm.log"
        warm.write_bytes(TRACEBACK)
        if os.geteuid() == 0:
            cmd = [sys.executable, "-c", _AS_NOBODY, str(warm)]
        else:
            cmd = [sys.executable, "-c", "import sys; from diagnose.cli import main; sys.exit(main(sys.argv[1:]))"]

        def run(*args):
            return subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=str(REPO))

        r = run(secret)
        assert r.returncode == 2, r.stderr
        assert r.stderr.splitlines() == [f"diagnose: {secret}: cannot read (Permission denied)",
                                         "diagnose: nothing could be read"]
        r = run(secret, good, "--format", "json", "-q")
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["inputs"] == [str(good)]
        assert report["notes"] == [f"{secret}: cannot read (Permission denied)"]
    finally:
        for f in d.iterdir():
            f.unlink()
        d.rmdir()


def test_broken_symlink_and_directory_loops(run_cli, tmp_path):
    logs = tmp_path / "logs"
    (logs / "rank0").mkdir(parents=True)
    (logs / "rank0" / "out.log").write_bytes(TRACEBACK)
    (logs / "rank0" / "up").symlink_to("..")  # loop to its parent
    (logs / "rank0" / "self").symlink_to(".")  # loop to itself
    (logs / "top").symlink_to(tmp_path)  # a parent of the folder given
    (logs / "dangling.log").symlink_to(tmp_path / "does-not-exist")
    (tmp_path / "outside.log").write_bytes(OOM)  # must not be reached through "top"
    code, report, _ = _scan(run_cli, logs)
    assert code == 1
    assert report["inputs"] == [str(logs / "rank0" / "out.log")]
    assert _ids(report) == {"MB-GEN-001"}
    notes = report["notes"]
    assert f"{logs / 'dangling.log'}: broken symlink, skipped" in notes
    assert sum("directory loop, skipped" in n for n in notes) == 3, notes


def test_only_a_loop_exits_2(run_cli, tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "again").symlink_to(d)
    code, _, err = _scan(run_cli, d)
    assert code == 2 and "directory loop" in err


def test_device_files_are_skipped_not_read(run_cli):
    # /dev/zero would never end and /dev/urandom never ends either: both must be refused at once
    t = time.monotonic()
    code, _, err = _scan(run_cli, "/dev/zero", "/dev/null")
    assert code == 2 and time.monotonic() - t < 10
    assert "/dev/zero: not a regular file, skipped" in err


# ----------------------------------------------------------------------------- FIFOs

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_fifo_inside_a_folder_is_skipped(tmp_path):
    (tmp_path / "out.log").write_bytes(TRACEBACK)
    os.mkfifo(tmp_path / "pipe")
    r = _cli_subprocess([tmp_path, "--format", "json", "-q"], timeout=60)
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert report["inputs"] == [str(tmp_path / "out.log")]
    assert report["notes"] == [f"{tmp_path / 'pipe'}: not a regular file (FIFO, socket or device), skipped"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_fifo_without_writer_times_out(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    t = time.monotonic()
    r = _cli_subprocess([tmp_path / "pipe"], timeout=60, env={"DIAGNOSE_FIFO_TIMEOUT": "1"})
    assert time.monotonic() - t < 30
    assert r.returncode == 2, r.stderr
    assert "pipe: named pipe (FIFO) sent no data within 1 s (no writer?), skipped" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_fifo_with_a_writer_is_read(run_cli, tmp_path, monkeypatch):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    monkeypatch.setenv("DIAGNOSE_FIFO_TIMEOUT", "20")

    def writer():
        with open(fifo, "wb") as fh:  # blocks until the scan opens the read end
            fh.write(b"hello\n")
            fh.flush()
            time.sleep(0.2)
            fh.write(TRACEBACK)

    th = threading.Thread(target=writer, daemon=True)
    th.start()
    code, report, _ = _scan(run_cli, fifo)
    th.join(10)
    assert code == 1 and "MB-GEN-001" in _ids(report) and report["notes"] == []


def test_fifo_timeout_env_is_validated(monkeypatch):
    monkeypatch.setenv("DIAGNOSE_FIFO_TIMEOUT", "soon")
    assert R.fifo_timeout() == R.FIFO_TIMEOUT
    monkeypatch.setenv("DIAGNOSE_FIFO_TIMEOUT", "-3")
    assert R.fifo_timeout() == 0.0


def test_stdin_with_hostile_bytes(tmp_path):
    data = b"\x00\xff\x1b[31m\r\n" * 1000 + TRACEBACK
    code = "import sys; from diagnose.cli import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", code, "-", "--format", "json", "-q"], input=data,
                       capture_output=True, timeout=120, cwd=str(REPO))
    assert r.returncode == 1, r.stderr
    assert "MB-GEN-001" in {f["signature"] for f in json.loads(r.stdout)["findings"]}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_parallel_scan_reports_the_same_notes(run_cli, tmp_path):
    """--jobs (one process per file) meets the same hostile folder as the serial scan."""
    d = tmp_path / "logs"
    d.mkdir()
    (d / "a.log").write_bytes(b"x" * 100 + b"\n" + TRACEBACK)
    _, gz = _gz_log()
    (d / "b.gz").write_bytes(gz[: len(gz) // 2])
    (d / "c.gz").write_bytes(b"\x1f\x8b\x08\x00" + b"\xff" * 64)
    (d / "d.bin").write_bytes(bytes(range(256)) * 100)
    os.mkfifo(d / "fifo")
    (d / "dangling").symlink_to(tmp_path / "nowhere")
    (d / "up").symlink_to("..")
    code1, serial, _ = _scan(run_cli, d)
    code2, par, _ = _scan(run_cli, d, extra=("--jobs", "2"))
    assert code1 == code2 == 1
    assert serial["inputs"] == par["inputs"] == [str(d / "a.log"), str(d / "b.gz")]  # d.bin: binary, skipped
    assert serial["notes"] == par["notes"] and len(serial["notes"]) == 6
    assert _ids(serial) == _ids(par)


# ----------------------------------------------------------- encodings and framing (issue 16, item 13)
@pytest.mark.parametrize("kind", ["xz", "bz2", "utf-16", "utf-16-be", "utf-32"])
def test_other_compressions_and_encodings_are_read(run_cli, tmp_path, kind):
    text = b"step 1 ok\n" + OOM + b"\n"
    p = tmp_path / "run.log"  # no telling suffix: detected by content
    if kind == "xz":
        p.write_bytes(lzma.compress(text))
    elif kind == "bz2":
        p.write_bytes(bz2.compress(text))
    else:
        enc = {"utf-16": "utf-16", "utf-16-be": "utf-16-be", "utf-32": "utf-32"}[kind]
        body = text.decode().encode(enc)
        p.write_bytes((b"\xfe\xff" + body) if kind == "utf-16-be" else body)
    code, report, _ = _scan(run_cli, p)
    assert code == 1 and any(s.startswith("MB-OOM") for s in _ids(report)), (kind, _ids(report), report["notes"])
    assert report["root_cause"]["line"] == 2


def test_zstd_without_its_extra_is_a_one_line_error_not_healthy(tmp_path):
    try:
        import zstandard  # noqa: F401
        pytest.skip("zstandard is installed here")
    except ImportError:
        pass
    p = tmp_path / "run.log.zst"
    p.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(32))
    r = subprocess.run([sys.executable, "-c", "import sys; from diagnose.cli import main; sys.exit(main(sys.argv[1:]))",
                        str(p)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert r.returncode == 2 and "zstd" in r.stderr and "Traceback" not in r.stderr


def test_lone_cr_ends_a_line_and_a_progress_bar_does_not_hide_the_error(run_cli, tmp_path):
    p = tmp_path / "cr.log"
    p.write_bytes(b"step 1 ok\r" + OOM + b"\r 45%|####      | 450/1000 [00:10<00:12]\rdone\r")
    code, report, _ = _scan(run_cli, p)
    assert code == 1 and any(s.startswith("MB-OOM") for s in _ids(report)), _ids(report)
    assert report["root_cause"]["line"] == 2


def test_ansi_code_inside_an_anchor_does_not_hide_it(run_cli, tmp_path):
    p = tmp_path / "ansi.log"
    p.write_bytes(OOM.replace(b"out of memory", b"out of \x1b[1;31mmemory\x1b[0m") + b"\n")
    code, report, _ = _scan(run_cli, p)
    assert code == 1 and any(s.startswith("MB-OOM") for s in _ids(report)), _ids(report)


# ----------------------------------------------------------- numbers and nesting (issue 16, item 18)
def test_integers_of_thousands_of_digits_are_text_not_a_crash(run_cli, tmp_path):
    big = "9" * 5000
    p = tmp_path / "big.log"
    p.write_text(f" iteration {big}/ 10 | elapsed time per iteration (ms): 1.0 | lm loss: 1.0 |\n"
                 f"[rank{big}]: something\n[Rank {big}] (after {big} iterations) memory (MB) | allocated: 1.0\n"
                 f"  successfully loaded checkpoint from /c at iteration {big}\n"
                 f"exitcode: {big}\n" + OOM.decode() + "\n")
    code, report, _ = _scan(run_cli, p)
    assert code == 1 and any(s.startswith("MB-OOM") for s in _ids(report))


@pytest.mark.parametrize("text,why", [("[" * 100000 + "]" * 100000, "nested too deep"),
                                      ('{"diagnose_baseline": ' + "9" * 5000 + "}", "4300 digits")])
def test_a_hostile_baseline_is_a_one_line_error(run_cli, tmp_path, text, why):
    log = tmp_path / "run.log"
    log.write_bytes(OOM + b"\n")
    bl = tmp_path / "bl.json"
    bl.write_text(text)
    code, _out, err = run_cli(str(log), "--baseline", str(bl))
    assert code == 2 and why in err and "internal error" not in err


def test_follow_on_a_folder_is_a_usage_error(run_cli, tmp_path):
    code, _out, err = run_cli(str(tmp_path), "--follow")
    assert code == 2 and "not a folder" in err


# ------------------------------------------- config blocks in logs (issue 16, items 10 and 11)
def _args_block(pp: int, n: int = 600) -> str:
    args = {f"arg_{i:04d}": i for i in range(n)}
    args.update(num_layers=4, hidden_size=64, pipeline_model_parallel_size=pp)
    return "\n".join(["------------------------ arguments ------------------------"]
                     + ["  {} {} {}".format(k, "." * max(1, 48 - len(k)), v) for k, v in sorted(args.items())]
                     + ["-------------------- end of arguments ---------------------"]) + "\n"


def test_an_alias_bomb_inside_a_logs_config_block_is_refused(run_cli, tmp_path):
    lines = ["INFO:recipe_runner:Final configuration:", 'l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 9)]
    lines += ["model: {num_layers: *l8}", OOM.decode()]
    p = tmp_path / "bomb.log"
    p.write_text("\n".join(lines) + "\n")
    code, report, _ = _scan(run_cli, p)  # 10**8 values if expanded: refused, the OOM still named
    assert code == 1 and report["root_cause"]["signature"].startswith("MB-OOM")


def test_a_job_restarted_many_times_is_read_in_constant_memory(tmp_path):
    """Each restart prints the MLM arguments again: only the last blocks are kept, the last one is
    the config, and the peak memory does not grow with the number of restarts."""
    import tracemalloc

    from diagnose.diagnosis import diagnose_paths

    peaks = {}
    for n in (40, 160):
        p = tmp_path / f"restarts{n}.log"
        p.write_text(_args_block(1) * (n - 1) + _args_block(2) + OOM.decode() + "\n")
        tracemalloc.start()
        try:
            report = diagnose_paths([str(p)], jobs=1)
            peaks[n] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert report.config.get("model.pipeline_model_parallel_size") == 2  # the last restart's
        assert len(report.structure.config_blocks) <= 4
    assert peaks[160] < 1.5 * peaks[40], peaks


@pytest.mark.parametrize("line,want", [
    # NCCL retrying a connection (INFO) is not MB-NCCL-032's failed connection (a WARN): read as
    # the last line of a log, a line the pattern excludes was once taken as a cut copy of one it
    # matches (a partial match does not test lookaheads)
    ("node003:51230:51230 [3] NCCL INFO socketPollConnect: connect returned Connection refused, "
     "retrying (30/34) after sleep for 3000 msec", "MB-SYM-015"),
    # the WARN line cut at the end of the paste is still recovered
    ("node003:51230:51230 [3] misc/socket.cc:484 NCCL WARN socketPollConnect: connect ret", "MB-NCCL-032"),
])
def test_a_last_line_the_pattern_excludes_is_not_read_as_cut(tmp_path, line, want):
    from diagnose.diagnosis import diagnose_paths

    log = tmp_path / "run.log"
    log.write_text(line + "\n")
    rc = diagnose_paths([str(log)], jobs=1).root_cause
    assert rc is not None and rc.finding.signature.id == want


def test_the_leading_exclusion_of_a_pattern_is_read_whole():
    from diagnose.match.verify import _leading_exclusion, excluded

    assert _leading_exclusion(r"(?i)^(?!.*(?:a|b\)))x") == r"(?i)^(?:.*(?:a|b\)))"
    assert _leading_exclusion(r"^(?![)(]x)y") == r"^(?:[)(]x)"
    assert _leading_exclusion(r"x^(?!a)") is None and _leading_exclusion(r"^(?=a)b") is None
    assert excluded(r"^(?![^\n]*NCCL INFO)[^\n]*?Connect", "h:1 NCCL INFO Connect")
    assert not excluded(r"^(?![^\n]*NCCL INFO)[^\n]*?Connect", "h:1 NCCL WARN Connect")
    assert not excluded(r"no exclusion here", "anything")
