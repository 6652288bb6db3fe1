"""Helpers shared by commands: loading the database and configs with one-line errors."""
from __future__ import annotations

import click

from .. import db as DB
from ..config.load import ConfigError, load_config


def load_db(path=None):
    try:
        return DB.load(path)
    except DB.DatabaseError as exc:
        raise click.ClickException(f"signature database: {exc}") from None


def load_cfg(path):
    if not path:
        return None
    try:
        return load_config(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


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
