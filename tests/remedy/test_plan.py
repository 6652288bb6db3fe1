"""The fix planner: structured and computed fixes, safety, predicted effect; the seed's cases."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from diagnose import exitcodes
from diagnose.config import fit as FIT
from diagnose.config import schema
from diagnose.config.load import load_config
from diagnose.config.runconfig import RunConfig
from diagnose.db import load
from diagnose.diagnosis import diagnose_paths
from diagnose.remedy import causes as C
from diagnose.remedy import computed as CO
from diagnose.remedy import cost as COST
from diagnose.remedy import plan as PL
from diagnose.remedy import search as SE

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "fixtures" / "logs" / "seed"
TINY = REPO / "fixtures" / "jobs" / "tiny_gpt_pp_offload.yaml"
RUN1 = REPO / "fixtures" / "logs" / "tiny_gpt_pp_offload_run1.log"
QWEN = yaml.safe_load((REPO / "diagnose" / "data" / "models.yaml").read_text())["models"]["qwen3-30b-a3b"]["model"]


@pytest.fixture(scope="module")
def db():
    return load()


def seed_plan(db, case: str, unsafe=False, world=None):
    log = SEED / f"qwen3_30b_a3b_{case}.log"
    cfg = load_config(str(SEED / f"qwen3_30b_a3b_{case}.yaml"))
    report = diagnose_paths([str(log)], db, cfg)
    ctx = C.context_from_report(report, world)
    return report, PL.plan(C.from_report(report), report.config, ctx, unsafe), ctx


def edits(p: PL.Plan) -> dict:
    return {e.key: e.new for e in p.edits}


# the seed's measured iteration-time factors (card.yaml: 996 ms baseline; 1871, 2484, 3187, 4189 ms)
MEASURED_FACTOR = {0.25: 1.9, 0.5: 2.5, 0.75: 3.2, 1.0: 4.2}


def test_slowdown_curve_is_the_seeds_measurement():
    assert [COST.slowdown(f) for f in (0, 0.25, 0.5, 0.75, 1.0)] == [1.0, 1.9, 2.5, 3.2, 4.2]
    assert COST.slowdown(1.0, overlap=True) == 3.9
    assert COST.slowdown(0.375) == pytest.approx(2.2)


def test_every_computed_fix_in_the_database_is_implemented(db):
    names = {f.compute for s in db.signatures for f in s.fixes if f.compute}
    assert names, "the database names computed fixes"
    assert names <= set(CO.COMPUTED), f"not implemented: {sorted(names - set(CO.COMPUTED))}"
    for n in ("offload_layers_in_range", "switch_to_optimizer_offload", "pp_and_optimizer_offload",
              "raise_offload_fraction", "add_pp", "lowest_fitting_offload_fraction", "divisor_pp"):
        assert n in CO.COMPUTED


def test_unknown_computed_fix_says_no_fix_known(db):
    from dataclasses import replace

    sig = db.get("MB-OFF-001")
    odd = replace(sig, fixes=(replace(sig.fixes[0], compute="no_such_fix"),))
    p = PL.plan([odd], RunConfig({"model": {"cpu_offloading": True, "num_layers": 4, "cpu_offloading_num_layers": 4}}))
    assert p.status == "no_fix" and not p.edits
    assert "no fix known" in p.no_fix[0][1] and "no_such_fix" in p.no_fix[0][1]


def test_seed_activation_offload_pp1_oom(db):
    report, p, ctx = seed_plan(db, "activation_offload_pp1_oom")
    assert report.root_cause.finding.signature.id == "MB-OFF-101"
    assert ctx.world_size == 16
    # the only fix changes the parallel layout: refused without --unsafe-fixes
    assert p.status == "unsafe" and not p.edits and p.refused[0].signature.id == "MB-OFF-101"
    _, p, _ = seed_plan(db, "activation_offload_pp1_oom", unsafe=True)
    e = edits(p)
    # minimal: at 16 H100, PP2 fits without any optimizer offload (no x1.9 for nothing)
    assert e == {"model.cpu_offloading": False, "model.cpu_offloading_num_layers": 0,
                 "model.pipeline_model_parallel_size": 2}
    eff = p.fixes[0].effect
    assert eff.before is not None and not eff.before.fits and eff.after.fits
    assert eff.after.peak_gb < eff.before.peak_gb and eff.slowdown is None
    assert "PP2 + no optimizer offload" in p.fixes[0].reason and "predicted iteration time" in p.fixes[0].reason
    # PP1 (the layout kept) does not fit without optimizer offload: the search says so
    assert "PP1: " in p.fixes[0].reason and "does not fit" in p.fixes[0].reason


def test_seed_activation_offload_pp1_oom_at_8_gpus_needs_the_lowest_fitting_fraction(db):
    """At 8 GPUs (DP2 at PP2) PP2 alone does not fit: PP2 + the lowest optimizer-offload fraction."""
    report, p, ctx = seed_plan(db, "activation_offload_pp1_oom", unsafe=True, world=8)
    e = edits(p)
    pp, f = e["model.pipeline_model_parallel_size"], e["optimizer.optimizer_offload_fraction"]
    assert pp == 2 and e["optimizer.optimizer_cpu_offload"] is True and e["model.cpu_offloading"] is False
    eff = p.fixes[0].effect
    assert eff.after.fits and eff.slowdown == MEASURED_FACTOR[f]  # the seed's table, not the code's own curve
    without = FIT.with_changes(report.config, [(k, v) for k, v in e.items() if not k.startswith("optimizer.")])
    assert not FIT.estimate(without, ctx).fits  # PP2 without offload does not fit at 8 GPUs
    lower = [x for x in FIT.FRACTIONS if x < f]
    if lower:  # ... and the next lower fraction does not either
        cfg = FIT.with_changes(report.config, [(k, v) for k, v in e.items() if k != "optimizer.optimizer_offload_fraction"]
                              + [("optimizer.optimizer_offload_fraction", lower[-1])])
        assert not FIT.estimate(cfg, ctx).fits


def test_seed_partial_offload_oom_raises_the_fraction(db):
    report, p, _ctx = seed_plan(db, "partial_optimizer_offload_oom")
    assert report.root_cause.finding.signature.id == "MB-OFF-102"
    e = edits(p)
    assert set(e) == {"optimizer.optimizer_offload_fraction"}
    f = e["optimizer.optimizer_offload_fraction"]
    assert f in FIT.FRACTIONS and f > 0.25
    eff = p.fixes[0].effect
    assert eff.after.fits and eff.after.calibrated  # scaled on what the OOM line says was needed
    # the log's own numbers, read here by hand: 74.52 GiB allocated by PyTorch + 3.00 GiB tried
    need = (74.52 + 3.00) * 2**30 / 1e9
    assert eff.before.peak_gb == pytest.approx(need, rel=0.005)
    # after: below the 79.11 GiB GPU with the memory model's margin, and lower by at least what
    # the extra offloaded quarter(s) free on this job (the measured ~3.8 GB per 25 %)
    assert eff.after.peak_gb + eff.after.margin_gb <= 79.11 * 2**30 / 1e9
    assert need - eff.after.peak_gb >= 3.0 * (f - 0.25) / 0.25
    assert eff.slowdown == MEASURED_FACTOR[f]


def test_seed_fraction_zero_oom_sets_a_fraction_that_fits(db):
    report, p, _ = seed_plan(db, "offload_fraction_zero_oom")
    assert report.root_cause.finding.signature.id == "MB-OFF-103"
    f = edits(p)["optimizer.optimizer_offload_fraction"]
    assert 0 < f <= 1 and p.fixes[0].effect.after.fits


def test_seed_full_offload_slowdown_turns_offload_off_where_it_fits_and_no_state_is_resumed(db):
    report, p, _ = seed_plan(db, "full_optimizer_offload_slow")
    # MB-OFF-105 (predicted saving from the memory model) takes the place of MB-OFF-104 (timers)
    assert report.root_cause.finding.signature.id == "MB-OFF-105"
    assert "optimizer step" in report.root_cause.hit.text  # the timers are in its evidence
    # the seed's config loads no checkpoint, and the model fits without offload: off, not 25 %
    assert edits(p) == {"optimizer.optimizer_cpu_offload": False, "optimizer.optimizer_offload_fraction": 0.0}
    assert p.fixes[0].effect.after.fits and "optimizer offload off: it fits without it" in p.fixes[0].reason


def test_seed_full_offload_slowdown_of_a_resumed_run_lowers_the_fraction(db, tmp_path):
    """A run that will load an optimizer state saved with offload on keeps offload on (that such a
    state loads into a run without it is not proved), at the lowest fraction that fits."""
    log = tmp_path / "run.log"
    log.write_text(" successfully loaded checkpoint from /ckpt [ t 1/2, p 1/2 ] at iteration 100\n"
                   + (SEED / "qwen3_30b_a3b_full_optimizer_offload_slow.log").read_text())
    cfg = load_config(str(SEED / "qwen3_30b_a3b_full_optimizer_offload_slow.yaml"))
    cfg.set("checkpoint.load", "/ckpt")
    report = diagnose_paths([str(log)], db, cfg)
    report.config.set("checkpoint.load", "/ckpt")
    ctx = C.context_from_report(report, None)
    assert ctx.resume is not None and ctx.resume.loads is not False and ctx.resume.optimizer_state
    p = PL.plan(C.from_report(report), report.config, ctx)
    f = edits(p)["optimizer.optimizer_offload_fraction"]
    assert f == 0.25 and "optimizer.optimizer_cpu_offload" not in edits(p)
    assert p.fixes[0].effect.slowdown < 4.0 and p.fixes[0].effect.after.fits


def test_overlap_when_the_lowest_fitting_fraction_is_already_in_use(db):
    """A fix the failed run already had did not help: the planner moves on to the next one."""
    report, _, ctx = seed_plan(db, "full_optimizer_offload_slow")
    ctx.gpu_memory_gb = 52.0  # only 100% fits on this smaller GPU
    p = PL.plan(C.from_report(report), report.config, ctx)
    assert edits(p) == {"optimizer.overlap_cpu_optimizer_d2h_h2d": True}
    assert p.fixes[0].effect.slowdown == 3.9


def qwen(tp=2, pp=2, ep=4, fraction=0.25, offload=True, act=False, seq=4096, gbs=512, mbs=1):
    m = dict(QWEN, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
             expert_tensor_parallel_size=1, sequence_parallel=tp > 1, cpu_offloading=act, seq_length=seq)
    return RunConfig({"model": m, "optimizer": {"optimizer_cpu_offload": offload, "optimizer_offload_fraction": fraction,
                                                "use_distributed_optimizer": True},
                      "ddp": {"use_distributed_optimizer": True},
                      "train": {"global_batch_size": gbs, "micro_batch_size": mbs}})


def test_partial_offload_else_more_pp(db):
    sig = db.get("MB-OFF-102")
    ctx = SE.Context(world_size=16, gpu_memory_gb=45.0)
    cfg = qwen()
    p = PL.plan([sig], cfg, ctx)
    # no fraction fits a 45 GB GPU at PP2; the next fix, more PP, is unsafe
    assert p.status == "unsafe" and p.refused[0].fix.compute == "add_pp"
    p = PL.plan([sig], cfg, ctx, allow_unsafe=True)
    e = edits(p)
    pp = e["model.pipeline_model_parallel_size"]
    assert pp > 2 and 48 % pp == 0 and 16 % (2 * pp) == 0 and p.fixes[0].effect.after.fits
    assert e["optimizer.optimizer_offload_fraction"] > 0.25
    # at PP2 even 100% did not fit
    assert not FIT.estimate(FIT.with_changes(cfg, [("optimizer.optimizer_offload_fraction", 1.0)]), ctx).fits


def test_layout_checks():
    cfg = qwen()
    assert SE.valid_layout(cfg, 16, 2, 2) is None
    assert SE.valid_layout(cfg, 16, 1, 5) == "TP1 x PP5 x CP1 does not divide 16 GPUs"
    assert SE.valid_layout(cfg, 20, 1, 5) == "PP5 does not divide 48 layers"
    assert "global batch" in SE.valid_layout(qwen(gbs=6), 16, 2, 2)
    assert SE.valid_layout(cfg, 16, 2, 1, ep=3) == "EP3 x ETP1 does not divide the 16 GPUs of a pipeline stage"


def test_divisor_fixes():
    ctx = SE.Context(world_size=16, gpu="h200")
    cfg = qwen(pp=3)  # 48 layers: fine; 16 GPUs: TP2 x PP3 does not divide
    ch, why = CO.divisor_pp(cfg, ctx, [])
    assert dict(ch)["model.pipeline_model_parallel_size"] == 2 and "PP2" in why
    cfg = qwen(tp=3, pp=1)
    ch, _ = CO.divisor_tp(cfg, ctx, [])
    assert dict(ch)["model.tensor_model_parallel_size"] == 2  # the nearest below that divides heads and GPUs
    cfg = qwen(ep=5, pp=1)
    ch, _ = CO.divisor_ep(cfg, ctx, [])
    assert dict(ch)["model.expert_model_parallel_size"] == 4
    with pytest.raises(FIT.NoFix, match="world size is unknown"):
        CO.divisor_pp(cfg, SE.Context(), [])


def test_offload_layers_in_range():
    cfg = RunConfig({"model": {"cpu_offloading": True, "num_layers": 4, "cpu_offloading_num_layers": 4}})
    ch, _ = CO.offload_layers_in_range(cfg, SE.Context(), [])
    assert ch == [("model.cpu_offloading_num_layers", 3)]
    cfg = RunConfig({"model": {"cpu_offloading": True, "num_layers": 4, "cpu_offloading_num_layers": -1}})
    assert CO.offload_layers_in_range(cfg, SE.Context(), [])[0] == [("model.cpu_offloading_num_layers", 0)]


def test_config_validation_fixes(db):
    cases = {
        "MB-OFF-003": ({"model": {"cpu_offloading": True, "recompute_granularity": "full"}},
                       {"model.recompute_granularity": None}),
        "MB-OFF-004": ({"model": {"cpu_offloading": True, "fine_grained_activation_offloading": True}},
                       {"model.fine_grained_activation_offloading": False}),
        "MB-OFF-006": ({"model": {"cpu_offloading": True, "cuda_graph_impl": "transformer_engine"}},
                       {"model.cuda_graph_impl": "none"}),
    }
    for sid, (data, want) in cases.items():
        p = PL.plan([db.get(sid)], RunConfig(data))
        got = edits(p)
        for k, v in want.items():
            assert got[k] == v, (sid, got)
        assert all(pf.safety == "safe" for pf in p.fixes)


def test_preflight_plan_of_the_tiny_config(db):
    cfg = load_config(str(TINY))
    p = C.plan_preflight(db, cfg, SE.Context(world_size=2))
    assert "MB-OFF-002" in [s.id for s in p.causes]
    e = edits(p)
    # the tiny model fits on its 2 GPUs without any offload: activation offload off is the fix
    assert e == {"model.cpu_offloading": False, "model.cpu_offloading_num_layers": 0}


def test_preflight_memory_model_plans_the_seed_case(db):
    """No log: the memory model alone says the PP=1 activation-offload config does not fit."""
    cfg = load_config(str(SEED / "qwen3_30b_a3b_activation_offload_pp1_oom.yaml"))
    p = C.plan_preflight(db, cfg, SE.Context(world_size=16), allow_unsafe=True)
    assert any(s.category == "cuda_oom" or s.id == C.MEMORY_RULE_ID for s in p.causes), p.notes
    e = edits(p)
    assert e.get("model.pipeline_model_parallel_size", 1) > 1 and e["model.cpu_offloading"] is False
    assert p.effect.after.fits


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-c", "import sys; from diagnose.cli import main; sys.exit(main(sys.argv[1:]))",
                           *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("case", ["activation_offload_pp1_oom", "partial_optimizer_offload_oom",
                                  "offload_fraction_zero_oom", "full_optimizer_offload_slow"])
def test_cli_seed_cases_show_diff_and_predicted_memory(tmp_path, case):
    cfg = tmp_path / "cfg.yaml"
    shutil.copy(SEED / f"qwen3_30b_a3b_{case}.yaml", cfg)
    args = [str(SEED / f"qwen3_30b_a3b_{case}.log"), "--fix", str(cfg), "--dry-run"]
    r = _cli(*args, cwd=tmp_path)
    if case == "activation_offload_pp1_oom":
        assert r.returncode == exitcodes.UNSAFE_REFUSED, r.stderr
        assert "--unsafe-fixes" in r.stderr and r.stdout == ""
        r = _cli(*args, "--unsafe-fixes", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    changed = ("+  pipeline_model_parallel_size: 2" if case == "activation_offload_pp1_oom"
               else "+  optimizer_offload_fraction:")  # the seed's OOM at PP1: PP2 fits without offload
    assert r.stdout.startswith("--- a/") and changed in r.stdout
    assert "predicted: memory per GPU" in r.stderr and " GB of 84.9 GB" in r.stderr
    assert cfg.read_text() == (SEED / f"qwen3_30b_a3b_{case}.yaml").read_text()  # --dry-run


def test_cli_no_fix_known_exit_6(tmp_path):
    log = tmp_path / "shape.log"
    log.write_text("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9120.50 GiB. GPU 0 has a "
                   "total capacity of 79.11 GiB of which 20.00 GiB is free.\n")
    cfg = tmp_path / "cfg.yaml"
    shutil.copy(TINY, cfg)
    r = _cli(str(log), "--fix", str(cfg), cwd=tmp_path)
    assert r.returncode == exitcodes.NO_FIX, r.stderr
    assert "MB-OOM-010" in r.stderr and cfg.read_text() == TINY.read_text()


def test_cli_json_plan(tmp_path):
    import json

    cfg = tmp_path / "cfg.yaml"
    shutil.copy(TINY, cfg)
    r = _cli(str(RUN1), "--fix", str(cfg), "--dry-run", "--format", "json", "-q", cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert doc["root_cause"]["signature"] == "MB-OFF-002" and doc["plan"]["status"] == "ok"
    assert doc["plan"]["fixes"][0]["safety"] == "safe" and doc["written"] is False
    assert doc["plan"]["fixes"][0]["predicted"]["after"]["fits"] is True


@pytest.mark.parametrize("case", ["activation_offload_pp1_oom", "partial_optimizer_offload_oom",
                                  "offload_fraction_zero_oom"])
def test_cli_fix_twice_is_one_change_and_one_backup(tmp_path, case):
    """The second --fix with the same log plans from the config the run printed, finds the file
    already has the fix, and writes nothing (no second backup, no fraction raised again)."""
    cfg = tmp_path / "cfg.yaml"
    shutil.copy(SEED / f"qwen3_30b_a3b_{case}.yaml", cfg)
    args = [str(SEED / f"qwen3_30b_a3b_{case}.log"), "--fix", str(cfg), "--unsafe-fixes"]
    r1 = _cli(*args, cwd=tmp_path)
    assert r1.returncode == 0 and "rewrote" in r1.stderr, r1.stderr
    once = cfg.read_text()
    r2 = _cli(*args, cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr
    assert "already has the fix; nothing changed" in r2.stderr and "differs from the config the run printed" in r2.stderr
    assert cfg.read_text() == once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml", "cfg.yaml.bak"]


def _without_printed_config(text: str) -> str:
    """The seed log without Bridge's "Final configuration:" block (a run that printed none)."""
    lines, out, inside = text.splitlines(keepends=True), [], False
    for ln in lines:
        if "Final configuration:" in ln:
            inside = True
            continue
        if inside and (ln.startswith((" ", "_target_", "-")) or (ln[:1].isalpha() and ln.rstrip().endswith(":"))):
            continue
        inside = False
        out.append(ln)
    return "".join(out)


@pytest.mark.parametrize("case", ["partial_optimizer_offload_oom", "offload_fraction_zero_oom",
                                  "activation_offload_pp1_oom"])
def test_cli_fix_again_with_a_log_that_printed_no_config_changes_nothing(tmp_path, case):
    """Issue 12, item 5: with no config printed in the log, the file is all --fix can plan from,
    and after the first fix it holds that fix: planned again from the same old failure, the
    offload fraction climbed 0.25 -> 0.5 -> 0.75 and backups piled up. The file now names the
    log its fix came from (remedy/stamp.py); the same log again changes nothing, a new log
    (the job run again) is planned as usual."""
    log = tmp_path / "run.log"
    text = _without_printed_config((SEED / f"qwen3_30b_a3b_{case}.log").read_text())
    assert "Final configuration" not in text and "optimizer_offload_fraction:" not in text
    log.write_text(text)
    cfg = tmp_path / "cfg.yaml"
    shutil.copy(SEED / f"qwen3_30b_a3b_{case}.yaml", cfg)
    args = [str(log), "--fix", str(cfg), "--unsafe-fixes", "--world-size", "16"]
    r1 = _cli(*args, cwd=tmp_path)
    assert r1.returncode == 0 and "rewrote" in r1.stderr, r1.stderr
    once = cfg.read_text()
    assert once.startswith("# diagnose --fix: MB-OFF-10") and " from run.log (log " in once.splitlines()[0]
    for _ in range(2):
        r = _cli(*args, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "already holds the fix made from this log" in r.stderr and cfg.read_text() == once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml", "cfg.yaml.bak", "run.log"]
    # the job run again and failed again: a new log, a new plan (its fix on top of the first)
    log.write_text(text + "[rank0]: (the rerun)\n")
    r = _cli(*args, cwd=tmp_path)
    assert "already holds" not in r.stderr and r.returncode == 0, r.stderr


def test_the_stamp_names_the_log_by_its_bytes_and_keeps_five(tmp_path):
    from diagnose.remedy import stamp

    a, b = tmp_path / "a.log", tmp_path / "b" / "a.log"
    b.parent.mkdir()
    a.write_text("x" * 10)
    b.write_text("x" * 10)
    assert stamp.log_digest([a]) == stamp.log_digest([b])  # the same bytes and name, any folder
    b.write_text("x" * 11)
    assert stamp.log_digest([a]) != stamp.log_digest([b])
    text = "model:\n  num_layers: 2\n"
    for i in range(7):
        text = stamp.with_stamp(text, f"MB-X-{i}", "run.log", f"{i:012x}")
    head = text.splitlines()
    assert [ln.split()[3] for ln in head[:5]] == ["MB-X-6", "MB-X-5", "MB-X-4", "MB-X-3", "MB-X-2"]
    assert head[5:] == ["model:", "  num_layers: 2"]
    assert stamp.fixed_from(text, f"{6:012x}") and stamp.fixed_from(text, f"{1:012x}") is None
    assert stamp.fixed_from("model:\n# diagnose --fix: MB-X from r (log 000000000006)\n", f"{6:012x}") is None


def test_cli_says_when_the_file_is_not_the_runs_config(tmp_path):
    """Another job's config given with the seed's log: the run's printed values are used, and said."""
    cfg = tmp_path / "cfg.yaml"
    shutil.copy(REPO / "fixtures" / "configs" / "seed_activation_offload_pp1.yaml", cfg)
    r = _cli(str(SEED / "qwen3_30b_a3b_activation_offload_pp1_oom.log"), "--fix", str(cfg), "--unsafe-fixes",
             "--dry-run", cwd=tmp_path)
    assert "differs from the config the run printed" in r.stderr and "(another model: is it this job's config?)" in r.stderr
    assert "model.num_layers: 32 in the file, 48 in the run" in r.stderr
    assert "+  pipeline_model_parallel_size: 2" in r.stdout  # planned for the run's 48-layer MoE, written to the file


def _mlm_args(**args) -> str:
    """Megatron-LM's arguments dump (arguments.py _print_args): sorted, dots to column 48."""
    lines = ["------------------------ arguments ------------------------"]
    for k in sorted(args, key=str.lower):
        lines.append("  {} {} {}".format(k, "." * (48 - len(k)), args[k]))
    lines.append("-------------------- end of arguments ---------------------")
    return "\n".join(lines) + "\n"


def test_overrides_for_a_megatron_lm_run_are_its_flags(tmp_path):
    """A run whose config came from Megatron-LM's arguments dump gets --flags, not Bridge keys."""
    log = tmp_path / "mlm.log"
    log.write_text(_mlm_args(num_layers=4, hidden_size=64, num_attention_heads=4, tensor_model_parallel_size=1,
                             pipeline_model_parallel_size=2, cpu_offloading=True, cpu_offloading_num_layers=1,
                             use_distributed_optimizer=True, optimizer_cpu_offload=False,
                             optimizer_offload_fraction=0.0, micro_batch_size=1, global_batch_size=4, world_size=2,
                             seq_length=64, bf16=True)
                   + "[rank0]: ValueError: Currently there is no support for Pipeline parallelism with CPU offloading\n")
    cfg = tmp_path / "cfg.yaml"
    shutil.copy(TINY, cfg)
    r = _cli(str(log), "--fix", str(cfg), "--overrides", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["(remove", "--cpu-offloading)", "--cpu-offloading-num-layers", "0"]
    assert "model.cpu_offloading" not in r.stdout


def test_a_real_megatron_lm_arguments_dump_still_gets_a_plan(tmp_path):
    """A real dump holds arguments Bridge has no key for (max_position_embeddings, ...): they are
    the job's business, never a reason to refuse a plan, whatever the wording of the problem
    (a did-you-mean once hid 'unknown key' from the planner, and every MLM run got no plan)."""
    cfg = tmp_path / "cfg.yaml"  # the tiny job's file with the run's offload (it gives what the dump lacks)
    cfg.write_text(TINY.read_text().replace("optimizer_cpu_offload: false", "optimizer_cpu_offload: true")
                   .replace("optimizer_offload_fraction: 0.0", "optimizer_offload_fraction: 1.0"))
    assert "optimizer_offload_fraction: 1.0" in cfg.read_text()
    r = _cli(str(REPO / "fixtures/logs/mlm_optimizer_offload_1.0_slow.log"), "--fix", str(cfg), "--overrides",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # the run loads no checkpoint and fits without offload: offload off, in Megatron-LM's flags
    assert r.stdout.split() == ["(remove", "--optimizer-cpu-offload)", "--optimizer-offload-fraction", "0.0"]
    assert "unknown key" not in r.stderr


def test_a_config_with_a_near_miss_unknown_key_is_still_planned():
    data = {"model": {"num_layerz": 4}, "nosuchsection": {"a": 1}}
    assert PL.unplannable(RunConfig(data)) is None
    assert any("did you mean" in p for p in schema.validate(data)) and schema.validate(data, unknown=False) == []


def test_override_of_a_key_absent_everywhere_gets_a_plus():
    absent = PL.PlannedEdit("env_vars.NCCL_DEBUG", PL.MISSING, "INFO")
    known = PL.PlannedEdit("optimizer.optimizer_offload_fraction", PL.MISSING, 0.25)
    present = PL.PlannedEdit("model.pipeline_model_parallel_size", 1, 2)
    assert absent.override == "+env_vars.NCCL_DEBUG=INFO"
    assert known.override == "optimizer.optimizer_offload_fraction=0.25"  # Bridge's ConfigContainer has it
    assert present.override == "model.pipeline_model_parallel_size=2"


def test_a_checkpoints_own_run_config_is_not_edited(tmp_path):
    it = tmp_path / "ckpt" / "iter_0000500"
    it.mkdir(parents=True)
    shutil.copy(SEED / "qwen3_30b_a3b_activation_offload_pp1_oom.yaml", it / "run_config.yaml")
    before = (it / "run_config.yaml").read_text()
    r = _cli(str(SEED / "qwen3_30b_a3b_activation_offload_pp1_oom.log"), "--fix", str(it / "run_config.yaml"),
             "--unsafe-fixes", cwd=tmp_path)
    assert r.returncode == exitcodes.USAGE and "checkpoint's record" in r.stderr
    assert (it / "run_config.yaml").read_text() == before and not list(it.glob("*.bak*"))


@pytest.mark.parametrize("version,override", [("0.5.1", False), ("0.6.0", True), (None, True)])
def test_env_vars_are_exported_instead_on_a_bridge_before_0_6(tmp_path, version, override):
    """Issue 12, item 6: env_vars is a ConfigContainer key from Megatron-Bridge 0.6.0. On a run
    whose Bridge is known to be older the variable is advice to export, never an override or a
    key written to the file; where the version is unknown the override comes with that note."""
    cfg = tmp_path / "cfg.yaml"
    shutil.copy(TINY, cfg)
    log = tmp_path / "run.log"
    log.write_text((f"megatron-bridge {version}\n" if version else "")
                   + "node001:48213:48213 [0] NCCL WARN Connect to 10.1.2.3<45678> failed : Connection refused\n")
    r = _cli(str(log), "--fix", str(cfg), "--overrides", cwd=tmp_path)
    assert ("+env_vars.NCCL_DEBUG=INFO" in r.stdout) is override, (r.stdout, r.stderr)
    assert ("export NCCL_DEBUG=INFO in the job's environment (env_vars is a config key from Megatron-Bridge "
            "0.6.0; this run has 0.5.1)" in r.stderr) is (version == "0.5.1")
    assert ("env_vars.* needs Megatron-Bridge >= 0.6" in r.stderr) is (version is None)
    r = _cli(str(log), "--fix", str(cfg), cwd=tmp_path)
    assert ("NCCL_DEBUG" in cfg.read_text()) is override, r.stderr
