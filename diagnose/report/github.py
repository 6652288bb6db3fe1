"""``--format github``: GitHub Actions workflow commands, plus a Markdown job summary.

One annotation per signature (a finding aggregates all its hits and ranks), never one per rank:
GitHub keeps at most 10 error, 10 warning and 10 notice annotations per step (50 per job). When a
level has more findings than that, the first nine are annotated and the tenth annotation lists the
rest. Findings that fail the gate are ``::error``; findings accepted by the baseline are
``::notice``; the others follow their severity (warning -> ``::warning``, info and advice ->
``::notice``).

When ``$GITHUB_STEP_SUMMARY`` is set, the Markdown report (report/markdown.py) is appended to it.
"""
from __future__ import annotations

import os

from ..model import Report
from . import ci
from .base import Formatter
from .markdown import render_markdown

MAX_PER_LEVEL = 10  # per step, per level (actions/toolkit docs/problem-matchers.md)
MAX_MESSAGE = 4000


def escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(s: str) -> str:
    return escape_data(s).replace(":", "%3A").replace(",", "%2C")


def command(level: str, message: str, **props) -> str:
    ps = ",".join(f"{k}={escape_property(str(v))}" for k, v in props.items() if v not in (None, ""))
    return f"::{level}{' ' + ps if ps else ''}::{escape_data(message[:MAX_MESSAGE])}"


def workspace_path(path: str) -> str:
    """GitHub attaches annotations to paths relative to the repository ($GITHUB_WORKSPACE)."""
    ws = os.environ.get("GITHUB_WORKSPACE")
    if ws and os.path.isabs(path):
        rel = os.path.relpath(path, ws)
        if not rel.startswith(".."):
            return rel.replace(os.sep, "/")
    return path


class GithubFormatter(Formatter):
    name = "github"

    def render(self, report: Report) -> str:
        baseline = self.options.get("baseline")
        g = ci.gate_of(report, self.fail_on, baseline)
        per_level: dict = {"error": [], "warning": [], "notice": []}
        for f in ci.annotated(report):
            st = ci.status(f, g)
            if st == "fail":
                lvl = "error"
            elif st == "baseline":
                lvl = "notice"
            else:
                lvl = {"error": "error", "warning": "warning"}.get(ci.level(f), "notice")
                if lvl == "error":  # below the threshold cannot be an error; keep it visible as a warning
                    lvl = "warning"
            per_level[lvl].append((f, st))
        lines = []
        for lvl, items in per_level.items():
            shown = items if len(items) <= MAX_PER_LEVEL else items[:MAX_PER_LEVEL - 1]
            for f, st in shown:
                s = f.signature
                title = f"{s.id} {s.title}" + (" (known, in baseline)" if st == "baseline" else "")
                lines.append(command(lvl, ci.message(f, report), file=workspace_path(f.first.file), line=f.first.line,
                                    title=title))
            rest = items[len(shown):]
            if rest:
                names = "\n".join(f"{f.signature.id} {ci.summary_line(f)} at {f.first.file}:{f.first.line}"
                                  for f, _ in rest)
                lines.append(command(lvl, names, title=f"{len(rest)} more {lvl} findings (see the job summary)"))
        summary = self.options.get("step_summary", os.environ.get("GITHUB_STEP_SUMMARY"))
        if summary:
            try:
                with open(summary, "a", encoding="utf-8") as fh:
                    fh.write(render_markdown(report, self.fail_on, baseline) + "\n")
            except OSError as exc:
                lines.append(command("warning", f"diagnose: cannot append to GITHUB_STEP_SUMMARY ({exc})"))
        if not lines:
            lines.append(command("notice", "diagnose: no failure found, the log looks healthy.", title="diagnose"))
        return "\n".join(lines) + "\n"
