"""Local launcher: the user's command line, run without a shell, in its own process group.

The command (``--launch-cmd "python -m torch.distributed.run --nproc_per_node=8
scripts/training/run_recipe.py --recipe ..."``) is split with ``shlex`` once; the fix's Hydra
overrides are appended to that argv as separate arguments, so no config value ever passes
through a shell. The job gets a new session (``setsid``): ``stop`` signals the whole group
(torchrun and every rank it started), SIGTERM first and SIGKILL after a grace period.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

from .base import Job, LaunchError, Launcher


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

    def __init__(self, command, cwd: Optional[str] = None, env: Optional[dict] = None, **_):
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

    def poll(self, job: Job) -> Optional[int]:
        proc, fh = job.handle
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

    def _group_alive(self, pgid: int) -> bool:
        """Is any process of the group still running? Zombies (dead, waiting for their parent
        or for init to reap them) do not count; without /proc, ask the kernel via killpg."""
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        try:
            entries = os.listdir("/proc")
        except OSError:
            return True
        for e in entries:
            if not e.isdigit():
                continue
            try:
                with open(f"/proc/{e}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                return True
        return False

    def stop(self, job: Job, grace_s: float = 1.0) -> None:
        proc, _ = job.handle
        pgid = proc.pid  # start_new_session: the child leads its own group
        job.extra["stopped"] = True
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                proc.poll()
                if proc.returncode is not None and not self._group_alive(pgid):
                    break
                time.sleep(0.02)
            else:
                continue
            break
        rc = proc.wait()
        self._finish(job, rc)

    def describe(self, job: Job) -> str:
        return f"local process group {job.job_id}"
