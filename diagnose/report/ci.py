"""What the CI formats (sarif, junit, github, gitlab, markdown) share: finding order, levels, the
gate status of each finding, messages, and links to the MCore / Bridge source a signature cites."""
from __future__ import annotations

from ..model import Finding, Report, Role, Signature

GITHUB = "https://github.com"


def reference_urls(sig: Signature) -> list[str]:
    """``{repo, path}`` references -> https://github.com/<repo>/blob/main/<path> (plus any ``url``)."""
    out = []
    for r in sig.references:
        if not isinstance(r, dict):
            continue
        if r.get("url"):
            out.append(str(r["url"]))
        elif r.get("repo") and r.get("path"):
            ref = r.get("ref") or "main"
            out.append(f"{GITHUB}/{r['repo']}/blob/{ref}/{str(r['path']).lstrip('/')}")
        elif r.get("repo"):
            out.append(f"{GITHUB}/{r['repo']}")
    return out


def ordered(report: Report) -> list[Finding]:
    """The root cause's finding first, then by severity (error first), then in log order."""
    rc = report.root_cause.finding if report.root_cause else None
    sev = {"error": 0, "warning": 1, "info": 2}
    return sorted(report.findings, key=lambda f: (f is not rc, f.signature.role == Role.ADVICE,
                                                  sev.get(f.signature.severity, 3), f.first.order))


def annotated(report: Report) -> list[Finding]:
    """``ordered``, without the generic finding the root cause refines where both point at the
    same line (one annotation per line: the specific one)."""
    rc = report.root_cause
    gen = rc.refines if rc is not None else None
    same = rc is not None and gen is not None and (gen.first.file, gen.first.line) == (rc.hit.file, rc.hit.line)
    return [f for f in ordered(report) if not (same and f is gen)]


def is_root(report: Report, f: Finding) -> bool:
    return report.root_cause is not None and report.root_cause.finding is f


def level(f: Finding) -> str:
    """error | warning | note (SARIF's words; advice is always a note)."""
    if f.signature.role == Role.ADVICE:
        return "note"
    return {"error": "error", "warning": "warning"}.get(f.signature.severity, "note")


def gate_of(report: Report, fail_on: str, baseline=None):
    from ..baseline import gate

    return gate(report.findings, fail_on, baseline)


def status(f: Finding, g) -> str:
    """'fail' (fails the gate) | 'baseline' (known, accepted) | 'pass' (below the threshold)."""
    if any(x is f for x in g.failing):
        return "fail"
    if any(x is f for x in g.known):
        return "baseline"
    return "pass"


def ranks_text(f: Finding) -> str:
    known = sorted(r for r in f.ranks if r is not None)
    if not known:
        return ""
    if len(known) <= 8:
        return "rank" + ("s " if len(known) > 1 else " ") + ", ".join(str(r) for r in known)
    return f"{len(known)} ranks ({known[0]}..{known[-1]})"


def summary_line(f: Finding) -> str:
    """'<title>: <count>x on ranks ...' in one line."""
    parts = [f"{f.count}x" if f.count != 1 else "once"]
    rt = ranks_text(f)
    if rt:
        parts.append(f"on {rt}")
    return f"{f.signature.title} ({' '.join(parts)})"


def fix_text(f: Finding, report: Report) -> str | None:
    s = f.signature
    if not s.fixes:
        return None
    fix = s.fixes[0]
    overrides = report.root_cause.overrides if report.root_cause is not None and is_root(report, f) else []
    if overrides:  # the fix the root cause's overrides come from (the first that applies to the config)
        keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
        fix = next((fx for fx in s.fixes if fx.edits and {e.key for e in fx.edits} == keys), fix)
    text = fix.text.strip()
    if overrides:
        text += "  Overrides: " + " ".join(overrides)
    return text


def message(f: Finding, report: Report) -> str:
    """The plain-text message of a finding: what, where, evidence, cause, fix."""
    s = f.signature
    head = ("Root cause: " if is_root(report, f) else "") + summary_line(f)
    lines = [head, f"Evidence ({f.first.file}:{f.first.line}): {f.first.text.strip()[:400]}"]
    if s.cause:
        lines.append(f"Cause: {' '.join(s.cause.split())}")
    fx = fix_text(f, report)
    if fx:
        lines.append(f"Fix: {' '.join(fx.split())}")
    if report.root_cause is not None and is_root(report, f) and report.root_cause.set_aside:
        aside = "; ".join(f"{x.signature.title} ({x.count}x)" for x in report.root_cause.set_aside)
        lines.append(f"Set aside as consequences: {aside}")
    return "\n".join(lines)


def help_text(s: Signature) -> str:
    parts = [" ".join(s.cause.split())]
    if s.confirm_text:
        parts.append("How to confirm: " + " ".join(s.confirm_text.split()))
    for fx in s.fixes:
        parts.append(f"Fix ({fx.safety}): " + " ".join(fx.text.split()))
    urls = reference_urls(s)
    if urls:
        parts.append("Source: " + " ".join(urls))
    return "\n\n".join(parts)


def help_markdown(s: Signature) -> str:
    parts = [f"**{s.title}** (`{s.id}` {s.slug}, {s.category}, {s.severity})", "", " ".join(s.cause.split())]
    if s.confirm_text:
        parts += ["", "**How to confirm:** " + " ".join(s.confirm_text.split())]
    if s.fixes:
        parts += ["", "**Fixes:**"]
        for fx in s.fixes:
            parts.append(f"- ({fx.safety}) " + " ".join(fx.text.split()))
    urls = reference_urls(s)
    if urls:
        parts += ["", "**Source:** " + ", ".join(f"[{u.split('/blob/main/')[-1]}]({u})" for u in urls)]
    return "\n".join(parts)
