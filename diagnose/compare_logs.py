"""``compare(baseline_log, run_log)``: both logs through the diagnosis, then compare.py's criteria.

The entry point of ``diagnose compare`` (commands/compare.py). It sits above the diagnosis
(it runs it twice); compare.py, which the diagnosis also uses for ``--baseline-run``, does not.
"""
from __future__ import annotations

from .compare import (
    CompareError,
    Comparison,
    check_completed,
    check_config,
    check_loss,
    check_memory,
    check_speed,
    offload_of,
    side_from_report,
)
from .config.runconfig import RunConfig
from .db import load
from .diagnosis import diagnose_paths


def compare(baseline_path: str, run_path: str, db=None, config: RunConfig | None = None,
            max_loss_delta: float = 0.001, time_tolerance: float = 0.25, memory_tolerance: float = 0.25,
            versions: dict | None = None, world_size: int | None = None) -> Comparison:
    db = db or load()
    base_rep = diagnose_paths([baseline_path], db, None, None, versions, sample=False)
    if not base_rep.inputs:
        raise CompareError(f"{baseline_path}: cannot be read" + (f" ({base_rep.notes[0]})" if base_rep.notes else ""))
    run_rep = diagnose_paths([run_path], db, config, None, versions, sample=False)
    if not run_rep.inputs:
        raise CompareError(f"{run_path}: cannot be read" + (f" ({run_rep.notes[0]})" if run_rep.notes else ""))
    base = side_from_report("baseline", [baseline_path], base_rep)
    run = side_from_report("run", [run_path], run_rep)
    if not base.points:
        raise CompareError(f"{baseline_path}: no iteration line (MLM/Bridge 'iteration N/M | ...'): "
                           "not a training log to compare against")
    notes = []
    if base_rep.root_cause is not None:
        rc = base_rep.root_cause
        notes.append(f"the baseline itself reports {rc.finding.signature.id} {rc.finding.signature.title} "
                     f"at {rc.hit.file}:{rc.hit.line}")
    if base.train_iters and base.last_iteration is not None and base.last_iteration < base.train_iters:
        notes.append(f"the baseline stopped at iteration {base.last_iteration} of {base.train_iters}")
    run_cfg = run_rep.config
    off = offload_of(run_cfg)
    base_off = offload_of(base_rep.config)
    if base_off.optimizer or base_off.activation:
        notes.append("the baseline log's config has offloading on: it is not a non-offloaded baseline")
    criteria = [
        check_config(run),
        check_completed(run),
        check_loss(base, run, max_loss_delta),
        check_memory(base, run, off, run_cfg, base_rep.config, memory_tolerance, world_size),
        check_speed(base, run, off, time_tolerance),
    ]
    return Comparison(base, run, off, criteria, max_loss_delta, notes)
