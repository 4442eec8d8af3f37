"""Scaled twins of the real configs keep their structural invariants (no Django)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from engine.contract import StageFailed
from engine.twin import PROMPT_TOKENS, build_twin, shrink
from engine.twin.shrink import TWIN_MAX_PARAMETERS
from tests.engine.stages.realconfigs import REALCONFIGS_DIR, load

# Builds and runs scaled twins with torch: left out of `make test-fast`.
pytestmark = pytest.mark.slow

# Every real config on disk: a new file is covered without editing this list.
CONFIGS = tuple(sorted(path.stem for path in REALCONFIGS_DIR.glob("*.json")))


@pytest.fixture(scope="module")
def twins(seeded_twin):
    return {name: seeded_twin(name) for name in CONFIGS}


def falcon_40b() -> dict:
    """Falcon-40B's shape in Falcon's own spelling (num_kv_heads, ffn_hidden_size), as its
    config.json holds it: transformers 5.25+ also writes the derived `num_key_value_heads`
    in `to_dict()`, which a Falcon checkpoint's config does not carry."""
    config = transformers.FalconConfig(
        hidden_size=8192,
        num_attention_heads=128,
        num_kv_heads=8,
        new_decoder_architecture=True,
        num_hidden_layers=60,
        ffn_hidden_size=32768,
    ).to_dict() | {"architectures": ["FalconForCausalLM"]}
    config.pop("num_key_value_heads", None)
    return config


def sizes(twin) -> dict:
    return {s["key"]: (s["original"], s["twin"]) for s in twin.description["sizes"]}


@pytest.mark.parametrize("name", CONFIGS)
def test_every_invariant_is_kept_and_the_description_is_json(twins, name):
    twin = twins[name]
    broken = [i for i in twin.description["invariants"] if not i["kept"]]
    assert broken == []
    json.dumps(twin.description, allow_nan=False)
    assert twin.description["code_source"] == "transformers"
    assert 2 <= twin.config.num_hidden_layers <= 6
    assert 64 <= twin.config.hidden_size <= 256
    assert twin.config.vocab_size == 512
    assert not twin.model.training
    assert twin.input_ids.shape == (2, PROMPT_TOKENS)
    assert int(twin.input_ids.max()) < twin.config.vocab_size


def test_llama_keeps_the_gqa_ratio_and_llama3_rope(twins):
    cfg = twins["meta-llama__Llama-3.1-8B"].config
    assert cfg.num_attention_heads // cfg.num_key_value_heads == 32 // 8
    assert cfg.num_key_value_heads == 2
    assert cfg.rope_parameters["rope_type"] == "llama3"
    assert cfg.rope_parameters["factor"] == 8.0
    assert sizes(twins["meta-llama__Llama-3.1-8B"])["num_hidden_layers"] == (32, 4)


def test_qwen3_moe_keeps_top8_and_a_gqa_ratio_of_16(twins):
    twin = twins["Qwen__Qwen3-235B-A22B-Instruct-2507"]
    cfg = twin.config
    assert cfg.num_attention_heads // cfg.num_key_value_heads == 16
    assert cfg.num_experts_per_tok == 8
    assert cfg.num_experts == 16 and cfg.num_experts_per_tok <= cfg.num_experts
    assert all(hasattr(layer.mlp, "experts") for layer in twin.model.model.layers)
    assert cfg.norm_topk_prob is True


def test_deepseek_v3_keeps_mla_dense_first_and_grouped_topk(twins):
    twin = twins["deepseek-ai__DeepSeek-V3"]
    cfg = twin.config
    layers = twin.model.model.layers
    assert not hasattr(layers[0].mlp, "experts")  # dense before MoE
    assert all(hasattr(layer.mlp, "experts") for layer in layers[1:])
    assert cfg.first_k_dense_replace == 1
    assert cfg.n_routed_experts % cfg.n_group == 0
    assert cfg.topk_group <= cfg.n_group == 8
    assert cfg.num_experts_per_tok == 8 <= cfg.topk_group * (cfg.n_routed_experts // cfg.n_group)
    assert cfg.n_shared_experts == 1
    assert cfg.scoring_func == "sigmoid" and cfg.topk_method == "noaux_tc"
    assert cfg.routed_scaling_factor == 2.5
    assert (cfg.q_lora_rank, cfg.kv_lora_rank) == (24, 8)  # 1536 : 512 = 3 : 1 kept
    assert hasattr(layers[0].self_attn, "kv_a_proj_with_mqa")
    assert cfg.rope_parameters["rope_type"] == "yarn"
    dropped = {d["key"] for d in twin.description["dropped"]}
    assert {"quantization_config", "auto_map", "num_nextn_predict_layers"} <= dropped


def test_kimi_k2_is_built_with_the_class_its_architectures_name(twins):
    twin = twins["moonshotai__Kimi-K2-Instruct"]
    assert twin.description["class"] == "DeepseekV3ForCausalLM"
    assert any("kimi_k2" in note for note in twin.description["notes"])
    assert sizes(twin)["n_routed_experts"] == (384, 16)
    assert twin.config.n_group == 1


def test_gpt_oss_keeps_alternating_sliding_layers_and_sinks(twins):
    twin = twins["openai__gpt-oss-20b"]
    cfg = twin.config
    assert cfg.layer_types == ["sliding_attention", "full_attention"] * 2
    assert cfg.sliding_window < PROMPT_TOKENS
    assert all(
        layer.self_attn.sinks.numel() == cfg.num_attention_heads
        for layer in twin.model.model.layers
    )
    assert cfg.num_experts_per_tok == 4 <= cfg.num_local_experts
    assert cfg.attention_bias is True


def test_the_realconfig_list_is_the_directory():
    assert len(CONFIGS) >= 6 and "openai__gpt-oss-20b" in CONFIGS


def test_falcon_sizes_are_shrunk_under_their_own_names():
    twin = build_twin(falcon_40b())
    cfg = twin.config
    assert sizes(twin)["ffn_hidden_size"] == (32768, cfg.ffn_hidden_size)
    assert cfg.ffn_hidden_size == 4 * cfg.hidden_size  # the 4x ratio kept
    assert sizes(twin)["num_kv_heads"] == (8, 2)
    assert cfg.num_attention_heads // cfg.num_kv_heads == 128 // 8  # GQA ratio of the model
    attn = twin.model.transformer.h[0].self_attention
    assert attn.num_kv_heads == 2
    assert twin.description["parameters"] < TWIN_MAX_PARAMETERS
    assert [i for i in twin.description["invariants"] if not i["kept"]] == []


def test_opt_sizes_are_shrunk_under_their_own_names():
    config = transformers.OPTConfig(
        hidden_size=9216,
        ffn_dim=36864,
        num_hidden_layers=64,
        num_attention_heads=72,
        word_embed_proj_dim=9216,
    ).to_dict() | {"architectures": ["OPTForCausalLM"]}
    twin = build_twin(config)
    assert twin.config.word_embed_proj_dim == twin.config.hidden_size
    assert sizes(twin)["ffn_dim"] == (36864, twin.config.ffn_dim)
    assert twin.description["parameters"] < 1_000_000


def test_invariants_are_checked_on_the_built_config(monkeypatch):
    """Without the alias table the shrink writes `num_key_value_heads`, which Falcon never
    reads: the built model keeps 8 K/V heads, and the invariant says so."""
    monkeypatch.setattr(shrink, "KEY_ALIASES", {})
    monkeypatch.setattr("engine.twin.build.TWIN_MAX_PARAMETERS", 10**9)
    twin = build_twin(falcon_40b())
    broken = {i["name"]: i for i in twin.description["invariants"] if not i["kept"]}
    assert broken["GQA group ratio (query heads per K/V head)"]["twin"] == 32 // 8
    assert any(
        "ignores keys the shrink set: num_key_value_heads" in n for n in twin.description["notes"]
    )


def test_a_twin_over_the_parameter_cap_is_refused_naming_the_keys(monkeypatch):
    # the shrink of a day-0 release whose width key it does not know, simulated for Falcon
    monkeypatch.setattr(shrink, "KEY_ALIASES", {})
    with pytest.raises(StageFailed) as err:
        build_twin(falcon_40b())
    assert "would have 137,110,528 parameters, over the cap of 20,000,000" in err.value.reason
    assert "config keys left at their release size: ffn_hidden_size=32768" in err.value.reason


def test_an_unknown_width_key_is_refused_not_run_huge():
    config = transformers.Qwen3NextConfig(linear_value_head_dim=2048).to_dict() | {
        "architectures": ["Qwen3NextForCausalLM"]
    }
    with pytest.raises(StageFailed, match=r"over the cap .*linear_value_head_dim=2048"):
        build_twin(config)


def test_building_a_twin_leaves_the_global_rng_alone():
    config = load("meta-llama__Llama-3.1-8B")
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_twin(config, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_seeded_weights_repeat_and_another_seed_differs():
    config = load("meta-llama__Llama-3.1-8B")
    a, b, c = build_twin(config), build_twin(config), build_twin(config, seed=1)
    wa, wb, wc = (t.model.model.layers[1].mlp.up_proj.weight for t in (a, b, c))
    assert torch.equal(wa, wb)
    assert not torch.equal(wa, wc)
    assert torch.equal(a.input_ids, b.input_ids)


def test_a_config_transformers_rejects_fails_naming_the_error():
    config = dict(load("meta-llama__Llama-3.1-8B"), initializer_range=50.0)
    with pytest.raises(
        StageFailed, match=r"transformers rejects the config for LlamaConfig.*initializer_range"
    ):
        build_twin(config)


def test_an_architecture_transformers_lacks_needs_allowed_remote_code():
    config = dict(
        load("meta-llama__Llama-3.1-8B"),
        model_type="day0tiny",
        architectures=["Day0TinyForCausalLM"],
        auto_map={"AutoModelForCausalLM": "modeling_day0tiny.Day0TinyForCausalLM"},
    )
    with pytest.raises(StageFailed) as err:
        build_twin(config, org="acme")
    assert "transformers has no Day0TinyForCausalLM" in err.value.reason
    assert "not allowed for org acme (trust_remote_code is off)" in err.value.reason


def test_an_unknown_rope_type_is_noted_by_analysis_and_refused_by_the_twin_naming_it():
    """transformers builds the rotary embedding from ROPE_INIT_FUNCTIONS[rope_type]: a type
    outside it cannot run in its classes (modeling_rope_utils.py)."""
    from engine.architecture import analyze_config

    config = load("meta-llama__Llama-3.1-8B")
    config["rope_scaling"] = dict(config["rope_scaling"], rope_type="ntk-by-parts-v9")
    notes = analyze_config(config).to_dict()["notes"]
    assert any("'ntk-by-parts-v9' is not a RoPE type transformers implements" in n for n in notes)
    with pytest.raises(StageFailed, match=r"RoPE type 'ntk-by-parts-v9' .* LlamaForCausalLM"):
        build_twin(config)
