"""The structure of a training log: what a line-by-line grep cannot see.

Each parser is keyed by literal anchors (logs/anchors.py, registered with the match engine next
to the signatures, so structure costs nothing on lines that have none) and reads either the one
line that hit (logs/parsers.py: iteration and memory lines, exceptions, step times, ...) or a
block that starts there (logs/blocks.py: timer blocks, tracebacks, torchrun's ChildFailedError
summary, the MLM ``arguments`` dump, Bridge's ``Final configuration:`` YAML and its non-default
summary). What they find goes into a bounded Structure (logs/records.py). This module is the
one place the rest of the package imports them from.
"""
from __future__ import annotations

from .anchors import ANCHORS, DENSE
from .blocks import BLOCKS, CONFIG_KEYS, Block, TracebackBlock, config_blocks_of_text
from .parsers import add_grad_norm, add_pace, iteration_year, on_line, parse_iteration, parse_memory, version_of
from .records import (
    MAX_ACTIVITY,
    MAX_PACE_SERIES,
    MAX_RECORDS,
    MAX_SERIES,
    IterationPoint,
    NanRuns,
    ScaleRuns,
    Structure,
    TorchrunFailure,
    Traceback,
    add_config_block,
    add_scale,
    add_timer_record,
    add_torchrun,
    merge_grad_norm_runs,
    merge_scale_runs,
    set_tail,
)
from .values import literal

__all__ = [
    "ANCHORS", "BLOCKS", "CONFIG_KEYS", "DENSE", "MAX_ACTIVITY", "MAX_PACE_SERIES", "MAX_RECORDS", "MAX_SERIES",
    "Block", "IterationPoint", "NanRuns", "ScaleRuns", "Structure", "TorchrunFailure", "Traceback",
    "TracebackBlock", "add_config_block", "add_grad_norm", "add_pace", "add_scale", "add_timer_record",
    "add_torchrun", "config_blocks_of_text", "iteration_year", "literal", "merge_grad_norm_runs",
    "merge_scale_runs", "on_line", "parse_iteration", "parse_memory", "set_tail", "version_of",
]
