"""``diagnose PATH...``: scan logs, name the root cause, report it."""
from __future__ import annotations

import sys

import click

from .. import exitcodes
from ..analyze.root_cause import severity_at_least
from ..diagnosis import diagnose_paths
from ..report import FORMATS, get_formatter
from .common import load_cfg, load_db, versions_option


def exit_code(report, fail_on: str) -> int:
    if any(severity_at_least(f, fail_on) for f in report.findings):
        return exitcodes.FINDINGS
    return exitcodes.OK


@click.command(epilog=exitcodes.HELP)
@click.argument("paths", nargs=-1, type=str)
@click.option("--format", "fmt", type=click.Choice(sorted(FORMATS)), default=None,
              help="Output format (default: text on a terminal, text otherwise too).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write the report to FILE.")
@click.option("--config", "config_path", type=str, help="The run's config (Bridge run_config.yaml, YAML, or MLM args dump).")
@click.option("--fail-on", type=click.Choice(["info", "warning", "error"]), default="error", show_default=True,
              help="Exit 1 when a finding at or above this severity is found.")
@click.option("--engine", type=click.Choice(["auto", "regex", "hyperscan"]), default="auto", show_default=True)
@click.option("--mcore-version", help="Megatron-Core version of the job (default: the newest known).")
@click.option("--baseline-ms", type=float, help="Baseline iteration time (ms) for slowdown symptoms.")
@click.option("-q", "--quiet", is_flag=True, help="No progress and no summary on stderr.")
@click.option("--signatures", "sig_path", type=click.Path(file_okay=False), hidden=True)
def scan(paths, fmt, output, config_path, fail_on, engine, mcore_version, baseline_ms, quiet, sig_path):
    """Scan training logs and name the one root cause."""
    if not paths:
        raise click.UsageError("no log given: diagnose PATH... (a file, a folder, a .gz, or - for stdin)")
    db = load_db(sig_path)
    cfg = load_cfg(config_path)
    report = diagnose_paths(paths, db, cfg, None if engine == "auto" else engine, versions_option(mcore_version),
                            baseline_ms)
    if not report.inputs:
        for n in report.notes:
            click.echo(f"diagnose: {n}", err=True)
        click.echo("diagnose: nothing could be read", err=True)
        return exitcodes.USAGE
    fmt = fmt or "text"
    formatter = get_formatter(fmt, fail_on=fail_on, color=(output is None and sys.stdout.isatty()))
    out = formatter.render(report)
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(out)
    else:
        click.echo(out, nl=False)
    if not quiet and (fmt != "text" or output):
        rc = report.root_cause
        summary = (f"root cause: {rc.finding.signature.id} {rc.finding.signature.title} "
                   f"({rc.hit.file}:{rc.hit.line})") if rc else "healthy: no failure found"
        click.echo(f"diagnose: {summary}", err=True)
    return exit_code(report, fail_on)
