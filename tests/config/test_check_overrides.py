"""Hydra-grammar overrides with Bridge's semantics (config/overrides.py)."""
from __future__ import annotations

import pytest

from diagnose.config import schema
from diagnose.config.load import ConfigError
from diagnose.config.overrides import apply_overrides
from diagnose.config.runconfig import RunConfig


def base():
    return RunConfig({"model": {"num_layers": 48, "cpu_offloading": False, "recompute_granularity": "full",
                                "offload_modules": None},
                      "optimizer": {"optimizer_offload_fraction": 0.0},
                      "dataset": {"data_path": None}}, "t.yaml")


def test_values_are_typed_like_hydra():
    cfg, _ = apply_overrides(base(), [
        "model.num_layers=24", "model.cpu_offloading=true", "model.recompute_granularity=null",
        "optimizer.optimizer_offload_fraction=0.5", "model.offload_modules=[core_attn,attn_proj]",
        "dataset.data_path='a b'",
    ])
    assert cfg.get("model.num_layers") == 24
    assert cfg.get("model.cpu_offloading") is True
    assert cfg.get("model.recompute_granularity") is None and cfg.has("model.recompute_granularity")
    assert cfg.get("optimizer.optimizer_offload_fraction") == 0.5
    assert cfg.get("model.offload_modules") == ["core_attn", "attn_proj"]
    assert cfg.get("dataset.data_path") == "a b"


def test_original_is_not_changed():
    b = base()
    apply_overrides(b, ["model.num_layers=2"])
    assert b.get("model.num_layers") == 48


def test_add_delete_force_add():
    cfg, notes = apply_overrides(base(), ["+model.moe_paged_stash=true", "~model.offload_modules", "++model.num_layers=8",
                                          "++model.new_key=1"])
    assert cfg.get("model.moe_paged_stash") is True
    assert not cfg.has("model.offload_modules")
    assert cfg.get("model.num_layers") == 8 and cfg.get("model.new_key") == 1
    assert any("model.moe_paged_stash" in n for n in notes)
    cfg, _ = apply_overrides(base(), ["~model.num_layers=48"])
    assert not cfg.has("model.num_layers")


@pytest.mark.parametrize("override,message", [
    ("model.nosuch=1", "could not override 'model.nosuch'.*\\+model.nosuch=1"),
    ("+model.num_layers=2", "already at 'model.num_layers'"),
    ("~model.nosuch", "'model.nosuch' does not exist"),
    ("~model.num_layers=12", "its value is 48"),
    ("model.num_layers=1,2", "sweeps"),
    ("model.num_layers", "expected KEY=VALUE"),
    ("model.num_layers=[1,", "override 'model.num_layers=\\[1,'"),
    ("db/mysql=x", "config groups"),
    ("++model.num_layers.x=1", "is a value"),
])
def test_refused_with_the_override_named(override, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(base(), [override])


def test_known_fields_may_be_changed_even_if_the_file_omits_them():
    cfg, _ = apply_overrides(base(), ["model.pipeline_model_parallel_size=2"], schema.known)
    assert cfg.get("model.pipeline_model_parallel_size") == 2
    with pytest.raises(ConfigError):
        apply_overrides(base(), ["model.pipeline_model_parallel_size=2"])  # without the schema: Hydra's struct rule


def test_distributed_optimizer_is_synced_like_bridge():
    cfg, _ = apply_overrides(RunConfig({"optimizer": {"use_distributed_optimizer": False},
                                        "ddp": {"use_distributed_optimizer": False}}),
                             ["ddp.use_distributed_optimizer=true"])
    assert cfg.get("optimizer.use_distributed_optimizer") is True
