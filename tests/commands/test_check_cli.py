"""``diagnose check``: input errors (exit 2), static rules from the database, JSON, exit codes."""
from __future__ import annotations

import json

import pytest

from diagnose.config import rules
from diagnose.config.load import ConfigError, load_config

CFG = "fixtures/configs"
MARCH = f"{CFG}/qwen3_30b_a3b_tp2_pp2_ep4.yaml"
SEED_MINIMAL = ["seed_optimizer_offload_50", "seed_optimizer_offload_100_overlap", "seed_activation_offload_pp1",
                "seed_weights_offload_pp1", "seed_activations_and_weights_pp1"]
# one per seed incompatibility: fixture -> (signature id, exit code at --fail-on error)
INCOMPATIBLE = {
    "incompat_activation_offload_pp2": ("MB-OFF-002", 1),
    "incompat_activation_offload_recompute": ("MB-OFF-003", 1),
    "incompat_activation_offload_fine_grained": ("MB-OFF-004", 1),
    "incompat_activation_offload_cuda_graphs": ("MB-OFF-006", 1),
    "incompat_offload_layers_out_of_range": ("MB-OFF-001", 1),
    "incompat_optimizer_offload_no_distopt": ("MB-OFF-053", 0),
    "incompat_optimizer_offload_fraction_range": ("MB-OFF-051", 0),
    "trap_optimizer_offload_fraction_zero": ("MB-OFF-050", 0),
    "trap_offload_layers_without_switch": ("MB-OFF-052", 0),
    "qwen3_30b_a3b_activation_offload_24_pp1": ("MB-OFF-055", 1),
}


@pytest.fixture(autouse=True)
def _cwd(repo, monkeypatch):
    monkeypatch.chdir(repo)


def jcheck(run_cli, *args):
    code, out, err = run_cli("check", *args, "--format", "json", "--mcore-version", "0.16.1")
    return code, (json.loads(out) if out.strip() else None), err


@pytest.mark.parametrize("name", SEED_MINIMAL)
def test_seed_minimal_configs_pass(run_cli, name):
    code, doc, err = jcheck(run_cli, f"{CFG}/{name}.yaml", "--world-size", "16", "--gpu", "h100")
    assert code == 0, (doc, err)
    assert doc["findings"] == []
    assert doc["memory"]["fits"] is True


@pytest.mark.parametrize("name", sorted(INCOMPATIBLE))
def test_each_seed_incompatibility_is_caught(run_cli, name):
    sid, want = INCOMPATIBLE[name]
    code, doc, _ = jcheck(run_cli, f"{CFG}/{name}.yaml", "--world-size", "16")
    assert [f["signature"] for f in doc["findings"]] == [sid]
    assert code == want
    code, _, _ = jcheck(run_cli, f"{CFG}/{name}.yaml", "--world-size", "16", "--fail-on", "warning")
    assert code == 1


def test_json_document_shape(run_cli):
    code, doc, _ = jcheck(run_cli, MARCH, "--world-size", "16", "model.cpu_offloading=true")
    assert code == 1
    assert {"findings", "memory", "notes", "schema_version"} <= set(doc)
    f = doc["findings"][0]
    assert {"signature", "title", "category", "severity", "evidence", "cause", "fix", "overrides", "source"} <= set(f)
    assert {"per_gpu_gb", "peak_gb", "capacity_gb", "fits", "host_gb", "breakdown"} <= set(doc["memory"])
    ids = {x["signature"] for x in doc["findings"]}
    # the same ids as the runtime errors they prevent: PP and recompute (the March recipe has both)
    assert {"MB-OFF-002", "MB-OFF-003"} <= ids
    rec = next(x for x in doc["findings"] if x["signature"] == "MB-OFF-003")
    assert "model.recompute_granularity=null" in rec["overrides"]
    assert "model.recompute_granularity = 'full'" in rec["evidence"]


def test_measured_row_through_the_cli(run_cli):
    code, doc, _ = jcheck(run_cli, MARCH, "--world-size", "16", "optimizer.optimizer_cpu_offload=true",
                          "optimizer.optimizer_offload_fraction=0.5")
    assert code == 0
    assert doc["memory"]["per_gpu_gb"] == pytest.approx(39.6, rel=0.05)
    assert doc["memory"]["host_gb"] > 0


def test_host_memory_rule(run_cli):
    args = [MARCH, "--world-size", "16", "optimizer.optimizer_cpu_offload=true", "optimizer.optimizer_offload_fraction=1.0"]
    code, doc, _ = jcheck(run_cli, *args, "--host-memory", "128")
    assert code == 1 and [f["signature"] for f in doc["findings"]] == ["MB-OFF-054"]
    assert doc["memory"]["host_gb"] > 128
    code, doc, _ = jcheck(run_cli, *args, "--host-memory", "2000")
    assert code == 0 and doc["findings"] == []
    code, doc, _ = jcheck(run_cli, *args)
    assert code == 0 and any("--host-memory" in n for n in doc["notes"])


def test_does_not_fit_on_a_smaller_gpu(run_cli):
    code, doc, _ = jcheck(run_cli, MARCH, "--world-size", "16", "--gpu", "a100-40")
    assert code == 1 and [f["signature"] for f in doc["findings"]] == ["MB-OFF-055"]
    code, doc, _ = jcheck(run_cli, MARCH, "--world-size", "16", "--gpu-memory", "141")
    assert code == 0 and doc["memory"]["capacity_gb"] == 141


def test_world_size_default_is_said(run_cli):
    _code, doc, _ = jcheck(run_cli, MARCH)
    assert doc["memory"]["world_size"] == 8
    assert any("smallest the layout allows" in n for n in doc["memory"]["notes"])


def test_version_aware_cuda_graph_rule(run_cli):
    args = [f"{CFG}/seed_activation_offload_pp1.yaml", "model.cuda_graph_impl=full_iteration", "--format", "json"]
    code, out, _ = run_cli("check", *args, "--mcore-version", "0.16.1")
    assert "MB-OFF-006" in {f["signature"] for f in json.loads(out)["findings"]}
    code, out, _ = run_cli("check", *args, "--mcore-version", "0.19.2")
    ids = {f["signature"] for f in json.loads(out)["findings"]}
    assert not ids & {"MB-OFF-006", "MB-OFF-007"}  # full_iteration is allowed from MCore 0.18
    code, out, _ = run_cli("check", f"{CFG}/incompat_activation_offload_cuda_graphs.yaml", "--format", "json",
                           "--mcore-version", "0.19.2")
    assert "MB-OFF-007" in {f["signature"] for f in json.loads(out)["findings"]} and code == 1


def test_rules_come_from_the_database(db):
    """Every config rule of the database fires in ``check`` on its own must-match config (and not
    on its must-not-match one), through rules.evaluate: not a set recomputed the way the code
    computes it. Version-gated ones: only where their MCore range says."""
    from diagnose.config.runconfig import RunConfig

    checked = 0
    for sig in db.signatures:
        if not (sig.preflight or sig.scope == "config") or not sig.confirm_when:
            continue
        for case, expect in [(c, True) for c in sig.tests_match] + [(c, False) for c in sig.tests_no_match]:
            if not isinstance(case, dict) or "config" not in case or case.get("log"):
                continue
            want = expect and not sig.applies.get("megatron-core", "").startswith(">=0.18")
            got = {f.id for f in rules.evaluate(RunConfig(case["config"]), db, {"megatron-core": "0.16.1"},
                                                case.get("metrics"))}
            assert (sig.id in got) is want, (sig.id, case, sorted(got))
            checked += 1
    assert checked >= 15, checked  # the config-scope rules and their examples (signatures/offload.yaml)
    # the literal ids the seed's preflight promises (docs/check.md), and the version gate both ways
    ids = {s.id for s in rules.rule_signatures(db, {"megatron-core": "0.16.1"})}
    assert {"MB-OFF-001", "MB-OFF-002", "MB-OFF-003", "MB-OFF-004", "MB-OFF-006", "MB-OFF-050", "MB-OFF-051",
            "MB-OFF-052", "MB-OFF-053", "MB-OFF-054", "MB-OFF-055"} <= ids
    assert "MB-OFF-007" not in ids and "MB-OFF-005" not in ids  # MCore >= 0.18 only
    assert "MB-OFF-007" in {s.id for s in rules.rule_signatures(db, {"megatron-core": "0.19.2"})}


def test_config_rules_from_other_families_fire_too(run_cli):
    code, doc, _ = jcheck(run_cli, MARCH, "--world-size", "16", "model.tensor_model_parallel_size=1")
    # SP without TP: a config-validation signature (signatures/config.yaml), not an offload one
    assert code == 1
    assert any(f["signature"] and f["signature"].startswith("MB-CFG") for f in doc["findings"])


def test_text_output_has_table_and_verdict(run_cli):
    code, out, _ = run_cli("check", f"{CFG}/qwen3_30b_a3b_activation_offload_24_pp1.yaml", "--world-size", "16")
    assert code == 1
    assert "MB-OFF-055" in out and "does NOT fit" in out and "steady state" in out
    code, out, _ = run_cli("check", MARCH, "--world-size", "16")
    assert code == 0 and "passes the static checks" in out and "fits" in out


def test_preset_as_config(run_cli):
    _code, doc, _ = jcheck(run_cli, "llama3-8b", "model.tensor_model_parallel_size=8", "+optimizer.use_distributed_optimizer=true",
                          "--world-size", "64", "--gpu", "h100")
    assert doc["memory"]["world_size"] == 64
    assert any("llama3-8b preset" in n for n in doc["notes"])


@pytest.mark.parametrize("args,message", [
    (["nosuch.yaml"], "no such file"),
    (["not-a-preset"], "not a model preset"),
    ([MARCH, "model.nosuch=1"], "could not override 'model.nosuch'"),
    ([MARCH, "model.tensor_model_parallel_size=two"], "model.tensor_model_parallel_size: expected an integer"),
    ([MARCH, "model.sequence_parallel=3"], "model.sequence_parallel: expected a boolean"),
    ([MARCH, "--gpu", "tpu"], "unknown GPU"),
    ([MARCH, "--world-size", "12"], "not divisible"),
    ([MARCH, "--gpu", "h100", "--gpu-memory", "80"], "not both"),
    ([MARCH, "--mcore-version", "latest"], "is not a version"),
])
def test_bad_input_exits_2_with_one_line(run_cli, args, message):
    code, _out, err = run_cli("check", *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2


def test_option_out_of_range_is_a_usage_error(run_cli):
    code, _, err = run_cli("check", MARCH, "--world-size", "0")
    assert code == 2 and "--world-size" in err and "Traceback" not in err


def test_bad_yaml_unknown_key_wrong_type_in_file(run_cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  num_layers: [1\n")
    code, _, err = run_cli("check", str(bad))
    assert code == 2 and "invalid YAML (line" in err
    bad.write_text("model:\n  num_layers: 4\n  cpu_ofloading: true\n")
    code, _, err = run_cli("check", str(bad))
    assert code == 2 and "model.cpu_ofloading: unknown key" in err
    bad.write_text("model:\n  num_layers: four\noptimizer:\n  optimizer_offload_fraction: half\n")
    code, _, err = run_cli("check", str(bad))
    assert code == 2 and "model.num_layers: expected an integer" in err and "1 more problem" in err
    bad.write_text("modle:\n  num_layers: 4\n")
    code, _, err = run_cli("check", str(bad))
    assert code == 2 and "modle: unknown section" in err


def test_strict_load_keeps_the_api(repo):
    cfg = load_config(str(repo / MARCH))
    assert cfg.get("model.tensor_model_parallel_size") == 2
    with pytest.raises(ConfigError):
        import os
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
            fh.write("model:\n  bogus: 1\n")
        try:
            load_config(fh.name, strict=True)
        finally:
            os.unlink(fh.name)


def test_plain_yaml_with_sections_and_preset_shapes(run_cli, tmp_path):
    p = tmp_path / "plain.yaml"
    p.write_text("model:\n  hf_model_id: Qwen/Qwen3-30B-A3B\n  tensor_model_parallel_size: 2\n"
                 "  pipeline_model_parallel_size: 2\n  expert_model_parallel_size: 4\n  expert_tensor_parallel_size: 1\n"
                 "  sequence_parallel: true\n  recompute_granularity: full\n  recompute_method: uniform\n"
                 "  recompute_num_layers: 1\n  pipeline_dtype: torch.bfloat16\n"
                 "optimizer:\n  use_distributed_optimizer: true\n  optimizer_cpu_offload: true\n"
                 "  optimizer_offload_fraction: 0.75\n")
    code, doc, _ = jcheck(run_cli, str(p), "--world-size", "16")
    assert code == 0, doc
    assert doc["memory"]["per_gpu_gb"] == pytest.approx(35.6, rel=0.05)
    assert any("Qwen/Qwen3-30B-A3B preset" in n for n in doc["notes"])


def test_mlm_arguments_dump_as_config(run_cli, repo):
    log = "fixtures/logs/compare/mlm_offload100_slow_fail.log"
    if not (repo / log).exists():
        pytest.skip("no MLM arguments fixture")
    code, doc, _ = jcheck(run_cli, log, "model.vocab_size=32000")
    assert code == 0
    assert doc["memory"]["world_size"] == 16 and any("from the job's arguments" in n for n in doc["notes"])
    code, _, err = run_cli("check", log, "model.num_layers=x")
    assert code == 2 and "model.num_layers: expected an integer" in err


def test_no_internal_error_on_arbitrary_override_values(db, tmp_path):
    """Whatever value an override gives a key, check answers with findings or a ConfigError, never a crash."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from diagnose.commands.check import run_check

    small = tmp_path / "small.yaml"  # a plain YAML (parsing the full run_config 100 times is slow)
    small.write_text("model:\n  hf_model_id: Qwen/Qwen3-30B-A3B\n  tensor_model_parallel_size: 2\n"
                     "  pipeline_model_parallel_size: 2\n  expert_model_parallel_size: 4\n  sequence_parallel: true\n"
                     "  recompute_granularity: full\n  cpu_offloading: false\n  cuda_graph_impl: none\n"
                     "optimizer:\n  optimizer_cpu_offload: false\n  optimizer_offload_fraction: 0.0\n"
                     "  use_distributed_optimizer: true\ntrain:\n  micro_batch_size: 1\n  global_batch_size: 64\n")
    keys = ["model.tensor_model_parallel_size", "model.pipeline_model_parallel_size", "model.num_layers",
            "model.cpu_offloading", "model.cpu_offloading_num_layers", "model.recompute_granularity",
            "optimizer.optimizer_offload_fraction", "optimizer.optimizer_cpu_offload", "model.expert_model_parallel_size",
            "model.moe_layer_freq", "model.seq_length", "train.micro_batch_size", "model.cuda_graph_impl"]
    values = st.one_of(st.integers(-3, 300), st.floats(-2, 3, allow_nan=False), st.booleans(), st.just("null"),
                       st.sampled_from(["full", "selective", "abc", "[1,2]", "''"]))

    @settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.sampled_from(keys), values), min_size=1, max_size=4),
           st.sampled_from([None, 1, 8, 16, 24]))
    def prop(pairs, world):
        ovs = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in pairs]
        try:
            res = run_check(str(small), ovs, db, {"megatron-core": "0.16.1"}, world_size=world)
        except ConfigError:
            return
        assert isinstance(res["findings"], list)

    prop()


def test_bridge_0_6_dataset_seq_length_is_a_known_key(run_cli, tmp_path):
    """Megatron-Bridge 0.6's GPTDatasetConfig dumps dataset.seq_length (issue 12, item 7)."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("dataset:\n  seq_length: 4096\nmodel:\n  num_layers: 4\n")
    code, _out, err = run_cli("check", str(cfg))
    assert "unknown key" not in err and code == 0, err


def test_a_misspelt_key_or_override_gets_did_you_mean(run_cli, tmp_path):
    """Issue 13: a typo in a config key or an override key names the key it probably meant."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("model:\n  cpu_ofloading: true\n")
    code, _, err = run_cli("check", str(cfg))
    assert code == 2 and "(did you mean model.cpu_offloading?)" in err
    code, _out, err = run_cli("check", MARCH, "model.pipline_model_parallel_size=2")
    assert code == 2 and "(did you mean model.pipeline_model_parallel_size?)" in err


def test_world_size_and_gpu_come_from_the_settings_file(run_cli, tmp_path, monkeypatch):
    """Issue 13: [tool.diagnose] world-size / gpu were read by --fix and ignored by check; the
    command line still wins, and the note says where each value came from."""
    from pathlib import Path

    march = str(Path(MARCH).resolve())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.diagnose]\nworld-size = 16\ngpu = "a100-40"\n')
    code, doc, _ = jcheck(run_cli, march)
    assert doc["memory"]["world_size"] == 16 and code == 1  # does not fit an A100-40 (MB-OFF-055)
    assert "world size 16: from pyproject.toml (world-size)" in doc["notes"]
    assert any(n.startswith("GPU a100-40: from pyproject.toml") for n in doc["notes"])
    code, doc, _ = jcheck(run_cli, march, "--world-size", "32", "--gpu", "h100")
    assert doc["memory"]["world_size"] == 32 and not any("pyproject" in n for n in doc["notes"])
    (tmp_path / "pyproject.toml").write_text('[tool.diagnose]\nlaunch-cmd = "torchrun --nnodes=2 '
                                              '--nproc_per_node=8 scripts/training/run_recipe.py --recipe x"\n')
    code, doc, _ = jcheck(run_cli, march)
    assert doc["memory"]["world_size"] == 16 and "world size 16: from the launch command in pyproject.toml" in doc["notes"]


@pytest.mark.parametrize("width", [80, 120])
def test_text_output_fits_the_terminal_and_never_cuts_an_override(run_cli, monkeypatch, width):
    """Issue 13: check's findings table was 120 columns wide whatever the terminal, and its Fix
    column cut the overrides exactly where they must be copied."""
    monkeypatch.setenv("COLUMNS", str(width))
    args = [f"{CFG}/qwen3_30b_a3b_activation_offload_24_pp1.yaml", "model.recompute_granularity=full",
            "--world-size", "16", "--mcore-version", "0.16.1"]
    code, out, _ = run_cli("check", *args)
    _, doc, _ = jcheck(run_cli, *args)
    assert code == 1 and doc["findings"]
    lines = out.splitlines()
    assert all(len(ln) <= width for ln in lines), max(lines, key=len)
    flat = " ".join(ln.strip() for ln in lines)
    for f in doc["findings"]:
        assert f"[{f['signature']}]" in out
        for o in f["overrides"]:
            assert o in flat, (f["signature"], o)
    assert "…" not in out
