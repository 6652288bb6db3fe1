"""The nouns of the tool, as small dataclasses.

A log line flows through them left to right:
``Signature`` (from the database) -> ``Hit`` (one matching line) -> ``Finding``
(all hits of one signature, per rank) -> ``RootCause`` (the one answer).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

# Root-cause categories (product.md, JSON ``root_cause.category``).
CATEGORIES = (
    "cuda_oom", "host_oom", "nccl_timeout", "nccl_error", "config_pp_cpu_offload",
    "config_recompute_cpu_offload", "config_cuda_graph_cpu_offload",
    "config_fine_grained_conflict", "config_offload_layers_range", "config_optimizer_offload",
    "cpu_offload_runtime", "config_divisibility", "config_other", "loss_nan", "import_error",
    "checkpoint_error", "slow_iteration", "slow_optimizer_offload", "cuda_error", "hang", "other",
)


class StrEnum(str, Enum):
    """A closed vocabulary whose members are their strings (enum.StrEnum, which Python 3.10 lacks):
    equal to, hashed, printed and formatted as the plain value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Role(StrEnum):
    """root: a primary cause. cascade: a consequence of another failure (promoted to root only
    when nothing else explains the run). confirmation: corroborates (e.g. torchrun's summary
    block). advice: a harmless warning or hint, never a root cause."""

    ROOT = "root"
    CASCADE = "cascade"
    CONFIRMATION = "confirmation"
    ADVICE = "advice"


class Scope(StrEnum):
    """line: one log line; metric: a symptom computed from the log's structure (iteration series,
    timers); refine: a sharper reading of another signature's hit, given the config or captures;
    config: a trap in the configuration itself that no framework reports (preflight, and the
    scan when the log or --config gives the config); layer: named by an evidence layer
    (analyze/layers.py) when no exact signature matched."""

    LINE = "line"
    METRIC = "metric"
    REFINE = "refine"
    CONFIG = "config"
    LAYER = "layer"


class Safety(StrEnum):
    SAFE = "safe"
    UNSAFE = "unsafe"
    DISPLAY_ONLY = "display-only"


SEVERITIES = tuple(Severity)
SEVERITY_RANK: dict[str, int] = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2}


def fails_gate(severity: str, role: str | None, fail_on: str) -> bool:
    """The one rule of every gate (scan, check, CI formats): severity at or above ``fail_on``;
    advice never fails."""
    return role != Role.ADVICE and SEVERITY_RANK[severity] >= SEVERITY_RANK[fail_on]

ROLES = tuple(Role)
SCOPES = tuple(Scope)
SAFETY = tuple(Safety)


@dataclass(frozen=True)
class Edit:
    """One config edit. ``op`` is set | scale | add | delete; ``value`` the operand."""

    key: str
    op: str = "set"
    value: Any = None
    max: float | None = None
    min: float | None = None


@dataclass(frozen=True)
class Fix:
    text: str
    safety: str = "safe"
    edits: tuple[Edit, ...] = ()
    compute: str | None = None  # name of a computed fix (remedy/computed.py) or None
    when: str | None = None  # config predicate: the fix applies only when it holds
    effect: str | None = None


@dataclass(frozen=True)
class Signature:
    id: str
    slug: str
    title: str
    category: str
    severity: str
    role: str
    scope: str
    anchors: tuple[str, ...]
    regex: str | None
    cause: str
    confirm_text: str
    confirm_when: str | None  # config predicate (diagnose/predicate.py), or None
    fixes: tuple[Fix, ...]
    references: tuple[dict, ...]
    applies: dict  # {"megatron-core": ">=0.17"} PEP 440 specifiers per framework
    tests_match: tuple[str, ...]
    tests_no_match: tuple[str, ...]
    file: str
    priority: int = 50
    supersedes: tuple[str, ...] = ()
    demoted_by: tuple[str, ...] = ()  # with any of these present, this root is only a cascade
    refines: tuple[str, ...] = ()  # ids or "category:<cat>" this signature sharpens
    metric: str | None = None  # predicate over metrics (scope metric)
    when_captures: str | None = None  # predicate over the regex captures (scope refine)
    preflight: bool = False  # the confirm predicate is also a static preflight rule
    version: int = 1
    last_verified: str | None = None
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()


@dataclass
class Hit:
    """One line that matched one signature."""

    sig_id: str
    file: str
    line: int  # 1-based line number in ``file``
    text: str  # the line, decoded, without rank prefix noise trimmed
    rank: int | None = None
    time: float | None = None  # seconds since epoch, where the line carries a timestamp
    captures: dict = field(default_factory=dict)
    order: int = 0  # global order of discovery (file order, then line)


@dataclass
class Finding:
    """All hits of one signature in a run."""

    signature: Signature
    first: Hit
    count: int = 0
    ranks: dict = field(default_factory=dict)  # rank (or None) -> count
    samples: list = field(default_factory=list)  # a few hits, for reports

    @property
    def id(self) -> str:
        return self.signature.id


@dataclass
class RootCause:
    finding: Finding
    hit: Hit
    confidence: str  # "confirmed" | "suspected"
    because: list = field(default_factory=list)  # human reasons (config facts that confirm)
    set_aside: list = field(default_factory=list)  # findings explained as consequences
    overrides: list = field(default_factory=list)  # "key=value" strings
    rank_source: str | None = None  # where the rank came from (line / torchrun block)
    refines: Finding | None = None  # the line finding a refine signature sharpened
    basis: str = "signature"  # the evidence layer that decided (analyze/layers.py BASES)
    straggler: dict | None = None  # collective timeouts: the rank that did not report, and who did


@dataclass
class Report:
    """Everything a formatter needs."""

    inputs: list
    root_cause: RootCause | None
    findings: list
    config: Any  # RunConfig or None
    config_source: str | None
    structure: Any  # analyze.structure summary (iterations, memory, torchrun)
    notes: list = field(default_factory=list)  # messages about unreadable input etc.
    bytes_read: int = 0
    lines_read: int = 0
    seconds: float = 0.0
