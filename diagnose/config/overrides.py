"""``key=value`` overrides with Bridge's semantics (Hydra's override grammar).

Bridge's ``run_recipe.py`` parses its trailing ``KEY=VALUE`` arguments with Hydra's
``OverridesParser`` and applies them to an OmegaConf struct config
(``omegaconf_utils.process_config_with_overrides``). We use the same parser, so quoting, lists,
dicts, ``null``, numbers and booleans are read exactly as Bridge reads them, and apply the same
rules:

* ``key=value``   change a key that exists (in the file, or as a field Bridge's dataclass has;
                  see ``schema.py``); an unknown key is refused as Hydra refuses it;
* ``+key=value``  add a key that does not exist yet (refused if it is already there);
* ``++key=value`` add or change;
* ``~key`` / ``~key=value``  delete a key that exists (with a value: only if it holds that value);
* ``key=null``    set None.

Sweeps (``a=1,2``), config groups (``db/mysql``) and ``@package`` are not config edits and are
refused. Every error is one line naming the override, raised as ``ConfigError`` (exit 2).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from .load import ConfigError
from .runconfig import MISSING, RunConfig, normalize


def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def parse(overrides: Iterable[str]) -> list:
    """Hydra ``Override`` objects, one per argument, or ConfigError naming the bad one."""
    from hydra.errors import HydraException

    parser = _parser()
    out = []
    for text in overrides:
        if "=" not in text and not text.startswith("~"):
            raise ConfigError(f"override {text!r}: expected KEY=VALUE (or +KEY=VALUE, ~KEY)")
        try:
            (ov,) = parser.parse_overrides([text])
        except HydraException as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"override {text!r}: {first}") from None
        if ov.is_sweep_override():
            raise ConfigError(f"override {text!r}: sweeps (a,b or range()) are not a single config")
        if ov.package is not None or "/" in ov.key_or_group:
            raise ConfigError(f"override {text!r}: config groups and @package are not supported, use dotted keys")
        out.append((text, ov))
    return out


def _plain(v):
    """Hydra hands back its own containers in a few cases; make them plain Python."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def apply_overrides(cfg: RunConfig, overrides: Iterable[str],
                    known: Callable[[str], bool] | None = None) -> tuple[RunConfig, list[str]]:
    """Apply ``overrides`` to a copy of ``cfg``. Returns (config, notes).

    ``known(dotted)`` tells whether Bridge's config has that field even where the file does not
    spell it out (a plain YAML that holds only a few keys); by default only keys in the file exist.
    """
    from hydra.core.override_parser.types import OverrideType

    out = cfg.copy()
    notes: list[str] = []
    added: list[str] = []
    for text, ov in parse(overrides):
        key = ov.key_or_group
        present = out.get(key, MISSING) is not MISSING
        exists = present or bool(known and known(key))
        if ov.type == OverrideType.DEL:
            if not present:
                raise ConfigError(f"override {text!r}: could not delete from config, {key!r} does not exist")
            if ov.value_type is not None:
                want = _plain(ov.value())
                if out.get(key) != want:
                    raise ConfigError(f"override {text!r}: could not delete {key!r}: its value is "
                                      f"{out.get(key)!r}, not {want!r}")
            out.delete(key)
            continue
        value = _plain(ov.value())
        if ov.type == OverrideType.CHANGE and not exists:
            raise ConfigError(f"override {text!r}: could not override {key!r}: no such key "
                              + _did_you_mean(key, out) + f"(to append to your config use +{text})")
        if ov.type == OverrideType.ADD and present:
            raise ConfigError(f"override {text!r}: could not append to config, an item is already at {key!r} "
                              f"(use {text[1:]} to change it)")
        parent = key.rsplit(".", 1)[0] if "." in key else None
        if parent is not None and out.get(parent, MISSING) is not MISSING and not isinstance(out.get(parent), dict):
            raise ConfigError(f"override {text!r}: {parent!r} is a value ({out.get(parent)!r}), not a section")
        out.set(key, value)
        if ov.type in (OverrideType.ADD, OverrideType.FORCE_ADD) and not exists:
            added.append(key)
    if added:
        notes.append("added by +key: " + ", ".join(added))
    out.added_keys = cfg.added_keys + tuple(added)
    return normalize(out), notes


def _did_you_mean(key: str, cfg: RunConfig) -> str:
    """"did you mean model.pipeline_model_parallel_size? " for a misspelt last part, or ""."""
    import difflib

    parent, _, last = key.rpartition(".")
    section = cfg.get(parent) if parent else cfg.data
    names = list(section) if isinstance(section, dict) else []
    if parent:
        from .schema import schema

        names += list((schema().get(parent.split(".")[0]) or {}) if "." not in parent else [])
    near = difflib.get_close_matches(last, names, n=1, cutoff=0.75)
    return f"(did you mean {parent + '.' if parent else ''}{near[0]}?) " if near else ""
