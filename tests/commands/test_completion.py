"""Shell completion (issue 13): subcommands after ``diagnose``, signature ids and slugs after
``signatures show|test``, categories after ``--category``; bash's own script, sourced in a real
bash, completes them; the zsh and fish scripts are emitted."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def _complete(words: str, cword: int, shell: str = "bash", cwd=None) -> list[str]:
    env = {**os.environ, "_DIAGNOSE_COMPLETE": f"{shell}_complete", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    out = subprocess.run([sys.executable, "-c", "import sys; from diagnose.cli import main; sys.exit(main())"],
                         env=env, capture_output=True, text=True, timeout=60, cwd=cwd)
    return out.stdout.splitlines()


def test_subcommands_and_paths_after_diagnose(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "run.log").write_text("x\n")
    got = _complete("diagnose ch", 1, cwd=tmp_path)
    assert "plain,check" in got and "plain,checkpoints/" in got
    assert _complete("diagnose ru", 1, cwd=tmp_path) == ["file,ru"]  # no command: the shell's files
    assert _complete("diagnose scan ch", 2, cwd=tmp_path) == ["file,ch"]  # scan's paths only


def test_signature_ids_slugs_and_categories():
    assert "plain,MB-OFF-101" in _complete("diagnose signatures show MB-OFF-10", 3)
    assert "plain,cpu-offload-with-pipeline-parallel" in _complete("diagnose signatures test cpu-offload-with-p", 3)
    assert _complete("diagnose signatures list --category cuda_o", 4) == ["plain,cuda_oom"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_bash_script_completes_in_a_real_bash(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    script = ('eval "$(_DIAGNOSE_COMPLETE=bash_source diagnose)"; COMP_WORDS=(diagnose signatures show MB-WRAP-01); '
              'COMP_CWORD=3; _diagnose_completion diagnose; echo "${COMPREPLY[@]}"; COMPREPLY=(); '
              'COMP_WORDS=(diagnose ch); COMP_CWORD=1; _diagnose_completion diagnose; echo "${COMPREPLY[@]}"')
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    ids, first = out.stdout.splitlines()
    assert "MB-WRAP-013" in ids.split() and first.split() == ["check", "checkpoints/"], out


@pytest.mark.parametrize("shell,marker", [("zsh", "compdef _diagnose_completion diagnose"),
                                          ("fish", "complete --no-files --command diagnose")])
def test_zsh_and_fish_scripts_are_emitted(shell, marker):
    env = {**os.environ, "_DIAGNOSE_COMPLETE": f"{shell}_source"}
    out = subprocess.run([str(BIN / "diagnose")], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and marker in out.stdout, out.stdout[:300]
