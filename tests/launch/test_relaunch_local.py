"""End to end through the local launcher: real torchrun, real MCore, no mocked launcher.

Run 1 of the tiny GPT job dies in MCore's TransformerConfig with the PP + CPU-offload ValueError;
``diagnose run1.log --fix cfg.yaml --relaunch --launcher local --launch-cmd ...`` rewrites the
YAML, relaunches, follows run 2 while it trains, and reports healthy (exit 4).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from diagnose import exitcodes

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "fixtures" / "jobs" / "train_tiny_gpt.py"
CFG = REPO / "fixtures" / "jobs" / "tiny_gpt_pp_offload.yaml"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
OOM = ("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity "
       "of 79.11 GiB of which 1.23 GiB is free. Of the allocated memory 70.30 GiB is allocated by PyTorch, and "
       "6.12 GiB is reserved by PyTorch but unallocated.")

try:  # only the tests that train the tiny GPT need megatron-core; the fake jobs run without it
    import megatron.core  # noqa: F401
    HAVE_MCORE = True
except ImportError:
    HAVE_MCORE = False
needs_mcore = pytest.mark.skipif(not HAVE_MCORE, reason="trains the tiny GPT: needs megatron-core (pip install -e '.[mcore]')")


def diagnose(*args, cwd, timeout=600, **kw):
    return subprocess.run([sys.executable, "-c", "import sys; from diagnose.cli import main; sys.exit(main(sys.argv[1:]))",
                           *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, **kw)


def train_cmd(cfg: str = "cfg.yaml") -> str:
    return shlex.join(TORCHRUN + [str(JOB), "--config", cfg])


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed grandchild stays a zombie until init reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] not in (b"Z", b"X")


def history(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


@needs_mcore
def test_run1_fails_then_fix_relaunch_trains(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    shutil.copy(CFG, cfg)
    with open(tmp_path / "run1.log", "wb") as fh:
        r1 = subprocess.run(shlex.split(train_cmd()), cwd=tmp_path, stdout=fh, stderr=subprocess.STDOUT, timeout=300)
    log1 = (tmp_path / "run1.log").read_text()
    assert r1.returncode != 0
    assert "ValueError: Currently there is no support for Pipeline parallelism with CPU offloading" in log1

    r = diagnose("run1.log", "--fix", "cfg.yaml", "--relaunch", "--launcher", "local", "--launch-cmd", train_cmd(),
                 "--history", "h.jsonl", cwd=tmp_path)
    assert r.returncode == exitcodes.FIXED_HEALTHY, r.stderr
    assert "root cause MB-OFF-002" in r.stderr and "the relaunched run is healthy" in r.stderr
    doc = yaml.safe_load(cfg.read_text())
    assert doc["model"]["cpu_offloading"] is False and doc["model"]["pipeline_model_parallel_size"] == 2
    # the tiny model fits without any offload: activation offload off is the whole (minimal) fix
    assert doc["optimizer"]["optimizer_cpu_offload"] is False and doc["optimizer"]["optimizer_offload_fraction"] == 0.0
    assert (tmp_path / "cfg.yaml.bak").read_text() == CFG.read_text()
    recs = history(tmp_path / "h.jsonl")
    assert len(recs) == 1
    rec = recs[0]
    assert rec["outcome"] == "healthy" and rec["exit_code"] == 0 and rec["root_cause"] is None
    assert rec["planned_for"] == ["MB-OFF-002"] and "+  cpu_offloading: false" in rec["diff"]
    assert "optimizer_cpu_offload" not in rec["diff"]
    assert rec["command"][-2:] == ["--config", "cfg.yaml"] and rec["job_id"] and rec["time"]
    log2 = (tmp_path / rec["log"]).read_text()
    assert log2.count("iteration ") >= 8 and "lm loss:" in log2  # run 2 trained, with PP=2 pipeline stages


@needs_mcore
def test_design_card_form_no_log_settings_and_overrides(tmp_path):
    """``diagnose --fix cfg.yaml --relaunch``: plan from the preflight, launcher from pyproject.toml;
    with --overrides the fix travels as Hydra overrides on the command line, the file stays."""
    cfg = tmp_path / "cfg.yaml"
    shutil.copy(CFG, cfg)
    (tmp_path / "pyproject.toml").write_text(
        "[tool.diagnose]\nlauncher = \"local\"\n" f"launch-cmd = {json.dumps(train_cmd())}\n"
        "history = \"runs/history.jsonl\"\nmax-attempts = 2\n")
    r = diagnose("--fix", "cfg.yaml", "--relaunch", "--overrides", cwd=tmp_path)
    assert r.returncode == exitcodes.FIXED_HEALTHY, r.stderr
    assert cfg.read_text() == CFG.read_text()  # untouched: the fix went on the command line
    rec = history(tmp_path / "runs" / "history.jsonl")[-1]
    assert rec["outcome"] == "healthy" and rec["planned_for"][0] == "MB-OFF-002"
    assert "model.cpu_offloading=false" in rec["command"] and "optimizer.optimizer_cpu_offload=true" not in rec["command"]
    log2 = (tmp_path / rec["log"]).read_text()
    assert "cpu_offloading: false" in log2 and log2.count("iteration ") >= 8


def test_no_launcher_configured_says_what_to_add(tmp_path):
    shutil.copy(CFG, tmp_path / "cfg.yaml")
    r = diagnose("--fix", "cfg.yaml", "--relaunch", cwd=tmp_path)
    assert r.returncode == exitcodes.USAGE
    assert "[tool.diagnose]" in r.stderr and "launch-cmd" in r.stderr and "Traceback" not in r.stderr


def _fake_job(tmp_path: Path, body: str) -> str:
    script = tmp_path / "job.py"
    script.write_text(body)
    return shlex.join([sys.executable, str(script)])


def test_same_root_cause_after_its_fix_stops_exit_5(tmp_path):
    shutil.copy(CFG, tmp_path / "cfg.yaml")
    cmd = _fake_job(tmp_path, "import sys\nprint('[rank0]: ValueError: Currently there is no support for Pipeline "
                              "parallelism with CPU offloading', flush=True)\nsys.exit(1)\n")
    r = diagnose(str(REPO / "fixtures" / "logs" / "tiny_gpt_pp_offload_run1.log"), "--fix", "cfg.yaml", "--relaunch",
                 "--launcher", "local", "--launch-cmd", cmd, "--history", "h.jsonl", cwd=tmp_path)
    assert r.returncode == exitcodes.RELAUNCH_FAILED, r.stderr
    assert "same root cause MB-OFF-002 came back after its fix" in r.stderr
    recs = history(tmp_path / "h.jsonl")
    assert len(recs) == 1 and recs[0]["root_cause"]["signature"] == "MB-OFF-002"


def test_early_abort_ends_the_job_within_2_s_of_the_fatal_line(tmp_path):
    """The job prints a fatal line and hangs (as ranks do until the NCCL watchdog fires): the
    loop ends its whole process group, grandchildren included, within 2 s of the line."""
    shutil.copy(CFG, tmp_path / "cfg.yaml")
    cmd = _fake_job(tmp_path, f"""import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open("child.pid", "w").write(str(child.pid))
for i in range(3):
    print(f" [2026-08-22 15:22:0{{i}}] iteration {{i + 1:8d}}/     100 | consumed samples: {{i * 4:12d}} | elapsed time per iteration (ms): 996.3 | learning rate: 3.000000E-05 | global batch size:     4 | lm loss: 5.5E+00 |", flush=True)
    time.sleep(0.3)
print({OOM!r}, flush=True)
with open("written.at", "w") as fh:
    fh.write(repr(time.time()))
time.sleep(300)
""")
    r = diagnose("--fix", "cfg.yaml", "--relaunch", "--launcher", "local", "--launch-cmd", cmd, "--history",
                 "h.jsonl", "--max-attempts", "1", "--world-size", "2", cwd=tmp_path, timeout=120)
    assert r.returncode == exitcodes.RELAUNCH_FAILED, r.stderr
    rec = history(tmp_path / "h.jsonl")[0]
    assert rec["outcome"] == "stopped_early" and rec["root_cause"]["signature"].startswith(("MB-OOM", "MB-OFF"))
    gap = rec["ended_at"] - float((tmp_path / "written.at").read_text())
    print(f"early abort: job ended {gap:.2f} s after the fatal line was written "
          f"({rec['detect_to_end_s']:.2f} s after diagnose read it)")
    assert gap < 2.0
    assert not running(int((tmp_path / "child.pid").read_text()))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_ctrl_c_ends_the_job_and_leaves_the_history_whole(tmp_path, sig):
    """Ctrl-C, and SIGTERM / SIGHUP too (issue 16, item 5): the job is stopped, the history
    records the attempt as interrupted, the exit code is 128 + the signal."""
    shutil.copy(CFG, tmp_path / "cfg.yaml")
    cmd = _fake_job(tmp_path, "import os, time\nopen('job.pid', 'w').write(str(os.getpid()))\n"
                              "print('training...', flush=True)\ntime.sleep(300)\n")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from diagnose.cli import main; sys.exit(main(sys.argv[1:]))",
                             "--fix", "cfg.yaml", "--relaunch", "--launcher", "local", "--launch-cmd", cmd,
                             "--history", "h.jsonl"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "job.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        job = int((tmp_path / "job.pid").read_text())
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err
    assert not running(job)
    lines = (tmp_path / "h.jsonl").read_text().splitlines()
    recs = [json.loads(ln) for ln in lines]  # every line is whole JSON
    assert recs[-1]["outcome"] == "interrupted" and recs[-1]["job_id"] and recs[-1]["signal"] == sig


@needs_mcore
def test_new_root_cause_is_planned_then_same_cause_returns_exit_5(tmp_path):
    """No log: the preflight fixes the config errors MCore would raise (layers out of range,
    recompute with offload); the relaunched run dies of the next real MCore error (CPU offloading
    without Transformer Engine), which is planned and applied in attempt 2; it comes back (TE is not
    installed here), so the loop stops with exit 5. Every attempt is in the history."""
    doc = yaml.safe_load(CFG.read_text())
    doc["model"].update(pipeline_model_parallel_size=1, cpu_offloading_num_layers=2, recompute_granularity="full",
                        recompute_method="uniform", recompute_num_layers=1)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(doc, sort_keys=True))
    r = diagnose("--fix", "cfg.yaml", "--relaunch", "--launcher", "local", "--launch-cmd", train_cmd(),
                 "--history", "h.jsonl", cwd=tmp_path)
    assert r.returncode == exitcodes.RELAUNCH_FAILED, r.stderr
    recs = history(tmp_path / "h.jsonl")
    assert [r["attempt"] for r in recs] == [1, 2]
    assert {"MB-OFF-001", "MB-OFF-003"} <= set(recs[0]["planned_for"])
    assert recs[0]["root_cause"]["signature"] == "MB-OFF-010"  # AssertionError: ... TE is not present
    assert recs[1]["planned_for"] == ["MB-OFF-010"] and "+  transformer_impl: transformer_engine" in recs[1]["diff"]
    assert recs[1]["root_cause"]["signature"] == "MB-OFF-010"
    assert "same root cause MB-OFF-010 came back after its fix" in r.stderr
    final = yaml.safe_load((tmp_path / "cfg.yaml").read_text())["model"]
    assert final["cpu_offloading_num_layers"] == 1 and final["recompute_granularity"] is None


@pytest.mark.parametrize("bad", ["history-folder", "log-dir-uncreatable"])
def test_unwritable_history_or_log_dir_is_refused_before_the_config_is_touched(tmp_path, bad):
    """Issue 16, item 7: --history naming a folder, a log-dir that cannot be created: exit 2
    before any write or launch (it used to crash after the config was rewritten or the job ran)."""
    shutil.copy(CFG, tmp_path / "cfg.yaml")
    (tmp_path / "blocker").write_text("a file where a folder should be\n")
    extra = ["--history", "hist"] if bad == "history-folder" else []
    if bad == "history-folder":
        (tmp_path / "hist").mkdir()
    else:
        (tmp_path / "diagnose.toml").write_text('log-dir = "blocker/runs"\n')
    cmd = _fake_job(tmp_path, "open('started', 'w').write('1')\n")
    r = diagnose("--fix", "cfg.yaml", "--relaunch", "--launcher", "local", "--launch-cmd", cmd, *extra,
                 "--world-size", "2", cwd=tmp_path, timeout=60)
    assert r.returncode == exitcodes.USAGE and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "cfg.yaml").read_text() == CFG.read_text() and not list(tmp_path.glob("cfg.yaml.bak*"))
    assert not (tmp_path / "started").exists()


def _fake_run_recipe(tmp_path) -> str:
    """A stand-in for Bridge's scripts/training/run_recipe.py: prints its arguments, then three
    healthy iterations. Returns the command that runs it with a recipe."""
    script = tmp_path / "run_recipe.py"
    script.write_text("import sys\nprint('argv:', ' '.join(sys.argv[1:]), flush=True)\n"
                      "for i in range(1, 4):\n"
                      "    print(f' iteration {i:>8}/       3 | elapsed time per iteration (ms): 20.0 | lm loss: 9.0 |',"
                      " flush=True)\n")
    return shlex.join([sys.executable, str(script), "--recipe", "tiny"])


def test_a_launch_command_that_reads_no_config_file_gets_the_fix_as_overrides(tmp_path):
    """Issue 12, item 6: Bridge's scripts/training/run_recipe.py builds its config from the
    recipe and trailing KEY=VALUE overrides; it reads no YAML. A rewritten file would never
    reach the job, so the fix is appended to the command and the file is left as it is."""
    shutil.copy(CFG, tmp_path / "cfg.yaml")
    cmd = _fake_run_recipe(tmp_path)
    r = diagnose(str(REPO / "fixtures" / "logs" / "tiny_gpt_pp_offload_run1.log"), "--fix", "cfg.yaml", "--relaunch",
                 "--launcher", "local", "--launch-cmd", cmd, "--history", "h.jsonl", cwd=tmp_path)
    assert r.returncode == exitcodes.FIXED_HEALTHY, r.stderr
    assert "reads no config file" in r.stderr
    assert (tmp_path / "cfg.yaml").read_text() == CFG.read_text()
    rec = history(tmp_path / "h.jsonl")[-1]
    assert "model.cpu_offloading=false" in rec["command"]
    assert "argv: --recipe tiny model.cpu_offloading=false" in (tmp_path / rec["log"]).read_text()


def test_a_relaunch_override_of_a_key_the_config_never_had_keeps_its_plus(tmp_path):
    """Issue 12, item 6: the relaunch loop rebuilt its overrides from (key, value) and lost the
    '+' a key absent from Bridge's ConfigContainer needs (OmegaConf refuses to set it without):
    NCCL's failed connection gets env_vars.NCCL_DEBUG=INFO, which must reach the job as
    '+env_vars.NCCL_DEBUG=INFO'."""
    shutil.copy(CFG, tmp_path / "cfg.yaml")
    log = tmp_path / "failed.log"
    log.write_text("node001:48213:48213 [0] NCCL WARN Connect to 10.1.2.3<45678> failed : Connection refused\n")
    cmd = _fake_run_recipe(tmp_path)
    r = diagnose(str(log), "--fix", "cfg.yaml", "--relaunch", "--launcher", "local", "--launch-cmd", cmd,
                 "--history", "h.jsonl", cwd=tmp_path)
    assert r.returncode == exitcodes.FIXED_HEALTHY, r.stderr
    rec = history(tmp_path / "h.jsonl")[-1]
    assert "argv: --recipe tiny +env_vars.NCCL_DEBUG=INFO" in (tmp_path / rec["log"]).read_text()
