"""Root-cause selection: roles, order across ranks, supersedes, demotion, refinement, healthy."""
import pytest

from diagnose.diagnosis import diagnose_text

OOM = ("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
       "capacity of 79.11 GiB of which 1.23 GiB is free.")
WATCHDOG = ("[rank{r}]:[E1130 10:{m:02d}:11.061727749 ProcessGroupNCCL.cpp:683] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=78, OpType=ALLREDUCE, NumelIn=80, NumelOut=80, Timeout(ms)=600000) "
            "ran for 600096 milliseconds before timing out.")


def _root(text, **kw):
    rep = diagnose_text(text, **kw)
    return rep, rep.root_cause


def test_oom_on_one_rank_beats_watchdog_timeouts_on_the_others():
    text = "\n".join([WATCHDOG.format(r=r, m=30) for r in (0, 1, 2)] + [OOM]) + "\n"
    _rep, rc = _root(text)
    assert rc.finding.signature.category == "cuda_oom" and rc.hit.rank == 3
    assert any(f.signature.id == "MB-NCCL-001" and f.count == 3 for f in rc.set_aside)


def test_watchdog_alone_is_promoted_to_root():
    _, rc = _root("\n".join(WATCHDOG.format(r=r, m=30) for r in (2, 0, 1)) + "\n")
    assert rc.finding.signature.id == "MB-NCCL-001" and rc.hit.rank == 2


def test_earliest_timestamp_wins_across_ranks_not_line_order():
    late = "[rank5]: [2026-08-22 15:30:00] ValueError: CPU offloading can be done only for layers less than 4"
    early = "[rank1]: [2026-08-22 15:20:00] ValueError: Currently there is no support for Pipeline parallelism with CPU offloading"
    _, rc = _root(late + "\n" + early + "\n")
    assert rc.finding.signature.id == "MB-OFF-002" and rc.hit.rank == 1


def test_torchrun_sigkill_of_a_stuck_worker_is_not_a_host_oom():
    kill = "  exitcode  : -9 (pid: 4422)\n  traceback : Signal 9 (SIGKILL) received by PID 4422\n"
    alone = diagnose_text(kill).root_cause
    assert alone.finding.signature.category == "host_oom"
    forced = ("W0822 15:23:01.442000 4410 torch/distributed/elastic/multiprocessing/api.py:924] Unable to shutdown "
              "process 4422 via Signals.SIGTERM, forcefully exiting via Signals.SIGKILL\n")
    rc = diagnose_text("\n".join(WATCHDOG.format(r=r, m=30) for r in (0, 1)) + "\n" + forced + kill).root_cause
    assert rc.finding.signature.id == "MB-NCCL-001"
    assert any(f.signature.id == "MB-RUN-006" for f in rc.set_aside)


def test_refinement_needs_the_config_and_confirms_it():
    from diagnose.config.runconfig import RunConfig

    _, rc = _root(OOM + "\n")
    assert rc.finding.signature.id == "MB-OOM-001" and rc.confidence == "suspected"
    cfg = RunConfig({"model": {"cpu_offloading": True, "pipeline_model_parallel_size": 1}})
    _, rc = _root(OOM + "\n", config=cfg)
    assert rc.finding.signature.id == "MB-OFF-101" and rc.confidence == "confirmed"
    assert rc.refines.signature.id == "MB-OOM-001"


def test_absurd_allocation_is_a_shape_bug():
    _, rc = _root("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9120.50 GiB. GPU 1 has a total "
                  "capacity of 79.11 GiB of which 20.00 GiB is free.\n")
    assert rc.finding.signature.id == "MB-OOM-010"


def test_warnings_only_is_healthy():
    text = ("/usr/lib/python3/site-packages/x.py:1: FutureWarning: `torch.cuda.amp.custom_fwd(args...)` is "
            "deprecated. Please use `torch.amp.custom_fwd(args..., device_type='cuda')` instead.\n"
            "UserWarning: Transformer Engine and Apex are not installed. Falling back to Torch optimizers.\n")
    _rep, rc = _root(text)
    assert rc is None


CHILD_FAILED = """[E1201 06:49:53.000000 100 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 1 (pid: 24870) of binary: /usr/bin/python
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
pretrain_gpt.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_06:49:53
  host      : node001
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 24870)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_06:49:52
  host      : node001
  rank      : 3 (local_rank: 3)
  exitcode  : 1 (pid: 24872)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_torchrun_root_cause_block_names_the_rank_when_several_raise():
    """Rank 1's line comes first in the log, but torchrun saw rank 3 fail first: rank 3."""
    err = "[rank{r}]: ValueError: Currently there is no support for Pipeline parallelism with CPU offloading"
    _, rc = _root(err.format(r=1) + "\n" + err.format(r=3) + "\n" + CHILD_FAILED)
    assert rc.finding.signature.id == "MB-OFF-002"
    assert rc.hit.rank == 3 and rc.rank_source == "torchrun Root Cause block"


def _watchdogs(ranks):
    return "".join(WATCHDOG.format(r=r, m=30) + "\n" for r in ranks)


def test_straggler_world_size_from_the_config_names_a_rank_the_log_never_shows():
    from diagnose.config.runconfig import RunConfig

    _, rc = _root(_watchdogs(range(7)))
    assert rc.straggler is None and rc.hit.rank == 0  # 7 ranks, all report: no one to blame
    _, rc = _root(_watchdogs(range(7)), config=RunConfig({"world_size": 8}, "<test>"))
    assert rc.straggler == {"reporting": list(range(7)), "not_reporting": [7], "world_size": 8, "rank": 7}
    assert rc.hit.rank == 7


def test_straggler_ranks_the_log_shows_beat_a_smaller_configured_world():
    from diagnose.config.runconfig import RunConfig

    rank3 = "[rank3]: [W1130 10:30:00.000000 ProcessGroupNCCL.cpp:1] Connection closed by peer [10.0.0.2]:1234\n"
    _, rc = _root(_watchdogs((0, 1, 2)) + rank3, config=RunConfig({"world_size": 3}, "<test>"))
    assert rc.straggler == {"reporting": [0, 1, 2], "not_reporting": [3], "world_size": 4, "rank": 3}


def test_two_reporting_ranks_are_enough_and_other_errors_are_not_timeouts():
    seen = "[rank2]: [W1130 10:30:00.000000 ProcessGroupNCCL.cpp:1] Connection closed by peer [10.0.0.2]:1234\n"
    _, rc = _root(_watchdogs((0, 1)) + seen)
    assert rc.finding.signature.id == "MB-NCCL-001"
    assert rc.straggler == {"reporting": [0, 1], "not_reporting": [2], "world_size": 3, "rank": 2}


def test_basis_names_the_layer_that_decided():
    _, rc = _root(OOM + "\n")
    assert rc.basis == "signature"
    _, rc = _root("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    main()\n"
                  "ZeroDivisionError: division by zero\n")
    assert rc.finding.signature.id == "MB-GEN-001" and rc.basis == "exception"
    _, rc = _root("RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 3; 60.96 GiB total capacity)\n")
    assert rc.finding.signature.id == "MB-GEN-011" and rc.basis == "exception"
    _, rc = _root(_watchdogs((2, 0, 1)))
    assert rc.basis == "cascade"


TB = "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    main()\n"


def test_exceptions_the_layers_skip_or_count():
    # a warning raised as an exception and a clean SystemExit end no run
    rep, rc = _root(TB + "UserWarning: this API is deprecated\n")
    assert rc is None and rep.metrics["unexplained_exceptions"] == 0
    rep, rc = _root(TB + "SystemExit: 0\n")
    assert rc is None
    # Ctrl-C: nothing, unless the stack shows where the job was waiting (a hang)
    _, rc = _root(TB + "KeyboardInterrupt\n")
    assert rc is None
    hung = ("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    main()\n"
            "  File \"/usr/lib/python3.10/threading.py\", line 324, in wait\n    gotit = waiter.acquire(True, timeout)\n"
            "KeyboardInterrupt\n")
    _, rc = _root(hung)
    assert rc.finding.signature.id == "MB-GEN-021" and rc.basis == "traceback"
    # two unknown exceptions are two, and the first one is the root cause
    rep, rc = _root(TB + "ZeroDivisionError: division by zero\n" + TB + "KeyError: 'x'\n")
    assert rep.metrics["unexplained_exceptions"] == 2 and rc.hit.line == 4
    assert rc.hit.captures["exc_type"] == "ZeroDivisionError" and rc.hit.captures["message"] == "division by zero"


def test_an_exception_is_explained_by_a_signature_two_lines_away_not_three():
    oom = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.11 GiB of which 1.23 GiB is free.\n"
    near = oom + "noise\n" + "RuntimeError: something else\n"  # 2 lines below the OOM: the same failure
    rep, _ = _root(near)
    assert rep.metrics["unexplained_exceptions"] == 0
    far = oom + "noise\nnoise\n" + "RuntimeError: something else\n"  # 3 lines below: another one
    rep, _ = _root(far)
    assert rep.metrics["unexplained_exceptions"] == 1
    above = "RuntimeError: something else\n" + "noise\n" + oom  # 2 lines above
    rep, _ = _root(above)
    assert rep.metrics["unexplained_exceptions"] == 0
    rep, rc = _root("RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB\n")
    assert rc.hit.captures["layer_row"] == "accelerator-oom-message" and rc.hit.file == "<text>" and rc.hit.line == 1


def test_rank_source_says_where_the_rank_came_from():
    _, rc = _root(OOM + "\n")
    assert rc.hit.rank == 3 and rc.rank_source == "log line"
    bare = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.23 GiB is free.\n"
    _, rc = _root(bare)
    assert rc.hit.rank is None and rc.rank_source == ""
    # no rank on the line: torchrun's Root Cause block gives it
    _, rc = _root(bare + CHILD_FAILED)
    assert rc.hit.rank == 3 and rc.rank_source == "torchrun Root Cause block"
    # one rank named on its line and another by torchrun: the line is not re-attributed
    _, rc = _root("[rank1]: " + bare + CHILD_FAILED)
    assert rc.hit.rank == 1 and rc.rank_source == "log line"


def test_a_config_trap_found_in_the_log_points_at_the_config_block():
    from diagnose.config.runconfig import RunConfig

    cfg = RunConfig({"optimizer": {"optimizer_cpu_offload": True, "optimizer_offload_fraction": 0.0,
                                   "use_distributed_optimizer": True}}, "run_config.yaml")
    rep, _rc = _root("", config=cfg)
    f = next(x for x in rep.findings if x.signature.id == "MB-OFF-050")
    assert (f.first.file, f.first.line) == ("run_config.yaml", 1)
    assert f.first.text == ("optimizer.optimizer_cpu_offload = True; optimizer.optimizer_offload_fraction = 0.0")


def test_static_overrides_take_the_first_applicable_fix_with_edits():
    from dataclasses import replace

    from diagnose.analyze.root_cause import static_overrides
    from diagnose.config.runconfig import RunConfig
    from diagnose.db import load
    from diagnose.model import Edit, Fix

    fixes = (Fix("text only"), Fix("not here", edits=(Edit("a.b", "set", 1),), when="model.x == 1"),
             Fix("every op", edits=(Edit("train.micro_batch_size", "scale", 0.5, min=1),
                                    Edit("train.global_batch_size", "add", 2),
                                    Edit("model.pipeline_model_parallel_size", "set", 2),
                                    Edit("model.virtual_pipeline_model_parallel_size", "delete"))))
    sig = replace(load().get("MB-OOM-001"), fixes=fixes)
    cfg = RunConfig({"model": {"x": 0, "pipeline_model_parallel_size": 1, "virtual_pipeline_model_parallel_size": 2},
                     "train": {"micro_batch_size": 4, "global_batch_size": 8}}, "<test>")
    # the config's numbers: the edits applied to them
    assert static_overrides(sig, cfg, {"model": {"x": 0}}) == [
        "train.micro_batch_size=2", "train.global_batch_size=10", "model.pipeline_model_parallel_size=2",
        "~model.virtual_pipeline_model_parallel_size"]
    # no config: scale and add shown as operations, set and delete as they are
    assert static_overrides(sig, None, {"model": {"x": 0}}) == [
        "train.micro_batch_size=x0.5", "train.global_batch_size=+2", "model.pipeline_model_parallel_size=2",
        "~model.virtual_pipeline_model_parallel_size"]
    # a fix whose condition holds (or is unknown) comes first
    assert static_overrides(sig, cfg, {"model": {"x": 1}}) == ["a.b=1"]
    assert static_overrides(sig, cfg, {}) == ["a.b=1"]
    assert static_overrides(replace(sig, fixes=fixes[:1]), cfg, {}) == []


def test_tiers_layers_before_failure_markers_and_the_likeliest_marker_first():
    npu = "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 3; 60.96 GiB total capacity)\n"
    failed = "subprocess.CalledProcessError: Command '['python', 'train.py']' returned non-zero exit status 1.\n"
    # a failure marker first, then an exception the layers read: the exception is the root cause
    _, rc = _root(failed + npu)
    assert rc.finding.signature.id == "MB-GEN-011" and rc.basis == "exception"
    # only markers: torchrun's (priority 50, the earliest of them) before a generic 'job failed' line (10)
    _, rc = _root("Error executing job with overrides: ['trainer.devices=8']\n" + CHILD_FAILED)
    assert rc.finding.signature.id == "MB-RUN-002" and rc.basis == "failure"  # torchrun agent: failed (exitcode: 1)
    assert rc.finding.signature.category == "other"


def test_a_refined_root_cause_keeps_the_evidence_line_of_what_it_refines():
    text = ("[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8192.00 GiB. GPU 2 has a total "
            "capacity of 79.11 GiB of which 60.23 GiB is free.\n")
    rep, rc = _root("noise\n" + text)
    assert rc.finding.signature.id == "MB-OOM-010" and rc.refines is not None
    refined = next(f for f in rep.findings if f.signature.id == "MB-OOM-010")
    first = refined.first
    assert (first.sig_id, first.file, first.line, first.rank, first.text) == (
        "MB-OOM-010", "<text>", 2, 2, text.strip())
    assert first.captures == rc.refines.first.captures and first.order == rc.refines.first.order


def test_a_weight_update_that_failed_for_an_out_of_memory_is_the_out_of_memory(db):
    """SGLang's "Failed to update parameter online: <reason>" (MB-CKPT-018) embeds the error
    that broke the update; an out-of-memory there is the root cause, a shape mismatch is not one."""
    tail = ". The full weights of the ModelRunner are partially updated. Please discard the whole weights."
    oom = ("Failed to update parameter online: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
           "capacity of 79.11 GiB of which 1.23 GiB is free." + tail)
    assert diagnose_text(oom, db).root_cause.finding.signature.id == "MB-OOM-001"
    shape = "Failed to update parameter online: start (256) + length (256) exceeds dimension size (256)." + tail
    assert diagnose_text(shape, db).root_cause.finding.signature.id == "MB-CKPT-018"


def test_an_unknown_error_before_the_watchdog_timeouts_is_the_cause_not_after_them():
    """One rank raises an error no signature knows; the others then time out in the collective
    it never joined (C++ watchdog records below it). The error is the root cause; printed after
    the timeouts instead, it is their consequence and the timeout is named."""
    err = "RuntimeError: Invalid mt19937 state"
    nccl = ("[E ProcessGroupNCCL.cpp:456] Some NCCL operations have failed or timed out. Due to the asynchronous "
            "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
    before = "\n".join([err, nccl] + [WATCHDOG.format(r=r, m=30) for r in (1, 2, 3)]) + "\n"
    rc = diagnose_text(before).root_cause
    assert rc.finding.signature.id == "MB-GEN-001" and rc.hit.text == err
    after = "\n".join([WATCHDOG.format(r=r, m=30) for r in (1, 2, 3)] + [err]) + "\n"
    assert diagnose_text(after).root_cause.finding.signature.category == "nccl_timeout"


# ---- a start-up hang (MB-SYM-010): output that stops in start-up, nothing failed

_BAR = "Epoch 0:   0%|          | 0/1234 [00:00<?, ?it/s]"


def test_output_that_stops_on_a_first_step_bar_is_a_start_up_hang_with_that_line_as_evidence():
    """The bar is the evidence, not the warning printed after it (the file's last line)."""
    rep = diagnose_text("[2024-08-06 04:53:37] Beginning epoch 0...\n" + _BAR + "\n"
                        "/opt/conda/lib/python3.9/site-packages/x.py:55: UserWarning: TypedStorage is deprecated.\n"
                        "  numel += p.storage().size()\n")
    rc = rep.root_cause
    assert rc.finding.signature.id == "MB-SYM-010" and rc.finding.signature.category == "hang"
    assert rc.hit.text == _BAR and rc.hit.line == 2


@pytest.mark.parametrize("log", [
    "",  # nothing read: no tail, no verdict about where it stopped
    "\n\n",
    # a cut traceback (no exception line) before the bar: the traceback is the failure
    'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n    main()\n' + _BAR + "\n",
    # an exception line without a traceback before it
    "RuntimeError: NCCL communicator was aborted\n" + _BAR + "\n",
    # a failed worker reported by torchrun
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n" + _BAR + "\n",
], ids=["empty", "blank", "cut-traceback", "exception", "torchrun"])
def test_no_start_up_hang_where_something_failed_or_nothing_was_read(log):
    rep = diagnose_text(log)
    assert rep.metrics.get("ends_in_init") is None
    assert rep.root_cause is None or rep.root_cause.finding.signature.id != "MB-SYM-010"
