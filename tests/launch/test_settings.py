"""Project settings for --relaunch ([tool.diagnose] / diagnose.toml) and the launch-command helpers."""
from __future__ import annotations

import pytest

from diagnose import settings as ST
from diagnose.launch.base import LaunchError, make_launcher
from diagnose.launch.local import split_command
from diagnose.remedy.causes import world_from_command


def test_pyproject_table(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.diagnose]\nlauncher = "slurm"\n'
                                            'launch-cmd = "jobs/train.sbatch --recipe r"\nmax-attempts = 2\n')
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    st = ST.find(sub)  # found from a folder below, like ruff/pytest
    assert st.get("launcher") == "slurm" and st.get("max-attempts") == 2 and st.source == tmp_path / "pyproject.toml"


def test_diagnose_toml_wins_and_pyproject_without_table_is_skipped(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.diagnose]\nlauncher = "slurm"\n')
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "pyproject.toml").write_text('[project]\nname = "y"\n')
    assert ST.find(inner).get("launcher") == "slurm"
    (inner / "diagnose.toml").write_text('launcher = "local"\nlaunch-cmd = "torchrun x.py"\n')
    st = ST.find(inner)
    assert st.get("launcher") == "local" and st.source.name == "diagnose.toml"


def test_an_unknown_key_is_a_warning_and_bad_toml_a_one_line_error(tmp_path):
    """Issue 13: an unknown key (a typo, or a newer version's key) stopped --fix; it is said and
    ignored, with a did-you-mean; a known key with a wrong value still stops before anything runs."""
    (tmp_path / "diagnose.toml").write_text('launchr = "local"\nlauncher = "slurm"\n')
    st = ST.find(tmp_path)
    assert st.get("launcher") == "slurm" and st.get("launchr") is None
    assert len(st.warnings) == 1 and "unknown key 'launchr'" in st.warnings[0] and "did you mean 'launcher'" in st.warnings[0]
    (tmp_path / "diagnose.toml").write_text('launcher = \n')
    with pytest.raises(ST.SettingsError, match="invalid TOML"):
        ST.find(tmp_path)


def test_a_tool_key_that_is_not_a_table(tmp_path):
    """Found by tests/remedy/test_fuzz_surfaces.py: `tool = "local"` crashed (str has no .get)."""
    (tmp_path / "diagnose.toml").write_text('tool = "local"\nlauncher = "local"\n')
    assert ST.find(tmp_path).get("launcher") == "local"
    (tmp_path / "diagnose.toml").write_text('[tool]\ndiagnose = 3\n')
    with pytest.raises(ST.SettingsError, match=r"tool\.diagnose must be a table"):
        ST.find(tmp_path)


def test_nothing_found(tmp_path):
    st = ST.find(tmp_path)
    assert st.get("launcher") is None and "[tool.diagnose]" in ST.HOWTO and "launch-cmd" in ST.HOWTO


def test_world_from_command():
    assert world_from_command("python -m torch.distributed.run --nproc_per_node=8 --nnodes=2 run.py") == 16
    assert world_from_command("torchrun --nproc-per-node 4 --nnodes 1:3 run.py") == 12
    assert world_from_command("python train.py") is None
    assert world_from_command(None) is None


def test_split_command_never_uses_a_shell():
    argv = split_command("python run.py --recipe 'a b' 'x=$(rm -rf /)'")
    assert argv == ["python", "run.py", "--recipe", "a b", "x=$(rm -rf /)"]
    with pytest.raises(LaunchError):
        split_command("python 'unclosed")
    with pytest.raises(LaunchError, match="unknown launcher"):
        make_launcher("k8s", "x")


@pytest.mark.parametrize("line,what", [('max-attempts = "three"', "max-attempts"), ("world-size = -4", "world-size"),
                                       ("launcher = 5", "launcher"), ('sbatch-args = "--partition=gpu"', "sbatch-args"),
                                       ("gpu-memory = true", "gpu-memory"), ("history = 3", "history")])
def test_settings_with_wrong_types_are_one_line_errors(tmp_path, line, what):
    """Issue 16, item 7: every value is checked when the file is read, before anything runs."""
    (tmp_path / "diagnose.toml").write_text(line + "\n")
    with pytest.raises(ST.SettingsError, match=f"{what} = .*: must be"):
        ST.find(tmp_path)


@pytest.mark.parametrize("cmd,reads", [
    ("torchrun --nproc_per_node=8 scripts/training/run_recipe.py --recipe qwen3_30b_a3b_pretrain_config", False),
    ("torchrun scripts/training/run_recipe.py --recipe x --config-file run_config.yaml", True),
    ("torchrun scripts/training/run_recipe.py --recipe x --config_file=run_config.yaml", True),
    ("python train.py --config run_config.yaml", True),
    ("python train.py", True),  # not a script known to read no file: the user's to know
])
def test_which_launch_commands_read_the_config_file(cmd, reads):
    from pathlib import Path

    from diagnose.launch.base import reads_config_file

    assert reads_config_file(split_command(cmd), Path("run_config.yaml")) is reads
