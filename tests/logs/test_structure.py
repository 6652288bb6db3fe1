"""The log's structure: rank prefixes, iteration / memory / timer lines, tracebacks, torchrun, configs."""
import gzip
from pathlib import Path

import pytest

from diagnose.diagnosis import diagnose_paths, diagnose_text
from diagnose.logs import lines as L
from diagnose.logs.structure import parse_iteration, parse_memory

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus"


@pytest.mark.parametrize("line,rank,rest", [
    ("[rank3]: ValueError: x", 3, "ValueError: x"),
    ("[default0]:[rank0]: RuntimeError: y", 0, "RuntimeError: y"),
    (" 2: [rank2]:   File \"a.py\"", 2, "  File \"a.py\""),
    ("15: [rank15]: AssertionError: z", 15, "AssertionError: z"),
    ("i.pretrain/0 [default2]:hello", 2, "hello"),
    ("(RayWorker pid=1234) boom", None, "boom"),
    ("[rank1]:[E810 03:04:11.061727749 ProcessGroupNCCL.cpp:683] [Rank 1] Watchdog", 1,
     "[E810 03:04:11.061727749 ProcessGroupNCCL.cpp:683] [Rank 1] Watchdog"),
    ("[Rank 0] (after 10 iterations) memory (GB) | a: 1", 0, "[Rank 0] (after 10 iterations) memory (GB) | a: 1"),
    ("plain line", None, "plain line"),
])
def test_rank_prefixes(line, rank, rest):
    assert L.split_prefix(line) == (rank, rest)


def test_clean_ansi_cr_nul_invalid_utf8():
    assert L.clean(b"\x1b[31mred\x1b[0m text\r\n") == "red text"
    assert L.clean(b"50%\r100% done\n") == "100% done"
    assert L.clean(b"a\x00b\xff\n") == "ab\ufffd"


def test_timestamps():
    assert L.timestamp(" [2026-08-22 15:22:22] iteration") == L.timestamp("[2026-08-22 15:22:22.000000]")
    assert L.timestamp("E1130 10:58:34.718000 19047 torch/x.py") is not None
    assert L.timestamp("no time here") is None


MLM_ITER = (" [2026-08-22 15:22:22.123456] iteration       10/     100 | consumed samples:        10240 | "
            "elapsed time per iteration (ms): 996.3 | learning rate: 3.000000E-05 | global batch size:  1024 | "
            "lm loss: 1.023456E+01 | loss scale: 1.0 | grad norm: 12.346 | number of skipped iterations:   0 | "
            "number of nan iterations:   0 |")
BRIDGE_ITER = MLM_ITER.replace(".123456]", "]").replace("lm loss", "lm loss: 9.9E+00 | load_balancing_loss")


def test_iteration_lines_both_formats():
    for text in (MLM_ITER, BRIDGE_ITER):
        p = parse_iteration(text, "f", 1)
        assert (p.iteration, p.train_iters, p.elapsed_ms) == (10, 100, 996.3)
        assert p.fields["grad norm"] == "12.346" and p.time is not None
    assert parse_iteration(MLM_ITER, "f", 1).fields["lm loss"] == "1.023456E+01"


def test_memory_lines_mib_and_gb():
    mlm = parse_memory("[Rank 0] (after 10 iterations) memory (MB) | allocated: 45025.71 | max allocated: 57338.10 | reserved: 62944.00 | max reserved: 62944.00")
    assert mlm["values"]["allocated"] == pytest.approx(45025.71 * 2**20 / 1e9)
    br = parse_memory("[Rank 0] (after 10 iterations) memory (GB) | mem-allocated-gigabytes: 47.213 | mem-max-allocated-gigabytes: 60.123 | mem-alloc-retires: 2 | mem-allocated-count: 12345")
    assert br["values"]["allocated"] == 47.213 and br["values"]["max_allocated"] == 60.123
    assert br["values"]["alloc_retries"] == 2


def test_timer_block_and_optimizer_share():
    text = ("(min, max) time across ranks (ms):\n"
            "    forward-backward ...............................: (950.12, 951.03)\n"
            "    optimizer ......................................: (40.10, 41.00)\n"
            "next line\n")
    rep = diagnose_text(text)
    assert rep.structure.timers["optimizer"] == (40.10, 41.00)
    assert rep.metrics["optimizer_share"] == pytest.approx(41.0 / (41.0 + 951.03))


TORCHRUN = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_10:58:18
  host      : node7
  rank      : 5 (local_rank: 1)
  exitcode  : -15 (pid: 18993)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 18993
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_10:58:17
  host      : node7
  rank      : 4 (local_rank: 0)
  exitcode  : 1 (pid: 18992)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_torchrun_block():
    rep = diagnose_text(TORCHRUN)
    tr = rep.structure.torchrun
    assert [(t.section, t.rank, t.local_rank, t.exitcode) for t in tr] == [("failure", 5, 1, -15), ("root", 4, 0, 1)]


def test_a_torchrun_summary_cut_short_ends_after_stray_lines():
    """A summary whose end the log lost stops being read after MAX_STRAY lines that are no part
    of it (it read on for 3,000 before): a later summary is read on its own, both records kept."""
    from diagnose.logs.blocks import TorchrunBlock

    cut = TORCHRUN.split("Root Cause")[0].splitlines()  # Failures only, no closing rule
    block = TorchrunBlock(S.Structure(), "f", 1, cut[0])
    assert all(block.feed_text(t, n) for n, t in enumerate(cut[1:], start=2))
    stray = [block.feed_text(f"step {i}: loss 2.0", 100 + i) for i in range(TorchrunBlock.MAX_STRAY + 5)]
    assert stray.index(False) == TorchrunBlock.MAX_STRAY  # ends at the first stray line over the limit
    assert [(t.section, t.rank) for t in block.s.torchrun] == [("failure", 5)]
    # a summary line between stray lines starts the count again
    block = TorchrunBlock(S.Structure(), "f", 1, cut[0])
    for n, t in enumerate(cut[1:], start=2):
        block.feed_text(t, n)
    lines = ["x"] * (TorchrunBlock.MAX_STRAY - 1) + ["[2]:"] + ["x"] * (TorchrunBlock.MAX_STRAY - 1)
    assert all(block.feed_text(t, 200 + i) for i, t in enumerate(lines))


def test_the_raise_line_of_a_traceback_does_not_start_a_torchrun_summary():
    from diagnose.logs.blocks import TorchrunBlock

    assert not TorchrunBlock.wanted(None, "f", 1, "[rank0]:     raise ChildFailedError(")
    assert not TorchrunBlock.wanted(None, "f", 1, '  File "/x/torch/distributed/run.py", line 3, in ChildFailedError')
    assert TorchrunBlock.wanted(None, "f", 1, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ")


def test_torchrun_root_names_the_rank_of_an_unprefixed_error():
    text = "ValueError: Currently there is no support for Pipeline parallelism with CPU offloading\n" + TORCHRUN
    rep = diagnose_text(text)
    assert rep.root_cause.finding.signature.id == "MB-OFF-002"
    assert rep.root_cause.hit.rank == 4 and "torchrun" in rep.root_cause.rank_source


def test_interleaved_tracebacks_are_followed_per_rank():
    text = "\n".join([
        "[rank1]: Traceback (most recent call last):",
        "[rank0]: Traceback (most recent call last):",
        '[rank1]:   File "train.py", line 3, in <module>',
        '[rank0]:   File "train.py", line 3, in <module>',
        "[rank1]:     main()",
        "[rank1]: KeyError: 'tokens'",
        '[rank0]:     main()',
        "[rank0]: KeyError: 'tokens'",
    ]) + "\n"
    rep = diagnose_text(text)
    tbs = rep.structure.tracebacks
    assert sorted((t.rank, t.exc_type, t.line) for t in tbs) == [(0, "KeyError", 8), (1, "KeyError", 6)]
    assert rep.root_cause.finding.signature.id == "MB-GEN-001"
    assert rep.root_cause.hit.line == 6 and rep.root_cause.hit.rank == 1


@pytest.mark.parametrize("last,exc_type", [
    # a class without an Error-like suffix ends the traceback when it is dotted or a builtin
    ("triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 212992, "
     "Hardware limit: 101376. Reducing block sizes or `num_stages` may help.", "triton.runtime.errors.OutOfResources"),
    ("StopIteration", "StopIteration"),
    ("_queue.Empty", "_queue.Empty"),
    # a log line with a capitalised word and a colon is not an exception: the traceback is cut
    ("INFO:root:saving the model", None),
    ("Epoch 3: 100%|##########| 10/10", None),
])
def test_the_exception_that_ends_a_traceback_may_name_any_class(last, exc_type):
    text = "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    main()\n" + last + "\n"
    tbs = diagnose_text(text).structure.tracebacks
    assert len(tbs) == 1 and tbs[0].exc_type == exc_type


def test_mlm_arguments_block_is_the_config():
    text = "\n".join([
        "------------------------ arguments ------------------------",
        "  cpu_offloading .................................. True",
        "  num_layers ...................................... 48",
        "  optimizer_offload_fraction ...................... 1.0",
        "  pipeline_model_parallel_size .................... 2",
        "  use_distributed_optimizer ....................... True",
        "-------------------- end of arguments ---------------------",
        "[rank0]: ValueError: Currently there is no support for Pipeline parallelism with CPU offloading",
    ]) + "\n"
    rep = diagnose_text(text)
    cfg = rep.config
    assert cfg.get("model.pipeline_model_parallel_size") == 2 and cfg.get("ddp.use_distributed_optimizer") is True
    assert rep.root_cause.confidence == "confirmed"
    assert "model.pipeline_model_parallel_size = 2" in rep.root_cause.because


def test_bridge_yaml_dump_and_summary_are_the_config():
    text = "\n".join([
        "INFO:recipe_runner:Final configuration:",
        "_target_: megatron.bridge.training.config.ConfigContainer",
        "model:",
        "  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider",
        "  cpu_offloading: true",
        "  num_layers: 48",
        "  pipeline_dtype:",
        "    _call_: false",
        "    _target_: torch.bfloat16",
        "  pipeline_model_parallel_size: 1",
        "  recompute_granularity: full",
        "optimizer:",
        "  _target_: megatron.bridge.training.config.OptimizerConfig",
        "  optimizer_cpu_offload: false",
        "[rank0]: ValueError: CPU offloading does not work when activation recomputation is enabled",
    ]) + "\n"
    rep = diagnose_text(text)
    assert rep.config.get("model.pipeline_dtype") == "torch.bfloat16"
    assert rep.root_cause.finding.signature.id == "MB-OFF-003"
    assert rep.root_cause.confidence == "confirmed"
    summary = "\n".join([
        "======================================================================",
        "Configuration Summary (Non-Default Values vs Megatron Core)",
        "======================================================================",
        "",
        "[optimizer] Non-default values (vs Mcore OptimizerConfig):",
        "  optimizer_cpu_offload: True  (Mcore default: False)",
        "  optimizer_offload_fraction: 0.5  (Mcore default: 0.0)",
        "",
        "[train]:",
        "  global_batch_size: 1024",
        "======================================================================",
    ]) + "\n"
    rep = diagnose_text(summary)
    assert rep.config.get("optimizer.optimizer_offload_fraction") == 0.5
    assert rep.config.get("train.global_batch_size") == 1024


def test_gzip_folder_and_rank_per_file(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    (d / "rank0.log").write_text("fine\n")
    with gzip.open(d / "rank3.log.gz", "wt") as fh:
        fh.write("ValueError: CPU offloading can be done only for layers less than 4\n")
    rep = diagnose_paths([str(d)])
    assert len(rep.inputs) == 2
    assert rep.root_cause.finding.signature.id == "MB-OFF-001"
    assert rep.root_cause.hit.rank == 3 and rep.root_cause.hit.captures["num_layers"] == 4


def test_lines_are_counted_across_chunks(tmp_path, monkeypatch):
    from diagnose.logs import read

    p = tmp_path / "big.log"
    body = "".join(f"line {i}\n" for i in range(5000))
    p.write_text(body + "ValueError: Currently there is no support for Pipeline parallelism with CPU offloading\n")
    monkeypatch.setattr(read, "CHUNK", 4096)
    rep = diagnose_paths([str(p)])
    assert rep.root_cause.hit.line == 5001
    assert rep.lines_read == 5001


def test_glog_timestamps_take_the_year_of_the_log():
    text = (" [2024-03-01 10:00:00] iteration        1/      10 | consumed samples:            8 | elapsed time per "
            "iteration (ms): 110.0 | lm loss: 5.5E+00 |\n"
            "[rank1]:[E0301 10:05:00.000000000 ProcessGroupNCCL.cpp:683] [Rank 1] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600100 "
            "milliseconds before timing out.\n")
    rep = diagnose_text(text)
    assert rep.structure.year == 2024
    assert rep.root_cause.hit.time == L.timestamp("[2024-03-01 10:05:00]")


# the fast field splitters give what the field regexes find, on any text
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from diagnose.logs import parsers as PA  # noqa: E402
from diagnose.logs import structure as S  # noqa: E402

_SOUP = st.lists(st.sampled_from(list("ab :|\t-._()/0123456789eE+nN\u00e9\n,=") +
                                 [" | ", ": ", "lm loss", "grad norm", " 1.5E+00 ", "|  x:  3", "\u00a0", "\x1c"]),
                 max_size=40).map("".join)


@settings(max_examples=3000, deadline=None)
@given(_SOUP)
def test_field_splitters_agree_with_the_field_regexes(text):
    want = {fm.group(1).strip(): fm.group(2).strip() for fm in PA._FIELD.finditer(text)}
    assert dict(PA._split_fields(text, PA._ITER_FIELDS)) == want
    want_mem = [(fm.group(1).strip(), fm.group(2)) for fm in PA._MEM_FIELD.finditer(text)]
    assert dict(PA._split_fields(text, PA._MEM_FIELDS)) == dict(want_mem)


def test_grad_norm_runs_of_a_file_read_in_two_parts_merge_to_the_whole():
    """parallel.py merges a file's pieces with merge_grad_norm_runs: for every split of every
    sequence of finite / NaN grad norms, the merge is what one read counts."""
    import itertools

    def runs(values, start=1):
        s = S.Structure()
        for i, v in enumerate(values):
            S.add_grad_norm(s, f"{{'loss': 1.5, 'grad_norm': {v}, 'epoch': 0.1}}", "f", start + i)
        return s.grad_norm_runs.get("f")

    for n in range(1, 8):
        for seq in itertools.product(("nan", "1.25"), repeat=n):
            whole = runs(seq)
            for cut in range(1, n):
                a, b = runs(seq[:cut]), runs(seq[cut:], start=cut + 1)
                assert S.merge_grad_norm_runs(a, b) == whole, (seq, cut)


def test_an_isolated_nan_grad_norm_is_a_skipped_step_and_a_lasting_one_a_failure():
    def dicts(*norms):
        return "".join(f"{{'loss': 0.2, 'grad_norm': {v}, 'epoch': 0.24}}\n" for v in norms)

    skipped, lasting = dicts("1.4", "nan", "4.8"), dicts("1.4", "4.8", "nan")
    assert diagnose_text(skipped).root_cause is None
    rc = diagnose_text(lasting).root_cause
    assert rc is not None and rc.finding.signature.id == "MB-SYM-011" and rc.hit.line == 3


def test_loss_scale_runs_of_a_file_read_in_two_parts_merge_to_the_whole():
    """Cuts of the fp16 loss scale, each lower than the last, counted across a piece boundary
    as one read counts them (parallel.py: merge_scale_runs), for every split of every sequence."""
    import itertools

    def runs(scales):
        r = S.ScaleRuns()
        for sc in scales:
            S.add_scale(r, sc)
        return r

    for n in range(1, 7):
        for seq in itertools.product((4.0, 2.0, 1.0), repeat=n):
            whole = runs(seq)
            for cut in range(1, n):
                assert S.merge_scale_runs(runs(seq[:cut]), runs(seq[cut:])) == whole, (seq, cut)


def _neox_line(i: int, loss: float) -> str:
    return (f" samples/sec: 2.721 | iteration {i:>8}/   55000 | elapsed time per iteration (ms): 11761.2 | "
            f"learning rate: 2.424E-09 | approx flops per GPU: 9.1TFLOPS | lm_loss: {loss:.6E} | "
            "number of skipped iterations:   0 | number of nan iterations:   0 |")


def test_a_loss_jump_is_the_largest_rise_of_two_nats_or_more_and_its_line(tmp_path):
    from diagnose.diagnosis import diagnose_paths

    losses = [2.27, 2.25, 2.2, 6.9, 7.0, 2.1, 2.3, 11.05]  # 2.2 -> 6.9 (x3.1), 2.3 -> 11.05 (x4.8)
    log = tmp_path / "run.log"
    log.write_text("".join(_neox_line(i + 1, v) + "\n" for i, v in enumerate(losses)))
    rep = diagnose_paths([str(log)], jobs=1)
    assert abs(rep.structure.peaks["loss_jump"] - 11.05 / 2.3) < 1e-6
    assert rep.structure.evidence["loss_jump"][1] == 8
    assert rep.root_cause is not None and rep.root_cause.finding.signature.id == "MB-SYM-012"
    # a rise under 2 nats is never a jump, however large the ratio (an RL loss near zero)
    log.write_text("".join(_neox_line(i + 1, v) + "\n" for i, v in enumerate([0.01, 0.5, 1.9, 0.3])))
    rep = diagnose_paths([str(log)], jobs=1)
    assert "loss_jump" not in rep.structure.peaks and rep.root_cause is None


def test_a_loss_jump_in_one_file_is_not_made_of_two_files(tmp_path):
    from diagnose.diagnosis import diagnose_paths

    (tmp_path / "a.log").write_text(_neox_line(1, 2.0) + "\n")
    (tmp_path / "b.log").write_text(_neox_line(1, 10.5) + "\n")
    rep = diagnose_paths([str(tmp_path)], jobs=1)
    assert "loss_jump" not in rep.structure.peaks


def test_ipython_and_rich_tracebacks_are_read_as_python_s():
    """A notebook's traceback (IPython: "path.py in func(args)", the line it was on marked
    "---->") and a rich box ("│ path.py:N in func │", the name wrapped onto the next box line, the
    line marked "❱") give the frames and source lines a Python traceback gives: a paste cut
    before its exception line is a failure, not a healthy log (both came back healthy)."""
    nb = (CORPUS / "config-ckpt" / "022_lightning-resume-ckpt-keyerror-notebook.log").read_text()
    tb = diagnose_text(nb).structure.tracebacks[0]
    assert tb.frames[:3] == ['File "/tmp/ipykernel_10535/1750406609.py", line 6, in <module>',
                             'File "/opt/conda/lib/python3.7/site-packages/pytorch_lightning/trainer/trainer.py", line 583, in fit',
                             'File "/opt/conda/lib/python3.7/site-packages/pytorch_lightning/trainer/call.py", line 38, '
                             'in _call_and_handle_interrupt']
    assert tb.source[:3] == ["ckpt_path=best_model_path,",
                             "self, self._fit_impl, model, train_dataloaders, val_dataloaders, datamodule, ckpt_path",
                             "return trainer_fn(*args, **kwargs)"]
    # with its exception line (the thread's KeyError) the traceback ends there, its type read
    head = "\n".join(nb.splitlines()[:20])
    tb = diagnose_text(head + "\n\nKeyError: 'radam_buffer'\n").structure.tracebacks[0]
    assert (tb.exc_type, tb.message) == ("KeyError", "'radam_buffer'")
    box = (CORPUS / "r3-general" / "022_llm-foundry-autoresume-max-duration-elapsed-richbox.log").read_text()
    rep = diagnose_text(box)
    tb = rep.structure.tracebacks[0]
    assert tb.frames[0] == 'File "/gpfs/home1/TooManyStacks/projects/llm-foundry/scripts/train/train.py", line 346, in <module>'
    assert tb.source[0] == "main(cfg)"
    assert rep.root_cause is not None
