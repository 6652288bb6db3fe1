"""The scan pipeline, left to right: read -> structure + match -> findings -> root cause -> Report."""
from __future__ import annotations

from collections.abc import Callable, Iterable

from .analyze import expected, layers, symptoms
from .analyze import root_cause as RC
from .config.runconfig import RunConfig, from_log_blocks
from .db import Database, load
from .model import Report, Severity
from .scan import Scanner, ScanResult

_SCANNERS: dict = {}


def scanner_for(db: Database, engine: str | None = None, versions: dict | None = None,
                sample: bool = True) -> Scanner:
    key = (id(db), engine, tuple(sorted((versions or {}).items())), sample)
    sc = _SCANNERS.get(key)
    if sc is None:
        sc = _SCANNERS[key] = Scanner(db, engine, versions, sample)
    return sc


def analyze(db: Database, res: ScanResult, config: RunConfig | None = None,
            baseline_ms: float | None = None, inputs: list | None = None,
            baseline_run: Report | None = None) -> Report:
    """Findings + structure (+ a config) -> Report with the one root cause. ``baseline_run``: a
    good run of the same job, diagnosed: slowdowns are measured against it."""
    logged = from_log_blocks(res.structure.config_blocks)
    # the config the run printed is the truth about that run: it wins over the file given, whose
    # other keys fill in; where the two disagree the report says so (a file edited since the run,
    # or the config of another job)
    cfg = config.merge(logged) if (logged and config) else (config or logged)
    differ = config.differences(logged) if (logged and config) else []
    if cfg is not None:
        where = _config_where(res, config)
    else:
        where = ("", 0)
    tables = layers.load_tables(db.root) if db.root else None
    metrics = symptoms.compute(res.structure, baseline_ms,
                               tables.startup_line if tables and tables.startup else None,
                               tables.stops() if tables else None)
    if baseline_run is not None:
        from .compare import side_from_report, slowdown_against

        here = Report(inputs=[], root_cause=None, findings=[], config=cfg, config_source=None, structure=res.structure)
        got = slowdown_against(side_from_report("baseline", baseline_run.inputs, baseline_run),
                               side_from_report("run", [], here), ", ".join(baseline_run.inputs) or "the baseline")
        if got is not None:
            metrics.update(got["metrics"])
            efile, eline, etext = got["evidence"]
            res.structure.note("baseline", efile, eline, etext, replace=True)
    if cfg is not None and cfg.get("optimizer.optimizer_cpu_offload") is True and "cpu_optimizer" in metrics:
        metrics["cpu_optimizer"] = 1
    timers = res.structure.evidence.get("timer_attribution", ("", 0, ""))[2]
    cost = expected.offload_cost(cfg, metrics, _world(cfg, res), timers) if cfg is not None else None
    if cost is not None:
        res.structure.note("offload_cost", where[0], where[1], cost.pop("_text"), replace=True)
        metrics.update(cost)
    metrics["unexplained_exceptions"] = RC.add_unexplained_exceptions(db, res.findings, res.structure,
                                                                      res.findings.lines)
    # the error-level findings so far (lines, exceptions): a symptom that only says "stopped" or
    # "slow" may ask for none
    metrics["error_findings"] = sum(1 for f in res.findings.all() if f.signature.severity == Severity.ERROR)
    RC.add_symptoms(db, res.findings, res.structure, cfg, metrics, where)
    root = RC.choose(db, res.findings, cfg, metrics, res.structure.torchrun)
    if root is not None:
        world = cfg.get("world_size") if cfg is not None else None
        root.straggler = RC.straggler(root, res.findings, _ranks_seen(res), world)
    report = Report(inputs=list(inputs or res.sources), root_cause=root, findings=res.findings.all(),
                    config=cfg, config_source=cfg.source if cfg is not None else None,
                    structure=res.structure, notes=list(res.notes), bytes_read=res.bytes_read,
                    lines_read=res.lines_read, seconds=res.seconds)
    if differ:
        differ.sort(key=lambda d: (d[0] not in IDENTITY, d[0]))  # the model's identity first
        shown = "; ".join(f"{k}: {_short(a)} in the file, {_short(b)} in the run" for k, a, b in differ[:4])
        more = f" (and {len(differ) - 4} more)" if len(differ) > 4 else ""
        other = " (another model: is it this job's config?)" if differ[0][0] in IDENTITY else ""
        given = (config.source if config is not None else "") or "the config given"
        report.notes.append(f"{given} differs from the config the run printed in "
                            f"{len(differ)} key(s){other}: {shown}{more}; the run's values are used")
    if root is not None:
        note = slow_part_note(root, res.structure)
        if note:
            report.notes.append(note)
    report.metrics = metrics  # type: ignore[attr-defined]
    report.engine = res.engine  # type: ignore[attr-defined]
    return report


SLOW = ("slow_iteration", "slow_optimizer_offload")


def slow_part_note(root, structure) -> str | None:
    """For a slowdown: which part of the step the timers say takes the time, or that the log
    cannot say (no timer breakdown): the signature's causes are then the usual ones, not this
    run's."""
    if root.finding.signature.category not in SLOW:
        return None
    got = structure.evidence.get("timer_attribution")
    if got and got[2] in root.hit.text:
        return None  # the evidence line is that attribution already
    if got:
        return f"where the time goes (timers, {got[0].rsplit('/', 1)[-1]}:{got[1]}): {got[2]}"
    if root.finding.signature.category == "slow_optimizer_offload":
        return None  # the config says why (the offload fraction): the cause is named
    return ("slow, cause not in the log: it has no timer breakdown (forward-backward, optimizer step, data, "
            "communication), so which part grew cannot be read from it; log the timers (Megatron "
            "--timing-log-level 2 --timing-log-option minmax, DeepSpeed wall_clock_breakdown, a profiler) and "
            "diagnose again")


# keys that name the model: a file and a log that differ in these are two different jobs
IDENTITY = ("model.hf_model_id", "model.num_layers", "model.hidden_size", "model.num_attention_heads",
            "model.num_moe_experts", "model.vocab_size", "model.ffn_hidden_size")


def _short(v) -> str:
    t = repr(v)
    return t if len(t) <= 40 else t[:37] + "..."


def _world(cfg: RunConfig, res: ScanResult) -> int | None:
    """The world size: the config's (MLM prints it), else the ranks the log shows, rounded up to
    what the config's parallel layout allows."""
    for key in ("world_size", "mlm.world_size"):
        w = cfg.get(key)
        if isinstance(w, int) and not isinstance(w, bool) and w > 0:
            return w
    from .config import layout

    seen = _ranks_seen(res)
    if not seen:
        return None
    try:
        return layout.of(cfg).round_up(max(seen) + 1)
    except layout.LayoutError:
        return max(seen) + 1


def _ranks_seen(res: ScanResult) -> set:
    """Every rank the log names: findings, tracebacks, torchrun's summary, one file per rank."""
    st = res.structure
    seen = {r for f in res.findings.all() for r in f.ranks}
    seen.update(tb.rank for tb in st.tracebacks)
    seen.update(e[2] for e in st.exceptions)
    seen.update(t.rank for t in st.torchrun)
    seen.update(m.get("rank") for m in st.memory)
    seen.update(res.file_ranks.values())
    seen.discard(None)
    return seen


def _config_where(res: ScanResult, given: RunConfig | None) -> tuple:
    if given is not None and given.source:
        return (given.source, 1)
    blocks = res.structure.config_blocks
    if blocks:
        _kind, file, line, _ = blocks[-1]
        return (file, line)
    return ("", 0)


def diagnose_paths(paths: Iterable[str], db: Database | None = None, config: RunConfig | None = None,
                   engine: str | None = None, versions: dict | None = None,
                   baseline_ms: float | None = None,
                   progress: Callable[[int], None] | None = None, jobs: int | None = None,
                   sample: bool = True, baseline_run: Report | None = None) -> Report:
    """Scan ``paths`` and analyze. ``jobs``: processes for many files (None: all cores when several
    large files are given, 1: serial); the result is the serial scan's either way. ``sample=False``
    reads every iteration, memory and step-time line (``compare`` wants every point)."""
    from .parallel import scan_parallel

    db = db or load()
    res = scan_parallel(scanner_for(db, engine, versions, sample), list(paths), jobs, progress=progress)
    return analyze(db, res, config, baseline_ms, baseline_run=baseline_run)


def scan_text(text: str, db: Database | None = None, name: str = "<text>",
              versions: dict | None = None) -> ScanResult:
    """Scan a log held in memory (one chunk) into a ScanResult."""
    from .analyze.findings import Findings
    from .logs import structure as S
    from .logs.read import Chunk

    sc = scanner_for(db or load(), None, versions)
    res = ScanResult(Findings(), S.Structure(), [], engine=sc.engine.name)
    data = text.encode("utf-8")
    chunk = Chunk(data, 1, 0)
    sc.scan_chunk(chunk, name, 0, res)
    sc._close_blocks(res)
    if data:  # the whole log: its end is where the output stopped
        last = chunk.first_line + (chunk.newlines or 0)
        S.set_tail(res.structure, name, data, last - 1 if data.endswith(b"\n") else last)
    res.sources.append(name)
    res.bytes_read = len(data)
    return res


def diagnose_text(text: str, db: Database | None = None, config: RunConfig | None = None,
                  name: str = "<text>", versions: dict | None = None,
                  baseline_ms: float | None = None) -> Report:
    """Diagnose a log held in memory (signature tests, follow mode)."""
    db = db or load()
    return analyze(db, scan_text(text, db, name, versions), config, baseline_ms)
