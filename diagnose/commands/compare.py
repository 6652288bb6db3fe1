"""``diagnose compare BASELINE_LOG RUN_LOG``: an offloaded run against its non-offloaded baseline.

Prints the success criteria as a table (or JSON), a terminal chart of loss and iteration time of
both runs over the iterations, optionally a PNG (``--plot``, needs matplotlib: the ``plot``
extra), and exits 0 when every criterion passes, 1 when one fails, 2 on bad input.
"""
from __future__ import annotations

import io
import json
import math
import sys

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import exitcodes
from ..compare import FAIL, NOT_CHECKED, PASS, CompareError, Comparison
from ..compare_logs import compare as run_compare
from .common import load_cfg, load_db, versions_option

BLOCKS = "▁▂▃▄▅▆▇█"
ASCII_LEVELS = "_.-=+*#@"
_STYLE = {PASS: "bold green", FAIL: "bold red", NOT_CHECKED: "yellow"}


# --------------------------------------------------------------------------- terminal chart

def _buckets(points: dict, idx: int, lo: int, hi: int, width: int) -> list:
    """Mean of series ``idx`` per column over the iteration range [lo, hi]."""
    sums = [0.0] * width
    counts = [0] * width
    span = max(1, hi - lo)
    for it, vals in points.items():
        v = vals[idx]
        if v is None or not math.isfinite(v):
            continue
        col = min(width - 1, int((it - lo) * (width - 1) / span + 0.5)) if hi > lo else 0
        sums[col] += v
        counts[col] += 1
    return [sums[i] / counts[i] if counts[i] else None for i in range(width)]


def sparkline(values: list, vmin: float, vmax: float, levels: str = BLOCKS) -> str:
    out = []
    for v in values:
        if v is None:
            out.append(" ")
            continue
        frac = 0.0 if vmax <= vmin else (v - vmin) / (vmax - vmin)
        out.append(levels[max(0, min(len(levels) - 1, int(frac * (len(levels) - 1) + 0.5)))])
    return "".join(out)


def render_chart(cmp: Comparison, width: int = 60, ascii_only: bool = False) -> str:
    """Loss and iteration time of both runs over the iterations, one sparkline per run and metric
    on a shared scale (so the two lines of a metric can be compared by eye)."""
    levels = ASCII_LEVELS if ascii_only else BLOCKS
    its = list(cmp.baseline.points) + list(cmp.run.points)
    if not its:
        return ""
    lo, hi = min(its), max(its)
    width = max(8, min(width, hi - lo + 1))
    lines = [f"iterations {lo}..{hi}"]
    for idx, name, unit in ((0, cmp.baseline.loss_key or "loss", ""), (1, "iteration time", " ms")):
        rows = [(side.label, _buckets(side.points, idx, lo, hi, width)) for side in (cmp.baseline, cmp.run)]
        vals = [v for _, r in rows for v in r if v is not None]
        if not vals:
            continue
        # the scale leaves out each run's first logged iteration (warm-up), which would flatten the rest
        steady = [v[idx] for side in (cmp.baseline, cmp.run) for it, v in side.points.items()
                  if idx == 1 and it != min(side.points) and v[idx] is not None and math.isfinite(v[idx])]
        vmin, vmax = (min(steady), max(steady)) if steady else (min(vals), max(vals))
        lines.append(f"{name} ({vmin:.4g}..{vmax:.4g}{unit}{', warm-up iteration off the scale' if idx else ''})")
        for label, r in rows:
            present = [v for v in r if v is not None]
            last = f"{present[-1]:.4g}{unit}" if present else "-"
            lines.append(f"  {label:<8} {sparkline(r, vmin, vmax, levels)}  last {last}")
    common = {i: (abs(cmp.run.points[i][0] - cmp.baseline.points[i][0]), None)
              for i in set(cmp.baseline.points) & set(cmp.run.points)
              if cmp.baseline.points[i][0] is not None and cmp.run.points[i][0] is not None
              and math.isfinite(cmp.baseline.points[i][0]) and math.isfinite(cmp.run.points[i][0])}
    if common:
        worst = max(v[0] for v in common.values())
        top = max(worst, 2 * cmp.max_loss_delta)
        over = sorted(i for i, v in common.items() if v[0] >= cmp.max_loss_delta)
        lines.append(f"|loss delta| (0..{top:.3g}; limit {cmp.max_loss_delta:g} at "
                     f"{sparkline([cmp.max_loss_delta], 0.0, top, levels)})")
        tail = f"over the limit at {len(over)} iteration(s) from {over[0]}" if over else "within the limit"
        lines.append(f"  {'run':<8} {sparkline(_buckets(common, 0, lo, hi, width), 0.0, top, levels)}  {tail}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- table / PNG

def table(cmp: Comparison, width: int = 110, color: bool = False) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=color, color_system="auto" if color else None,
                  highlight=False)
    t = Table(title=f"diagnose compare: {escape(cmp.run.paths[0])} vs baseline {escape(cmp.baseline.paths[0])}",
              expand=True, show_lines=True)
    t.add_column("Criterion", no_wrap=True)
    t.add_column("Result", no_wrap=True)
    t.add_column("Details")
    for c in cmp.criteria:
        t.add_row(escape(c.title), f"[{_STYLE[c.status]}]{c.status.upper()}[/]",
                  escape(c.detail) + (f"\n[dim]{escape(', '.join(c.evidence[:3]))}[/]" if c.evidence else ""))
    con.print(t)
    off = cmp.offload
    con.print(f"offload: optimizer_cpu_offload={off.optimizer} optimizer_offload_fraction={off.fraction} "
              f"overlap_cpu_optimizer_d2h_h2d={off.overlap} cpu_offloading={off.activation}"
              + (f" [dim](from {escape(off.source)})[/]" if off.source else ""))
    for n in cmp.notes:
        con.print(f"[yellow]note:[/] {escape(n)}")
    verdict = "PASSED" if cmp.passed else "FAILED"
    counts = ", ".join(f"{sum(1 for c in cmp.criteria if c.status == s)} {s}" for s in (PASS, FAIL, NOT_CHECKED))
    con.print(f"[{'bold green' if cmp.passed else 'bold red'}]{verdict}[/] ({counts})")
    return buf.getvalue()


def plot_png(cmp: Comparison, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise click.ClickException("--plot needs matplotlib: pip install 'diagnose[plot]'") from None
    from matplotlib.ticker import MaxNLocator

    fig, (ax1, axd, ax2) = plt.subplots(3, 1, figsize=(9, 8), sharex=True, gridspec_kw={"height_ratios": [3, 1.4, 3]})
    for side, style in ((cmp.baseline, "-"), (cmp.run, "--")):
        its = sorted(side.points)
        loss = [(i, side.points[i][0]) for i in its if side.points[i][0] is not None]
        ms = [(i, side.points[i][1]) for i in its if side.points[i][1] is not None]
        label = f"{side.label} ({side.paths[0]})"
        if loss:
            ax1.plot([a for a, _ in loss], [b for _, b in loss], style, marker=".", label=label)
        if ms:
            ax2.plot([a for a, _ in ms], [b for _, b in ms], style, marker=".", label=label)
    common = sorted(i for i in set(cmp.baseline.points) & set(cmp.run.points)
                    if cmp.baseline.points[i][0] is not None and cmp.run.points[i][0] is not None)
    if common:
        axd.plot(
            common, [cmp.run.points[i][0] - cmp.baseline.points[i][0] for i in common], "k.-", label="run - baseline"
        )
    for y in (cmp.max_loss_delta, -cmp.max_loss_delta):
        axd.axhline(y, color="red", linestyle=":", linewidth=1)
    axd.set_ylabel("loss delta")
    speed = next((c for c in cmp.criteria if c.name == "speed"), None)
    if speed is not None and isinstance(speed.expected, float) and cmp.baseline.iter_ms:
        ax2.axhline(cmp.baseline.iter_ms * speed.expected, color="gray", linestyle=":",
                    label=f"expected {speed.expected:.2f}x baseline")
    ax1.set_ylabel(cmp.baseline.loss_key or "loss")
    ax2.set_ylabel("elapsed time per iteration (ms)")
    ax2.set_xlabel("iteration")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    status = "  ".join(f"{c.name}: {c.status}" for c in cmp.criteria)
    ax1.set_title(f"{'PASSED' if cmp.passed else 'FAILED'} - {status}", fontsize=9)
    for ax in (ax1, axd, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise click.ClickException(f"{path}: cannot write the plot ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------- command

@click.command(epilog="Exit codes: 0 no criterion failed (those not checked are listed on stderr; --strict fails "
                      "on them); 1 a criterion failed; 2 usage or input error, or no criterion could be checked at "
                      "all; 3 internal error.")
@click.argument("baseline_log", type=str)
@click.argument("run_log", type=str)
@click.option("--config", "config_path", type=str, help="The offloaded run's config (else the one its log printed).")
@click.option("--max-loss-delta", type=click.FloatRange(min=0, min_open=True), default=0.001, show_default=True,
              help="Largest |loss delta| allowed at a common iteration.")
@click.option("--time-tolerance", type=click.FloatRange(min=0), default=0.25, show_default=True,
              help="Fail when the iteration-time factor exceeds the expected penalty by more than this share.")
@click.option("--memory-tolerance", type=click.FloatRange(min=0, max=1), default=0.25, show_default=True,
              help="Fail when the memory drop falls short of the expected drop by more than this share.")
@click.option("--world-size", type=click.IntRange(min=1),
              help="GPUs of the jobs (the expected memory drop depends on the optimizer sharding; "
                   "default: from the log's config where it says).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False), help="Also draw loss and iteration time to a PNG."
)
@click.option("--chart/--no-chart", default=True, show_default=True, help="Terminal chart under the table (text).")
@click.option("--mcore-version", help="Megatron-Core version of the jobs (default: the newest known).")
@click.option("--strict", is_flag=True, help="A criterion that cannot be checked fails the comparison (exit 1).")
def compare(baseline_log, run_log, config_path, max_loss_delta, time_tolerance, memory_tolerance, world_size, fmt,
            plot_path, chart, mcore_version, strict):
    """Check an offloaded run against its non-offloaded baseline: completed without OOM/NCCL
    error, loss matches at every common iteration, memory dropped with the offload fraction,
    iteration time within the expected penalty."""
    db = load_db()
    cfg = load_cfg(config_path)
    try:
        cmp = run_compare(baseline_log, run_log, db, cfg, max_loss_delta, time_tolerance, memory_tolerance,
                          versions_option(mcore_version), world_size)
    except CompareError as exc:
        raise click.ClickException(str(exc)) from None
    if plot_path:
        plot_png(cmp, plot_path)
    if fmt == "json":
        doc = cmp.as_dict()
        if plot_path:
            doc["plot"] = plot_path
        click.echo(json.dumps(doc, indent=2))
    else:
        color = sys.stdout.isatty()
        click.echo(table(cmp, color=color), nl=False)
        if chart:
            enc = (getattr(sys.stdout, "encoding", None) or "").lower()
            click.echo(render_chart(cmp, ascii_only="utf" not in enc), nl=False)
        if plot_path:
            click.echo(f"plot written to {plot_path}")
    unchecked = [c.name for c in cmp.criteria if c.status == NOT_CHECKED]
    if unchecked:
        click.echo(f"diagnose: not checked: {', '.join(unchecked)}" + ("" if strict else " (--strict fails on that)"),
                   err=True)
    if not cmp.passed:
        return exitcodes.FINDINGS
    if unchecked and len(unchecked) == len(cmp.criteria):
        click.echo("diagnose: no criterion could be checked", err=True)
        return exitcodes.USAGE
    return exitcodes.FINDINGS if (strict and unchecked) else exitcodes.OK
