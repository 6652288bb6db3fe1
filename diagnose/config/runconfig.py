"""RunConfig: a training job's configuration in Bridge's layout (model.*, optimizer.*, ddp.* ...).

Built from a Bridge ``run_config.yaml`` / plain YAML (config/load.py), or recovered from the log
(the MLM ``arguments`` dump, Bridge's ``Final configuration:`` YAML and its non-default summary).
Megatron-LM argument names are mapped onto Bridge paths by ``diagnose/data/mlm_args.yaml``.
"""
from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from ..predicate import lookup

MISSING = object()  # "no such key" (None is a value)


@lru_cache(maxsize=1)
def mlm_map() -> dict:
    path = Path(__file__).resolve().parent.parent / "data" / "mlm_args.yaml"
    return yaml.safe_load(path.read_text(encoding="utf-8"))


class RunConfig:
    def __init__(self, data: dict | None = None, source: str = ""):
        self.data: dict = data or {}
        self.source = source
        self.added_keys: tuple = ()  # keys that +key overrides added (config/overrides.py)

    # dotted access -------------------------------------------------------------------------
    def get(self, dotted: str, default: Any = None):
        return lookup(self.data, dotted, default)

    def has(self, dotted: str) -> bool:
        return self.get(dotted, MISSING) is not MISSING

    def set(self, dotted: str, value: Any):
        cur: Any = self.data
        parts = dotted.split(".")
        for part in parts[:-1]:
            nxt = cur.get(part)
            if not isinstance(nxt, dict):
                nxt = cur[part] = {}
            cur = nxt
        cur[parts[-1]] = value

    def delete(self, dotted: str):
        cur: Any = self.data
        parts = dotted.split(".")
        for part in parts[:-1]:
            cur = cur.get(part)
            if not isinstance(cur, dict):
                return
        cur.pop(parts[-1], None)

    def copy(self) -> RunConfig:
        return RunConfig(copy.deepcopy(self.data), self.source)

    def __bool__(self):
        return bool(self.data)

    # merging ---------------------------------------------------------------------------------
    def merge(self, other: RunConfig) -> RunConfig:
        """Values of ``other`` fill in (and override) this one's."""
        def rec(a: dict, b: dict):
            for k, v in b.items():
                if isinstance(v, dict) and isinstance(a.get(k), dict):
                    rec(a[k], v)
                else:
                    a[k] = copy.deepcopy(v)
        out = self.copy()
        rec(out.data, other.data)
        out.source = ", ".join(s for s in (self.source, other.source) if s)
        return out

    def differences(self, other: RunConfig) -> list:
        """(key, this value, other's value) for every leaf key both have with different values."""
        out = []

        def rec(a: dict, b: dict, prefix: str):
            for k, v in a.items():
                if k not in b or k == "_target_":
                    continue
                w = b[k]
                if isinstance(v, dict) and isinstance(w, dict):
                    rec(v, w, f"{prefix}{k}.")
                elif not isinstance(v, dict) and not isinstance(w, dict) and (v != w or type(v) is not type(w)) \
                        and not (isinstance(v, (int, float)) and isinstance(w, (int, float))
                                 and not isinstance(v, bool) and not isinstance(w, bool) and v == w):
                    out.append((f"{prefix}{k}", v, w))
        rec(self.data, other.data, "")
        return out


def normalize(cfg: RunConfig) -> RunConfig:
    """Fill the few derived values rules rely on (Bridge syncs the distributed optimizer flags)."""
    d_opt = cfg.get("optimizer.use_distributed_optimizer")
    d_ddp = cfg.get("ddp.use_distributed_optimizer")
    if d_opt is True or d_ddp is True:
        cfg.set("optimizer.use_distributed_optimizer", True)
        cfg.set("ddp.use_distributed_optimizer", True)
    model = cfg.get("model")
    if isinstance(model, dict) and isinstance(model.get("transformer"), dict):
        # newer Bridge GPTModelConfig nests transformer fields under model.transformer
        for k, v in model["transformer"].items():
            model.setdefault(k, v)
    return cfg


def from_mlm_args(args: dict, source: str = "") -> RunConfig:
    table = mlm_map()
    cfg = RunConfig(source=source)
    for name, value in args.items():
        targets = table.get(name)
        if targets is None:
            cfg.set(f"mlm.{name}", value)
            continue
        for t in ([targets] if isinstance(targets, str) else targets):
            if t.startswith("!"):  # inverted boolean (untie_embeddings -> share_embeddings)
                cfg.set(t[1:], (not value) if isinstance(value, bool) else value)
            else:
                cfg.set(t, value)
    return normalize(cfg)


def from_bridge_summary(doc: dict, source: str = "") -> RunConfig:
    return normalize(RunConfig({k: dict(v) for k, v in doc.items() if isinstance(v, dict)}, source))


def from_log_blocks(blocks: list) -> RunConfig | None:
    """The config the job printed, merged in order of reliability (summary is post-validation).
    A log of a job restarted many times prints its config each time: the last block of each kind
    is the run that failed last, and the only one read (linear in the log, whatever the restarts)."""
    order = {"mlm_args": 0, "bridge_yaml": 1, "bridge_summary": 2}
    last: dict = {}
    for b in blocks:
        last[b[0]] = b
    cfg = None
    for kind, file, line, doc in sorted(last.values(), key=lambda b: order.get(b[0], 9)):
        src = f"{file}:{line} ({kind})"
        if kind == "mlm_args":
            part = from_mlm_args(doc, src)
        elif kind == "bridge_summary":
            part = from_bridge_summary(doc, src)
        else:
            data = strip_targets(doc)
            if not isinstance(data, dict):  # a block that held only a _target_
                continue
            part = normalize(RunConfig(data, src))
        cfg = part if cfg is None else cfg.merge(part)
    return cfg


def strip_targets(doc):
    """Drop Bridge's ``_target_``/``_call_`` bookkeeping; keep torch dtypes as their name."""
    if isinstance(doc, dict):
        if "_target_" in doc and set(doc) <= {"_target_", "_call_"}:
            return doc["_target_"]
        return {k: strip_targets(v) for k, v in doc.items() if k not in ("_target_", "_call_", "_args_", "_name_")}
    if isinstance(doc, list):
        return [strip_targets(v) for v in doc]
    return doc

