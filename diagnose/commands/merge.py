"""``diagnose merge PART...``: the report of a scan done in shards (``diagnose PATH --shard K/N``).

Each shard scanned part of the inputs on its own machine (a Slurm array task, say) and wrote a
partial result; merge folds them in scan order, exactly as ``--jobs`` folds its workers'
(parallel.merge_partials), then diagnoses and reports like ``diagnose PATH``.
"""
from __future__ import annotations

import click

from .. import exitcodes
from ..diagnosis import analyze
from ..parallel import ShardError, merge_partials, read_partial
from ..report import FORMATS
from .common import gate_options, load_cfg, load_db
from .options import ReportOptions
from .scan import _load_baseline, finish


@click.command(epilog=exitcodes.HELP)
@click.argument("parts", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(sorted(FORMATS)), default=None,
              help="Output format (default: text), as for a scan.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the report to FILE (summary on stderr).")
@gate_options
@click.option("--baseline-ms", type=float, help="Baseline iteration time (ms) for slowdown symptoms.")
@click.option("-q", "--quiet", is_flag=True, help="No summary on stderr.")
@click.option("-v", "--details", is_flag=True, help="Text report: every fix, the confirmation and all other findings.")
@click.option("--color", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True)
@click.option("--signatures", "sig_path", type=click.Path(file_okay=False), hidden=True)
def merge(parts, fmt, output, config_path, fail_on, baseline_path, write_baseline, baseline_ms, quiet, details,
          color, sig_path):
    """Merge the partial results of a sharded scan (diagnose PATH --shard K/N -o PART) into one report.

    \b
      diagnose logs/ --shard 1/4 -o part1.dpart    (on each of 4 machines: K = 1..4)
      diagnose merge part*.dpart                   the serial scan's report and exit code

    Partial results are pickles: merge only the ones your own jobs wrote.
    """
    db = load_db(sig_path)
    cfg = load_cfg(config_path)
    baseline = _load_baseline(baseline_path)
    try:
        res = merge_partials([read_partial(p) for p in parts], {s.id: s for s in db.signatures})
    except ShardError as exc:
        raise click.UsageError(str(exc)) from None
    except KeyError as exc:  # a signature id this database does not have
        raise click.UsageError(f"the partial results were scanned with another signature database ({exc})") from None
    report = analyze(db, res, cfg, baseline_ms)
    return finish(report, db, ReportOptions(fmt, output, fail_on, baseline_path, write_baseline, details, color, quiet),
                  baseline)
