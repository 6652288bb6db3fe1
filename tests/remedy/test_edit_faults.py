"""Faults while --fix writes the user's config: kill -9 at any point, two --fix at once, a file
changed between plan and write. The config is always either the old or the new text, never a
mix; every backup is a complete copy of the old text; nothing is clobbered."""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from diagnose.remedy import edit as E

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "fixtures" / "jobs" / "tiny_gpt_pp_offload.yaml"
RUN1 = REPO / "fixtures" / "logs" / "tiny_gpt_pp_offload_run1.log"

# The child writes NEW over the config once it is told to; the parent kills it with SIGKILL at a
# random moment. OLD and NEW are big enough (a few MB) that the write and fsyncs take a while.
_WRITER = r"""
import sys
from pathlib import Path
from diagnose.remedy import edit as E
path, new = sys.argv[1], Path(sys.argv[2]).read_text()
snap = E.snapshot(path)
print("ready", flush=True)
sys.stdin.readline()
E.write(snap, new)
print("done", flush=True)
"""


def _texts(size_mb: int = 4) -> tuple[str, str]:
    base = TINY.read_text()
    pad_old = "".join(f"# old padding line {i:08d} " + "o" * 60 + "\n" for i in range(size_mb * 12_000))
    pad_new = "".join(f"# new padding line {i:08d} " + "n" * 60 + "\n" for i in range(size_mb * 12_000))
    return base + pad_old, base.replace("cpu_offloading: true", "cpu_offloading: false") + pad_new


def _state(d: Path, name: str) -> dict:
    return {p.name: p for p in d.iterdir() if p.name.startswith(name) or p.name.startswith("." + name)}


@pytest.mark.slow
def test_sigkill_at_random_points_leaves_old_or_new_and_intact_backups(tmp_path):
    old, new = _texts()
    newfile = tmp_path / "new.txt"
    newfile.write_text(new)
    cfg = tmp_path / "cfg.yaml"
    rnd = random.Random(6)
    seen = {"old": 0, "new": 0}
    delays = []
    # how long one whole write takes here (start-up excluded): kills are spread over 0..1.3x that
    spans = []
    for _ in range(3):  # the slowest of three whole writes: fsync times vary from write to write
        cfg.write_text(old)
        for p in tmp_path.iterdir():
            if p.name.startswith("cfg.yaml.bak"):
                p.unlink()
        child = subprocess.Popen([sys.executable, "-c", _WRITER, str(cfg), str(newfile)], cwd=str(REPO),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        spans.append(time.monotonic() - t0)
        child.wait(30)
        child.stdout.close()
        child.stdin.close()
        assert cfg.read_text() == new
    span = max(spans) * 1.3
    for i in range(16):
        cfg.write_text(old)
        for p in tmp_path.iterdir():  # a clean slate, except the stale lock a kill may leave
            if p.name.startswith(("cfg.yaml.bak", ".cfg.yaml.")):
                p.unlink()
        child = subprocess.Popen([sys.executable, "-c", _WRITER, str(cfg), str(newfile)], cwd=str(REPO),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        # the first kill before anything is written, the last after the write has surely ended,
        # the others anywhere in between
        delay = 0.0 if i == 0 else (2 * span if i == 15 else rnd.uniform(0, span))
        delays.append(delay)
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        child.stdout.close()
        child.stdin.close()
        text = cfg.read_text()
        assert text in (old, new), f"partial config after kill at {delay:.3f} s ({len(text)} chars)"
        seen["old" if text == old else "new"] += 1
        baks = sorted(p for p in tmp_path.iterdir() if p.name.startswith("cfg.yaml.bak"))
        for b in baks:
            assert b.read_text() == old, f"backup {b.name} is not a complete copy of the old config"
        if text == new:
            assert baks, "the config was replaced but no backup exists"
    assert seen["old"] >= 1 and seen["new"] >= 1, (seen, delays, span)
    # after all those kills (a stale lock, stray temporary files) a normal write still works
    cfg.write_text(old)
    snap = E.snapshot(cfg)
    res = E.write(snap, new)
    assert res.changed and cfg.read_text() == new and res.backup.read_text() == old
    assert not (tmp_path / ("cfg.yaml" + E.LOCK_SUFFIX)).exists()
    print(f"sigkill: {seen}, write takes ~{span / 1.3:.3f} s, kills at {[round(d, 3) for d in delays]}")


def test_kill_before_replace_never_touches_the_config(tmp_path, monkeypatch):
    """Simulated crash at each step of write(): the config stays old until os.replace."""
    old, new = _texts(1)
    cfg = tmp_path / "cfg.yaml"

    class Crash(BaseException):
        pass

    for step in ("fsync", "chmod", "replace"):
        cfg.write_text(old)
        for p in tmp_path.iterdir():
            if p != cfg:
                p.unlink()
        snap = E.snapshot(cfg)
        target = {"fsync": os, "chmod": os, "replace": os}[step]
        real = getattr(target, step)
        calls = {"n": 0}

        def boom(*a, _real=real, _step=step, calls=calls, **k):
            calls["n"] += 1
            if _step != "fsync" or calls["n"] == 2:  # 2nd fsync: the temporary copy of the new text
                raise Crash()
            return _real(*a, **k)

        monkeypatch.setattr(target, step, boom)
        with pytest.raises(Crash):
            E.write(snap, new)
        monkeypatch.setattr(target, step, real)
        assert cfg.read_text() == old, step
        assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == [], step
        for b in tmp_path.glob("cfg.yaml.bak*"):
            assert b.read_text() == old


def _fix_cli(cfg: Path, cwd: Path):
    code = "import sys; from diagnose.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", code, str(RUN1), "--fix", str(cfg)], cwd=str(cwd),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.slow
def test_two_fix_runs_at_once_on_the_same_file(tmp_path):
    """Two real `diagnose LOG --fix cfg.yaml` at the same moment: one writes, the other refuses
    (lock held, or the file changed since its plan) or finds the fix already there; the result
    is exactly one clean fix with one backup of the original."""
    cfg = tmp_path / "cfg.yaml"
    shutil.copy(TINY, cfg)
    original = cfg.read_text()
    procs = [_fix_cli(cfg, tmp_path) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = [p.returncode for p in procs]
    for (_out, err), code in zip(outs, codes):
        assert "Traceback" not in err and "internal error" not in err, err
        assert code in (0, 2), (code, err)
    assert 0 in codes, outs
    text = cfg.read_text()
    assert text != original and "cpu_offloading: false" in text
    baks = sorted(tmp_path.glob("cfg.yaml.bak*"))
    assert [b.name for b in baks] == ["cfg.yaml.bak"] and baks[0].read_text() == original
    assert not (tmp_path / ("cfg.yaml" + E.LOCK_SUFFIX)).exists()
    for (_out, err), code in zip(outs, codes):
        if code == 2:
            last = err.strip().splitlines()[-1]  # the plan is printed first; the refusal is one line
            assert ("being edited by another diagnose --fix" in last or "changed since the fix was planned" in last), err


def test_lock_is_exclusive_between_threads_of_writers(tmp_path):
    """Many writers racing on one snapshot: exactly one wins, the rest refuse; one backup."""
    cfg = tmp_path / "cfg.yaml"
    old, new = _texts(1)
    cfg.write_text(old)
    snap = E.snapshot(cfg)
    results, barrier = [], threading.Barrier(6)

    def go(k):
        barrier.wait()
        try:
            E.write(snap, new + f"# writer {k}\n")
            results.append(("ok", k))
        except E.EditError as exc:
            results.append(("refused", str(exc)))

    threads = [threading.Thread(target=go, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    wins = [r for r in results if r[0] == "ok"]
    assert len(results) == 6 and len(wins) == 1, results
    assert cfg.read_text() == new + f"# writer {wins[0][1]}\n"
    assert [b.name for b in tmp_path.glob("cfg.yaml.bak*")] == ["cfg.yaml.bak"]
    for r in results:
        if r[0] == "refused":
            assert "being edited by another" in r[1] or "changed since the fix was planned" in r[1], r


def test_changed_between_plan_and_write_is_refused_and_kept(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    shutil.copy(TINY, cfg)
    snap = E.snapshot(cfg)
    planned = E.render(snap, [("model.cpu_offloading", False)])
    cfg.write_text(TINY.read_text() + "# edited by a human meanwhile\n")
    with pytest.raises(E.EditError, match="changed since the fix was planned"):
        E.write(snap, planned)
    assert cfg.read_text().endswith("# edited by a human meanwhile\n")
    assert list(tmp_path.glob("cfg.yaml.bak*")) == []


def test_read_only_config_is_refused(tmp_path):
    """A config marked read-only (no write bit) is the user's "do not touch": refuse, even as root."""
    cfg = tmp_path / "cfg.yaml"
    shutil.copy(TINY, cfg)
    os.chmod(cfg, 0o444)
    snap = E.snapshot(cfg)
    with pytest.raises(E.EditError, match="read-only"):
        E.write(snap, E.render(snap, [("model.cpu_offloading", False)]))
    assert cfg.read_text() == TINY.read_text()
    assert list(tmp_path.glob("cfg.yaml.bak*")) == []
    assert (os.stat(cfg).st_mode & 0o777) == 0o444


def test_read_only_folder_is_a_one_line_error(tmp_path):
    """The backup and the temporary file go beside the config: a folder we cannot write is refused
    before the config is touched (as root, simulated by a folder that is really a file)."""
    cfg = tmp_path / "cfg.yaml"
    shutil.copy(TINY, cfg)
    snap = E.snapshot(cfg)
    new = E.render(snap, [("model.cpu_offloading", False)])
    gone = E.Snapshot(tmp_path / "not-a-dir" / "cfg.yaml", snap.text, snap.sha256)
    (tmp_path / "not-a-dir").write_text("a file")
    with pytest.raises(E.EditError):
        E.write(gone, new)
    assert cfg.read_text() == TINY.read_text()


# --- owned files (issue 16: items 1, 2, 3, 17) -------------------------------------------------
def _fix_text(text: str) -> str:
    return text.replace("cpu_offloading: true", "cpu_offloading: false")


def test_a_symlinked_config_is_edited_through_the_link(tmp_path):
    """Item 1: the link stays a link; its target gets the new value (and the backup beside it)."""
    real = tmp_path / "real"
    real.mkdir()
    target = real / "cfg.yaml"
    target.write_text(TINY.read_text())
    link = tmp_path / "cfg.yaml"
    link.symlink_to(target)
    snap = E.snapshot(link)
    res = E.write(snap, _fix_text(snap.text))
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert "cpu_offloading: false" in target.read_text() and link.read_text() == target.read_text()
    assert res.backup.parent == real and res.backup.read_text() == TINY.read_text()


def test_an_empty_lock_left_by_a_crash_is_taken_over_after_the_grace(tmp_path):
    """Item 2: an empty lock (a crash between create and write, a full disk) no longer refuses
    every later --fix: once older than the grace period it is stale."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(TINY.read_text())
    lock = tmp_path / ("cfg.yaml" + E.LOCK_SUFFIX)
    lock.write_text("")
    old = time.time() - E.LOCK_GRACE_S - 5
    os.utime(lock, (old, old))
    snap = E.snapshot(cfg)
    assert E.write(snap, _fix_text(snap.text)).changed and not lock.exists()


def test_a_lock_naming_a_reused_pid_is_stale(tmp_path):
    """Item 2: the PID is alive but it is another process (another start time)."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(TINY.read_text())
    lock = tmp_path / ("cfg.yaml" + E.LOCK_SUFFIX)
    # a process of our own stands for the other owner (never a PID we did not start: the lock code
    # signals the PID it reads, and a mutant of it must not reach anyone else)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(f"{other.pid} 1\n")  # alive, but it did not start at tick 1: another process
        with E.FileLock(cfg) as held:
            assert held.took_over and "another process" in held.took_over
        lock.write_text(f"{other.pid} {E._start_time(other.pid)}\n")  # the live owner itself: respected
        with pytest.raises(E.EditError, match="being edited by another"), E.FileLock(cfg):
            pass
    finally:
        other.kill()
        other.wait()


def test_mode_of_a_private_config_is_kept_for_the_file_and_its_backup(tmp_path):
    """Item 3: a 0600 config stays 0600, and its backup is not world-readable either."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(TINY.read_text())
    os.chmod(cfg, 0o600)
    snap = E.snapshot(cfg)
    res = E.write(snap, _fix_text(snap.text))
    assert os.stat(cfg).st_mode & 0o777 == 0o600 and os.stat(res.backup).st_mode & 0o777 == 0o600
    st = os.stat(cfg)
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_owner_of_another_users_config_is_kept(tmp_path):
    """Item 3: root editing a user's config leaves it (and the backup) the user's."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(TINY.read_text())
    os.chown(cfg, 4242, 4343)
    os.chmod(cfg, 0o640)
    snap = E.snapshot(cfg)
    res = E.write(snap, _fix_text(snap.text))
    for p in (cfg, res.backup):
        st = os.stat(p)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (4242, 4343, 0o640)


def test_crlf_and_bom_are_kept(tmp_path):
    """Item 17: a Windows-edited config keeps its CR LF line ends and its BOM; only the edited
    line changes."""
    cfg = tmp_path / "cfg.yaml"
    raw = b"\xef\xbb\xbf" + TINY.read_text().replace("\n", "\r\n").encode()
    cfg.write_bytes(raw)
    snap = E.snapshot(cfg)
    new = E.render(snap, [("model.cpu_offloading", False)])
    res = E.write(snap, new)
    out = cfg.read_bytes()
    assert out.startswith(b"\xef\xbb\xbf") and out.count(b"\r\n") == out.count(b"\n")
    changed = [(a, b) for a, b in zip(raw.split(b"\r\n"), out.split(b"\r\n")) if a != b]
    assert len(changed) == 1 and b"cpu_offloading: false" in changed[0][1]
    assert res.backup.read_bytes() == raw


def test_the_new_file_is_born_beside_the_old_one_and_the_folder_is_synced(tmp_path, monkeypatch):
    """What makes the write atomic and durable (mutation testing found it unchecked): the
    temporary file is in the same folder as the config (a rename across filesystems is not
    atomic), hidden and named after it (.NAME.*.tmp; the backup's .NAME.*.bak.tmp), and the
    folder itself is fsynced after the rename."""
    import stat as _stat

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(TINY.read_text())
    renamed, linked, synced = [], [], []
    real_replace, real_link, real_fsync = os.replace, os.link, os.fsync
    monkeypatch.setattr(os, "replace", lambda a, b: renamed.append((a, b)) or real_replace(a, b))
    monkeypatch.setattr(os, "link", lambda a, b: linked.append((a, b)) or real_link(a, b))
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(_stat.S_ISDIR(os.fstat(fd).st_mode)) or real_fsync(fd))
    snap = E.snapshot(cfg)
    E.write(snap, _fix_text(snap.text))
    (src, dst), = renamed
    assert Path(src).parent == Path(dst).parent == tmp_path and Path(dst).name == "cfg.yaml"
    assert Path(src).name.startswith(".cfg.yaml.") and Path(src).name.endswith(".tmp")
    backups = [(a, b) for a, b in linked if Path(b).name.startswith("cfg.yaml.bak")]
    assert backups and all(Path(a).parent == tmp_path and Path(a).name.startswith(".cfg.yaml.")
                           and Path(a).name.endswith(".bak.tmp") for a, _ in backups)
    assert True in synced and synced.count(False) >= 2  # the folder, and the backup and the new text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".cfg.yaml.")]  # no temporary file left
