"""The scan command's options, bundled by what they are for (frozen: a command reads them, never
changes them). ``diagnose/commands/scan.py`` builds them from the command line and hands them to
the code that reports a diagnosis (``finish``, also used by ``merge``) or plans and applies a fix
(``fix.run_fix``)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReportOptions:
    """How a diagnosis is written and gated."""

    fmt: str | None = None  # text, json, sarif, junit, github, gitlab, markdown (None: text)
    output: str | None = None  # -o FILE (None: stdout)
    fail_on: str = "error"
    baseline_path: str | None = None  # --baseline: known findings that do not fail the gate
    write_baseline: str | None = None
    details: bool = False  # -v
    color: str = "auto"
    quiet: bool = False


@dataclass(frozen=True)
class Machine:
    """What the job runs on, for computed fixes (the settings file fills what is not given)."""

    world_size: int | None = None
    gpu: str | None = None
    gpu_memory: float | None = None  # GB (1e9 bytes)


@dataclass(frozen=True)
class FixOptions:
    """``--fix CFG`` and what goes with it: how the fix is written and whether the job is relaunched."""

    fix_path: str
    dry_run: bool = False
    overrides_mode: bool = False  # print KEY=VALUE overrides instead of rewriting the file
    unsafe: bool = False  # --unsafe-fixes
    relaunch: bool = False
    launcher_kind: str | None = None  # local | slurm
    launch_cmd: str | None = None
    max_attempts: int | None = None
    history_path: str | None = None
    machine: Machine = Machine()
    bridge_version: str | None = None
