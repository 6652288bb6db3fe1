"""``diagnose check CONFIG [key=value ...]``: preflight a config before any GPU is spent.

CONFIG is a Bridge ``run_config.yaml``, a plain YAML of the same sections, an MLM arguments dump,
or the name of a model preset (``diagnose/data/models.yaml``). Overrides follow Bridge's Hydra
grammar (config/overrides.py). Then: static rules from the signature database (config/rules.py),
optionally MCore's own validation (``--mcore``, config/mcore.py), and the memory estimate
(config/memory.py), whose verdict joins the rules as ``metrics.*`` (MB-OFF-054, MB-OFF-055).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .. import exitcodes
from .. import predicate as P
from ..config import memory as M
from ..config import rules, schema
from ..config.load import ConfigError, check_keys, load_config
from ..config.overrides import apply_overrides
from ..config.runconfig import RunConfig
from .common import load_db, load_settings, machine_from_settings, newest_known

JSON_SCHEMA_VERSION = 1


def _versions(mcore_version):
    from ..config.mcore import version as installed

    if mcore_version:
        from packaging.version import InvalidVersion, Version

        try:
            Version(mcore_version)
        except InvalidVersion:
            raise click.ClickException(f"--mcore-version {mcore_version!r} is not a version (e.g. 0.16.1)") from None
        return {"megatron-core": mcore_version}, f"megatron-core {mcore_version} (--mcore-version)"
    v = installed()
    if v:
        return {"megatron-core": v}, f"megatron-core {v} (installed)"
    v = newest_known()
    return {"megatron-core": v}, f"megatron-core {v} (newest known; megatron-core is not installed)"


def _db_keys(db) -> set:
    out = set()
    for s in db.signatures:
        for expr in (s.confirm_when, *(fx.when for fx in s.fixes)):
            if expr:
                out |= {n for n in P.names(expr) if n.split(".")[0] not in ("metrics", "captures")}
        for fx in s.fixes:
            out |= {e.key for e in fx.edits}
    return out


def load_base(config: str, preset: str | None) -> tuple[RunConfig, list]:
    notes = []
    p = Path(config)
    if p.exists() or any(c in config for c in "/\\") or config.endswith((".yaml", ".yml", ".txt", ".log")):
        cfg = load_config(config, strict=True)
    else:
        pr = M.find_preset(config)
        if pr is None:
            raise ConfigError(
                f"{config}: no such file, and not a model preset (presets: {', '.join(sorted(M.presets()))})"
            )
        cfg = RunConfig({"model": dict(pr["model"])}, f"preset {config}")
        notes.append(
            f"config: the {config} preset ({pr.get('hf', '')}) and MCore's defaults for every key it does not set"
        )
    return cfg, notes


def run_check(config, overrides, db, versions, *, gpu=None, gpu_memory=None, world_size=None, host_memory=None,
              gpus_per_node=8, use_mcore=False, preset=None) -> dict:
    """The whole check as data: {"config", "findings": [CheckFinding], "memory": MemoryEstimate|None, "notes"}."""
    cfg, notes = load_base(config, preset)
    db_keys = _db_keys(db)
    cfg, more = apply_overrides(cfg, overrides, lambda k: schema.known(k) or k in db_keys)
    notes += more
    added = cfg.added_keys
    if "(mlm_args)" in str(cfg.source) or "(bridge_" in str(cfg.source):
        # recovered from a log and mapped by diagnose itself: check only what the overrides set
        touched = RunConfig()
        for text in overrides:
            key = text.lstrip("+~").split("=", 1)[0]
            if not text.startswith("~") and cfg.has(key) and key not in added:
                touched.set(key, cfg.get(key))
        check_keys(touched.data, "after overrides")
    else:
        check_keys(cfg.data, "after overrides" if overrides else (cfg.source or config), skip=added)
    cfg, used, filled = M.fill_from_preset(cfg, preset)
    if filled:
        notes.append(f"from the {used} preset (the config leaves them out): {', '.join(filled)}")
    elif preset and used is None:
        raise ConfigError(f"--model {preset}: not a model preset (presets: {', '.join(sorted(M.presets()))})")
    est = None
    logged_world = cfg.get("mlm.world_size")
    if world_size is None and isinstance(logged_world, int) and not isinstance(logged_world, bool) and logged_world > 0:
        world_size = logged_world
        notes.append(f"world size {world_size}: from the job's arguments (world_size)")
    try:
        est = M.estimate(cfg, world_size=world_size, gpu=gpu, gpu_memory_gb=gpu_memory, gpus_per_node=gpus_per_node)
    except M.MemoryModelError as exc:
        if (world_size is not None and "world size" in str(exc)) or "unknown GPU" in str(exc):
            raise ConfigError(str(exc)) from None
        notes.append(f"memory: not estimated ({exc})")
    metrics = est.metrics() if est else {}
    if host_memory is not None:
        metrics["host_capacity_gb"] = float(host_memory)
    elif est and est.host_gb > 0:
        notes.append(f"host memory: {est.host_gb:.1f} GB per node for offloaded optimizer states "
                     f"({est.pinned_gb:.1f} GB of it pinned); "
                     "give --host-memory GB to check it against the node's RAM")
    rcfg = cfg
    if world_size is not None and cfg.get("mlm.world_size") is None:
        rcfg = cfg.copy()
        rcfg.set("mlm.world_size", int(world_size))  # the name the database's world-size rules read
    findings = rules.evaluate(rcfg, db, versions, metrics)
    mcore_results = []
    if use_mcore:
        from ..config import mcore

        mcore_results = mcore.validate(cfg, db, versions)
        by_id = {f.id: f for f in findings}
        for res in mcore_results:
            ev = f"MCore {res.stage}: {res.line}"
            if res.environment:
                notes.append(f"--mcore: {res.stage} could not be checked on this machine ({res.line[:200]})")
                continue
            if res.signature is not None and res.signature.id in by_id:
                f = by_id[res.signature.id]
                f.source = "static+mcore"
                f.evidence = f"{f.evidence} | {ev}"
            elif res.signature is not None:
                findings.append(
                    rules.CheckFinding(
                        res.signature,
                        "mcore",
                        ev,
                        rules.fix_overrides(res.signature, cfg, rules.roots(cfg, metrics)),
                        res.signature.title,
                        res.signature.severity,
                    )
                )
            else:
                findings.append(rules.CheckFinding(None, "mcore", ev, [], f"MCore refused the config ({res.exc_type}); "
                                               "no signature names this message", "error"))
        iv = mcore.version()
        built = [st for st, sec in (("TransformerConfig", "model"), ("OptimizerConfig", "optimizer"))
                 if cfg.get(sec) and st not in {r.stage for r in mcore_results}]
        if built:
            notes.append(f"--mcore: megatron-core {iv} built {' and '.join(built)} without an error")
        if iv and versions.get("megatron-core") != iv:
            notes.append(f"--mcore ran the installed megatron-core {iv}; the static rules are for "
                         f"{versions.get('megatron-core')}")
    return {"config": cfg, "findings": findings, "memory": est, "notes": notes, "mcore": mcore_results}


def finding_dict(f: rules.CheckFinding) -> dict:
    s = f.signature
    return {
        "signature": s.id if s else None, "slug": s.slug if s else None, "title": f.title or (s.title if s else ""),
        "category": s.category if s else "config_other", "severity": f.level, "role": s.role if s else "root",
        "source": f.source, "evidence": f.evidence, "cause": s.cause if s else None,
        "fix": s.fixes[0].text if s and s.fixes else None, "overrides": f.overrides,
    }


def result_dict(res: dict, versions_text: str, fail_on: str) -> dict:
    est = res["memory"]
    return {
        "schema_version": JSON_SCHEMA_VERSION, "command": "check", "config": res["config"].source,
        "versions": versions_text, "fail_on": fail_on,
        "findings": [finding_dict(f) for f in res["findings"]],
        "memory": est.as_dict() if est else None,
        "notes": res["notes"],
    }


_SEV = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def render_text(res: dict, versions_text: str, color: bool) -> str:
    import io

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ..report.text import Lines, terminal_width

    buf = io.StringIO()
    width = terminal_width()  # the terminal's (COLUMNS), as the scan's report
    c = Console(file=buf, force_terminal=color, color_system="auto" if color else None, width=width,
                highlight=False)
    c.print(f"[bold]diagnose check[/] {escape(str(res['config'].source))}  [dim]rules for {escape(versions_text)}[/]")
    fs = res["findings"]
    if fs:
        # one block per finding, as the scan's first screen: wrapped to the width, the overrides
        # whole (a table's column cut them exactly where they must be copied)
        lines = Lines(width)
        for f in fs:
            s = f.signature
            lines.add(f"{f.level}[{s.id if s else '-'}] {f.title} ({f.source})", style=_SEV.get(f.level, "bold"))
            lines.add(f.evidence[:400], indent="  ", label="config")
            if f.overrides:
                lines.add(" ".join(f.overrides), indent="  ", label="overrides", style="bold cyan")
            if s and s.fixes:
                lines.add(s.fixes[0].text, indent="  ", label="fix")
        for t in lines.out:
            c.print(t)
    else:
        c.print("[bold green]No rule fires: the config passes the static checks.[/]")
    est = res["memory"]
    if est is not None:
        t = Table(title=f"Memory per GPU ({est.stage}, world size {est.world_size}, {escape(est.gpu)}); GB = 1e9 bytes",
                  expand=False)
        t.add_column("Component")
        t.add_column("GB", justify="right")
        for k in ("weights", "grads", "optimizer_gpu"):
            t.add_row(k, f"{est.breakdown[k]:.2f}")
        t.add_row("[bold]steady state (mem-allocated-gigabytes)[/]", f"[bold]{est.per_gpu_gb:.2f}[/]")
        t.add_row("activations (peak, in flight)", f"{est.breakdown['activations']:.2f}")
        t.add_row("[bold]peak allocated[/]", f"[bold]{est.peak_gb:.2f}[/]")
        t.add_row("margin (allocator, CUDA context, NCCL)", f"{est.margin_gb:.2f}")
        t.add_row("GPU capacity", f"{est.capacity_gb:.2f}")
        if est.host_gb:
            t.add_row("host memory per node (offloaded optimizer)", f"{est.host_gb:.1f}")
            t.add_row("  of it pinned (FP32 clone, grads)", f"{est.pinned_gb:.1f}")
        c.print(t)
        verdict = ("[bold green]fits[/]" if est.fits else "[bold red]does NOT fit[/]")
        c.print(f"Verdict: {verdict}: peak {est.peak_gb:.1f} + margin {est.margin_gb:.1f} "
                f"{'<=' if est.fits else '>'} capacity {est.capacity_gb:.1f} GB")
        for n in est.notes:
            c.print(f"[dim]- {escape(n)}[/]")
    for n in res["notes"]:
        c.print(f"[dim]note: {escape(n)}[/]")
    return buf.getvalue()


@click.command(epilog=exitcodes.HELP_CHECK)
@click.argument("config")
@click.argument("overrides", nargs=-1)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--gpu", help="GPU by name: h100, h200, a100-40, a100-80, b200, ... (default h100).")
@click.option(
    "--gpu-memory", type=click.FloatRange(min=0, min_open=True), help="GPU memory in GB (1e9 bytes) instead of --gpu."
)
@click.option(
    "--world-size", type=click.IntRange(min=1), help="Number of GPUs (default: the smallest the layout allows)."
)
@click.option(
    "--host-memory",
    type=click.FloatRange(min=0, min_open=True),
    help="Host RAM per node in GB, for the pinned offloaded optimizer states.",
)
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--model", "preset", help="Model preset for shape keys the config leaves out (diagnose/data/models.yaml)."
)
@click.option(
    "--mcore",
    "use_mcore",
    is_flag=True,
    help="Also build MCore's TransformerConfig / OptimizerConfig and report MCore's own exception.",
)
@click.option(
    "--mcore-version", help="Megatron-Core version of the job (default: the installed one, else the newest known)."
)
@click.option("--fail-on", type=click.Choice(["info", "warning", "error"]), default="error", show_default=True)
@click.option("--signatures", "sig_path", type=click.Path(file_okay=False), hidden=True)
def check(config, overrides, fmt, gpu, gpu_memory, world_size, host_memory, gpus_per_node, preset, use_mcore,
          mcore_version, fail_on, sig_path):
    """Preflight CONFIG (a run_config.yaml, plain YAML, MLM args dump, or a model preset name) with
    key=value overrides."""
    if gpu and gpu_memory:
        raise click.ClickException("give --gpu or --gpu-memory, not both")
    world_size, gpu, gpu_memory, from_settings = machine_from_settings(load_settings(), world_size, gpu, gpu_memory)
    db = load_db(sig_path)
    versions, vtext = _versions(mcore_version)
    try:
        res = run_check(config, list(overrides), db, versions, gpu=gpu, gpu_memory=gpu_memory, world_size=world_size,
                        host_memory=host_memory, gpus_per_node=gpus_per_node, use_mcore=use_mcore, preset=preset)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except M.MemoryModelError as exc:
        raise click.ClickException(str(exc)) from None
    except Exception as exc:
        from ..config.mcore import MCoreUnavailable

        if isinstance(exc, MCoreUnavailable):
            raise click.ClickException(f"--mcore: {exc}") from None
        raise
    res["notes"] = from_settings + list(res.get("notes") or [])
    if fmt == "json":
        click.echo(json.dumps(result_dict(res, vtext, fail_on), indent=2, default=str))
    else:
        click.echo(render_text(res, vtext, color=sys.stdout.isatty()), nl=False)
    return exitcodes.FINDINGS if any(f.fails(fail_on) for f in res["findings"]) else exitcodes.OK
