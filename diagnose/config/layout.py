"""A config's parallel layout, read once, with megatron-core's defaults, and its arithmetic.

TP, PP, CP, EP, ETP and VPP come from ``model.*_parallel_size`` (a missing size is 1, except
ETP, which MCore defaults to TP). Dense layers replicate over data parallelism in groups of
TP x PP x CP ranks, experts in groups of ETP x EP x PP ranks: a world size must be a multiple of
both (``fits``), the smallest is their least common multiple, and the ranks a log shows round up
to the next such multiple. The memory model, the planner and the world-size inference all read
the layout here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .runconfig import RunConfig

KEYS = {"tp": "model.tensor_model_parallel_size", "pp": "model.pipeline_model_parallel_size",
        "cp": "model.context_parallel_size", "ep": "model.expert_model_parallel_size",
        "etp": "model.expert_tensor_parallel_size", "vpp": "model.virtual_pipeline_model_parallel_size"}


class LayoutError(ValueError):
    """A parallel size that is not a whole number >= 1 (one line)."""


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    vpp: int = 1

    @property
    def dense_group(self) -> int:
        """Ranks that hold one copy of the dense layers: TP x PP x CP."""
        return self.tp * self.pp * self.cp

    @property
    def expert_group(self) -> int:
        """Ranks that hold one copy of the experts: ETP x EP x PP."""
        return self.etp * self.ep * self.pp

    def smallest_world(self) -> int:
        return math.lcm(self.dense_group, self.expert_group)

    def fits(self, world: int) -> bool:
        return world >= 1 and world % self.dense_group == 0 and world % self.expert_group == 0

    def dp(self, world: int | None) -> int | None:
        """Data-parallel size of the dense layers at ``world`` GPUs (None: it does not divide)."""
        return world // self.dense_group if world and world % self.dense_group == 0 else None

    def round_up(self, seen: int) -> int:
        """The smallest world size >= ``seen`` the layout allows (a log shows a lower bound)."""
        step = self.smallest_world()
        return -(-seen // step) * step


def _size(cfg: RunConfig, key: str, default: int) -> int:
    v = cfg.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise LayoutError(f"{key} = {v!r:.40} is not a whole number")
    if int(v) < 1:
        raise LayoutError(f"{key} = {v!r} must be at least 1")
    return int(v)


def of(cfg: RunConfig) -> Layout:
    """The layout ``cfg`` sets (LayoutError for a size that is not a whole number >= 1)."""
    tp = _size(cfg, KEYS["tp"], 1)
    return Layout(tp=tp, pp=_size(cfg, KEYS["pp"], 1), cp=_size(cfg, KEYS["cp"], 1), ep=_size(cfg, KEYS["ep"], 1),
                  etp=_size(cfg, KEYS["etp"], tp), vpp=_size(cfg, KEYS["vpp"], 1))
