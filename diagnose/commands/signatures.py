"""``diagnose signatures list|show|test``: browse, explain and self-test the database."""
from __future__ import annotations

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import exitcodes
from .common import complete_category, complete_signature, load_db


@click.group()
def signatures():
    """The signature database: list, show ID, test."""


@signatures.command("list")
@click.option("--category", help="Only this category.", shell_complete=complete_category)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def list_(category, fmt):
    """One line per signature."""
    db = load_db()
    if category and category not in {s.category for s in db.signatures}:
        import difflib

        from ..model import CATEGORIES

        near = difflib.get_close_matches(category, list(CATEGORIES), n=1)
        raise click.UsageError(f"--category {category!r}: no such category" +
                               (f"; did you mean {near[0]!r}?" if near else f" (one of: {', '.join(CATEGORIES)})"))
    sigs = [s for s in db.signatures if not category or s.category == category]
    if fmt == "json":
        import json

        click.echo(json.dumps([{"id": s.id, "slug": s.slug, "title": s.title, "category": s.category,
                                "severity": s.severity, "role": s.role, "scope": s.scope} for s in sigs], indent=2))
        return exitcodes.OK
    t = Table(show_lines=False, expand=False)
    for col in ("ID", "Slug", "Category", "Sev", "Role", "Scope", "Title"):
        t.add_column(col)
    for s in sigs:
        t.add_row(s.id, s.slug, s.category, s.severity, s.role, s.scope, escape(s.title))
    Console(highlight=False).print(t)  # the terminal's width (COLUMNS), not a fixed 200
    click.echo(f"{len(sigs)} signatures in {len(db.files)} files")
    return exitcodes.OK


@signatures.command("show")
@click.argument("key", shell_complete=complete_signature)
def show(key):
    """Everything about one signature (by id, slug or alias)."""
    db = load_db()
    s = db.get(key)
    if s is None:
        raise click.ClickException(f"no signature {key!r} (see: diagnose signatures list)")
    c = Console(width=110, highlight=False)
    c.print(f"[bold]{s.id}[/] ({escape(s.slug)}) — {escape(s.title)}")
    c.print(
        f"category {s.category} · severity {s.severity} · role {s.role} · scope {s.scope} · priority {s.priority}"
        f" · file signatures/{s.file} · version {s.version}"
        + (f" · verified {s.last_verified}" if s.last_verified else "")
    )
    if s.applies:
        c.print("applies to: " + ", ".join(f"{k} {v}" for k, v in s.applies.items()))
    if s.anchors:
        c.print("\n[bold]Matches[/]")
        for a in s.anchors:
            c.print(f"  anchor: {escape(repr(a))}")
        if s.regex:
            c.print(f"  regex:  {escape(s.regex)}")
    if s.metric:
        c.print(f"\n[bold]Metric[/]  {escape(s.metric)}")
    if s.refines:
        c.print(
            f"\n[bold]Refines[/]  {', '.join(s.refines)}"
            + (f"  when captures: {escape(s.when_captures)}" if s.when_captures else "")
        )
    c.print(f"\n[bold]Cause[/]\n  {escape(s.cause)}")
    c.print(f"\n[bold]How to confirm[/]\n  {escape(s.confirm_text)}")
    if s.confirm_when:
        c.print(
            f"  config predicate: {escape(s.confirm_when)}"
            + ("  [dim](also a preflight rule)[/]" if s.preflight else "")
        )
    if s.fixes:
        c.print("\n[bold]Fixes[/]")
        from ..edits import override

        for fx in s.fixes:
            c.print(f"  - [{fx.safety}] {escape(fx.text)}")
            for e in fx.edits:
                c.print(
                    "      " + (escape(override(e.key, e.value, e.op)) if e.op in ("set", "delete")
                                else escape(f"{e.key} {e.op} {e.value}"))
                )
            if fx.compute:
                c.print(f"      computed: {fx.compute}")
            if fx.effect:
                c.print(f"      effect: {escape(fx.effect)}")
    if s.references:
        c.print("\n[bold]Source[/]")
        for r in s.references:
            c.print("  " + escape(" ".join(str(v) for v in r.values())))
    c.print("\n[bold]Examples[/]")
    for case in s.tests_match:
        c.print(f"  [green]match[/]    {escape(_case(case))}")
    for case in s.tests_no_match:
        c.print(f"  [red]no match[/] {escape(_case(case))}")
    return exitcodes.OK


def _case(case) -> str:
    if isinstance(case, str):
        return case
    parts = []
    if case.get("log") or case.get("line"):
        parts.append((case.get("log") or case.get("line")).strip().splitlines()[-1][:160])
    if case.get("config") is not None:
        parts.append(f"with config {case['config']}")
    return " ".join(parts)


@signatures.command("test")
@click.argument("ids", nargs=-1, shell_complete=complete_signature)
@click.option("-v", "--verbose", is_flag=True)
def test(ids, verbose):
    """Run every signature's must-match / must-not-match examples."""
    from ..sigtest import run_all

    db = load_db()
    unknown = [i for i in ids if db.get(i) is None]
    if unknown:
        raise click.UsageError(f"no signature {', '.join(map(repr, unknown))} (see: diagnose signatures list)")
    results = run_all(db, {db.get(i).id for i in ids} or None)
    bad = [r for r in results if not r.ok]
    for r in results if verbose else bad:
        mark = "ok  " if r.ok else "FAIL"
        kind = "match" if r.expect else "no_match"
        click.echo(f"{mark} {r.sig.id} {kind}: {_case(r.case)[:150]} {r.detail}")
    nsig = len({r.sig.id for r in results})
    click.echo(f"{len(results) - len(bad)} passed, {len(bad)} failed ({nsig} signatures)")
    return exitcodes.FINDINGS if bad else exitcodes.OK


@signatures.command("export")
@click.option("--patterns", "what", flag_value="patterns", default=True,
              help="One pattern per line for grep -E -f / rg -f: every anchor the scan uses, regex-escaped.")
@click.option("--schema", "what", flag_value="schema",
              help="The JSON Schema of a signature file (signatures/schema.json), for editors.")
@click.option("--markdown", "what", flag_value="markdown",
              help="The database as documentation (docs/signatures.md).")
@click.option(
    "--signatures-only", is_flag=True, help="Leave out the structure parsers' anchors (iteration, timers...)."
)
@click.option("--mcore-version", help="Only signatures that apply to this Megatron-Core version (default: all).")
def export(what, signatures_only, mcore_version):
    """Export the database for other tools: ``--patterns`` (the default) for grep and ripgrep,
    ``--schema`` for editors, ``--markdown`` for people (docs/signatures.md).

    \b
      diagnose signatures export --patterns > patterns.txt
      rg -c -f patterns.txt run.log        grep -c -E -f patterns.txt run.log
    """
    if what == "schema":
        from ..sigschema import text

        click.echo(text(), nl=False)
        return exitcodes.OK
    if what == "markdown":
        from ..sigdocs import markdown

        click.echo(markdown(load_db()), nl=False)
        return exitcodes.OK
    from ..match.anchors import line_pattern, scan_anchors

    db = load_db()
    anchors = scan_anchors(db, {"megatron-core": mcore_version} if mcore_version else None,
                           structure=not signatures_only)
    pats = sorted({line_pattern(a) for lits in anchors.values() for a in lits})
    click.echo("\n".join(pats))
    return exitcodes.OK
