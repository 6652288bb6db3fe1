"""The human report: the first screen tells the story, the rest comes with --details.

Laid out like ruff's or ripgrep's output, for the real terminal width (``COLUMNS`` honoured, 100
when there is no terminal): the root cause as ``severity[ID] title``, where (file:line, rank),
the evidence line, the cause in one sentence, the fix as copy-pasteable overrides (wrapped, never
cut), and one line for what was set aside. ``--details`` (``-v``) adds the confirmation, every
fix and every other finding. Colour only on a terminal, or with ``--color always`` /
``FORCE_COLOR``; never with ``--color never`` / ``NO_COLOR``.
"""
from __future__ import annotations

import io
import re
import shutil
import textwrap

from rich.console import Console
from rich.text import Text

from ..model import Report
from .base import Formatter

_SEV_STYLE = {"error": "bold red", "warning": "bold yellow", "info": "bold cyan"}
MIN_WIDTH, DEFAULT_WIDTH = 40, 100
EVIDENCE_LINES = 3  # the evidence line, wrapped, at most this many lines on the first screen
DETAILS_EVIDENCE_LINES = 6  # with --details: more of it, still leaving the overrides on the first screen
SYMPTOM_EVIDENCE_LINES = 4  # a symptom's evidence is the analysis (expected vs observed, the timers)

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
        return ""
    if len(known) <= 4:
        return "rank " + ",".join(str(r) for r in known)
    return f"{len(known)} ranks ({ranges(known)})"


def first_sentence(text: str) -> str:
    m = re.match(r"(.+?[.!?])(?:\s|$)", " ".join(text.split()))
    return m.group(1) if m else " ".join(text.split())


def terminal_width(given=None) -> int:
    """``given``, else the terminal's (``COLUMNS`` first, as shutil reads it), else 100."""
    w = given or shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    return max(MIN_WIDTH, int(w))


class Lines:
    """Styled lines wrapped to the width with a hanging indent (never wider, nothing cut unless
    asked: ``limit`` lines, the last then ends with an ellipsis)."""

    def __init__(self, width: int):
        self.width = width
        self.out: list = []

    def add(self, text: str, style: str = "", indent: str = "", label: str = "", limit: int = 0,
            label_style: str = "bold", hang: str = "    ", sep: str = ":"):
        head = indent + (f"{label}{sep} " if label else "")
        body = textwrap.wrap(" ".join(text.split()), width=self.width, initial_indent=head,
                             subsequent_indent=indent + hang, break_on_hyphens=False) or [head.rstrip()]
        if limit and len(body) > limit:
            body = body[:limit]
            body[-1] = body[-1][: self.width - 1].rstrip() + "…"
        for i, line in enumerate(body):
            t = Text()
            if i == 0 and label:
                t.append(indent)
                t.append(label + sep, style=label_style)
                t.append(line[len(head) - 1:], style=style)
            else:
                t.append(line, style=style)
            self.out.append(t)

    def blank(self):
        self.out.append(Text(""))


def render_root(lines: Lines, r: Report, details: bool, known: bool = False):
    rc = r.root_cause
    if rc is None:
        msg = "healthy: no failure found"
        if r.structure is not None and not r.structure.iterations and not r.findings:
            msg += " (no iteration lines either: the log may be incomplete)"
        lines.add(msg, style="bold green")
        return
    s = rc.finding.signature
    if known:  # accepted by --baseline: said, not alarmed about (the exit code is 0)
        lines.add(f"known[{s.id}] {s.title} (in the baseline: not failing the gate)", style="dim")
    else:
        lines.add(f"{s.severity}[{s.id}] {s.title}", style=_SEV_STYLE.get(s.severity, "bold"))
    where = f"{rc.hit.file}:{rc.hit.line}"
    rank = "" if rc.hit.rank is None else f", rank {rc.hit.rank}"
    src = f" (from {rc.rank_source})" if details and rc.rank_source and rc.rank_source != "log line" and rank else ""
    lines.add(f"{where}{rank}{src}  [{s.category}, {rc.confidence}]", indent="  ", label="-->", style="",
              label_style="bold blue", sep="")
    limit = DETAILS_EVIDENCE_LINES if details else (EVIDENCE_LINES if lines.width >= 120 else EVIDENCE_LINES - 1)
    if rc.basis == "symptom":  # not a log line but the analysis (the saving, the timers): said whole
        limit = max(limit, SYMPTOM_EVIDENCE_LINES)
    lines.add(rc.hit.text, indent="   | ", style="italic", hang="", limit=limit)
    if rc.overrides:  # right under the evidence: the fix, whole and copy-pasteable
        lines.add(" ".join(rc.overrides), indent="  ", label="overrides", style="bold cyan")
    if rc.basis != "signature":
        lines.add(BASIS_TEXT.get(rc.basis, rc.basis), indent="  ", label="basis", limit=0 if details else 2)
    if rc.straggler:
        st = rc.straggler
        lines.add(f"{len(st['reporting'])} of {st['world_size']} report the timeout ({ranges(st['reporting'])}); "
                  f"not reporting: {ranges(st['not_reporting'])}", indent="  ", label="ranks")
    lines.add(s.cause if details else first_sentence(s.cause), indent="  ", label="cause", limit=0 if details else 2)
    if rc.because:
        lines.add("; ".join(rc.because), indent="  ", label="config", limit=0 if details else 1)
    fixes = s.fixes if details else s.fixes[:1]
    for fx in fixes:
        lines.add(fx.text if details else first_sentence(fx.text), indent="  ", label=f"fix ({fx.safety})",
                  limit=0 if details else 2)
    if details and s.confirm_text:
        lines.add(s.confirm_text, indent="  ", label="confirm")
    if rc.set_aside and not details:
        parts = []
        # the widest first: a cascade on 512 ranks says more than a launcher's one line
        aside = sorted(rc.set_aside, key=lambda f: (-len([k for k in f.ranks if k is not None]), -f.count))
        for f in aside[:3]:
            nr = len([k for k in f.ranks if k is not None])
            parts.append(f"{f.signature.title} ({f.count}x" + (f" on {nr} ranks" if nr else "") + ")")
        more = len(rc.set_aside) - 3
        lines.add("; ".join(parts) + (f"; and {more} more" if more > 0 else "") + " (--details for all)",
                  indent="  ", label=f"set aside {len(rc.set_aside)}", limit=1, style="dim")


def render_findings(lines: Lines, r: Report):
    rc = r.root_cause
    shown = {id(rc.finding), id(rc.refines)} if rc is not None else set()
    others = [f for f in r.findings if id(f) not in shown]
    if not others:
        return
    single = len(r.inputs) <= 1
    lines.blank()
    lines.add(f"other findings ({len(others)}):", style="bold")
    for f in others:
        s = f.signature
        at = str(f.first.line) if single else f"{f.first.file.rsplit('/', 1)[-1]}:{f.first.line}"
        meta = ", ".join(x for x in (s.role, f"x{f.count}", _ranks(f), f"line {at}" if single else at) if x)
        lines.add(f"{s.title} ({meta})", indent="  ", label=f"{s.severity}[{s.id}]",
                  label_style=_SEV_STYLE.get(s.severity, "bold"))


def color_wanted(option) -> bool:
    """``"always"`` / ``"never"`` (--color) decide; otherwise ``option`` says whether stdout is a
    terminal, and NO_COLOR / FORCE_COLOR (https://no-color.org, https://force-color.org) win
    over it."""
    import os

    if option == "always":
        return True
    if option == "never":
        return False
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return option is True


class TextFormatter(Formatter):
    name = "text"
    machine = False

    def render(self, report: Report) -> str:
        width = terminal_width(self.options.get("width"))
        details = bool(self.options.get("details"))
        lines = Lines(width)
        baseline = self.options.get("baseline")
        known = False
        if baseline is not None and report.root_cause is not None:
            from ..baseline import gate

            known = report.root_cause.finding in gate([report.root_cause.finding], self.fail_on, baseline).known
        render_root(lines, report, details, known)
        if details:
            render_findings(lines, report)
        for n in report.notes:
            lines.add(n, label="note", label_style="bold yellow")
        buf = io.StringIO()
        color = color_wanted(self.options.get("color", False))
        console = Console(file=buf, width=width, force_terminal=color, color_system="auto" if color else None,
                          highlight=False, soft_wrap=True)
        for t in lines.out:
            console.print(t)
        return buf.getvalue()
