"""The config writer: ruamel round trip, backups, atomic replace, lock, refusal on a changed file."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from diagnose.remedy import edit as E

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "fixtures" / "jobs" / "tiny_gpt_pp_offload.yaml"
QWEN = REPO / "fixtures" / "logs" / "seed" / "qwen3_30b_a3b_activation_offload_pp1_oom.yaml"
RUN1 = REPO / "fixtures" / "logs" / "tiny_gpt_pp_offload_run1.log"

HAND = """\
# top comment
_target_: megatron.bridge.training.config.ConfigContainer
model:
  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider
  cpu_offloading: true   # keep me
  name: 'single-quoted'
  other: "double-quoted"
  pipeline_model_parallel_size: 2
  recompute_granularity: full
  list_key:
    - a
    - b
optimizer:
  optimizer_cpu_offload: false
env_vars: null
"""


def _copy(tmp_path, src: Path, name="cfg.yaml") -> Path:
    dst = tmp_path / name
    shutil.copy(src, dst)
    return dst


def test_no_change_is_byte_identical(tmp_path):
    for src in (TINY, QWEN):
        p = _copy(tmp_path, src)
        snap = E.snapshot(p)
        assert E.render(snap, []) == snap.text
        assert E.render(snap, [("model.num_layers", yaml.safe_load(snap.text)["model"]["num_layers"])]) == snap.text


def test_round_trip_keeps_comments_order_targets_quotes(tmp_path):
    p = tmp_path / "cfg.yaml"
    p.write_text(HAND)
    snap = E.snapshot(p)
    new = E.render(snap, [("model.cpu_offloading", False), ("model.recompute_granularity", None),
                          ("optimizer.optimizer_offload_fraction", 0.25),
                          ("env_vars.PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")])
    assert "# top comment" in new and "# keep me" in new
    assert "name: 'single-quoted'" in new and 'other: "double-quoted"' in new
    assert "_target_: megatron.bridge.models.gpt_provider.GPTModelProvider" in new
    assert "recompute_granularity: null" in new  # None is written as null, not an empty value
    assert "    - a\n    - b" in new  # the file's sequence indentation is kept
    doc = yaml.safe_load(new)
    assert doc["model"]["cpu_offloading"] is False
    assert doc["optimizer"]["optimizer_offload_fraction"] == 0.25
    assert doc["env_vars"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert list(doc["model"]) == list(yaml.safe_load(HAND)["model"])  # key order unchanged
    # only the edited lines differ
    diff = E.unified_diff(snap.text, new, "cfg.yaml")
    changed = [ln for ln in diff.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    assert len(changed) == 8, diff


def test_new_key_goes_where_a_sorted_file_has_it(tmp_path):
    p = _copy(tmp_path, TINY)
    snap = E.snapshot(p)
    new = E.render(snap, [("optimizer.overlap_cpu_optimizer_d2h_h2d", True)])
    keys = list(yaml.safe_load(new)["optimizer"])
    assert keys == sorted(keys, key=str)


def test_delete_and_transformer_nesting(tmp_path):
    p = tmp_path / "cfg.yaml"
    p.write_text("model:\n  transformer:\n    cpu_offloading: true\n    num_layers: 4\n  seq_length: 8\n")
    snap = E.snapshot(p)
    new = E.render(snap, [("model.cpu_offloading", False), ("model.seq_length", E.DELETE)])
    doc = yaml.safe_load(new)
    assert doc["model"]["transformer"]["cpu_offloading"] is False  # edited where it lives
    assert "cpu_offloading" not in doc["model"] and "seq_length" not in doc["model"]


def test_refuses_to_replace_a_section(tmp_path):
    p = _copy(tmp_path, TINY)
    with pytest.raises(E.EditError, match="is a section"):
        E.render(E.snapshot(p), [("model", 1)])


def test_write_backup_atomic_and_never_overwrites_old_backups(tmp_path):
    p = _copy(tmp_path, TINY)
    original = p.read_text()
    (tmp_path / "cfg.yaml.bak").write_text("an older backup\n")
    snap = E.snapshot(p)
    res = E.write(snap, E.render(snap, [("model.cpu_offloading", False)]))
    assert res.changed and res.backup == tmp_path / "cfg.yaml.bak.1"
    assert (tmp_path / "cfg.yaml.bak").read_text() == "an older backup\n"
    assert res.backup.read_text() == original
    assert yaml.safe_load(p.read_text())["model"]["cpu_offloading"] is False
    assert res.diff.startswith("--- a/") and "-  cpu_offloading: true" in res.diff
    # no temporary file or lock left behind
    assert sorted(x.name for x in tmp_path.iterdir()) == ["cfg.yaml", "cfg.yaml.bak", "cfg.yaml.bak.1"]
    snap2 = E.snapshot(p)
    res2 = E.write(snap2, E.render(snap2, [("model.pipeline_model_parallel_size", 1)]))
    assert res2.backup == tmp_path / "cfg.yaml.bak.2"


def test_refuses_when_the_file_changed_since_the_plan(tmp_path):
    p = _copy(tmp_path, TINY)
    snap = E.snapshot(p)
    new = E.render(snap, [("model.cpu_offloading", False)])
    p.write_text(p.read_text() + "# edited by hand meanwhile\n")
    with pytest.raises(E.EditError, match="changed since the fix was planned"):
        E.write(snap, new)
    assert p.read_text().endswith("# edited by hand meanwhile\n")
    assert not list(tmp_path.glob("*.bak*"))


def test_lock_against_a_concurrent_fix_and_stale_lock_takeover(tmp_path):
    p = _copy(tmp_path, TINY)
    lock = tmp_path / ("cfg.yaml" + E.LOCK_SUFFIX)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        lock.write_text(f"{holder.pid}\n")
        snap = E.snapshot(p)
        with pytest.raises(E.EditError, match="being edited by another diagnose --fix"):
            E.write(snap, E.render(snap, [("model.cpu_offloading", False)]))
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its lock is stale and is taken over
    snap = E.snapshot(p)
    assert E.write(snap, E.render(snap, [("model.cpu_offloading", False)])).changed
    assert not lock.exists()


def test_keeps_file_mode(tmp_path):
    p = _copy(tmp_path, TINY)
    os.chmod(p, 0o640)
    snap = E.snapshot(p)
    E.write(snap, E.render(snap, [("model.cpu_offloading", False)]))
    assert (os.stat(p).st_mode & 0o777) == 0o640


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-c", "import sys; from diagnose.cli import main; sys.exit(main(sys.argv[1:]))",
                           *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_cli_fix_rewrites_then_second_fix_changes_nothing(tmp_path):
    p = _copy(tmp_path, TINY)
    r = _cli(str(RUN1), "--fix", str(p), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # the tiny model fits without any offload: activation offload off is the whole fix
    assert "-  cpu_offloading: true" in r.stdout and "optimizer_cpu_offload: true" not in r.stdout
    assert "# activation offload: only works at PP=1" in p.read_text()  # comment kept
    first = p.read_text()
    assert (tmp_path / "cfg.yaml.bak").read_text() == TINY.read_text()
    r2 = _cli(str(RUN1), "--fix", str(p), cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr
    assert r2.stdout == "" and "already has the fix" in r2.stderr
    assert p.read_text() == first
    assert not (tmp_path / "cfg.yaml.bak.1").exists()


def test_cli_dry_run_and_overrides_write_nothing(tmp_path):
    p = _copy(tmp_path, TINY)
    r = _cli(str(RUN1), "--fix", str(p), "--dry-run", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("--- a/")
    r = _cli(str(RUN1), "--fix", str(p), "--overrides", cwd=tmp_path)
    assert r.returncode == 0
    assert r.stdout.split() == ["model.cpu_offloading=false", "model.cpu_offloading_num_layers=0"]
    assert p.read_text() == TINY.read_text() and not list(tmp_path.glob("*.bak*"))


def test_cli_bad_config_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    r = _cli(str(RUN1), "--fix", str(bad), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = _cli(str(RUN1), "--fix", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert r.returncode == 2 and "no such file" in r.stderr


# --- render: exactly the asked change, nothing else (mutation testing, issue 18) --------------------
def _snap_of(tmp_path, text: str):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return E.snapshot(p)


BASE = "model:\n  num_layers: 4\n  hidden_size: 64  # a comment\noptimizer:\n  lr: 0.1\n"


def test_render_no_op_changes_return_the_text_unchanged(tmp_path):
    s = _snap_of(tmp_path, BASE)
    assert E.render(s, []) == BASE
    assert E.render(s, [("model.num_layers", 4)]) == BASE  # same value, same type
    assert E.render(s, [("model.nope", E.DELETE)]) == BASE  # deleting what is not there
    assert E.render(s, [("absent_section.key", E.DELETE)]) == BASE  # ... not even the section: nothing created


def test_render_a_type_change_is_a_change(tmp_path):
    s = _snap_of(tmp_path, BASE)
    out = E.render(s, [("optimizer.lr", 0.1), ("model.num_layers", 4.0)])
    assert "num_layers: 4.0" in out and "lr: 0.1" in out


@pytest.mark.parametrize("first", [("model.nope", E.DELETE), ("model.num_layers", 4)], ids=["delete-absent", "no-op"])
def test_render_goes_on_after_a_change_that_does_nothing(tmp_path, first):
    s = _snap_of(tmp_path, BASE)
    out = E.render(s, [first, ("optimizer.lr", 0.2), ("model.hidden_size", E.DELETE)])
    assert "lr: 0.2" in out and "hidden_size" not in out and "num_layers: 4" in out


INDENTS = {
    "two": "model:\n  num_layers: 4\n  layers:\n  - a\n  - b\noptimizer:\n  lr: 0.1\n",
    "two-offset": "model:\n  num_layers: 4\n  layers:\n    - a\n    - b\noptimizer:\n  lr: 0.1\n",
    "four": "model:\n    num_layers: 4\n    layers:\n    - a\n    - b\noptimizer:\n    lr: 0.1\n",
    "four-offset": "model:\n    num_layers: 4\n    layers:\n        - a\n        - b\noptimizer:\n    lr: 0.1\n",
    "comments-first": "# header\n\nmodel:   # the model\n    # a comment line\n    num_layers: 4\n    layers:\n      - a\n"
                      "optimizer:\n    lr: 0.1\n",
}


@pytest.mark.parametrize("style", sorted(INDENTS))
def test_render_keeps_the_files_own_indentation(tmp_path, style):
    """Only the edited line changes, whatever the file's mapping indent and sequence offset."""
    text = INDENTS[style]
    out = E.render(_snap_of(tmp_path, text), [("optimizer.lr", 0.2)])
    a, b = text.splitlines(), out.splitlines()
    assert len(a) == len(b) and [i for i, (x, y) in enumerate(zip(a, b)) if x != y] == [a.index(next(
        ln for ln in a if "lr:" in ln))], (style, out)


@pytest.mark.parametrize("text,want", [
    (INDENTS["two"], (2, 0)), (INDENTS["two-offset"], (2, 2)), (INDENTS["four"], (4, 0)),
    (INDENTS["four-offset"], (4, 4)), (INDENTS["comments-first"], (4, 2)),
    ("a: 1\nb:\n  # a comment at another indent\n\n   c: 2\n", (3, 0)),  # comments and blank lines skipped
    ("a:\n- x\nb:\n    c: 1\n", (4, 0)),  # a sequence right under its key, a mapping indented 4
    ("- a\n- b\n", (2, 0)),  # nothing to learn from: the defaults
    ("a: 1  # trailing: comment\nb:\n      c: 2\n", (6, 0)),  # a colon inside a comment is no key
    ("a:\n  - x: 1\n    y: 2\nb:\n  c: 3\n", (2, 2)),  # a key inside a sequence item is not a mapping indent
])
def test_guess_indent_reads_the_files_own_style(text, want):
    assert E.guess_indent(text) == want


def test_the_lock_holds_who_took_it(tmp_path, monkeypatch):
    """While held: 'PID START' of this process, mode 0644, born complete from a hidden .tmp file
    beside it; a second taker is told the config's name and the holder's pid."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(BASE)
    linked = []
    real_link = os.link
    monkeypatch.setattr(os, "link", lambda a, b: linked.append((a, b)) or real_link(a, b))
    with E.FileLock(cfg) as lock:
        assert lock.path.read_text() == f"{os.getpid()} {E._start_time(os.getpid())}\n"
        assert os.stat(lock.path).st_mode & 0o777 == 0o644
        (src, dst), = linked
        assert Path(dst) == lock.path and Path(src).parent == tmp_path
        assert Path(src).name.startswith(f".{lock.path.name}.") and src.endswith(".tmp")
        other = E.FileLock(cfg)
        other._stale = lambda: None  # (our own pid: never stale)
        with pytest.raises(E.EditError) as ei:
            other.__enter__()
        assert str(ei.value).startswith("cfg.yaml is being edited by another diagnose --fix")
        assert f"pid {os.getpid()})" in str(ei.value) and str(ei.value).endswith("when it has finished")
    assert not lock.path.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_render_never_rewraps_long_lines_and_writes_null(tmp_path):
    long = "x" * 300
    s = _snap_of(tmp_path, f"model:\n  name: {long}\n  a: 1\n  items:\n  - one\n")
    out = E.render(s, [("model.a", None), ("model.note", "y" * 300), ("model.items", ["one", "two"])])
    assert f"  name: {long}\n" in out and "  note: " + "y" * 300 + "\n" in out
    assert "  a: null\n" in out and "  - one\n  - two\n" in out


def test_diff_headers_are_gits_for_absolute_and_relative_paths():
    d = E.unified_diff("a: 1\n", "a: 2\n", "/abs/dir/cfg.yaml")
    assert d.startswith("--- a/abs/dir/cfg.yaml\n+++ b/abs/dir/cfg.yaml\n")
    assert E.unified_diff("a: 1\n", "a: 2\n", "rel/cfg.yaml").startswith("--- a/rel/cfg.yaml\n+++ b/rel/cfg.yaml\n")


def test_a_fresh_empty_lock_is_respected_until_the_grace_ends(tmp_path):
    """Another --fix may be between creating and filling it: not taken over before LOCK_GRACE_S."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(BASE)
    (tmp_path / ("cfg.yaml" + E.LOCK_SUFFIX)).write_text("")
    with pytest.raises(E.EditError, match="being edited by another"), E.FileLock(cfg):
        pass


def test_a_dangling_symlink_is_a_one_line_error(tmp_path):
    link = tmp_path / "cfg.yaml"
    link.symlink_to(tmp_path / "gone.yaml")
    with pytest.raises(E.EditError, match="symbolic link to nothing"):
        E.snapshot(link)


def test_a_null_section_becomes_a_section_in_place(tmp_path):
    s = _snap_of(tmp_path, "a: 1\nenv_vars: null\nz: 2\n")
    assert E.render(s, [("env_vars.NCCL_DEBUG", "INFO")]) == "a: 1\nenv_vars:\n  NCCL_DEBUG: INFO\nz: 2\n"


def test_write_reports_its_diff(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(BASE)
    snap = E.snapshot(cfg)
    res = E.write(snap, E.render(snap, [("optimizer.lr", 0.2)]))
    assert res.changed and res.diff.startswith(f"--- a/{str(cfg).lstrip('/')}\n") and "+  lr: 0.2\n" in res.diff
