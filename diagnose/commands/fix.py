"""``diagnose [LOG...] --fix CFG [--relaunch]`` and ``diagnose --follow LOG``: wiring only.

Options of the default scan command (diagnose/commands/scan.py) hand over to ``run_fix`` /
``run_follow`` here. The logic lives in remedy/ (plan, edit) and launch/ (launchers, follow,
loop); this module reads the options and the project settings, prints, and picks the exit code.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from .. import exitcodes
from .. import settings as ST
from ..config.load import ConfigError, load_config
from ..diagnosis import diagnose_paths
from ..launch import loop as LP
from ..launch.base import LaunchError, make_launcher, reads_config_file
from ..launch.follow import POLL_S, Follower
from ..launch.local import split_command
from ..remedy import causes as C
from ..remedy import edit as E
from ..remedy import plan as PL
from ..remedy import stamp as SP
from .common import emit_report, load_settings, machine_from_settings
from .options import FixOptions, Machine

STATUS_CODE = {"ok": exitcodes.OK, "applied": exitcodes.OK, "nothing": exitcodes.OK,
               "unsafe": exitcodes.UNSAFE_REFUSED, "no_fix": exitcodes.NO_FIX}


def _err(msg: str, quiet: bool = False):
    if not quiet:
        click.echo(msg, err=True)


def _settings() -> ST.Settings:
    return load_settings()


def _load(path: str):
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    # a plan on a NaN, a size 0 or a date where a count belongs would be nonsense (keys this
    # version does not know are fine: they are the job's business)
    bad = PL.unplannable(cfg)
    if bad:
        raise click.ClickException(f"{path}: {bad}")
    return cfg


def _snapshot(path: str) -> E.Snapshot:
    try:
        return E.snapshot(path)
    except E.EditError as exc:
        raise click.ClickException(str(exc)) from None


def _planner(db, machine: Machine, allow_unsafe, bridge_version=None):
    def planner(report, cfg):
        ctx = C.context_from_report(report, machine.world_size, machine.gpu, machine.gpu_memory, db, bridge_version)
        return PL.rebase(PL.plan(C.from_report(report), report.config or cfg, ctx, allow_unsafe), cfg)
    return planner


def _is_mlm(report) -> bool:
    """The run is a Megatron-LM one: its config came from the ``arguments`` dump it printed."""
    return bool(report is not None and report.config is not None and "(mlm_args)" in (report.config.source or "")
                and "(bridge_yaml)" not in (report.config.source or ""))


def _checkpoint_record(path: str) -> bool:
    """``iter_NNNNNNN/run_config.yaml``: a checkpoint's record of the run that saved it."""
    p = Path(path).resolve()
    return (
        bool(re.fullmatch(r"iter_\d+", p.parent.name))
        or (p.parent.parent / "latest_checkpointed_iteration.txt").is_file()
    )


def run_fix(paths, opts: FixOptions, *, db, versions, engine, fmt, quiet) -> int:
    fix_path, dry_run, overrides_mode, unsafe, relaunch = (opts.fix_path, opts.dry_run, opts.overrides_mode,
                                                           opts.unsafe, opts.relaunch)
    bridge_version = opts.bridge_version
    if relaunch and dry_run:
        raise click.UsageError("--dry-run writes nothing, so it cannot be combined with --relaunch")
    if _checkpoint_record(fix_path):
        raise click.UsageError(f"{fix_path} is a checkpoint's record of the run that saved it; fix the job's own "
                               "config (the one it is launched with), not the checkpoint's")
    st = _settings()
    cfg = _load(fix_path)
    snap = _snapshot(fix_path)
    launch_cmd = opts.launch_cmd or st.get("launch-cmd")
    if relaunch and not ((opts.launcher_kind or st.get("launcher")) and launch_cmd):
        raise click.ClickException(ST.HOWTO)
    m = opts.machine
    world_size, gpu, gpu_memory, _ = machine_from_settings(st, m.world_size, m.gpu, m.gpu_memory, launch_cmd)
    machine = Machine(world_size, gpu, gpu_memory)
    report = None
    if paths:
        report = diagnose_paths(paths, db, cfg, engine, versions)
        if not report.inputs:
            for n in report.notes:
                _err(f"diagnose: {n}")
            _err("diagnose: nothing could be read")
            return exitcodes.USAGE
        ctx = C.context_from_report(report, world_size, gpu, gpu_memory, db, bridge_version)
        for n in report.notes:
            _err(f"diagnose: {n}", quiet)
        rc = report.root_cause
        if rc is None:
            _err("diagnose: the log is healthy: nothing to fix", quiet)
        else:
            _err(f"diagnose: root cause {rc.finding.signature.id} {rc.finding.signature.title} "
                 f"({rc.hit.file}:{rc.hit.line}, {rc.confidence})", quiet)
        # planned on the config the run printed (it wins in report.config), written to the file:
        # a value the file already has is no change, so --fix twice is one change
        plan = PL.rebase(PL.plan(C.from_report(report), report.config or cfg, ctx, unsafe), cfg)
        if ctx.resume is not None and ctx.resume.loads is not False and plan.causes:
            _err(f"diagnose: checkpoint: the run {ctx.resume.describe()}", quiet)
    else:
        ctx = PL.Context(world_size=world_size, gpu=gpu, gpu_memory_gb=gpu_memory)
        plan = C.plan_preflight(db, cfg, ctx, unsafe, versions)
        if not plan.causes:
            _err(f"diagnose: preflight of {fix_path}: no problem found", quiet)
    if ctx.world_size:
        _err(
            f"diagnose: world size {ctx.world_size}"
            + (
                " (from the ranks the log shows, rounded up to the layout; give --world-size to be sure)"
                if ctx.world_inferred
                else ""
            ),
            quiet,
        )
    text = PL.describe(plan)
    if text:
        _err(text, quiet)

    if relaunch:
        return _relaunch(db, plan, report, replace(opts, launch_cmd=launch_cmd, machine=machine), st, quiet)

    code = STATUS_CODE[plan.status]
    if overrides_mode:
        if plan.overrides and _is_mlm(report):
            flags, missing = plan.mlm_flags()
            click.echo(" ".join(flags))
            if missing:
                _err("diagnose: Megatron-LM has no argument for " + ", ".join(missing) + "; set it in the job", quiet)
        elif plan.overrides:
            click.echo(" ".join(shlex.quote(o) for o in plan.overrides))
            caveat = PL.env_vars_caveat(plan.overrides, ctx)
            if caveat:
                _err(f"diagnose: {caveat}", quiet)
        elif plan.status == "applied":
            _err(f"diagnose: {fix_path} already has the fix; no override needed", quiet)
        return code
    # the same failed log twice: its fix is in the file already (a log that printed no config
    # leaves the file to plan from, and planned again the fix would climb): remedy/stamp.py
    digest = SP.log_digest(report.inputs) if report is not None and report.inputs else None
    prior = SP.fixed_from(snap.text, digest) if digest and plan.status == "ok" else None
    if prior:
        _err(f"diagnose: {fix_path} already holds the fix made from this log ({prior}); nothing changed: "
             "run the job again and diagnose its new log", quiet)
        return STATUS_CODE["applied"]
    try:
        new = E.render(snap, [(e.key, e.new) for e in plan.edits])
    except E.EditError as exc:
        raise click.ClickException(str(exc)) from None
    if digest and report is not None and new != snap.text:
        new = SP.with_stamp(new, ",".join(s.id for s in plan.causes), os.path.basename(report.inputs[0]), digest)
    diff = E.unified_diff(snap.text, new, fix_path)
    result = None
    if not dry_run and diff:
        try:
            result = E.write(snap, new)
        except E.EditError as exc:
            raise click.ClickException(str(exc)) from None
    if fmt == "json":
        click.echo(json.dumps({"root_cause": LP.root_json(report), "plan": PL.to_json(plan), "diff": diff,
                               "written": bool(result), "backup": str(result.backup) if result else None}, indent=2))
    elif diff:
        click.echo(diff, nl=False)
    if plan.status == "applied" or (plan.status == "ok" and not diff):
        _err(f"diagnose: {fix_path} already has the fix; nothing changed", quiet)
    elif result is not None:
        _err(f"diagnose: rewrote {fix_path} (backup: {result.backup})", quiet)
    elif dry_run and diff:
        _err("diagnose: --dry-run: nothing written", quiet)
    if plan.status == "unsafe":
        _err("diagnose: the fix changes the parallel layout or batch semantics (unsafe); rerun with --unsafe-fixes",
             quiet)
    return code


def _relaunch(db, plan, report, opts: FixOptions, st, quiet) -> int:
    fix_path, overrides_mode, launch_cmd, history_path = opts.fix_path, opts.overrides_mode, opts.launch_cmd, \
        opts.history_path
    kind = opts.launcher_kind or st.get("launcher")
    if not kind or not launch_cmd:
        raise click.ClickException(ST.HOWTO)
    base = st.folder or Path.cwd()
    history = Path(history_path or st.get("history") or "diagnose-history.jsonl")
    if not history_path and st.get("history") and not history.is_absolute():
        history = base / history
    log_dir = Path(st.get("log-dir") or "diagnose-runs")
    if st.get("log-dir") and not log_dir.is_absolute():
        log_dir = base / log_dir
    # everything the loop will write is checked before the config is touched or a job started
    if history.is_dir():
        raise click.UsageError(f"--history {history} is a folder; give a file (JSON lines)")
    for folder, what in ((history.parent, "--history's folder"), (log_dir, "the log folder (log-dir)")):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise click.UsageError(f"cannot create {what} {folder}: {exc.strerror or exc}") from None
        if not os.access(folder, os.W_OK):
            raise click.UsageError(f"{what} {folder} is not writable")
    try:
        launcher = make_launcher(kind, launch_cmd, sbatch_args=st.get("sbatch-args") or [])
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from None
    max_attempts = opts.max_attempts or int(st.get("max-attempts") or 3)
    if not overrides_mode and not reads_config_file(split_command(launch_cmd), Path(fix_path)):
        overrides_mode = True  # a rewritten file would never reach the job
        _err(f"diagnose: the launch command reads no config file ({Path(fix_path).name} is not in it): the fix "
             "is appended to it as KEY=VALUE overrides and the file is left as it is", quiet)
    loop = LP.RelaunchLoop(db, launcher, None if overrides_mode else Path(fix_path), LP.History(history), log_dir,
                           max_attempts=max_attempts, use_overrides=overrides_mode, allow_unsafe=opts.unsafe,
                           planner=_planner(db, opts.machine, opts.unsafe, opts.bridge_version),
                           echo=(lambda s: None) if quiet else (lambda s: click.echo(s, err=True)),
                           load_config=lambda: _load(fix_path))
    try:
        with LP.stop_signals_interrupt():
            res = loop.run(LP.Step(plan, report))
    except E.EditError as exc:
        raise click.ClickException(str(exc)) from None
    _err(f"diagnose: {res.message} (history: {history})", quiet)
    return res.code


def run_follow(path: str, db, cfg, formatter, fail_on, exit_code, quiet, poll_s: float = POLL_S,
               output: str | None = None) -> int:
    """Diagnose ``path`` as it grows; stop at the first fatal root cause or on Ctrl-C. The live
    lines go to stdout only with the text report on stdout; with a machine format or ``-o FILE``
    they go to stderr, so stdout (or FILE) holds the report alone."""
    live_err = bool(output) or getattr(formatter, "machine", True)
    fol = Follower(path, db, cfg)
    if not Path(path).exists():
        _err(f"diagnose: waiting for {path} to appear", quiet)
    _err(f"diagnose: following {path} (Ctrl-C to stop)", quiet)
    try:
        while True:
            for f in fol.poll():
                h = f.first
                click.echo(
                    f"{time.strftime('%H:%M:%S')} {f.id} [{f.signature.severity}/{f.signature.role}] "
                    f"{f.signature.title} ({h.file}:{h.line}"
                    + (f", rank {h.rank}" if h.rank is not None else "")
                    + f") x{f.count}",
                    err=live_err,
                )
                (sys.stderr if live_err else sys.stdout).flush()
            if fol.fatal() is not None:
                _err("diagnose: fatal root cause seen; stopped following", quiet)
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        _err("diagnose: stopped following (Ctrl-C)", quiet)
    report = fol.report()
    C.show_computed_overrides(report)  # where the root cause's fix is computed, the planner's answer
    emit_report(formatter.render(report), output)
    if output:
        _err(f"diagnose: report written to {output}", quiet)
    return exit_code(report, fail_on)
