"""``--format markdown``: the report as GitHub-flavoured Markdown (PR comments, job summaries).

Also the body of the GitHub step summary (report/github.py) and of GitLab's issue content."""
from __future__ import annotations

from ..model import Report
from . import ci
from .base import Formatter

_ICON = {"fail": "❌", "baseline": "☑️", "pass": "ℹ️"}


def cell(s) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(s).split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def code(s: str, limit: int = 300) -> str:
    s = " ".join(str(s).split())[:limit]
    fence = "``" if "`" in s else "`"
    return f"{fence}{s}{fence}" if s else ""


def render_markdown(report: Report, fail_on: str = "error", baseline=None, title: str = "diagnose") -> str:
    g = ci.gate_of(report, fail_on, baseline)
    out = []
    verdict = ("**failed**: " + f"{len(g.failing)} finding(s) at or above `{fail_on}`"
               + (" not in the baseline" if baseline is not None else "")) if g.failing else "**passed**"
    out.append(f"## {title}: {cell(', '.join(report.inputs) or '-')}")
    out.append("")
    out.append(f"Gate {verdict} (`--fail-on {fail_on}`"
               + (f", {len(g.known)} known finding(s) accepted by the baseline" if baseline is not None else "") + ").")
    out.append("")
    rc = report.root_cause
    if rc is None:
        out.append("**No failure found: the log looks healthy.**")
    else:
        s = rc.finding.signature
        out.append(f"### Root cause: {cell(s.title)}")
        out.append("")
        out.append("| | |")
        out.append("|---|---|")
        out.append(f"| Signature | `{s.id}` {cell(s.slug)} ({s.category}, {s.severity}, {rc.confidence}) |")
        rank = "?" if rc.hit.rank is None else rc.hit.rank
        out.append(f"| Where | `{cell(rc.hit.file)}:{rc.hit.line}` rank {rank} |")
        out.append(f"| Evidence | {code(rc.hit.text)} |")
        out.append(f"| Cause | {cell(s.cause)} |")
        if rc.because:
            out.append(f"| Config | {cell('; '.join(rc.because))} |")
        if s.confirm_text:
            out.append(f"| Confirm | {cell(s.confirm_text)} |")
        for i, fx in enumerate(s.fixes[:3]):
            out.append(f"| {'Fix' if i == 0 else ''} | {cell(fx.text)} ({fx.safety}) |")
        if rc.overrides:
            out.append(f"| Overrides | {code(' '.join(rc.overrides), 1000)} |")
        if rc.set_aside:
            out.append(
                "| Set aside | " + cell("; ".join(f"{f.signature.title} ({f.count}x)" for f in rc.set_aside)) + " |"
            )
        urls = ci.reference_urls(s)
        if urls:
            out.append(
                "| Source | "
                + ", ".join(f"[{cell(u.split('/blob/')[-1].split('/', 1)[-1])}]({u})" for u in urls)
                + " |"
            )
    findings = ci.ordered(report)
    if findings:
        out.append("")
        out.append("### Findings")
        out.append("")
        out.append("| | Signature | Severity | Title | Count | Ranks | First at |")
        out.append("|---|---|---|---|---:|---|---|")
        for f in findings:
            st = ci.status(f, g)
            s = f.signature
            out.append(f"| {_ICON[st]} | `{s.id}` | {s.severity}{' (advice)' if s.role == 'advice' else ''} | "
                       f"{cell(s.title)}{' *(baseline)*' if st == 'baseline' else ''} | {f.count} | "
                       f"{cell(ci.ranks_text(f)) or '-'} | `{cell(f.first.file)}:{f.first.line}` |")
    for n in report.notes:
        out.append("")
        out.append(f"> note: {cell(n)}")
    return "\n".join(out) + "\n"


class MarkdownFormatter(Formatter):
    name = "markdown"

    def render(self, report: Report) -> str:
        return render_markdown(report, self.fail_on, self.options.get("baseline"))
