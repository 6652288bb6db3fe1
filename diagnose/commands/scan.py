"""``diagnose PATH...``: scan logs, name the root cause, report it."""
from __future__ import annotations

import os
import sys

import click

from .. import baseline as BL
from .. import exitcodes
from ..diagnosis import diagnose_paths
from ..report import FORMATS, get_formatter
from .common import complete_path_or_command, emit_report, gate_options, load_cfg, load_db, versions_option
from .options import FixOptions, Machine, ReportOptions


def exit_code(report, fail_on: str, baseline=None) -> int:
    """1 when a finding at or above --fail-on is found that the --baseline does not accept."""
    return exitcodes.FINDINGS if BL.gate(report.findings, fail_on, baseline).failing else exitcodes.OK


@click.command(epilog=exitcodes.HELP)
@click.argument("paths", nargs=-1, type=str, shell_complete=complete_path_or_command)
@click.option("--format", "fmt", type=click.Choice(sorted(FORMATS)), default=None,
              help="Output format (default: text). Machine formats (json, sarif, junit, github, gitlab, "
                   "markdown) go to stdout, the human summary to stderr.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the report to FILE (summary on stderr).")
@gate_options
@click.option("--engine", type=click.Choice(["auto", "regex", "hyperscan"]), default="auto", show_default=True)
@click.option("--mcore-version", help="Megatron-Core version of the job (default: the newest known).")
@click.option("--baseline-ms", type=float, help="Baseline iteration time (ms) for slowdown symptoms.")
@click.option("--baseline-run", "baseline_run", type=str, metavar="LOG",
              help="The log of a good run of the same job: say how much slower this run is, since when, "
                   "and which timed component grew (diagnose compare's reading of both logs).")
@click.option("-q", "--quiet", is_flag=True, help="No progress and no summary on stderr.")
@click.option("-v", "--details", is_flag=True, help="Text report: every fix, the confirmation and all other findings.")
@click.option("--color", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
              help="Colour in the text report (auto: on a terminal; NO_COLOR / FORCE_COLOR are honoured).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Processes: one file each, and a file of 64 MB or more cut in pieces (default: every "
                   "core when several files of 16 MB or more in all, or one of 64 MB or more, are given; "
                   "1 = serial). The result is the serial scan's.")
@click.option("--shard", metavar="K/N", help="Scan only part K of N of the inputs (the tasks of a --jobs N scan whose "
              "position is K-1 modulo N) and write that partial result to -o FILE; 'diagnose merge' folds "
              "the N partial results into the serial scan's report (a Slurm job array: README).")
@click.option("--signatures", "sig_path", type=click.Path(file_okay=False), hidden=True)
@click.option("--fix", "fix_path", type=str, metavar="CFG",
              help="Plan a fix for the root cause (or, with no log, for the config's preflight) and rewrite CFG.")
@click.option("--dry-run", is_flag=True, help="With --fix: print the diff, write nothing.")
@click.option("--overrides", "overrides_mode", is_flag=True,
              help="With --fix: print the fix as key=value overrides for run_recipe.py instead of editing "
                   "(with --relaunch: pass them on the command line).")
@click.option(
    "--unsafe-fixes", is_flag=True, help="Also apply fixes that change the parallel layout or batch semantics."
)
@click.option("--relaunch", is_flag=True, help="With --fix: relaunch the job, follow it, fix and repeat.")
@click.option("--launcher", "launcher_kind", type=click.Choice(["local", "slurm"]),
              help="How to relaunch (default: [tool.diagnose] launcher in pyproject.toml / diagnose.toml).")
@click.option(
    "--launch-cmd", help="The job's command line (local: run without a shell; slurm: script + args, or --wrap)."
)
@click.option("--max-attempts", type=click.IntRange(min=1), help="Relaunches at most (default 3).")
@click.option(
    "--history", "history_path", type=str, help="JSON-lines history of attempts (default diagnose-history.jsonl)."
)
@click.option("--world-size", type=click.IntRange(min=1), help="GPUs of the job, for computed fixes.")
@click.option("--gpu", help="GPU name for the memory model (H100, H200, A100-80, B200 ...).")
@click.option("--gpu-memory", type=float, help="GPU memory in GB (1e9 bytes), instead of --gpu.")
@click.option("--bridge-version", help="With --fix: Megatron-Bridge version of the job, where the log does not print "
              "it (pip list); fixes that depend on it, e.g. optimizer offload on a fine-tune, are refused while it "
              "is unknown.")
@click.option(
    "--follow", is_flag=True, help="Follow LOG as it grows; diagnose lines as they arrive; stop at a fatal root cause."
)
def scan(
    paths,
    fmt,
    output,
    config_path,
    fail_on,
    baseline_path,
    write_baseline,
    engine,
    mcore_version,
    baseline_ms,
    baseline_run,
    quiet,
    sig_path,
    fix_path,
    dry_run,
    overrides_mode,
    unsafe_fixes,
    relaunch,
    launcher_kind,
    launch_cmd,
    max_attempts,
    history_path,
    world_size,
    gpu,
    gpu_memory,
    bridge_version,
    follow,
    jobs,
    shard,
    details,
    color,
):
    """Scan training logs and name the one root cause."""
    if fix_path or follow:
        from .fix import run_fix, run_follow

        db = load_db(sig_path)
        eng = None if engine == "auto" else engine
        if follow:
            if len(paths) != 1 or os.path.isdir(paths[0]):
                raise click.UsageError("--follow takes exactly one log file (not a folder)")
            formatter = get_formatter(fmt or "text", fail_on=fail_on, color=sys.stdout.isatty() and not output, db=db)
            return run_follow(paths[0], db, load_cfg(config_path), formatter, fail_on, exit_code, quiet,
                              output=output)
        opts = FixOptions(fix_path, dry_run, overrides_mode, unsafe_fixes, relaunch, launcher_kind, launch_cmd,
                          max_attempts, history_path, Machine(world_size, gpu, gpu_memory), bridge_version)
        return run_fix(paths, opts, db=db, versions=versions_option(mcore_version), engine=eng, fmt=fmt,
                       quiet=quiet)
    if relaunch or dry_run or overrides_mode or unsafe_fixes:
        raise click.UsageError("--relaunch, --dry-run, --overrides and --unsafe-fixes need --fix CFG")
    if not paths:
        raise click.UsageError("no log given: diagnose PATH... (a file, a folder, a .gz, or - for stdin)")
    for opt, target, inputs in (("-o", output, (*paths, config_path, baseline_path, baseline_run)),
                                ("--write-baseline", write_baseline, (*paths, config_path, baseline_run))):
        if target and names_an_input(target, inputs):
            raise click.UsageError(f"{opt} {target}: that file is one of the inputs; writing it would overwrite it")
    if shard:
        return _scan_shard(paths, shard, output, engine, mcore_version, sig_path, quiet,
                           fmt=fmt, config_path=config_path, baseline_path=baseline_path,
                           write_baseline=write_baseline, baseline_ms=baseline_ms, baseline_run=baseline_run)
    db = load_db(sig_path)
    cfg = load_cfg(config_path)
    baseline = _load_baseline(baseline_path)
    if engine not in ("auto", None):
        from ..match.engines import available_engines

        if engine not in available_engines():
            raise click.UsageError(f"--engine {engine}: not installed here (pip install 'diagnose[fast]')")
    from ..progress import ScanProgress, total_size

    show = not quiet and sys.stderr.isatty()  # the bar: only on a terminal, after a second
    with ScanProgress(total_size(paths) if show else None, enabled=show) as bar:
        base = None
        if baseline_run:
            base = diagnose_paths([baseline_run], db, None, None if engine == "auto" else engine,
                                  versions_option(mcore_version), sample=False)
            if not base.inputs:
                raise click.UsageError(f"--baseline-run {baseline_run}: nothing could be read")
        report = diagnose_paths(paths, db, cfg, None if engine == "auto" else engine, versions_option(mcore_version),
                                baseline_ms, progress=bar, jobs=jobs, baseline_run=base)
    return finish(report, db, ReportOptions(fmt, output, fail_on, baseline_path, write_baseline, details, color, quiet),
                  baseline)


def _load_baseline(path):
    try:
        return BL.load(path) if path else None
    except BL.BaselineError as exc:
        raise click.ClickException(f"baseline: {exc}") from None


def finish(report, db, opts: ReportOptions, baseline) -> int:
    """Report a diagnosis (scan, merge): write the baseline if asked, render, summarise, exit code.
    ``baseline`` is the loaded --baseline (or None)."""
    from ..remedy.causes import show_computed_overrides

    fmt, output, fail_on, write_baseline, quiet = opts.fmt, opts.output, opts.fail_on, opts.write_baseline, opts.quiet

    show_computed_overrides(report)  # where the root cause's fix is computed, the planner's answer
    if not report.inputs:
        for n in report.notes:
            click.echo(f"diagnose: {n}", err=True)
        click.echo("diagnose: nothing could be read", err=True)
        return exitcodes.USAGE
    if write_baseline:
        try:
            n = BL.write(write_baseline, report.findings)
        except BL.BaselineError as exc:
            raise click.ClickException(f"baseline: {exc}") from None
        baseline = BL.load(write_baseline)
        if not quiet:
            click.echo(f"diagnose: baseline of {n} finding(s) written to {write_baseline}", err=True)
    fmt = fmt or "text"
    tty = output is None and sys.stdout.isatty()
    formatter = get_formatter(fmt, fail_on=fail_on, color=tty if opts.color == "auto" else opts.color, db=db,
                              baseline=baseline, details=opts.details)
    emit_report(formatter.render(report), output)
    if not quiet and (fmt != "text" or output):
        click.echo(stderr_summary(report, fail_on, baseline, output), err=True)
    return exit_code(report, fail_on, baseline)


def parse_shard(text: str) -> tuple[int, int]:
    """``K/N`` -> (K, N), 1 <= K <= N."""
    k, sep, n = (text or "").partition("/")
    if not sep or not k.strip().isdigit() or not n.strip().isdigit() or not 1 <= int(k) <= int(n):
        raise click.BadParameter(f"{text!r}: expected K/N with 1 <= K <= N (e.g. 2/4)", param_hint="--shard")
    return int(k), int(n)


def _scan_shard(paths, shard, output, engine, mcore_version, sig_path, quiet, **others) -> int:
    """``--shard K/N -o FILE``: scan part K of N, write the partial result, report nothing yet."""
    from ..diagnosis import scanner_for
    from ..parallel import ShardError, scan_shard, write_partial

    k, n = parse_shard(shard)
    bad = [f"--{name.replace('_', '-')}" for name, value in others.items() if value]
    if bad:
        raise click.UsageError(f"--shard writes a partial result only: {', '.join(bad)} belong to 'diagnose merge'")
    if not output:
        raise click.UsageError("--shard K/N needs -o FILE, where the partial result is written")
    if not paths:
        raise click.UsageError("no log given: diagnose PATH... --shard K/N -o FILE")
    db = load_db(sig_path)
    try:
        part = scan_shard(scanner_for(db, None if engine == "auto" else engine, versions_option(mcore_version)),
                          list(paths), k, n)
        write_partial(part, output)
    except ShardError as exc:
        raise click.UsageError(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"-o {output}: {exc.strerror or exc}") from None
    if not part["inputs"]:
        click.echo("diagnose: nothing could be read", err=True)
        return exitcodes.USAGE
    if not quiet:
        mine = sum(r.bytes_read for _, r in part["results"])
        click.echo(f"diagnose: shard {k}/{n}: {len(part['results'])} of {part['tasks']} task(s), "
                   f"{mine / 1e6:.1f} MB scanned; partial result in {output} (diagnose merge PARTS...)", err=True)
    return exitcodes.OK


def names_an_input(target: str, inputs) -> bool:
    """Is ``target`` (an output file) the same file as one of ``inputs`` (through links too)?"""
    if not os.path.exists(target):
        return False
    for p in inputs:
        if p and p != "-" and os.path.exists(p):
            try:
                if os.path.samefile(target, p):
                    return True
            except OSError:
                continue
    return False


def stderr_summary(report, fail_on: str, baseline, output) -> str:
    """The human summary that goes to stderr beside a machine format or -o FILE."""
    rc = report.root_cause
    lines = [(f"diagnose: root cause: {rc.finding.signature.id} {rc.finding.signature.title} "
              f"({rc.hit.file}:{rc.hit.line})") if rc else "diagnose: healthy: no failure found"]
    g = BL.gate(report.findings, fail_on, baseline)
    gate = f"diagnose: {len(report.findings)} finding(s); {len(g.failing)} at or above --fail-on {fail_on}"
    if baseline is not None:
        gate += f" not in the baseline ({len(g.known)} known)"
    lines.append(gate + (" -> exit 1" if g.failing else " -> exit 0"))
    if output:
        lines.append(f"diagnose: report written to {output}")
    return "\n".join(lines)
