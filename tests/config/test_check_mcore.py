"""``diagnose check --mcore``: real megatron-core 0.16.1 validates the fixtures; its exception is
named through the database with the same id as the static rule."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from diagnose.config import mcore

pytestmark = [pytest.mark.mcore, pytest.mark.slow]
CFG = "fixtures/configs"
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _cwd(repo, monkeypatch):
    monkeypatch.chdir(repo)


def jcheck(run_cli, *args):
    code, out, err = run_cli("check", "--mcore", "--format", "json", "--world-size", "16", *args)
    return code, (json.loads(out) if out.strip() else None), err


@pytest.mark.parametrize("name,sid,message", [
    ("incompat_activation_offload_pp2", "MB-OFF-002", "Currently there is no support for Pipeline parallelism with CPU offloading"),
    ("incompat_activation_offload_recompute", "MB-OFF-003", "CPU offloading does not work when activation recomputation is enabled"),
    ("incompat_activation_offload_fine_grained", "MB-OFF-004", "fine_grained_activation_offloading cannot be enabled with cpu_offloading."),
    ("incompat_activation_offload_cuda_graphs", "MB-OFF-006", "CUDA graphs not supported with CPU offloading."),
    ("incompat_offload_layers_out_of_range", "MB-OFF-001", "CPU offloading can be done only for layers less than 32"),
])
def test_mcore_raises_and_the_database_names_it(run_cli, name, sid, message):
    code, doc, _ = jcheck(run_cli, f"{CFG}/{name}.yaml")
    assert code == 1
    (f,) = doc["findings"]
    assert f["signature"] == sid and f["source"] == "static+mcore"
    assert message in f["evidence"]


@pytest.mark.parametrize("name,sid", [
    ("incompat_optimizer_offload_no_distopt", "MB-OFF-053"),  # MCore does not check these: static only
    ("incompat_optimizer_offload_fraction_range", "MB-OFF-051"),
])
def test_traps_mcore_does_not_check_stay_static(run_cli, name, sid):
    _code, doc, _ = jcheck(run_cli, f"{CFG}/{name}.yaml")
    assert [(f["signature"], f["source"]) for f in doc["findings"]] == [(sid, "static")]


@pytest.mark.parametrize("name", ["qwen3_30b_a3b_tp2_pp2_ep4", "seed_optimizer_offload_50", "seed_optimizer_offload_100_overlap",
                                  "seed_activation_offload_pp1", "seed_weights_offload_pp1", "seed_activations_and_weights_pp1"])
def test_mcore_accepts_the_good_configs(run_cli, name):
    code, doc, _ = jcheck(run_cli, f"{CFG}/{name}.yaml")
    assert code == 0 and doc["findings"] == []
    assert not any("could not be checked" in n for n in doc["notes"])
    assert any("built TransformerConfig and OptimizerConfig without an error" in n for n in doc["notes"])


def test_an_mcore_message_no_signature_knows_is_still_reported(run_cli, tmp_path, monkeypatch):
    import re
    import shutil

    args = (f"{CFG}/qwen3_30b_a3b_tp2_pp2_ep4.yaml", "model.add_bias_linear=true", "model.expert_tensor_parallel_size=2")
    code, doc, _ = jcheck(run_cli, *args)
    assert code == 1 and "MB-CFG-053" in {f["signature"] for f in doc["findings"]}
    # the same MCore error against a database that lacks its signature is still reported, unnamed
    sigs = tmp_path / "sigs"
    shutil.copytree(REPO / "signatures", sigs)
    text = (sigs / "config.yaml").read_text()
    text = re.sub(r"\n  - id: MB-CFG-053\n.*?(?=\n  - id: |\Z)", "\n", text, flags=re.S)
    (sigs / "config.yaml").write_text(text)
    monkeypatch.setenv("DIAGNOSE_SIGNATURES", str(sigs))
    code, doc, _ = jcheck(run_cli, *args)
    assert code == 1
    unnamed = [f for f in doc["findings"] if f["signature"] is None]
    assert unnamed and "Bias in Moe is only supported when ETP==1" in unnamed[0]["evidence"]
    assert unnamed[0]["source"] == "mcore" and unnamed[0]["severity"] == "error"


def test_optimizer_config_is_built_too(db):
    from diagnose.config.runconfig import RunConfig

    res = mcore.validate(RunConfig({"optimizer": {"use_precision_aware_optimizer": True,
                                                  "use_distributed_optimizer": False}}), db)
    assert [r.stage for r in res] == ["OptimizerConfig"]
    assert "only supported with distributed optimizer" in res[0].message


def test_mcore_unavailable_is_exit_2(run_cli, monkeypatch):
    def boom():
        raise mcore.MCoreUnavailable("megatron-core cannot be imported (ImportError: test)")

    monkeypatch.setattr(mcore, "_classes", boom)
    code, _, err = run_cli("check", f"{CFG}/seed_optimizer_offload_50.yaml", "--mcore")
    assert code == 2 and "--mcore: megatron-core cannot be imported" in err
