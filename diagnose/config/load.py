"""Read a config file into a RunConfig: Bridge run_config.yaml, plain YAML, or an MLM arguments dump."""
from __future__ import annotations

import stat
from pathlib import Path

import yaml

from ..errors import DiagnoseError
from ..yamlsafe import YamlBomb, check_expansion
from .runconfig import RunConfig, from_log_blocks, normalize, strip_targets


class ConfigError(DiagnoseError):
    """The config cannot be used (one line, names the file and, where known, the key path)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses duplicate keys instead of silently keeping the last one."""


def _construct_mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *base": merged by flatten_mapping below
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise ConfigError(f"a key that is a list or mapping (line {key_node.start_mark.line + 1})") from None
        if key in seen:
            raise ConfigError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
        seen[key] = True
    # SafeConstructor.construct_mapping merges "<<" keys (explicit keys win over merged ones)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

MAX_CONFIG_BYTES = 32 << 20


def _check_expansion(doc, path: str) -> None:
    try:
        check_expansion(doc, path)
    except YamlBomb as exc:
        raise ConfigError(str(exc)) from None


def load_config(path: str, strict: bool = False) -> RunConfig:
    """Read ``path``. With ``strict`` (``diagnose check``), unknown sections or keys and values of
    the wrong type are refused with a ConfigError naming the key's path (config/schema.py)."""
    p = Path(path)
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{path}: not a regular file (a FIFO, socket or device), expected a YAML file")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB, not a config file")
        text = p.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if "------------------------ arguments ------------------------" in text:
        return _from_log_text(text, path)
    try:
        doc = yaml.load(text, Loader=_UniqueKeyLoader)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{path}: YAML nested too deeply") from None
    if doc is None:
        raise ConfigError(f"{path}: empty config")
    if not isinstance(doc, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections (model:, optimizer:, ...), got {type(doc).__name__}"
        )
    _check_expansion(doc, path)
    data = strip_targets(doc)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level holds only a _target_, no sections (model:, optimizer:, ...)")
    if strict:
        check_keys(data, path)
    return normalize(RunConfig(data, path))


def check_keys(data: dict, source: str, skip: tuple = ()) -> None:
    """ConfigError for the first unknown key / wrong type (and how many more there are)."""
    from .schema import validate

    problems = validate(data, skip)
    if problems:
        more = f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})" if len(problems) > 1 else ""
        first = problems[0].replace("\r", "\\r").replace("\n", "\\n")  # a key may hold a newline
        raise ConfigError(f"{source}: {first}{more}")


def _from_log_text(text: str, path: str) -> RunConfig:
    from ..logs.structure import config_blocks_of_text

    cfg = from_log_blocks(config_blocks_of_text(text, path))
    if cfg is None:
        raise ConfigError(f"{path}: no arguments block could be read")
    return cfg
