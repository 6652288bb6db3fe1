"""The relaunch loop through a REAL single-node Slurm on localhost (slurmctld + slurmd in a tmp dir).

The cluster is configured as ../shared/spec/cpu-probe/scripts/slurm_up.sh shows, with
``auth/none`` (no munge needed) and ports of its own; it comes up in about a second. The tests
are skipped, with the reason, only where the Slurm binaries are missing, we are not root (slurmd
must be), or the node never becomes idle. ``.ci/run`` installs slurmctld, slurmd and slurm-client.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from diagnose import exitcodes

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SBATCH_JOB = REPO / "fixtures" / "jobs" / "train_tiny_gpt.sbatch"
CFG = REPO / "fixtures" / "jobs" / "tiny_gpt_pp_offload.yaml"
OOM = ("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity "
       "of 79.11 GiB of which 1.23 GiB is free. Of the allocated memory 70.30 GiB is allocated by PyTorch, and "
       "6.12 GiB is reserved by PyTorch but unallocated.")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _why_no_slurm() -> str | None:
    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
               if shutil.which(b) is None]
    if missing:
        return f"Slurm binaries missing: {', '.join(missing)} (apt-get install slurmctld slurmd slurm-client)"
    if os.geteuid() != 0:
        return "slurmd needs root to start jobs; not root here"
    return None


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = _why_no_slurm()
    if why:
        print(f"SKIP Slurm tests: {why}")
        pytest.skip(why)
    base = tmp_path_factory.mktemp("slurm")
    for d in ("log", "spool/ctld", "spool/d"):
        (base / d).mkdir(parents=True)
    conf = base / "slurm.conf"
    conf.write_text(f"""ClusterName=diagnose
SlurmctldHost=localhost
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={base}/spool/ctld
SlurmdSpoolDir={base}/spool/d
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/linear
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
MinJobAge=600
KillWait=2
NodeName=localhost CPUs={os.cpu_count() or 2} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    pids = []
    try:
        t0 = time.monotonic()
        for argv in (["slurmctld"], ["slurmd", "-N", "localhost"]):
            r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                pytest.skip(f"{argv[0]} did not start: {(r.stderr or r.stdout).strip()[-300:]}")
        for pidfile in ("slurmctld.pid", "slurmd.pid"):
            for _ in range(100):
                if (base / pidfile).exists() and (base / pidfile).read_text().strip():
                    pids.append(int((base / pidfile).read_text()))
                    break
                time.sleep(0.05)
        state = ""
        while time.monotonic() - t0 < 30:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout.strip()
            if state == "idle":
                break
            time.sleep(0.25)
        if state != "idle":
            log = (base / "log" / "slurmctld.log").read_text()[-500:] if (base / "log" / "slurmctld.log").exists() else ""
            pytest.skip(f"the Slurm node did not become idle (state {state!r}): {log}")
        print(f"Slurm up in {time.monotonic() - t0:.1f} s ({conf})")
        yield env
    finally:
        for pid in reversed(pids):  # only the daemons this fixture started, by pid
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for pid in pids:
            for _ in range(40):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                try:
                    if open(f"/proc/{pid}/stat", "rb").read().split(b") ")[1][:1] == b"Z":
                        break
                except OSError:
                    break
                time.sleep(0.05)


def diagnose(*args, cwd, env, timeout=600):
    return subprocess.run([sys.executable, "-c", "import sys; from diagnose.cli import main; sys.exit(main(sys.argv[1:]))",
                           *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**env, "PYTHONPATH": str(REPO)})


def job_env(env: dict) -> dict:
    return {**env, "PYTHON": sys.executable, "TINY_GPT": str(REPO / "fixtures" / "jobs" / "train_tiny_gpt.py")}


def test_slurm_run1_fails_then_fix_relaunch_trains(slurm, tmp_path):
    pytest.importorskip("megatron.core")
    env = job_env(slurm)
    shutil.copy(CFG, tmp_path / "cfg.yaml")
    # run 1 through Slurm: dies of MCore's real ValueError
    r1 = subprocess.run(["sbatch", "--wait", "--parsable", f"--output={tmp_path}/run1.log", str(SBATCH_JOB),
                         "--config", "cfg.yaml"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r1.returncode != 0
    assert "there is no support for Pipeline parallelism with CPU offloading" in (tmp_path / "run1.log").read_text()
    r = diagnose("run1.log", "--fix", "cfg.yaml", "--relaunch", "--launcher", "slurm",
                 "--launch-cmd", shlex.join([str(SBATCH_JOB), "--config", "cfg.yaml"]), "--history", "h.jsonl",
                 cwd=tmp_path, env=env)
    assert r.returncode == exitcodes.FIXED_HEALTHY, r.stderr
    assert "Slurm job" in r.stderr
    doc = yaml.safe_load((tmp_path / "cfg.yaml").read_text())
    assert doc["model"]["cpu_offloading"] is False and doc["optimizer"]["optimizer_cpu_offload"] is False
    rec = [json.loads(ln) for ln in (tmp_path / "h.jsonl").read_text().splitlines()][-1]
    assert rec["launcher"] == "slurm" and rec["job_id"].isdigit() and rec["outcome"] == "healthy"
    assert rec["command"][0] == "sbatch" and str(SBATCH_JOB) in rec["command"]
    log2 = Path(rec["log"]).read_text()  # the job's output file
    assert f"job {rec['job_id']} on" in log2 and log2.count("iteration ") >= 8


# a job that prints a CUDA OOM after a second, notes when, and then hangs (the early abort's subject)
HANG_AFTER_OOM = f"""import time
print("training...", flush=True)
time.sleep(1.0)
print({OOM!r}, flush=True)
open("written.at", "w").write(repr(time.time()))
time.sleep(300)
"""


def test_slurm_early_abort_scancels_within_2_s(slurm, tmp_path):
    shutil.copy(CFG, tmp_path / "cfg.yaml")
    script = tmp_path / "hang.py"
    script.write_text(HANG_AFTER_OOM)
    r = diagnose("--fix", "cfg.yaml", "--relaunch", "--launcher", "slurm", "--world-size", "2",
                 "--launch-cmd", shlex.join([sys.executable, str(script)]), "--history", "h.jsonl",
                 "--max-attempts", "1", cwd=tmp_path, env=slurm, timeout=180)
    assert r.returncode == exitcodes.RELAUNCH_FAILED, r.stderr
    rec = [json.loads(ln) for ln in (tmp_path / "h.jsonl").read_text().splitlines()][-1]
    assert rec["outcome"] == "stopped_early" and "--wrap" in rec["command"]
    gap = rec["ended_at"] - float((tmp_path / "written.at").read_text())
    print(f"Slurm early abort: job {rec['job_id']} ended {gap:.2f} s after the fatal line was written")
    assert gap < 2.0
    state = subprocess.run(["scontrol", "show", "job", "-o", rec["job_id"]], env=slurm, capture_output=True,
                           text=True).stdout
    assert "JobState=CANCELLED" in state


def test_scontrol_values_with_spaces_are_read_whole():
    """Issue 16, item 6: a log path with a space was cut at the space (the wrong file followed)."""
    from diagnose.launch.slurm import parse_scontrol

    line = ("JobId=12 JobName=wrap UserId=root(0) GroupId=root(0) JobState=RUNNING Reason=None "
            "Dependency=(null) ExitCode=0:0 Command=/runs/my job/train.sh --lr=0.1 WorkDir=/runs/my job "
            "StdErr=/runs/my job/diagnose runs/attempt-1 x.log StdIn=/dev/null "
            "StdOut=/runs/my job/diagnose runs/attempt-1 x.log Power= TRES=cpu=1,mem=1G,node=1")
    d = parse_scontrol(line + "\n")
    assert d["StdOut"] == "/runs/my job/diagnose runs/attempt-1 x.log" and d["JobState"] == "RUNNING"
    assert d["Command"] == "/runs/my job/train.sh --lr=0.1" and d["TRES"] == "cpu=1,mem=1G,node=1"
    assert d["Power"] == "" and d["ExitCode"] == "0:0"


def test_slurm_early_abort_in_a_folder_with_spaces(slurm, tmp_path):
    """The job's output file sits under a path with spaces: the right file is followed (the
    fatal line is seen and the job scancelled within 2 s)."""
    work = tmp_path / "my runs" / "job one"
    work.mkdir(parents=True)
    shutil.copy(CFG, work / "cfg.yaml")
    script = work / "hang job.py"
    script.write_text(HANG_AFTER_OOM)
    r = diagnose("--fix", "cfg.yaml", "--relaunch", "--launcher", "slurm", "--world-size", "2",
                 "--launch-cmd", shlex.join([sys.executable, str(script)]), "--history", "h.jsonl",
                 "--max-attempts", "1", cwd=work, env=slurm, timeout=180)
    assert r.returncode == exitcodes.RELAUNCH_FAILED, r.stderr
    rec = [json.loads(ln) for ln in (work / "h.jsonl").read_text().splitlines()][-1]
    assert rec["outcome"] == "stopped_early" and " " in rec["log"] and Path(rec["log"]).is_file()
    assert rec["ended_at"] - float((work / "written.at").read_text()) < 2.0


def test_slurm_array_of_four_shards_merges_to_the_serial_report(slurm, tmp_path):
    """The README's recipe: one array task per shard over a 64-file folder, then merge."""
    logs = tmp_path / "logs"
    logs.mkdir()
    corpus = sorted((REPO / "fixtures" / "corpus").glob("*/*.log"))
    for r in range(64):
        (logs / f"rank{r}.log").write_bytes(corpus[(r * 7) % len(corpus)].read_bytes())
    (tmp_path / "parts").mkdir()
    py = shlex.quote(sys.executable)
    wrap = (f"{py} -c 'import sys; from diagnose.cli import main; sys.exit(main(sys.argv[1:]))' logs "
            "--shard $SLURM_ARRAY_TASK_ID/4 -o parts/part$SLURM_ARRAY_TASK_ID.dpart")
    env = {**slurm, "PYTHONPATH": str(REPO)}
    r = subprocess.run(["sbatch", "--wait", "--array=1-4", f"--output={tmp_path}/shard-%a.out", "--wrap", wrap],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr, [p.read_text() for p in tmp_path.glob("shard-*.out")])
    parts = sorted(str(p) for p in (tmp_path / "parts").glob("*.dpart"))
    assert len(parts) == 4
    merged = diagnose("merge", *parts, "--format", "json", cwd=tmp_path, env=env)
    serial = diagnose("logs", "--format", "json", "-j", "1", cwd=tmp_path, env=env)
    assert merged.returncode == serial.returncode == 1, merged.stderr
    a, b = json.loads(merged.stdout), json.loads(serial.stdout)
    a.pop("stats", None)
    b.pop("stats", None)
    assert a == b and a["root_cause"] is not None
