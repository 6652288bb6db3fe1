"""``diagnose PATH...``: scan logs, name the root cause, report it."""
from __future__ import annotations

import sys

import click

from .. import baseline as BL
from .. import exitcodes
from ..diagnosis import diagnose_paths
from ..report import FORMATS, get_formatter
from .common import load_cfg, load_db, versions_option


def exit_code(report, fail_on: str, baseline=None) -> int:
    """1 when a finding at or above --fail-on is found that the --baseline does not accept."""
    return exitcodes.FINDINGS if BL.gate(report.findings, fail_on, baseline).failing else exitcodes.OK


@click.command(epilog=exitcodes.HELP)
@click.argument("paths", nargs=-1, type=str)
@click.option("--format", "fmt", type=click.Choice(sorted(FORMATS)), default=None,
              help="Output format (default: text). Machine formats (json, sarif, junit, github, gitlab, "
                   "markdown) go to stdout, the human summary to stderr.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the report to FILE (summary on stderr).")
@click.option("--config", "config_path", type=str, help="The run's config (Bridge run_config.yaml, YAML, or MLM args dump).")
@click.option("--fail-on", type=click.Choice(["info", "warning", "error"]), default="error", show_default=True,
              help="Exit 1 when a finding at or above this severity is found (advice never fails).")
@click.option("--baseline", "baseline_path", type=str,
              help="Baseline file of accepted findings: exit 1 only on findings not in it.")
@click.option("--write-baseline", "write_baseline", type=str,
              help="Record the current findings as accepted in FILE (then exit as if gated by it: 0).")
@click.option("--engine", type=click.Choice(["auto", "regex", "hyperscan"]), default="auto", show_default=True)
@click.option("--mcore-version", help="Megatron-Core version of the job (default: the newest known).")
@click.option("--baseline-ms", type=float, help="Baseline iteration time (ms) for slowdown symptoms.")
@click.option("-q", "--quiet", is_flag=True, help="No progress and no summary on stderr.")
@click.option("--signatures", "sig_path", type=click.Path(file_okay=False), hidden=True)
def scan(paths, fmt, output, config_path, fail_on, baseline_path, write_baseline, engine, mcore_version, baseline_ms,
         quiet, sig_path):
    """Scan training logs and name the one root cause."""
    if not paths:
        raise click.UsageError("no log given: diagnose PATH... (a file, a folder, a .gz, or - for stdin)")
    db = load_db(sig_path)
    cfg = load_cfg(config_path)
    try:
        baseline = BL.load(baseline_path) if baseline_path else None
    except BL.BaselineError as exc:
        raise click.ClickException(f"baseline: {exc}") from None
    if engine not in ("auto", None):
        from ..match.engine import available_engines

        if engine not in available_engines():
            raise click.UsageError(f"--engine {engine}: not installed here (pip install 'diagnose[fast]')")
    report = diagnose_paths(paths, db, cfg, None if engine == "auto" else engine, versions_option(mcore_version),
                            baseline_ms)
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
    formatter = get_formatter(fmt, fail_on=fail_on, color=(output is None and sys.stdout.isatty()), db=db,
                              baseline=baseline)
    out = formatter.render(report)
    if output:
        try:
            with open(output, "w", encoding="utf-8") as fh:
                fh.write(out)
        except OSError as exc:
            raise click.ClickException(f"{output}: cannot write the report ({exc.strerror or exc})") from None
    else:
        click.echo(out, nl=False)
    if not quiet and (fmt != "text" or output):
        click.echo(stderr_summary(report, fail_on, baseline, output), err=True)
    return exit_code(report, fail_on, baseline)


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
