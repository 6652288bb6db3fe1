"""Property test: the static rules and real megatron-core agree on every generated config.

Hypothesis draws offload / parallel / recompute / CUDA-graph settings; for each config the
database's static rules (config/rules.py, for the installed MCore version) and MCore's own
TransformerConfig / OptimizerConfig (config/mcore.py, real exceptions named through the line
signatures) must agree: both accept, or both reject, and MCore's exception is named by a signature
the static rules also report. "Static rules MCore enforces" are the error signatures whose
references name one of MCore's config files (data in the database, not a list in this test): the
others (Bridge's own checks, Transformer Engine's runtime checks, silent traps) are not MCore's to
agree with. The number of examples is printed (run with -s) and asserted.
"""
from __future__ import annotations

import pytest

mcore_mod = pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from diagnose import db as DB  # noqa: E402
from diagnose.config import mcore, rules  # noqa: E402
from diagnose.config.runconfig import RunConfig, normalize  # noqa: E402

pytestmark = [pytest.mark.mcore, pytest.mark.slow]

MCORE_CONFIG_FILES = ("megatron/core/transformer/transformer_config.py", "megatron/core/model_parallel_config.py",
                      "megatron/core/optimizer/optimizer_config.py")
N_EXAMPLES = 600
SEEN = {"n": 0, "reject": 0, "ids": {}}


def _enforced_by_mcore_config(sig) -> bool:
    return sig.severity == "error" and sig.role == "root" and any(
        str(r.get("path", "")) in MCORE_CONFIG_FILES and "Megatron-LM" in str(r.get("repo", "Megatron-LM"))
        for r in sig.references)


configs = st.fixed_dictionaries({
    "model": st.fixed_dictionaries({
        "num_layers": st.sampled_from([2, 4]),
        "hidden_size": st.just(64),
        "add_bias_linear": st.just(False),  # the rest of the model as Bridge recipes set it
        "attention_dropout": st.just(0.0),
        "hidden_dropout": st.just(0.0),
        "num_attention_heads": st.just(4),
        "tensor_model_parallel_size": st.sampled_from([1, 2]),
        "sequence_parallel": st.sampled_from([False, False, True]),
        "pipeline_model_parallel_size": st.sampled_from([1, 2]),
        "pipeline_dtype": st.sampled_from(["torch.bfloat16", "torch.bfloat16", "torch.bfloat16", None]),
        "expert_model_parallel_size": st.sampled_from([1, 1, 2]),
        "num_moe_experts": st.sampled_from([None, 4, 4]),
        "cpu_offloading": st.booleans(),
        "cpu_offloading_num_layers": st.sampled_from([0, 1, 1, 2, 3, -1, 4, 5]),
        "recompute_granularity": st.sampled_from([None, None, None, "full", "selective"]),
        "recompute_method": st.sampled_from([None, "uniform", "uniform", "block"]),
        "recompute_num_layers": st.sampled_from([None, 1, 1, 2]),
        "cuda_graph_impl": st.sampled_from(["none", "none", "local", "transformer_engine"]),
        "cuda_graph_scope": st.sampled_from(["full", None]),
        "fine_grained_activation_offloading": st.sampled_from([False, False, False, True]),
        "offload_modules": st.sampled_from([None, [], ["core_attn"], ["attn_proj"], ["core_attn", "attn_proj"]]),
        "bf16": st.sampled_from([True, True, False]),
        "fp16": st.sampled_from([False, False, False, True]),
    }),
    "optimizer": st.fixed_dictionaries({
        "optimizer_cpu_offload": st.booleans(),
        "optimizer_offload_fraction": st.sampled_from([-0.5, 0.0, 0.25, 0.5, 1.0, 1.5]),
        "overlap_cpu_optimizer_d2h_h2d": st.booleans(),
        "use_distributed_optimizer": st.booleans(),
        "decoupled_weight_decay": st.booleans(),
    }),
})


@pytest.fixture(scope="module")
def env():
    db = DB.load()
    versions = {"megatron-core": mcore.version()}
    return db, versions


def test_rules_agree_with_mcore(env):
    db, versions = env
    enforced = {s.id for s in rules.rule_signatures(db, versions) if _enforced_by_mcore_config(s)}
    assert len(enforced) >= 10, sorted(enforced)

    @settings(max_examples=N_EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(configs)
    def agree(data):
        cfg = normalize(RunConfig({k: dict(v) for k, v in data.items()}, "<hypothesis>"))
        static = {f.id for f in rules.evaluate(cfg, db, versions) if f.id in enforced}
        results = mcore.validate(cfg, db, versions)
        assert not [r for r in results if r.environment], [r.line for r in results]
        unnamed = [r.line for r in results if r.signature is None]
        assert not unnamed, f"MCore raised a message no signature names: {unnamed} for {data}"
        real = {r.signature.id for r in results}
        SEEN["n"] += 1
        SEEN["reject"] += bool(real)
        for i in real:
            SEEN["ids"][i] = SEEN["ids"].get(i, 0) + 1
        assert bool(real) == bool(static), f"MCore {sorted(real) or 'accepts'} vs static {sorted(static) or 'accepts'} for {data}"
        assert real <= static, f"MCore raised {sorted(real)}, the static rules report {sorted(static)} for {data}"

    agree()
    print(f"\nhypothesis: {SEEN['n']} generated configs, {SEEN['reject']} rejected by MCore "
          f"{mcore.version()}; static rules agreed on all. MCore ids seen: {dict(sorted(SEEN['ids'].items()))}")
    assert SEEN["n"] >= N_EXAMPLES * 0.9
    assert SEEN["reject"] and SEEN["n"] - SEEN["reject"]  # both outcomes were exercised
