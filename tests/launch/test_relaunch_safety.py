"""Relaunch safety: config values never reach a shell.

A fix's values end up as Hydra overrides appended to the user's launch command. Whatever a value
holds (``$(touch ...)``, ``; rm -rf``, backticks, quotes, newlines), the local launcher passes it
as one argv element without a shell, the Slurm launcher quotes it for the shell Slurm runs, and
Hydra (what Bridge's run_recipe.py uses) reads back exactly the original value.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diagnose.config.overrides import parse
from diagnose.edits import format_value, override
from diagnose.launch.local import LocalLauncher, split_command


def hostile_values(tmp: Path) -> list:
    pwned = tmp / "pwned"
    victim = tmp / "victim"
    return [
        f"$(touch {pwned})",
        f"`touch {pwned}`",
        f"; touch {pwned}",
        f"x; rm -rf {victim}",
        f"&& touch {pwned} &&",
        f"| tee {pwned}",
        f"> {pwned}",
        f"'; touch {pwned}; echo '",
        f'"; touch {pwned}; echo "',
        f"\\'; touch {pwned} #",
        f"line1\ntouch {pwned}",
        "${oc.env:HOME}",
        "null",
        "true",
        "a\\",
        "ünïcödé",
        "",
        "*",
    ]


ARGV_ECHO = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]


def test_override_round_trips_through_hydra(tmp_path):
    for v in hostile_values(tmp_path):
        text = override("model.name", v)
        ((_, ov),) = parse([text])
        assert ov.value() == v and isinstance(ov.value(), str), (v, text)


def test_local_launcher_passes_values_as_argv_without_a_shell(tmp_path):
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "keep").write_text("keep")
    values = hostile_values(tmp_path)
    extra = [override(f"model.k{i}", v) for i, v in enumerate(values)]
    launcher = LocalLauncher(shlex.join(ARGV_ECHO))
    log = tmp_path / "job.log"
    job = launcher.start(extra, log)
    deadline = time.monotonic() + 60
    while launcher.poll(job) is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert launcher.poll(job) == 0
    argv = json.loads(log.read_text().strip().splitlines()[-1])
    assert argv == extra  # one argv element per override, byte for byte
    for i, (arg, v) in enumerate(zip(argv, values)):
        ((_, ov),) = parse([arg])
        assert ov.key_or_group == f"model.k{i}" and ov.value() == v
    assert not (tmp_path / "pwned").exists()
    assert (tmp_path / "victim" / "keep").read_text() == "keep"
    assert isinstance(job.command, list) and job.command[: len(ARGV_ECHO)] == ARGV_ECHO


def test_launch_command_is_split_once_never_evaluated(tmp_path):
    argv = split_command(f"python train.py --name '$(touch {tmp_path}/pwned)' --x \"a b\"")
    assert argv == ["python", "train.py", "--name", f"$(touch {tmp_path}/pwned)", "--x", "a b"]
    assert split_command(["a b", 3]) == ["a b", "3"]


def test_slurm_wrap_quotes_every_argument(tmp_path, monkeypatch):
    """The --wrap string is what Slurm's shell runs: run it through sh here and compare argv."""
    from diagnose.launch import slurm

    captured = {}

    def fake_run(argv, *a, **k):
        if argv[0] == "sbatch":
            captured["argv"] = argv
            return subprocess.CompletedProcess(argv, 0, "4242\n", "")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(slurm, "_run", fake_run)
    launcher = slurm.SlurmLauncher(shlex.join(ARGV_ECHO))
    values = hostile_values(tmp_path)
    extra = [override(f"model.k{i}", v) for i, v in enumerate(values)]
    try:
        launcher.start(extra, tmp_path / "slurm.log")
    except slurm.LaunchError:
        pass  # a later query of the fake scheduler may fail; the submission is what we test
    argv = captured["argv"]
    wrap = argv[argv.index("--wrap") + 1]
    r = subprocess.run(["sh", "-c", wrap], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == extra
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("v", [1, 0.25, True, None, [1, 2], ["a b", "$(x)"]])
def test_non_string_values_keep_their_type(v):
    ((_, ov),) = parse([f"k={format_value(v)}"])
    assert ov.value() == v
