"""The human report (rich): the root cause first, then the other findings grouped by signature."""
from __future__ import annotations

import io

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..model import Report
from .base import Formatter

_SEV_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


# what each evidence layer means to a reader (analyze/layers.py)
BASIS_TEXT = {
    "anchor": "the known message, on a line cut at the end of the log or wrapped over two lines",
    "exception": "read from the exception's type and message (no exact signature for this wording)",
    "traceback": "read from the traceback's frames (the exception line is missing or unknown)",
    "context": "what the job was doing when it failed (the line just before the traceback)",
    "wrapper": "reported by the launcher or native code (Ray, MPI, a signal, an assertion)",
    "symptom": "a symptom in the run's metrics, not an error line",
    "cascade": "only consequences were found (the first failure is not in this log)",
    "failure": "the job failed, and the log does not say why",
}


def ranges(ranks: list) -> str:
    """0,1,2,3,5 -> "0-3,5"."""
    out, start, prev = [], None, None
    for r in sorted(ranks) + [None]:
        if r is not None and prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = r
    return ",".join(out)


def _ranks(f) -> str:
    known = sorted(r for r in f.ranks if r is not None)
    if not known:
        return "-"
    if len(known) <= 6:
        return ", ".join(f"{r}:{f.ranks[r]}" for r in known)
    return f"{len(known)} ranks ({known[0]}..{known[-1]})"


def render_root(console: Console, r: Report):
    rc = r.root_cause
    if rc is None:
        msg = "No failure found: the log looks healthy."
        if r.structure is not None and not r.structure.iterations and not r.findings:
            msg = "No failure found (no iteration lines either: the log may be incomplete)."
        console.print(Panel(Text(msg, style="bold green"), title="diagnose", expand=False))
        return
    s = rc.finding.signature
    where = f"{rc.hit.file}:{rc.hit.line}"
    rank = "?" if rc.hit.rank is None else str(rc.hit.rank)
    body = Table.grid(padding=(0, 1))
    body.add_column(style="bold", no_wrap=True)
    body.add_column()
    body.add_row("Signature", f"{s.id} {escape(s.slug)}  [dim]({s.category}, {s.severity}, {rc.confidence})[/]"
                 + (f"  [dim]refines {rc.refines.signature.id}[/]" if rc.refines is not None else ""))
    if rc.basis != "signature":
        body.add_row("Basis", escape(BASIS_TEXT.get(rc.basis, rc.basis)))
    body.add_row("Where", f"{escape(where)}  rank {rank}" + (f" [dim](from {rc.rank_source})[/]" if rc.rank_source and rc.rank_source != 'log line' else ""))
    if rc.straggler:
        st = rc.straggler
        body.add_row("Ranks", escape(f"{len(st['reporting'])} of {st['world_size']} report the timeout ("
                                     f"{ranges(st['reporting'])}); not reporting: {ranges(st['not_reporting'])}"))
    body.add_row("Evidence", Text(rc.hit.text[:600], style="italic"))
    body.add_row("Cause", escape(s.cause))
    if rc.because:
        body.add_row("Config", escape("; ".join(rc.because)))
    if s.confirm_text:
        body.add_row("Confirm", escape(s.confirm_text))
    for i, fx in enumerate(s.fixes[:3]):
        body.add_row("Fix" if i == 0 else "", f"{escape(fx.text)} [dim]({fx.safety})[/]")
    if rc.overrides:
        body.add_row("Overrides", Text(" ".join(rc.overrides), style="bold cyan"))
    if rc.set_aside:
        parts = []
        for f in rc.set_aside:
            nr = len([k for k in f.ranks if k is not None])
            parts.append(f"{f.signature.title} ({f.count}x" + (f" on {nr} ranks" if nr else "") + ")")
        body.add_row("Set aside", escape("; ".join(parts)))
    console.print(Panel(body, title=f"[{_SEV_STYLE.get(s.severity, 'bold')}]Root cause: {escape(s.title)}[/]",
                        expand=True))


def render_findings(console: Console, r: Report):
    rc = r.root_cause
    shown = {id(rc.finding), id(rc.refines)} if rc is not None else set()
    others = [f for f in r.findings if id(f) not in shown]
    if not others:
        return
    single = len(r.inputs) <= 1
    t = Table(title="Other findings", show_lines=False, expand=False)
    t.add_column("Signature", no_wrap=True)
    t.add_column("Sev")
    t.add_column("Role")
    t.add_column("Title", min_width=30)
    t.add_column("Count", justify="right")
    t.add_column("Ranks")
    t.add_column("First line" if single else "First at")
    for f in others:
        s = f.signature
        t.add_row(s.id, Text(s.severity, style=_SEV_STYLE.get(s.severity, "")), s.role, escape(s.title),
                  str(f.count), _ranks(f), escape(str(f.first.line) if single else f"{f.first.file.rsplit('/', 1)[-1]}:{f.first.line}"))
    console.print(t)


class TextFormatter(Formatter):
    name = "text"
    machine = False

    def render(self, report: Report) -> str:
        buf = io.StringIO()
        width = self.options.get("width") or 110
        console = Console(file=buf, width=width, force_terminal=self.options.get("color", False),
                          color_system="auto" if self.options.get("color") else None, highlight=False)
        render_root(console, report)
        render_findings(console, report)
        for n in report.notes:
            console.print(f"[yellow]note:[/] {escape(n)}")
        return buf.getvalue()
