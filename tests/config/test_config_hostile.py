"""Hostile configs: every bad config is a one-line ConfigError (exit 2 through the CLI), never a
hang, a memory blow-up or a traceback. And the relaunch history survives kill -9."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diagnose.config.load import MAX_CONFIG_BYTES, ConfigError, load_config
from diagnose.config.overrides import apply_overrides
from diagnose.config.runconfig import RunConfig

REPO = Path(__file__).resolve().parents[2]
LOG = b"Traceback (most recent call last):\n  File \"a.py\", line 1\nRuntimeError: boom\n"


def _cfg(tmp_path, text, name="cfg.yaml") -> Path:
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


def _refused(path, match, strict=False):
    t = time.monotonic()
    with pytest.raises(ConfigError, match=match) as ei:
        load_config(str(path), strict=strict)
    assert time.monotonic() - t < 10
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    return msg


def billion_laughs(levels=12, width=10) -> str:
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * width) + "]")
    lines.append(f"model: {{num_layers: *l{levels - 1}}}")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_fast(tmp_path):
    p = _cfg(tmp_path, billion_laughs())
    _refused(p, "aliases expand to more than")


def test_alias_bomb_in_a_mapping_is_refused(tmp_path):
    text = "a: &a {x: 1, y: 1, z: 1, w: 1, v: 1, u: 1, t: 1, s: 1, r: 1, q: 1}\n"
    for i in range(1, 9):
        prev = "a" if i == 1 else f"b{i - 1}"
        text += f"b{i}: &b{i} {{" + ", ".join(f"k{j}: *{prev}" for j in range(10)) + "}\n"
    p = _cfg(tmp_path, text + "model: *b8\n")
    _refused(p, "aliases expand")


def test_modest_aliases_are_fine(tmp_path):
    p = _cfg(tmp_path, "base: &b {hidden_size: 64, num_layers: 2}\nmodel: *b\noptimizer: {lr: 0.001}\n")
    cfg = load_config(str(p))
    assert cfg.get("model.hidden_size") == 64


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "a: &a\n  b: *a\n", "model: &m {x: [1, *m]}\n"])
def test_recursive_aliases_are_refused(tmp_path, text):
    _refused(_cfg(tmp_path, text), "recursive|refers to itself")


def test_duplicate_keys(tmp_path):
    msg = _refused(_cfg(tmp_path, "model:\n  num_layers: 2\n  num_layers: 4\n"), "duplicate key")
    assert "'num_layers'" in msg and "line 3" in msg


@pytest.mark.parametrize("text,kind", [("- a\n- b\n", "list"), ("42\n", "int"), ("just text\n", "str"),
                                       ("true\n", "bool"), ("3.5\n", "float")])
def test_non_mapping_root(tmp_path, text, kind):
    _refused(_cfg(tmp_path, text), f"top level must be a mapping.*got {kind}")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n", "null\n", "~\n"])
def test_empty_configs(tmp_path, text):
    _refused(_cfg(tmp_path, text), "empty config")


@pytest.mark.parametrize("text,where", [
    ("model: {a: 1\n", "line"),
    ("model:\n  a: 1\n b: 2\n", "line 3"),
    ("model: [1, 2\n", "line"),
    ("a: 'unterminated\n", "line"),
    ("\t- tab\n", "line"),
    ("a: !!python/object:os.system ls\n", "line"),  # unsafe tags are refused by the safe loader
    ("a: !custom 1\n", "line"),
    ("? [1, 2]\n: list key\n", None),
])
def test_invalid_yaml_is_one_line(tmp_path, text, where):
    msg = _refused(_cfg(tmp_path, text), "invalid YAML|a key that is a list")
    if where:
        assert where in msg


def test_deep_nesting(tmp_path):
    _refused(_cfg(tmp_path, "a: " + "[" * 5000 + "]" * 5000 + "\n"), "nested too deeply|invalid YAML")
    deep = "".join("  " * i + f"k{i}:\n" for i in range(60)) + "  " * 60 + "x: 1\n"
    cfg = load_config(str(_cfg(tmp_path, deep, "deep2.yaml")))  # 60 levels is odd but legal
    assert cfg.get("k0.k1.k2") is not None
    deeper = "".join("  " * i + f"k{i}:\n" for i in range(400)) + "  " * 400 + "x: 1\n"
    _refused(_cfg(tmp_path, deeper, "deep3.yaml"), "nested too deeply")


def test_binary_and_invalid_utf8(tmp_path):
    p = _cfg(tmp_path, b"\x00\x01\x02\xff\xfe\x89PNG\r\n\x1a\n" * 100)
    with pytest.raises(ConfigError):
        load_config(str(p))
    p = _cfg(tmp_path, b"model:\n  name: caf\xe9\n", "latin1.yaml")
    assert load_config(str(p)).get("model.name") == "caf\ufffd"


def test_too_big_is_refused_without_reading(tmp_path):
    p = tmp_path / "huge.yaml"
    with open(p, "wb") as fh:
        fh.truncate(MAX_CONFIG_BYTES + 1)  # sparse: nothing to read, only the size counts
    _refused(p, "larger than")


def test_missing_directory_fifo_device(tmp_path):
    _refused(tmp_path / "nope.yaml", "no such file")
    _refused(tmp_path, "is a directory")
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "cfg.fifo")
        _refused(tmp_path / "cfg.fifo", "not a regular file")  # would block forever if opened
    _refused(Path("/dev/zero"), "not a regular file")
    (tmp_path / "file").write_text("x")
    _refused(tmp_path / "file" / "cfg.yaml", "cannot read")


WRONG_TYPES = """\
model:
  num_layers: "twelve"
  hidden_size: [1, 2]
  tensor_model_parallel_size: {a: 1}
  cpu_offloading: "yes please"
  pipeline_model_parallel_size: -3
optimizer: 7
ddp: [1, 2]
train: null
"""


def test_wrong_types_strict_is_refused_naming_the_key(tmp_path):
    msg = _refused(_cfg(tmp_path, WRONG_TYPES), "expected|unknown", strict=True)
    assert "more problem" in msg


def test_wrong_types_non_strict_scan_does_not_crash(tmp_path, run_cli):
    """A config full of wrong types still lets the scan run (rules just cannot confirm)."""
    cfg = _cfg(tmp_path, WRONG_TYPES)
    log = tmp_path / "run.log"
    log.write_bytes(LOG + b"ValueError: pipeline_model_parallel_size must be > 0\n")
    code, out, err = run_cli(str(log), "--config", str(cfg), "--format", "json", "-q")
    assert code in (0, 1), err
    assert "internal error" not in err and "Traceback" not in err
    json.loads(out)


def test_unknown_sections(tmp_path):
    text = "model: {num_layers: 2}\nbananas: {ripe: true}\n"
    _refused(_cfg(tmp_path, text), "bananas: unknown section", strict=True)
    assert load_config(str(_cfg(tmp_path, text, "b.yaml"))).get("bananas.ripe") is True


@pytest.mark.parametrize("text", ["model: {1: x, 2.5: y, null: z, true: w}\n", "model: {1: x, 2.5: y, null: z}\n",
                                  "1: {2: 3}\n",
                                  "model: {transformer: 5}\n", "model: {transformer: {1: 2}}\n"])
def test_odd_keys_strict_and_loose(tmp_path, text):
    p = _cfg(tmp_path, text)
    for strict in (False, True):
        try:
            load_config(str(p), strict=strict)
        except ConfigError as exc:  # e.g. YAML's 1 and true are one key in Python: a duplicate
            assert "\n" not in str(exc)


def test_cli_bad_configs_exit_2_one_line(tmp_path, run_cli):
    log = tmp_path / "run.log"
    log.write_bytes(LOG)
    for name, text in [("bomb.yaml", billion_laughs()), ("dup.yaml", "a: 1\na: 2\n"), ("list.yaml", "- 1\n"),
                       ("bad.yaml", "a: [\n"), ("rec.yaml", "a: &a [*a]\n")]:
        p = _cfg(tmp_path, text, name)
        code, out, err = run_cli(str(log), "--config", str(p))
        assert code == 2, (name, err)
        assert out == "" and len(err.strip().splitlines()) == 1 and name in err, (name, err)


@pytest.mark.parametrize("ov", [
    "model.num_layers=$(rm -rf /)", "model.x=1,2", "model=", "=1", "~", "+", "++", "model.a.b.c.d.e=1",
    "db/mysql=1", "model.num_layers@pkg=1", "model.num_layers=[1,2", "model.num_layers='", "a" * 5000 + "=1",
    "model." + ".".join(["k"] * 2000) + "=1", "model.num_layers=${oc.env:HOME}", "model.num_layers=\x00",
    "\n=\n", "~model.missing", "+model.num_layers=3", "model.num_layers.x=1",
])
def test_hostile_overrides_are_one_line_errors_or_applied(ov):
    cfg = RunConfig({"model": {"num_layers": 2, "a": 1}}, "cfg.yaml")
    try:
        out, notes = apply_overrides(cfg, [ov])
    except ConfigError as exc:
        assert "\n" not in str(exc).strip() or "\n" in ov
        return
    assert isinstance(out, RunConfig) and isinstance(notes, list)
    assert cfg.get("model.num_layers") == 2  # the original is never modified


# ----------------------------------------------------------------------------- the relaunch history

_APPENDER = r"""
import sys
from pathlib import Path
from diagnose.launch.loop import History
h = History(Path(sys.argv[1]))
print("ready", flush=True)
i = 0
while True:
    h.append({"attempt": i, "diff": "x" * 3000, "command": ["python", "train.py", "model.k='$(x)'"]})
    i += 1
"""


@pytest.mark.slow
def test_history_survives_kill_9(tmp_path):
    path = tmp_path / "history.jsonl"
    for k in range(5):
        child = subprocess.Popen([sys.executable, "-c", _APPENDER, str(path)], cwd=str(REPO),
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.05 + 0.07 * k)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        child.stdout.close()
    from diagnose.launch.loop import History

    records = History(path).read()
    assert len(records) > 0
    raw = path.read_bytes().split(b"\n")
    whole = [ln for ln in raw if ln]
    # every line but possibly a torn last one of each kill is a whole record
    assert len(records) >= len(whole) - 5
    for r in records:
        assert r["diff"] == "x" * 3000


def test_history_read_skips_a_torn_record(tmp_path):
    from diagnose.launch.loop import History

    h = History(tmp_path / "h.jsonl")
    h.append({"attempt": 1})
    with open(h.path, "ab") as fh:
        fh.write(b'{"attempt": 2, "diff": "--- a/cfg')  # the process died mid-record
    h.append({"attempt": 3})
    assert [r["attempt"] for r in h.read()] == [1, 3]


# ------------------------------------------------- values no job can have (issue 16, item 15)
@pytest.mark.parametrize("line,match", [
    ("model: {num_layers: -5}", "num_layers: -5 must be at least 1"),
    ("model: {pipeline_model_parallel_size: 0}", "pipeline_model_parallel_size: 0 must be at least 1"),
    ("model: {tensor_model_parallel_size: -1}", "tensor_model_parallel_size: -1 must be at least 1"),
    ("optimizer: {optimizer_offload_fraction: .nan}", "optimizer_offload_fraction: nan is not a finite number"),
    ("train: {train_iters: 2026-01-01}", "train_iters: expected an integer"),
    ("train: {global_batch_size: .inf}", "expected an integer|not a finite number"),
])
def test_impossible_values_are_refused_in_one_line(tmp_path, line, match):
    _refused(_cfg(tmp_path, line + "\n"), match, strict=True)


def test_zero_layers_offloaded_is_a_value_a_job_can_have(tmp_path):
    assert load_config(str(_cfg(tmp_path, "model: {cpu_offloading_num_layers: 0, num_layers: 4}\n")), strict=True)


def test_yaml_merge_keys_are_read(tmp_path):
    cfg = load_config(str(_cfg(tmp_path, "model: &m\n  num_layers: 4\n  hidden_size: 64\n"
                                         "optimizer:\n  lr: 0.1\n"
                                         "ddp:\n  <<: {use_distributed_optimizer: true, overlap_grad_reduce: false}\n"
                                         "  overlap_grad_reduce: true\n")), strict=True)
    assert cfg.get("ddp.use_distributed_optimizer") is True and cfg.get("ddp.overlap_grad_reduce") is True


@pytest.mark.parametrize("line", ["model: {num_layers: .nan, pipeline_model_parallel_size: 2}",
                                  "model: {pipeline_model_parallel_size: 0, num_layers: 4}",
                                  "train: {train_iters: 2026-01-01}"])
def test_fix_on_an_impossible_config_is_exit_2_not_a_crash(tmp_path, line):
    cfg = _cfg(tmp_path, line + "\n")
    log = _cfg(tmp_path, "[rank0]: ValueError: Currently there is no support for Pipeline parallelism with CPU "
                         "offloading\n", "run.log")
    r = subprocess.run([sys.executable, "-c", "import sys; from diagnose.cli import main; sys.exit(main(sys.argv[1:]))",
                        str(log), "--fix", str(cfg), "--world-size", "2"], capture_output=True, text=True,
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert cfg.read_text() == line + "\n"
