"""Helpers shared by commands: loading the database and configs with one-line errors."""
from __future__ import annotations

import os

import click

from .. import db as DB
from ..config.load import ConfigError, load_config


def load_db(path=None):
    try:
        return DB.load(path)
    except DB.DatabaseError as exc:
        raise click.ClickException(f"signature database: {exc}") from None


def load_settings():
    """The [tool.diagnose] settings (settings.py); a bad value is a one-line error, an unknown key
    a one-line warning on stderr."""
    from .. import settings as ST

    try:
        st = ST.find()
    except ST.SettingsError as exc:
        raise click.ClickException(str(exc)) from None
    for w in st.warnings:
        click.echo(f"diagnose: warning: {w}", err=True)
    return st


def machine_from_settings(st, world_size, gpu, gpu_memory, launch_cmd=None):
    """What the command line leaves out, from the settings (``--fix`` and ``check`` alike):
    world-size, else the launch command's --nnodes x --nproc_per_node (``launch_cmd``, else the
    settings' launch-cmd); gpu or gpu-memory when neither was given. Returns (world_size, gpu,
    gpu_memory, notes saying where each came from)."""
    from ..remedy.causes import world_from_command

    notes = []
    where = st.source.name if st.source else ""
    if world_size is None:
        world_size = st.get("world-size")
        if world_size is not None:
            notes.append(f"world size {world_size}: from {where} (world-size)")
        else:
            world_size = world_from_command(launch_cmd or st.get("launch-cmd"))
            if world_size is not None:
                notes.append(f"world size {world_size}: from the launch command"
                             + ("" if launch_cmd else f" in {where}"))
    if gpu is None and gpu_memory is None:
        gpu, gpu_memory = st.get("gpu"), st.get("gpu-memory")
        if gpu and gpu_memory:
            raise click.ClickException(f"{st.source}: give gpu or gpu-memory, not both")
        if gpu or gpu_memory:
            notes.append(f"GPU {gpu or f'{gpu_memory} GB'}: from {where}")
    return world_size, gpu, gpu_memory, notes


def load_cfg(path):
    if not path:
        return None
    try:
        return load_config(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def complete_signature(ctx, param, incomplete: str) -> list:
    """Shell completion: signature ids and slugs that start with what was typed."""
    from click.shell_completion import CompletionItem

    try:
        db = DB.load()
    except DB.DatabaseError:
        return []
    low = incomplete.lower()
    return [CompletionItem(s.id, help=s.title) for s in db.signatures if s.id.lower().startswith(low)] + \
        [CompletionItem(s.slug, help=s.id) for s in db.signatures if s.slug.startswith(low)]


def complete_category(ctx, param, incomplete: str) -> list:
    from click.shell_completion import CompletionItem

    from ..model import CATEGORIES

    return [CompletionItem(c) for c in CATEGORIES if c.startswith(incomplete)]


def complete_path_or_command(ctx, param, incomplete: str) -> list:
    """The scan's PATHs: files and folders (the shell's own completion), and, for the first word
    after ``diagnose``, the subcommands too (``diagnose ch<TAB>`` -> check)."""
    import glob

    from click.shell_completion import CompletionItem

    from . import REGISTRY

    if ctx.params.get(param.name) or not ctx.meta.get("diagnose.implied_scan"):
        return [CompletionItem(incomplete, type="file")]
    cmds = [CompletionItem(n, help="subcommand") for n in REGISTRY if n != "scan" and n.startswith(incomplete)]
    if not cmds:
        return [CompletionItem(incomplete, type="file")]  # the shell's own file completion
    # a subcommand matches: the paths that match too, listed here (a "file" item would make
    # bash's script drop the subcommands)
    paths = sorted(glob.glob(glob.escape(incomplete) + "*"))[:200]
    return cmds + [CompletionItem(p + ("/" if os.path.isdir(p) else ""), help="path") for p in paths]


def versions_option(mcore_version):
    return {"megatron-core": mcore_version} if mcore_version else {"megatron-core": newest_known()}


def newest_known() -> str:
    return "0.19.2"


def emit_report(text: str, output=None) -> None:
    """The rendered report to ``output`` (-o FILE) or stdout; an unwritable FILE is one line."""
    if not output:
        click.echo(text, nl=False)
        return
    try:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise click.ClickException(f"{output}: cannot write the report ({exc.strerror or exc})") from None


def gate_options(fn):
    """The options a report's gate shares (scan, merge): the run's config, --fail-on, and the
    baseline of accepted findings to read or write."""
    for deco in reversed((
        click.option("--config", "config_path", type=str,
                     help="The run's config (Bridge run_config.yaml, YAML, or MLM args dump)."),
        click.option("--fail-on", type=click.Choice(["info", "warning", "error"]), default="error",
                     show_default=True,
                     help="Exit 1 when a finding at or above this severity is found (advice never fails)."),
        click.option("--baseline", "baseline_path", type=str, metavar="FILE",
                     help="Baseline file of accepted findings: exit 1 only on findings not in it."),
        click.option("--write-baseline", "write_baseline", type=str, metavar="FILE",
                     help="Record the current findings as accepted in FILE (then exit as if gated by it: 0)."),
    )):
        fn = deco(fn)
    return fn

