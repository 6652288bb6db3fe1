"""The metrics of analyze/symptoms.py value by value, each worked out by hand from the log.

The slowdown, NaN and hang signatures read these numbers; the corpus tests check them end to
end (a category on a real log), which let a wrong median, a count off by one or a lost evidence
line through (a mutation run on symptoms.py: 69 % of its mutants survived). Here every metric of
a small log in each format is pinned, with the line its evidence points to.
"""
from __future__ import annotations

import pytest

from diagnose.analyze import symptoms as SY
from diagnose.diagnosis import diagnose_text

COMMON = {"unexplained_exceptions": 0}


def it(i: int, ms: float, loss: str | None = "1.000000E+01", gn: str = "1.500", nan: int = 0, total: int = 100) -> str:
    """A Megatron-LM iteration line (training.py training_log)."""
    lossf = f" lm loss: {loss} |" if loss is not None else ""
    return (f" [2026-11-28 03:40:55] iteration {i:8d}/{total:8d} | consumed samples: {i * 64:12d} | elapsed time per "
            f"iteration (ms): {ms} | learning rate: 3.000000E-05 | global batch size:    64 |{lossf} loss scale: 1.0 "
            f"| grad norm: {gn} | number of skipped iterations:   0 | number of nan iterations: {nan:3d} |")


def metrics(text: str):
    rep = diagnose_text(text)
    m = {k: v for k, v in rep.metrics.items() if k != "error_findings"}
    return m, rep.structure.evidence


def test_a_run_that_slows_down_in_one_step():
    times = [5000, 1000, 1100, 1200, 1300, 1400, 2000, 2100]
    m, ev = metrics("\n".join(it(i, ms) for i, ms in enumerate(times, 1)) + "\n")
    assert m == {
        "iterations": 8, "last_iteration": 8, "train_iters": 100,
        "iter_ms_median": 1350.0,  # (1300 + 1400) / 2
        "iter_ms_first": 1100,  # the median of iterations 2-4 (the first is warm-up)
        "iter_ms_last": 2000,  # the median of the last three
        "iter_time_growth": 2000 / 1100, "iter_time_trend": 1.0,  # strictly slower past the first
        "loss_missing_iters": 0, "loss_nan_iters": 0, "grad_norm_nan_iters": 0, "nan_iters_reported": 0,
        # past two warm-up iterations, six remain: split 3 | 3, medians 1200 and 2000
        "iter_time_step": 1.667, "iter_time_step_at": 6, "iter_time_step_separation": 1.0, **COMMON}
    assert ev["iter_time_step"] == ("<text>", 6, "from iteration 6: median 2000 ms per iteration, 1.7x the 1200 ms "
                                    "before it (iterations 3-5)")
    assert ev["slowest_iteration"][:2] == ("<text>", 1) and "(ms): 5000 |" in ev["slowest_iteration"][2]


def test_a_short_paste_compares_its_first_and_last_points():
    m, _ = metrics("\n".join(it(i, ms) for i, ms in enumerate([1000, 1200, 1100, 1500], 1)) + "\n")
    assert m == {
        "iterations": 4, "last_iteration": 4, "train_iters": 100, "iter_ms_median": 1150.0,
        "iter_ms_first": 1000, "iter_ms_last": 1500, "iter_time_growth": 1.5,
        "iter_time_trend": 0.667,  # 5 of 6 pairs rise, 1 falls: (5 - 1) / 6
        "loss_missing_iters": 0, "loss_nan_iters": 0, "grad_norm_nan_iters": 0, "nan_iters_reported": 0, **COMMON}


def test_nan_and_missing_losses_are_counted_line_by_line():
    lines = [it(1, 900), it(2, 1000, loss="nan", gn="nan", nan=1), it(3, 1000, loss=None, nan=2),
             it(4, 1000, nan=3, total=50)]
    m, ev = metrics("\n".join(lines) + "\n")
    assert m == {
        "iterations": 4, "last_iteration": 4, "train_iters": 100,  # the largest planned total printed
        "iter_ms_median": 1000.0, "iter_ms_first": 900, "iter_ms_last": 1000, "iter_time_growth": 1000 / 900,
        "iter_time_trend": 0.5,  # 3 of 6 pairs rise, 3 tie
        "loss_missing_iters": 1, "loss_nan_iters": 1, "grad_norm_nan_iters": 1, "nan_iters_reported": 3, **COMMON}
    assert [ev[k][1] for k in ("loss_nan", "grad_norm_nan", "loss_missing")] == [2, 2, 3]


def test_another_frameworks_progress_bar_is_the_series_and_its_slowest_step_the_evidence():
    bars = [(1, "2.00"), (2, "2.10"), (3, "5.50"), (4, "2.20"), (5, "2.30"), (6, "2.40"), (7, "2.50")]
    m, ev = metrics("\n".join(f"Train:  {i}%|#   | {i}/50 [00:{i:02d}<01:00, {t}s/it]" for i, t in bars) + "\n")
    assert m == {
        "iterations": 7, "last_iteration": 7, "train_iters": 50, "iter_ms_median": 2300.0,
        "iter_ms_first": 2200.0,  # the median of 2.10, 5.50, 2.20 s
        "iter_ms_last": 2400.0, "iter_time_growth": 2400 / 2200,
        "iter_time_trend": 0.467,  # past the first: (5 - 4 + 3 + 2 + 1) / 15
        "loss_missing_iters": 0, "loss_nan_iters": 0, "grad_norm_nan_iters": 0, "nan_iters_reported": 0, **COMMON}
    assert ev["slowest_iteration"] == ("<text>", 3, "Train:  3%|#   | 3/50 [00:03<01:00, 5.50s/it]")


def _block(fb: tuple, opt: tuple) -> str:
    return ("(min, max) time across ranks (ms):\n"
            f"    forward-backward ...............................: ({fb[0]:.2f}, {fb[1]:.2f})\n"
            f"    optimizer ......................................: ({opt[0]:.2f}, {opt[1]:.2f})\n")


def test_the_median_timer_record_speaks_for_the_run_and_the_ranks_spread_is_min_to_max():
    text = (it(1, 4000) + "\n" + _block((900, 1000), (3000, 3100)) + it(2, 4000) + "\n"
            + _block((800, 1000), (100, 200)) + it(3, 4000) + "\n" + _block((950, 1000), (1900, 2000)))
    m, ev = metrics(text)
    # shares 3100/4100, 200/1200, 2000/3000: the median is the third record's (its maxima)
    assert m["optimizer_share"] == pytest.approx(2 / 3) and m["cpu_optimizer"] == 0
    assert m["timer_spread"] == pytest.approx(1000 / 950)  # the last record's forward-backward, max / min
    assert ev["timer_attribution"] == ("<text>", 10, "optimizer step 2000.0 ms = 67% of the timed iteration "
                                       "(forward-backward 1000.0 ms); the median of 3 timer records")


def test_deepspeed_timers_skipped_steps_and_cpu_adam():
    text = ("[Rank 0] time (ms) | forward: 100.00 | backward: 200.00 | step: 900.00\n"
            "Adam Optimizer #0 is created with AVX512 arithmetic capability.\n"
            "[2024-01-01 00:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=40, skipped=30, lr=[1e-05]\n"
            "[2024-01-01 00:00:01,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=20, skipped=20, lr=[1e-05]\n")
    m, ev = metrics(text)
    # forward + backward = 300 ms against the step's 900; no min/max in this format: no spread
    assert m == {"cpu_optimizer": 1, "optimizer_share": 0.75, "skipped_steps": 30, "skipped_step_share": 0.75, **COMMON}
    assert ev["timer_attribution"] == ("<text>", 1, "optimizer step 900.0 ms = 75% of the timed iteration "
                                       "(forward 100.0 ms, backward 200.0 ms)")
    assert ev["ds_skipped"][1] == 3  # the report with the most steps counts all, wherever it is


def test_memory_peak_and_the_allocator_retries_growth():
    mem = ("[Rank 0] (after {i} iterations) memory (GB) | mem-allocated-gigabytes: 37.413 | mem-max-allocated-gigabytes: "
           "{a} | mem-alloc-retires: {r} | mem-allocated-count: 12345")
    lines = [it(1, 1000), mem.format(i=1, a=40.5, r=2), it(2, 1000), mem.format(i=2, a=42.25, r=5),
             it(3, 1000), mem.format(i=3, a=41.0, r=9)]
    m, ev = metrics("\n".join(lines) + "\n")
    assert m["mem_max_allocated_gb"] == 42.25
    assert m["alloc_retries_growth"] == 7  # 9 at the peak minus 2 in the first report
    assert ev["memory_retries"][1] == 2
    one = metrics("\n".join(lines[:2]) + "\n")[0]
    assert "alloc_retries_growth" not in one  # one report is no growth


def test_nan_grad_norms_in_metric_dicts_count_the_longest_run_and_whether_it_is_still_open():
    text = ("{'loss': 1.2, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.1}\n"
            "{'loss': 1.1, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.2}\n"
            "{'loss': 1.3, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.3}\n"
            "{'loss': 1.3, 'grad_norm': inf, 'learning_rate': 1e-05, 'epoch': 0.4}\n")
    m, ev = metrics(text)
    assert m == {"grad_norm_nan_run": 2, "grad_norm_nan_last": 1, **COMMON}
    assert ev["grad_norm_nan_run"][1] == 3  # where the open run began
    closed = metrics(text + "{'loss': 1.0, 'grad_norm': 0.4, 'learning_rate': 1e-05, 'epoch': 0.5}\n")
    assert closed[0] == {"grad_norm_nan_run": 2, "grad_norm_nan_last": 0, **COMMON}
    assert "grad_norm_nan_run" not in closed[1]


def test_a_collapsing_loss_scale_is_its_minimum_and_its_longest_fall():
    scales = (128, 64, 32, 64, 16)
    m, ev = metrics("\n".join(f"epoch 001 | loss 9.1 | nll_loss 8.0 | ppl 256 | wps 21004.5 | loss_scale {s} | wall 512"
                              for s in scales) + "\n")
    assert m == {"loss_scale_min": 16, "loss_scale_drops": 3, **COMMON}  # 128 > 64 > 32: three in a fall
    assert ev["loss_scale_min"][1] == 5


def test_kendall_tau_and_separation_by_hand():
    assert SY.kendall_tau([1, 2, 3]) == 1.0 and SY.kendall_tau([3, 2, 1]) == -1.0
    assert SY.kendall_tau([5]) == 0.0 and SY.kendall_tau([]) == 0.0
    assert SY.kendall_tau([1, 1, 2]) == pytest.approx(2 / 3)
    # past TREND_POINTS an even subset is read: every second point of this series, strictly rising
    xs = [i if i % 2 == 0 else 10_000 - i for i in range(2 * SY.TREND_POINTS)]
    assert SY.kendall_tau(xs) == 1.0
    assert SY.separation([1, 2], [3, 4]) == 1.0 and SY.separation([3], [1]) == 0.0
    assert SY.separation([1, 2], [2, 2]) == 0.75  # ties count half
    assert SY.separation([], [1]) == 0.0 and SY.separation([1], []) == 0.0


def test_a_step_change_in_a_long_run_is_found_with_bounded_work():
    """2,000 iterations, 1.0 s then 2.0 s from iteration 1,001: an even subset of CHANGE_POINTS
    points and at most CHANGE_SPLITS splits still place the step within one subset stride."""
    times = [1000.0] * 1000 + [2000.0] * 1000
    m, ev = metrics("\n".join(it(i, ms, total=2000) for i, ms in enumerate(times, 1)) + "\n")
    assert m["iter_time_step"] == 2.0 and m["iter_time_step_separation"] == 1.0
    stride = 2000 / SY.CHANGE_POINTS
    assert abs(m["iter_time_step_at"] - 1001) <= stride + 1
    assert ev["iter_time_step"][2].startswith(f"from iteration {m['iter_time_step_at']}: median 2000 ms per iteration, "
                                              "2.0x the 1000 ms before it")
    flat = metrics("\n".join(it(i, 1000.0) for i in range(1, 9)) + "\n")[0]
    assert flat["iter_time_step"] == 1.0  # no change: the best split is no step


def _timers(**named) -> str:
    """An MLM timer block with the given (min, max) timers (dashes written as underscores)."""
    return "(min, max) time across ranks (ms):\n" + "".join(
        f"    {k.replace('_', '-')} ...............................: ({v[0]:.2f}, {v[1]:.2f})\n"
        for k, v in named.items())


def test_forward_and_backward_timers_stand_for_forward_backward_where_it_is_missing():
    # the shares from each component's max; the spread from their sums' min and max
    m, ev = metrics(it(1, 1000) + "\n" + _timers(forward_compute=(100, 120), backward_compute=(200, 260),
                                                 optimizer=(50, 60)))
    assert m["optimizer_share"] == pytest.approx(60 / (120 + 260 + 60))
    assert m["timer_spread"] == pytest.approx((120 + 260) / (100 + 200))
    # the largest component leads, whatever its name's place in the alphabet
    assert ev["timer_attribution"][2] == ("backward 260.0 ms = 59% of the timed iteration (optimizer step 60.0 ms, "
                                          "forward 120.0 ms)")
    m = metrics(it(1, 1000) + "\n" + _timers(forward_compute=(100, 120), optimizer=(50, 60)))[0]
    assert m["optimizer_share"] == pytest.approx(60 / 180) and m["timer_spread"] == pytest.approx(1.2)
    m = metrics(it(1, 1000) + "\n" + _timers(backward_compute=(200, 250), optimizer=(50, 60)))[0]
    assert m["optimizer_share"] == pytest.approx(60 / 310) and m["timer_spread"] == pytest.approx(1.25)


def test_forward_backward_leads_the_attribution_when_it_is_the_largest_part():
    ev = metrics(it(1, 1000) + "\n" + _timers(forward_backward=(890, 900), optimizer=(95, 100)))[1]
    assert ev["timer_attribution"][2] == ("forward-backward 900.0 ms = 90% of the timed iteration "
                                          "(optimizer step 100.0 ms)")


def test_timers_at_zero_or_below_a_millisecond_are_read_without_a_division_by_zero():
    m = metrics("[Rank 0] time (ms) | forward: 0.10 | backward: 0.20 | step: 0.10\n")[0]
    assert m["optimizer_share"] == pytest.approx(0.25)
    m = metrics("[Rank 0] time (ms) | forward: 0.00 | backward: 0.00 | step: 0.00\n")[0]
    assert "optimizer_share" not in m and m["cpu_optimizer"] == 0
    m = metrics(it(1, 1000) + "\n" + _timers(forward_backward=(0, 5), optimizer=(1, 2)))[0]
    assert "timer_spread" not in m and m["optimizer_share"] == pytest.approx(2 / 7)
    m = metrics(it(1, 1000) + "\n" + _timers(forward_backward=(5, 5), optimizer=(1, 2)))[0]
    assert "timer_spread" not in m  # no spread between ranks: nothing to say


def test_one_timer_record_is_not_called_a_median():
    ev = metrics(it(1, 1000) + "\n" + _timers(forward_backward=(900, 1000), optimizer=(400, 500)))[1]
    assert ev["timer_attribution"][2] == "forward-backward 1000.0 ms = 67% of the timed iteration (optimizer step 500.0 ms)"
    two = it(1, 1000) + "\n" + _timers(forward_backward=(900, 1000), optimizer=(400, 500)) + it(2, 1000) + "\n" \
        + _timers(forward_backward=(900, 1000), optimizer=(100, 200))
    assert metrics(two)[1]["timer_attribution"][2].endswith("; the median of 2 timer records")


def test_the_edges_of_the_series_metrics():
    # six iterations are a long series (the median of 2-4 against the last three)
    m = metrics("\n".join(it(i, ms) for i, ms in enumerate([5000, 1000, 1100, 1200, 1300, 1400], 1)) + "\n")[0]
    assert (m["iter_ms_first"], m["iter_ms_last"]) == (1100, 1300)
    # a first point at 0 ms has no growth to speak of; half a millisecond has
    m = metrics("\n".join(it(i, ms) for i, ms in enumerate([0, 500, 800], 1)) + "\n")[0]
    assert m["iter_ms_first"] == 0 and "iter_time_growth" not in m
    m = metrics("\n".join(it(i, ms) for i, ms in enumerate([0.5, 1.0, 2.0], 1)) + "\n")[0]
    assert m["iter_time_growth"] == 4.0
    m = metrics("\n".join(it(i, ms) for i, ms in enumerate([5000, 0, 0, 0, 10, 20, 30], 1)) + "\n")[0]
    assert m["iter_ms_first"] == 0 and "iter_time_growth" not in m
    m = metrics("\n".join(it(i, ms) for i, ms in enumerate([5000, 0.5, 0.5, 0.5, 1, 1, 1], 1)) + "\n")[0]
    assert m["iter_time_growth"] == 2.0
    # a flat run: every split costs nothing; the first one is taken, and it is no step
    m = metrics("\n".join(it(i, 1000.0) for i in range(1, 13)) + "\n")[0]
    assert (m["iter_time_step"], m["iter_time_step_at"], m["iter_time_step_separation"]) == (1.0, 6, 0.5)
    # a step between sub-millisecond iterations is still a step; at 0 ms there is none
    m = metrics("\n".join(it(i, ms) for i, ms in enumerate([0.5] * 7 + [1.0] * 5, 1)) + "\n")[0]
    assert (m["iter_time_step"], m["iter_time_step_at"]) == (2.0, 8)
    assert "iter_time_step" not in metrics("\n".join(it(i, 0) for i in range(1, 10)) + "\n")[0]
    # a step right after the warm-up of a long run: the first split is among those tried
    times = [9000, 9000] + [1000] * 3 + [2000] * 97
    m = metrics("\n".join(it(i, ms, total=200) for i, ms in enumerate(times, 1)) + "\n")[0]
    assert (m["iter_time_step"], m["iter_time_step_at"]) == (2.0, 6)
    assert SY.kendall_tau([1, 2]) == 1.0 and SY.kendall_tau([2, 1]) == -1.0


def test_overflow_steps_skipped_share_and_a_scale_printed_once():
    m = metrics("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768\n"
                "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 32768, reducing to 16384\n")[0]
    assert m == {"overflow_steps": 2, "loss_scale_min": 16384, "loss_scale_drops": 2, **COMMON}
    m = metrics("epoch 001 | loss 9.1 | nll_loss 8.0 | ppl 256 | wps 21004.5 | loss_scale 128 | wall 512\n")[0]
    assert m == {"loss_scale_min": 128, "loss_scale_drops": 1, **COMMON}
    m = metrics("[2024-01-01 00:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=3, skipped=1, lr=[1e-05]\n")[0]
    assert m == {"skipped_steps": 1, "skipped_step_share": 0.3333, **COMMON}  # four digits


def test_an_open_nan_run_of_one_value_counts_and_where_output_stops_is_one_and_its_evidence():
    m = metrics("{'loss': 1.2, 'grad_norm': nan, 'epoch': 0.1}\n{'loss': 1.1, 'grad_norm': 0.5, 'epoch': 0.2}\n"
                "{'loss': 1.3, 'grad_norm': nan, 'epoch': 0.3}\n")[0]
    assert m == {"grad_norm_nan_run": 1, "grad_norm_nan_last": 1, **COMMON}
    m, ev = metrics("initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/2\nAll DDP processes registered. Starting ddp with 2 "
                    "processes\n")
    assert m["ends_in_init"] == 1 and ev["ends_in_init"][1] == 2
    m, ev = metrics("INFO 06-30 11:57:50 [block_pool.py:264] Successfully reset prefix cache\n")
    assert m["ends_in_rollout_sync"] == 1 and ev["ends_in_rollout_sync"][1] == 1


def test_the_longest_open_nan_run_of_several_files_is_the_evidence(tmp_path):
    from diagnose.diagnosis import diagnose_paths

    (tmp_path / "a.log").write_text("{'loss': 1.0, 'grad_norm': nan, 'epoch': 0.1}\n")
    (tmp_path / "b.log").write_text("{'loss': 1.0, 'grad_norm': 0.5, 'epoch': 0.1}\n"
                                    "{'loss': 1.0, 'grad_norm': nan, 'epoch': 0.2}\n"
                                    "{'loss': 1.0, 'grad_norm': nan, 'epoch': 0.3}\n")
    rep = diagnose_paths([str(tmp_path / "a.log"), str(tmp_path / "b.log")], jobs=1)
    assert rep.metrics["grad_norm_nan_run"] == 2
    file, line, _ = rep.structure.evidence["grad_norm_nan_run"]
    assert file.endswith("b.log") and line == 2


def test_a_last_line_cut_mid_way_is_read_as_the_line_it_copies():
    """symptoms.last_progress: a last line that is a strict beginning (8 characters or more) of
    one of the three lines above it was cut by the paste; the line before it tells."""
    start = "host:15833:15833 [1] NCCL INFO Setting affinity for GPU 1 to ff00ff"
    for tail, hang in [("host:158", True), ("host:15", False),  # 8 characters: cut; 7: too short to tell
                       (start, True)]:
        m = metrics("iteration?\n" + start + "\n" + tail + "\n")[0]
        assert (m.get("ends_in_init") == 1) is hang, tail
    # two lines: a start-up line and its cut copy
    assert metrics(start + "\nhost:15833:15833 [1] NCCL\n")[0].get("ends_in_init") == 1
    # the line above the cut copy is what counts, not the one above that
    assert metrics("All DDP processes registered. Starting ddp with 2 processes\nsomething else entirely\n"
                   "something else\n")[0].get("ends_in_init") is None
    # a copy four lines up is too far to tell
    far = "\n".join([start, "other line one", "other line two",
                     "All DDP processes registered. Starting ddp with 2 processes", "host:15833:158"]) + "\n"
    assert metrics(far)[0].get("ends_in_init") is None
