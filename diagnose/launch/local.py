"""Local launcher: the user's command line, run without a shell, in its own process group.

The command (``--launch-cmd "python -m torch.distributed.run --nproc_per_node=8
scripts/training/run_recipe.py --recipe ..."``) is split with ``shlex`` once; the fix's Hydra
overrides are appended to that argv as separate arguments, so no config value ever passes
through a shell. The job gets a new session (``setsid``); ``stop`` signals its whole process
tree (the group, plus every descendant: torchrun starts each rank in a session of its own),
SIGTERM first and SIGKILL after a grace period, and returns once none of them runs.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from .base import Job, Launcher, LaunchError

LEADER_GRACE_S = 0.3  # after the ranks are gone, how long torchrun may take to exit on SIGTERM


def split_command(command) -> list[str]:
    if isinstance(command, (list, tuple)):
        argv = [str(a) for a in command]
    else:
        try:
            argv = shlex.split(command or "")
        except ValueError as exc:
            raise LaunchError(f"cannot split the launch command: {exc}") from None
    if not argv:
        raise LaunchError("the launch command is empty")
    return argv


class LocalLauncher(Launcher):
    name = "local"

    def __init__(self, command, cwd: str | None = None, env: dict | None = None, **_):
        self.argv = split_command(command)
        self.cwd = cwd
        self.env = env

    def start(self, extra_args: list[str], log_path: Path) -> Job:
        argv = self.argv + list(extra_args)
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the log as they are printed
        fh = open(log_path, "ab", buffering=0)  # noqa: SIM115 - closed when the job ends
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                    cwd=self.cwd, env=env, start_new_session=True, close_fds=True)
        except FileNotFoundError:
            fh.close()
            raise LaunchError(f"cannot run {argv[0]!r}: no such program") from None
        except PermissionError:
            fh.close()
            raise LaunchError(f"cannot run {argv[0]!r}: permission denied") from None
        except OSError as exc:
            fh.close()
            raise LaunchError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None
        return Job(job_id=str(proc.pid), command=argv, log_path=log_path, started=time.time(),
                   handle=(proc, fh), state="RUNNING")

    def poll(self, job: Job) -> int | None:
        proc, _fh = job.handle
        rc = proc.poll()
        if rc is None:
            return None
        self._finish(job, rc)
        return job.exit_code

    def _finish(self, job: Job, rc: int):
        if job.ended is None:
            job.ended = time.time()
            job.exit_code = rc
            job.state = "COMPLETED" if rc == 0 else ("CANCELLED" if job.extra.get("stopped") else "FAILED")
            job.handle[1].close()

    @staticmethod
    def _procs() -> dict | None:
        """pid -> (ppid, pgid, running) from /proc (None where /proc is missing). Zombies (dead,
        waiting to be reaped) are not running."""
        try:
            entries = os.listdir("/proc")
        except OSError:
            return None
        out = {}
        for e in entries:
            if not e.isdigit():
                continue
            try:
                with open(f"/proc/{e}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            f = stat[stat.rfind(b")") + 2:].split()
            if len(f) > 2:
                out[int(e)] = (int(f[1]), int(f[2]), f[0] not in (b"Z", b"X"))
        return out

    def _tree(self, root: int) -> set[int]:
        """The job's processes: its process group and every descendant of its leader. torchrun
        starts each rank in a session of its own, so the group alone misses the ranks."""
        procs = self._procs()
        if procs is None:
            return {root}
        kids: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in procs.items():
            kids.setdefault(ppid, []).append(pid)
        out, todo = set(), [root]
        while todo:
            pid = todo.pop()
            if pid in out:
                continue
            out.add(pid)
            todo.extend(kids.get(pid, ()))
        out.update(pid for pid, (_, pgid, _) in procs.items() if pgid == root)
        return out

    def _alive(self, pids: set[int]) -> set[int]:
        procs = self._procs()
        if procs is None:
            alive = set()
            for pid in pids:
                try:
                    os.kill(pid, 0)
                    alive.add(pid)
                except ProcessLookupError:
                    pass
                except PermissionError:
                    alive.add(pid)
            return alive
        return {pid for pid in pids if pid in procs and procs[pid][2]}

    def stop(self, job: Job, grace_s: float = 1.0) -> None:
        """SIGTERM to the job's whole process tree (group + descendants), SIGKILL to what is
        left after ``grace_s``; returns when none of them runs."""
        proc, _ = job.handle
        job.extra["stopped"] = True
        pids = self._tree(proc.pid)
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            if proc.poll() is None or self._alive(pids):
                pids |= self._tree(proc.pid) if proc.poll() is None else set()
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
                for pid in self._alive(pids):
                    try:
                        os.kill(pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            deadline = time.monotonic() + wait
            ranks_gone = None
            while time.monotonic() < deadline:
                proc.poll()
                alive = self._alive(pids)
                if proc.returncode is not None and not alive:
                    break
                if alive <= {proc.pid}:
                    # only the launcher (torchrun) is left, tearing down after its ranks died:
                    # give it LEADER_GRACE_S to finish its report, then it gets SIGKILL
                    ranks_gone = ranks_gone or time.monotonic()
                    if time.monotonic() - ranks_gone > LEADER_GRACE_S:
                        deadline = 0
                time.sleep(0.02)
            else:
                continue
            break
        rc = proc.wait()
        self._finish(job, rc)

    def describe(self, job: Job) -> str:
        return f"local process group {job.job_id}"
