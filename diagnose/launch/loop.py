"""plan -> write -> relaunch -> follow, again, within a budget of attempts.

Each attempt applies the current plan (rewrites the config, or appends the fix as Hydra
overrides to the command), starts the job through a launcher, follows its log live and ends
the job as soon as a fatal root cause appears. The attempt is appended to the JSON-lines
history file (time, diff, command, job id, log path, outcome, root cause). Then:

* the run is healthy (exit 0, no error root cause): done, exit 4 (0 when nothing was changed);
* the root cause is one this loop already fixed: the fix did not work, stop (exit 5);
* otherwise plan a fix for the new root cause and go again, up to ``max_attempts`` (exit 5
  when the budget is spent); no fix known: exit 6; only an unsafe fix: exit 7.

Ctrl-C ends the running job (its process group, or scancel), writes the attempt as
``interrupted`` and re-raises, so the history file always holds whole lines.
"""
from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .. import exitcodes
from ..config.runconfig import RunConfig
from ..db import Database
from ..model import Report, Severity
from ..remedy import edit as E
from ..remedy import plan as PL
from .base import Job, Launcher, LaunchError
from .follow import POLL_S, Follower

# --- stop signals --------------------------------------------------------------------------------
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP while relaunching: handled like Ctrl-C (the job is stopped, the history
    says "interrupted"); the exit code is 128 + the signal's number, as a shell reports it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class stop_signals_interrupt:
    """Within this block SIGTERM and SIGHUP raise Terminated, as SIGINT raises KeyboardInterrupt:
    the job is never left running with no history record (a scheduler's scancel, a closed
    terminal). The previous handlers come back afterwards."""

    def __enter__(self):
        self.old = {}

        def handler(signum, _frame):
            raise Terminated(signum)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self.old[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread: nothing to install
                pass
        return self

    def __exit__(self, *exc):
        for sig, h in self.old.items():
            signal.signal(sig, h)
        return False


# --- history -------------------------------------------------------------------------------------
class History:
    """Append-only JSON lines; each record is one os.write on an O_APPEND file, SIGINT, SIGTERM
    and SIGHUP held off while it is written."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def append(self, record: dict):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = (json.dumps(record, sort_keys=False, default=str) + "\n").encode("utf-8")
        old = signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                end = os.fstat(fd).st_size
                if end and os.pread(fd, 1, end - 1) != b"\n":  # a record torn by a kill: end it
                    data = b"\n" + data
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # a record torn by a kill -9 or a full disk: the others still count
        return out


def root_json(report: Report | None) -> dict | None:
    if report is None or report.root_cause is None:
        return None
    rc = report.root_cause
    s = rc.finding.signature
    return {"signature": s.id, "slug": s.slug, "title": s.title, "category": s.category, "severity": s.severity,
            "file": rc.hit.file, "line": rc.hit.line, "rank": rc.hit.rank, "text": rc.hit.text[:500]}


def healthy(report: Report, exit_code: int | None) -> bool:
    rc = report.root_cause
    return exit_code == 0 and (rc is None or rc.finding.signature.severity != Severity.ERROR)


# --- watching one job ----------------------------------------------------------------------------
@dataclass
class Watched:
    report: Report
    exit_code: int | None
    stopped_early: bool = False
    detect_to_end_s: float | None = None  # fatal line read -> job gone
    seconds: float = 0.0


def watch(launcher: Launcher, job: Job, db: Database, config: RunConfig | None = None,
          echo: Callable[[str], None] = lambda s: None, poll_s: float = POLL_S,
          timeout_s: float | None = None) -> Watched:
    """Follow ``job``'s log until it ends, or end it the moment a fatal root cause appears."""
    fol = Follower(launcher.log_path(job), db, config)
    t0 = time.monotonic()
    try:
        while True:
            for f in fol.poll():
                h = f.first
                echo(f"  live: {f.id} {f.signature.title} ({h.file}:{h.line}"
                     + (f", rank {h.rank}" if h.rank is not None else "") + f") x{f.count}")
            fatal = fol.fatal()
            if fatal is not None:
                t_seen = fol.first_fatal_at or time.monotonic()
                echo(f"  fatal root cause {fatal.id} seen; ending {launcher.describe(job)} now")
                launcher.stop(job)
                ended = time.monotonic()
                return Watched(fol.report(), job.exit_code, True, ended - t_seen, ended - t0)
            rc = launcher.poll(job)
            if rc is not None:
                return Watched(fol.report(), rc, False, None, time.monotonic() - t0)
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                echo(f"  no end after {timeout_s:.0f} s; ending {launcher.describe(job)}")
                launcher.stop(job)
                return Watched(fol.report(), job.exit_code, True, None, time.monotonic() - t0)
            time.sleep(poll_s)
    except BaseException:
        if job.ended is None:
            try:
                launcher.stop(job)
            except LaunchError:
                pass
        raise


# --- the loop ------------------------------------------------------------------------------------
@dataclass
class Step:
    """What one attempt applies."""

    plan: PL.Plan
    report: Report | None = None  # the failed run the plan came from (None: preflight)


@dataclass
class LoopResult:
    code: int
    attempts: int
    message: str
    records: list = field(default_factory=list)


class RelaunchLoop:
    def __init__(self, db: Database, launcher: Launcher, config_path: Path | None, history: History,
                 log_dir: Path, max_attempts: int = 3, use_overrides: bool = False,
                 allow_unsafe: bool = False, planner: Callable[[Report, RunConfig | None], PL.Plan] | None = None,
                 echo: Callable[[str], None] = lambda s: None, poll_s: float = POLL_S,
                 timeout_s: float | None = None, load_config: Callable[[], RunConfig] | None = None):
        self.db, self.launcher, self.config_path = db, launcher, config_path
        self.history, self.log_dir = history, Path(log_dir)
        self.max_attempts, self.use_overrides, self.allow_unsafe = max_attempts, use_overrides, allow_unsafe
        self.planner, self.echo, self.poll_s, self.timeout_s = planner, echo, poll_s, timeout_s
        self.load_config = load_config
        self.overrides: list[str] = []  # accumulated fix overrides (use_overrides)
        self._applied: dict = {}  # key -> value behind self.overrides
        self._was: dict = {}  # key -> its value before the first fix (MISSING: absent: "+key=")
        self.fixed: set[str] = set()  # root causes this loop has applied a fix for
        self.changed_any = False

    def _config(self) -> RunConfig | None:
        cfg = self.load_config() if self.load_config else None
        if cfg is not None and self._applied:
            cfg = PL.with_changes(cfg, list(self._applied.items()))
        return cfg

    def _apply(self, plan: PL.Plan) -> tuple[str, list]:
        """Apply the plan's edits: (diff, overrides added)."""
        edits = plan.edits
        if not edits:
            return "", []
        if self.use_overrides or self.config_path is None:
            added = []
            for e in edits:
                self._applied[e.key] = e.new
                self._was.setdefault(e.key, e.old)
                added.append(e.override)
            # one override per key, latest value; a key the config never had keeps its "+"
            self.overrides = [PL.PlannedEdit(k, self._was[k], v).override for k, v in self._applied.items()]
            return "", added
        snap = E.snapshot(self.config_path)
        new = E.render(snap, [(e.key, e.new) for e in edits])
        res = E.write(snap, new)
        return res.diff, []

    def run(self, first: Step) -> LoopResult:
        step = first
        records: list[dict] = []
        attempt = 0
        while True:
            plan = step.plan
            status = plan.status
            if status == "unsafe":
                return LoopResult(
                    exitcodes.UNSAFE_REFUSED, attempt, "the only fix is unsafe; rerun with --unsafe-fixes", records
                )
            if status == "no_fix":
                return LoopResult(exitcodes.NO_FIX, attempt, "no fix known for " +
                                  ", ".join(s.id for s, _ in plan.no_fix) if plan.no_fix else "no fix known", records)
            if attempt >= self.max_attempts:
                return LoopResult(exitcodes.RELAUNCH_FAILED, attempt,
                                  f"still failing after {attempt} attempt(s) (--max-attempts {self.max_attempts})",
                                  records)
            attempt += 1
            diff, added = self._apply(plan)
            if diff or added:
                self.changed_any = True
            for pf in plan.fixes:
                self.fixed.add(pf.signature.id)
            if diff:
                self.echo(diff.rstrip("\n"))
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
            log_path = self.log_dir / f"attempt-{attempt}-{stamp}-{os.getpid()}.log"
            record = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "attempt": attempt,
                      "config": str(self.config_path) if self.config_path else None,
                      "planned_for": [s.id for s in plan.causes], "diff": diff, "overrides": list(self.overrides),
                      "launcher": self.launcher.name, "plan": PL.to_json(plan)}
            try:
                job = self.launcher.start(list(self.overrides), log_path)
            except LaunchError as exc:
                record.update(outcome="launch_error", error=str(exc), command=None, job_id=None, log=str(log_path),
                              root_cause=None, exit_code=None)
                self.history.append(record)
                records.append(record)
                return LoopResult(exitcodes.USAGE, attempt, f"cannot relaunch: {exc}", records)
            record.update(command=job.command, job_id=job.job_id, log=str(self.launcher.log_path(job)))
            try:
                self.echo(f"attempt {attempt}/{self.max_attempts}: started {self.launcher.describe(job)}; "
                          f"log {self.launcher.log_path(job)}")
                w = watch(self.launcher, job, self.db, self._config(), self.echo, self.poll_s, self.timeout_s)
            except BaseException as exc:  # Ctrl-C (or a bug): the job must not outlive us
                if job.ended is None:
                    try:
                        self.launcher.stop(job)
                    except LaunchError:
                        pass
                record.update(outcome="interrupted" if isinstance(exc, KeyboardInterrupt) else "error",
                              signal=getattr(exc, "signum", signal.SIGINT if isinstance(exc, KeyboardInterrupt)
                                             else None),
                              exit_code=job.exit_code, root_cause=None,
                              seconds=round(time.time() - job.started, 3), ended_at=job.ended)
                self.history.append(record)
                raise
            ok = healthy(w.report, w.exit_code)
            outcome = "healthy" if ok else ("stopped_early" if w.stopped_early else "failed")
            record.update(outcome=outcome, exit_code=w.exit_code, root_cause=root_json(w.report),
                          seconds=round(w.seconds, 3), ended_at=job.ended,
                          detect_to_end_s=None if w.detect_to_end_s is None else round(w.detect_to_end_s, 3))
            self.history.append(record)
            records.append(record)
            rc = w.report.root_cause
            self.echo(f"attempt {attempt}: {outcome}" + (f" (exit {w.exit_code})" if w.exit_code is not None else "")
                      + (f"; root cause {rc.finding.signature.id} {rc.finding.signature.title}" if rc else "")
                      + (f"; ended {w.detect_to_end_s:.2f} s after the fatal line" if w.detect_to_end_s else ""))
            if ok:
                return LoopResult(exitcodes.FIXED_HEALTHY if self.changed_any else exitcodes.OK, attempt,
                                  "the relaunched run is healthy", records)
            if rc is None:
                return LoopResult(exitcodes.RELAUNCH_FAILED, attempt,
                                  f"the relaunched run failed (exit {w.exit_code}) and no root cause was recognised",
                                  records)
            sid = rc.finding.signature.id
            if sid in self.fixed:
                return LoopResult(exitcodes.RELAUNCH_FAILED, attempt,
                                  f"the same root cause {sid} came back after its fix; stopping", records)
            if self.planner is None:
                return LoopResult(exitcodes.RELAUNCH_FAILED, attempt, "the relaunched run failed", records)
            step = Step(self.planner(w.report, self._config()), w.report)
            self.echo(PL.describe(step.plan))
