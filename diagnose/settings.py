"""Project settings for the relaunch: which launcher, which command, the way ruff/pytest read theirs.

Looked up from the current folder upwards, the first of:

* ``diagnose.toml`` (or ``.diagnose.toml``) with the keys at the top level, or under ``[tool.diagnose]``;
* ``pyproject.toml`` with a ``[tool.diagnose]`` table.

Keys::

    [tool.diagnose]
    launcher = "local"                  # or "slurm"
    launch-cmd = "torchrun --nproc_per_node=8 scripts/training/run_recipe.py --recipe qwen3_30b_a3b_pretrain_config"
    sbatch-args = ["--partition=gpu"]   # slurm only: extra sbatch options
    max-attempts = 3
    history = "diagnose-history.jsonl"
    world-size = 16                     # for computed fixes when no log shows the ranks
    gpu = "H100"

Command-line options win over the file. Relative paths in the file are relative to its folder.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import DiagnoseError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# key -> (what it must be, the check): every value is checked when the file is read, before
# anything is planned, written or launched
def _pos_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 20


def _pos_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e6


def _text(v) -> bool:
    return isinstance(v, str) and v.strip() != "" and "\x00" not in v


TYPES = {
    "launcher": ("\"local\" or \"slurm\"", lambda v: v in ("local", "slurm")),
    "launch-cmd": ("a command line (text)", _text),
    "sbatch-args": ("a list of texts", lambda v: isinstance(v, list) and all(_text(x) for x in v)),
    "max-attempts": ("a positive integer", _pos_int),
    "history": ("a file path (text)", _text),
    "world-size": ("a positive integer", _pos_int),
    "gpu": ("a GPU name (text)", _text),
    "gpu-memory": ("a positive number of GB", _pos_num),
    "gpus-per-node": ("a positive integer", _pos_int),
    "log-dir": ("a folder path (text)", _text),
}
KEYS = set(TYPES)

HOWTO = """no launcher configured for --relaunch. Give --launcher and --launch-cmd, or add to pyproject.toml:

    [tool.diagnose]
    launcher = "local"   # or "slurm"
    launch-cmd = "python -m torch.distributed.run --nproc_per_node=8 scripts/training/run_recipe.py --recipe NAME"

(or the same keys, without the table header, in a diagnose.toml beside it)"""


class SettingsError(DiagnoseError):
    pass


@dataclass
class Settings:
    values: dict = field(default_factory=dict)
    source: Path | None = None
    warnings: list = field(default_factory=list)  # unknown keys, ignored (one line each)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    @property
    def folder(self) -> Path | None:
        return self.source.parent if self.source else None


def _table(path: Path) -> dict | None:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{path}: cannot read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: invalid TOML: {exc}") from None
    tool = doc.get("tool")
    tool = tool.get("diagnose") if isinstance(tool, dict) else None
    if tool is not None and not isinstance(tool, dict):
        raise SettingsError(f"{path}: tool.diagnose must be a table ([tool.diagnose]), got {tool!r:.60}")
    if path.name == "pyproject.toml" or tool is not None:
        return tool
    return {k: v for k, v in doc.items() if k != "tool"}


def find(start: Path | None = None) -> Settings:
    cur = (start or Path.cwd()).resolve()
    for folder in (cur, *cur.parents):
        for name in ("diagnose.toml", ".diagnose.toml", "pyproject.toml"):
            p = folder / name
            if not p.is_file():
                continue
            table = _table(p)
            if table is None:
                continue  # a pyproject.toml without [tool.diagnose]: keep looking up
            warnings = []
            for key in sorted(set(table) - KEYS):  # a newer version's key, or a typo: said, not fatal
                import difflib

                near = difflib.get_close_matches(key, sorted(KEYS), n=1)
                warnings.append(f"{p}: unknown key {key!r} in the diagnose settings, ignored"
                                + (f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(sorted(KEYS))})"))
                del table[key]
            for key, value in table.items():  # a known key with a wrong value stops before anything runs
                what, ok = TYPES[key]
                if not ok(value):
                    raise SettingsError(f"{p}: {key} = {value!r:.60}: must be {what}")
            return Settings(dict(table), p, warnings)
    return Settings()
