"""Slurm launcher: ``sbatch`` the user's script (or ``--wrap`` a command), follow its output file.

* Submission: when the launch command's first word is a batch script (a file with a shebang,
  named ``*.sh`` / ``*.sbatch`` / ``*.slurm`` or holding ``#SBATCH`` lines), the rest are its
  arguments: ``sbatch --parsable --output=LOG [sbatch_args] SCRIPT ARGS... OVERRIDES``
  (argv, no shell on our side). Otherwise the command is submitted with ``--wrap``; every
  argument, the fix's overrides included, is quoted with ``shlex.quote`` so the shell Slurm
  starts sees each one as a single word.
* State: ``squeue`` while the job is known to the controller, then ``scontrol show job``
  (``JobState``, ``ExitCode``), then ``sacct`` where accounting is configured.
* Log: the ``--output`` file we asked for (``scontrol``'s ``StdOut`` confirms it).
* Stop: ``scancel`` (Slurm signals every step of the job), then wait until it has left RUNNING.
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from .base import Job, Launcher, LaunchError
from .local import split_command

POLL_STATE_S = 0.5  # squeue/scontrol at most this often per job
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
          "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "STOPPED"}


_FIELD = re.compile(r"(?:^|(?<= ))([A-Za-z][\w:/]*)=(.*?)(?= [A-Za-z][\w:/]*=|\s*$)", re.S)


def parse_scontrol(text: str) -> dict:
    """``scontrol show job -o``'s ``Key=Value`` pairs. A value runs to the next `` Key=``, so a
    path with spaces (``StdOut=/runs/my run/attempt 1.log``) is read whole."""
    return {k: v for k, v in _FIELD.findall(text.strip())}


def _run(argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise LaunchError(f"{argv[0]}: not found (is Slurm's client installed and on PATH?)") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"{argv[0]} did not answer within {timeout:.0f} s") from None


class SlurmLauncher(Launcher):
    name = "slurm"

    def __init__(self, command, sbatch_args: list | None = None, cwd: str | None = None, **_):
        self.argv = split_command(command)
        if self.argv[0] == "sbatch":  # "sbatch job.sh args" is accepted and means "job.sh args"
            self.argv = self.argv[1:]
            if not self.argv:
                raise LaunchError("the launch command 'sbatch' has no script")
        self.sbatch_args = [str(a) for a in (sbatch_args or [])]
        self.cwd = cwd
        if shutil.which("sbatch") is None:
            raise LaunchError("sbatch: not found (is Slurm's client installed and on PATH?)")

    def _is_script(self) -> bool:
        """A batch script: a text file with a shebang, named *.sh / *.sbatch / *.slurm or holding
        #SBATCH directives. Anything else (python, torchrun, a binary) is submitted with --wrap."""
        p = Path(self.argv[0])
        if not p.is_absolute() and self.cwd:
            p = Path(self.cwd) / p
        try:
            with open(p, "rb") as fh:
                head = fh.read(65536)
        except OSError:
            return False
        if not head.startswith(b"#!"):
            return False
        return p.suffix in (".sh", ".sbatch", ".slurm", ".bash") or b"\n#SBATCH" in head

    def start(self, extra_args: list[str], log_path: Path) -> Job:
        log_path = Path(log_path).resolve()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        head = ["sbatch", "--parsable", f"--output={log_path}", "--open-mode=append"]
        if self.cwd:
            head.append(f"--chdir={Path(self.cwd).resolve()}")
        head += self.sbatch_args
        if self._is_script():
            argv = head + self.argv + list(extra_args)
        else:
            argv = head + ["--wrap", shlex.join(self.argv + list(extra_args))]
        cp = _run(argv)
        if cp.returncode != 0:
            msg = (cp.stderr or cp.stdout).strip().splitlines()
            raise LaunchError(f"sbatch failed (exit {cp.returncode}): {msg[-1] if msg else 'no message'}")
        m = re.match(r"\s*(\d+)", cp.stdout)
        if not m:
            raise LaunchError(f"sbatch gave no job id: {cp.stdout.strip()!r}")
        job = Job(job_id=m.group(1), command=argv, log_path=log_path, started=time.time(), state="PENDING")
        out = self._scontrol(job.job_id).get("StdOut")
        if out and out != str(log_path):
            job.log_path = Path(out)
        return job

    # --- state -----------------------------------------------------------------------------------
    def _squeue(self, job_id: str) -> str | None:
        cp = _run(["squeue", "-h", "-j", job_id, "-o", "%T"])
        if cp.returncode != 0:
            return None
        st = cp.stdout.strip().splitlines()
        return st[0].strip() if st else None

    def _scontrol(self, job_id: str) -> dict:
        cp = _run(["scontrol", "show", "job", "-o", job_id])
        if cp.returncode != 0:
            return {}
        return parse_scontrol(cp.stdout)

    def _sacct(self, job_id: str) -> dict:
        if shutil.which("sacct") is None:
            return {}
        cp = _run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State,ExitCode"])
        if cp.returncode != 0 or not cp.stdout.strip():
            return {}
        state, _, code = cp.stdout.strip().splitlines()[0].partition("|")
        return {"JobState": state.split()[0], "ExitCode": code}

    def state(self, job: Job) -> tuple[str, int | None]:
        """(state, exit code or None)."""
        st = self._squeue(job.job_id)
        if st in ACTIVE and st not in ("COMPLETING",):
            return st, None
        info = self._scontrol(job.job_id) or self._sacct(job.job_id)
        state = info.get("JobState") or st or "UNKNOWN"
        if state in ACTIVE:
            return state, None
        code = info.get("ExitCode", "")
        m = re.match(r"(\d+):(\d+)", code)
        if m:
            rc, sig = int(m.group(1)), int(m.group(2))
            return state, (rc if rc else (128 + sig if sig else (0 if state == "COMPLETED" else 1)))
        return state, (0 if state == "COMPLETED" else 1)

    def poll(self, job: Job) -> int | None:
        """The job's exit code once it has ended. The controller is asked at most every
        POLL_STATE_S (the log itself is followed much more often)."""
        if job.ended is not None:
            return job.exit_code
        now = time.monotonic()
        if now - job.extra.get("polled", 0.0) < POLL_STATE_S:
            return None
        job.extra["polled"] = now
        state, rc = self.state(job)
        job.state = state
        if rc is None:
            return None
        job.ended, job.exit_code = time.time(), rc
        return rc

    def stop(self, job: Job, grace_s: float = 1.0) -> None:
        job.extra["stopped"] = True
        cp = _run(["scancel", job.job_id])
        if cp.returncode != 0 and "already completing or completed" not in (cp.stderr or ""):
            raise LaunchError(f"scancel {job.job_id} failed: {(cp.stderr or cp.stdout).strip()}")
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            state, rc = self.state(job)
            if rc is not None or state not in ACTIVE:
                job.state = state
                job.ended = job.ended or time.time()
                job.exit_code = rc if rc is not None else 1
                return
            time.sleep(0.05)
        raise LaunchError(f"job {job.job_id} still {state} 30 s after scancel")

    def describe(self, job: Job) -> str:
        return f"Slurm job {job.job_id}"

