"""The package's dependency direction: no module imports a layer above it, and no import cycle.

The layers, lowest first, read as the pipeline (CONTRIBUTING.md): shared vocabulary and helpers;
the database, the log readers and the fingerprints; matching and configs; the scan and the
analysis; the diagnosis; remediation; the reports; the launchers; the CLI. Every import counts,
also one inside a function. A new top-level module or package must be given its layer here.
"""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "diagnose"

LAYERS = [
    {"__init__", "model", "predicate", "exitcodes", "errors", "atomic", "settings", "edits", "yamlsafe"},
    {"db", "regex_safety", "sigschema", "logs", "fingerprint", "layer_tables", "data"},
    {"match", "config"},
    {"scan", "parallel", "analyze", "progress"},
    {"diagnosis", "baseline", "compare", "compare_logs"},
    {"remedy"},
    {"report", "sigdocs", "sigtest"},
    {"launch"},
    {"commands", "cli"},
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> dict:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path) -> set:
    """The project's modules ``name`` imports (anywhere in the file), as dotted names."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "diagnose":
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names)  # "from . import plan"
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "diagnose")
    return found


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_top_level_module_has_a_layer():
    tops = {_top(m) for m in _modules()}
    assert tops <= set(RANK), sorted(tops - set(RANK))


def test_no_module_imports_a_layer_above_it():
    mods = _modules()
    bad = []
    for name, path in mods.items():
        for target in _imports(name, path):
            if target in mods and RANK[_top(target)] > RANK[_top(name)]:
                bad.append(f"{name} -> {target}")
    assert not bad, bad


def test_no_import_cycle_between_modules():
    mods = _modules()
    graph = {n: {t for t in _imports(n, p) if t in mods and t != n and not n.startswith(t + ".")}
             for n, p in mods.items()}
    state: dict = {}
    cycle: list = []

    def visit(n, stack):
        state[n] = 1
        stack.append(n)
        for t in sorted(graph[n]):
            if state.get(t) == 1:
                cycle.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [])
    assert not cycle, cycle[:3]


def test_the_checks_see_a_violation(tmp_path, monkeypatch):
    """The import reader finds relative and function-level imports (the checks cannot pass empty)."""
    src = tmp_path / "diagnose" / "config"
    src.mkdir(parents=True)
    f = src / "x.py"
    f.write_text("def f():\n    from ..remedy import plan\n    from . import load\n")
    assert {"diagnose.remedy", "diagnose.remedy.plan", "diagnose.config", "diagnose.config.load"} <= \
        _imports("diagnose.config.x", f)
