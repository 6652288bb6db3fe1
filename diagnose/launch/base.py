"""The launcher interface: start a job, poll it, find its log, stop it.

A backend (``local.py``: a process group on this machine; ``slurm.py``: an sbatch job) turns the
user's command plus the fix's extra arguments into a running job. The relaunch loop
(``loop.py``) only talks to this interface, so a new backend is one module and one line in
``BACKENDS``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DiagnoseError


class LaunchError(DiagnoseError):
    """The job could not be started or queried (one line for the user)."""


@dataclass
class Job:
    """A started job. ``job_id``: a pid (local) or a Slurm job id."""

    job_id: str
    command: list  # argv as run (local) or as submitted (slurm)
    log_path: Path
    started: float  # time.time()
    handle: Any = None  # the backend's own state (Popen, ...)
    ended: float | None = None
    exit_code: int | None = None
    state: str = "STARTING"
    extra: dict = field(default_factory=dict)


class Launcher(ABC):
    name = "base"

    @abstractmethod
    def start(self, extra_args: list[str], log_path: Path) -> Job:
        """Start the user's command with ``extra_args`` (Hydra overrides) appended; its output
        (stdout and stderr) goes to ``log_path`` (or to the file the scheduler writes)."""

    @abstractmethod
    def poll(self, job: Job) -> int | None:
        """None while the job runs; its exit code once it has ended."""

    def log_path(self, job: Job) -> Path:
        return job.log_path

    @abstractmethod
    def stop(self, job: Job, grace_s: float = 1.0) -> None:
        """End the job (and everything it started) now; returns once it is gone."""

    def describe(self, job: Job) -> str:
        return f"{self.name} job {job.job_id}"


# launch scripts that read no config file: the fix reaches the job only as trailing KEY=VALUE
# overrides (Megatron-Bridge's scripts/training/run_recipe.py builds the config from the recipe)
OVERRIDES_ONLY = ("run_recipe.py",)


def reads_config_file(argv: list, config_path: Path) -> bool:
    """Does the command read ``config_path``? False where it runs a script that takes overrides
    only and names no such file (then a rewritten YAML would never reach the job)."""
    names = {str(config_path), config_path.name, str(config_path.resolve())}
    if any(a in names or a.endswith("=" + str(config_path)) or Path(a).name == config_path.name for a in argv):
        return True
    return not any(Path(a).name in OVERRIDES_ONLY for a in argv)


BACKENDS = {"local": "diagnose.launch.local:LocalLauncher", "slurm": "diagnose.launch.slurm:SlurmLauncher"}


def make_launcher(kind: str, command: str, **opts) -> Launcher:
    import importlib

    if kind not in BACKENDS:
        raise LaunchError(f"unknown launcher {kind!r} (one of: {', '.join(BACKENDS)})")
    mod, cls = BACKENDS[kind].split(":")
    return getattr(importlib.import_module(mod), cls)(command, **opts)
