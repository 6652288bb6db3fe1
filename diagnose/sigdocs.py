"""docs/signatures.md, generated from the database (``diagnose signatures export --markdown``).

One section per category, one entry per signature: its id and slug, title, severity and role,
what it matches, the cause, how to confirm, the fixes with their safety and edits, and the
sources it was written from. tests/signatures/test_sigschema.py checks the file in the repository is the
one the database gives, so the documentation cannot drift from the rules.
"""
from __future__ import annotations

from collections import defaultdict

from .db import Database
from .model import CATEGORIES, Scope


def _one_line(text: str) -> str:
    return " ".join((text or "").split())


def _code(text: str) -> str:
    """``text`` as inline code, whatever backticks it holds."""
    text = text.replace("\n", " ")
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown(db: Database) -> str:
    by_cat = defaultdict(list)
    for s in db.signatures:
        by_cat[s.category].append(s)
    out = ["# Signature database", "",
           "Generated from `signatures/*.yaml` by `diagnose signatures export --markdown`; do not edit.",
           f"{len(db.signatures)} signatures. `diagnose signatures show ID` prints one, with its examples.", "",
           "| category | signatures |", "|---|---|"]
    cats = [c for c in CATEGORIES if c in by_cat] + sorted(c for c in by_cat if c not in CATEGORIES)
    out += [f"| [{c}](#{c.replace('_', '-')}) | {len(by_cat[c])} |" for c in cats]
    for c in cats:
        out += ["", f"## {c}"]
        for s in sorted(by_cat[c], key=lambda x: x.id):
            out += ["", f"### {s.id} `{s.slug}`", "", f"**{_one_line(s.title)}** — {s.severity}, {s.role}"
                    + (f", scope {s.scope}" if s.scope != Scope.LINE else "")]
            if s.anchors:
                out.append("- matches: " + ", ".join(_code(a) for a in s.anchors[:6])
                           + (f" (+{len(s.anchors) - 6} more)" if len(s.anchors) > 6 else ""))
            if s.metric:
                out.append(f"- holds when: {_code(_one_line(s.metric))}")
            if s.confirm_when:
                out.append(f"- confirmed by the config when: {_code(_one_line(s.confirm_when))}")
            if s.applies:
                out.append("- applies to: " + ", ".join(f"{k} {v}" for k, v in sorted(s.applies.items())))
            out.append(f"- cause: {_one_line(s.cause)}")
            if s.confirm_text:
                out.append(f"- confirm: {_one_line(s.confirm_text)}")
            for fx in s.fixes:
                edits = "; ".join(f"{e.key} {e.op} {e.value!r}" if e.op != "delete" else f"{e.key} delete"
                                  for e in fx.edits)
                extra = f" (computed: {fx.compute})" if fx.compute else (f" (edits: {_code(edits)})" if edits else "")
                out.append(f"- fix ({fx.safety}): {_one_line(fx.text)}{extra}")
            refs = [r.get("repo", "") + (f" `{r['path']}`" if r.get("path") else "") if isinstance(r, dict) else str(r)
                    for r in s.references]
            if refs:
                out.append("- sources: " + "; ".join(refs))
    return "\n".join(out) + "\n"
