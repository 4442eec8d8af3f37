"""Config reading for release-day architectures: per-layer lists, per-layer-type RoPE,
sliding-window KV freed and kept, model types only transformers knows (counted from its own
meta-device build), and unknown model types (estimated, with what was assumed)."""

from __future__ import annotations

import pytest

from engine.architecture import AnalysisError, analyze_config, meta_bounds
from engine.architecture import meta_build as meta_build_module
from tests.engine.stages.realconfigs import load

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_NO_TOKEN_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def _transformers_model(config: dict, auto: str = "AutoModelForCausalLM"):
    """The model transformers builds from `config` on the meta device."""
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
    with torch.device("meta"):
        return getattr(transformers, auto).from_config(cfg)


def _param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _active_from_model(model, top_k: dict[int, int], experts: int, tied: bool) -> int:
    """Active params of a transformers model, computed from its own parameters: every
    parameter but the input embedding, routed experts scaled by top_k[layer] / experts."""
    active = 0
    embedding = model.get_input_embeddings().weight
    for name, p in model.named_parameters():
        if p is embedding:
            active += p.numel() if tied else 0
        elif ".experts." in name:
            layer = int(name.split(".layers.")[1].split(".")[0])
            active += p.numel() * top_k[layer] // experts
        else:
            active += p.numel()
    return active


# --- per-layer lists (Hunyuan-A13B's moe_topk: [8, 8, ...]) -----------------------------------


def _hunyuan_small(**change) -> dict:
    """HunYuanMoEV1Config's defaults, shrunk, with per-layer lists as Hunyuan-A13B writes them."""
    defaults = transformers.HunYuanMoEV1Config().to_dict()
    keep = ("hidden_act", "rms_norm_eps", "rope_parameters", "tie_word_embeddings")
    config = {k: defaults[k] for k in keep}
    config.update(
        model_type="hunyuan_v1_moe",
        architectures=["HunYuanMoEV1ForCausalLM"],
        hidden_size=64,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=128,
        max_position_embeddings=256,
        num_experts=4,
        moe_topk=[2, 1, 2, 1],
        moe_intermediate_size=[48, 48, 48, 48],
        num_shared_expert=[1, 1, 1, 1],
        use_qk_norm=True,
        use_mixed_mlp_moe=True,
        **_NO_TOKEN_IDS,
    )
    config.update(change)
    return config


def test_hunyuan_per_layer_top_k_counts_each_layer_with_its_own_top_k():
    config = _hunyuan_small()
    analysis = analyze_config(config)
    model = _transformers_model(config)
    assert analysis.params_source == "family table"
    assert analysis.total_params == _param_count(model)
    top_k = dict(enumerate(config["moe_topk"]))
    assert analysis.active_params == _active_from_model(model, top_k, 4, tied=False)
    moe = analysis.moe
    assert moe["experts_per_token"] == 2  # the largest; the per-layer list says the rest
    assert moe["per_layer"]["experts_per_token"] == [2, 1, 2, 1]
    assert any("experts_per_token vary between MoE layers" in n for n in analysis.notes)


def test_hunyuan_uniform_per_layer_lists_read_as_one_value():
    analysis = analyze_config(_hunyuan_small(moe_topk=[2, 2, 2, 2]))
    assert analysis.moe["experts_per_token"] == 2 and "per_layer" not in analysis.moe


def test_hunyuan_a13b_shape_is_analysed_not_refused():
    """Hunyuan-A13B-Instruct's published shape (config.json: 32 layers, hidden 4096, 64
    experts, moe_topk [8] x 32, one shared MLP, tied embeddings; model card: 80B total, 13B
    active). Before per-layer lists were read: `moe_topk must be an integer, got [8, 8, ...]`."""
    config = _hunyuan_small(
        hidden_size=4096,
        intermediate_size=3072,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128167,
        num_experts=64,
        moe_topk=[8] * 32,
        moe_intermediate_size=[3072] * 32,
        num_shared_expert=[1] * 32,
        tie_word_embeddings=True,
    )
    analysis = analyze_config(config)
    model = _transformers_model(config)
    assert analysis.total_params == _param_count(model)
    assert analysis.active_params == _active_from_model(
        model, dict.fromkeys(range(32), 8), 64, True
    )
    assert round(analysis.total_params / 1e9) == 80 and round(analysis.active_params / 1e9) == 13


def test_per_layer_list_of_the_wrong_length_names_the_key():
    with pytest.raises(
        AnalysisError, match=r"moe_topk must be an integer or a list of one .*\(4\)"
    ):
        analyze_config(_hunyuan_small(moe_topk=[2, 2]))


def test_per_layer_expert_counts_and_widths_for_a_table_family():
    """A Qwen3-MoE config whose expert count and width vary per layer: each layer's router,
    experts and active experts follow its own values."""
    config = {
        "model_type": "qwen3_moe",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 128,
        "tie_word_embeddings": False,
        "num_experts": [4, 8, 8],
        "num_experts_per_tok": [1, 2, 2],
        "moe_intermediate_size": [16, 24, 24],
    }
    analysis = analyze_config(config)
    h = 64
    attention = 64 * 64 + 2 * 32 * 64 + 64 * 64 + 2 * 16
    norms = 2 * h

    def moe(experts: int, width: int) -> int:
        return experts * h + experts * 3 * width * h

    total = 2 * 128 * h + h + 3 * (attention + norms) + moe(4, 16) + 2 * moe(8, 24)
    assert analysis.total_params == total
    active = 128 * h + h + 3 * (attention + norms) + 4 * h + 1 * 3 * 16 * h
    active += 2 * (8 * h + 2 * 3 * 24 * h)
    assert analysis.active_params == active
    assert analysis.moe["per_layer"]["num_experts"] == [4, 8, 8]


# --- per-layer-type RoPE (transformers v5 rope_parameters) ------------------------------------


def test_v5_rope_parameters_report_every_layer_type():
    """A Gemma 3 text config in transformers v5 form: one RoPE dict per layer type. Both
    entries are read, each with its own type, theta and factor, as transformers keeps them."""
    config = {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 128,
        "max_position_embeddings": 4096,
        "sliding_window": 512,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        **_NO_TOKEN_IDS,
    }
    rope = analyze_config(config).rope
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    expected = transformers.AutoConfig.for_model("gemma3_text", **kwargs).rope_parameters
    per_type = rope["per_layer_type"]
    assert per_type["full_attention"]["theta"] == expected["full_attention"]["rope_theta"]
    assert per_type["sliding_attention"]["theta"] == expected["sliding_attention"]["rope_theta"]
    assert per_type["full_attention"]["type"] == "linear"
    assert per_type["full_attention"]["factor"] == 8.0
    assert per_type["sliding_attention"] == {
        "type": "default",
        "factor": 1.0,
        "theta": 10_000.0,
        "layers": 5,
    }
    assert per_type["full_attention"]["layers"] == 1
    # The top-level fields stay the full-attention layers' (the long-context scaling).
    assert (rope["type"], rope["factor"], rope["theta"]) == ("linear", 8.0, 1_000_000.0)
    assert rope["local_theta"] == 10_000.0


def test_v4_gemma3_config_reports_the_sliding_layers_rope_too():
    from .test_architecture_cases import GEMMA3_4B

    per_type = analyze_config(GEMMA3_4B).rope["per_layer_type"]
    assert per_type["sliding_attention"]["theta"] == 10_000.0
    assert per_type["full_attention"]["theta"] == 1_000_000.0
    assert per_type["full_attention"]["type"] == "linear"
    assert per_type["sliding_attention"]["layers"] + per_type["full_attention"]["layers"] == 34


# --- sliding-window KV: freed and kept ----------------------------------------------------------


def test_gpt_oss_120b_kv_at_131072_tokens_freed_and_kept():
    """gpt-oss-120b: gpt-oss-20b's family with 36 layers (18 sliding(128) / 18 full, 8 KV
    heads of 64): 4,836,556,800 B freed, 9,663,676,416 B kept."""
    config = load("openai__gpt-oss-20b")
    config.update(
        num_hidden_layers=36,
        num_local_experts=128,
        layer_types=["sliding_attention", "full_attention"] * 18,
    )
    analysis = analyze_config(config)
    per_layer = 2 * 8 * 64 * 2
    assert analysis.kv_cache_bytes_at_max_context == 18 * per_layer * (131_072 + 128)
    assert analysis.kv_cache_bytes_at_max_context == 4_836_556_800
    assert analysis.kv_cache_bytes_at_max_context_kept == 9_663_676_416
    windowed = analysis.kv_cache_windowed
    assert windowed["tokens"] == 131_072
    assert (windowed["freed_bytes"], windowed["kept_bytes"]) == (4_836_556_800, 9_663_676_416)
    assert any("vLLM" in engine for engine in windowed["freed_by"])
    assert any("--disable-hybrid-kv-cache-manager" in e for e in windowed["kept_by"])
    assert any("--disable-hybrid-swa-memory" in e for e in windowed["kept_by"])


def test_model_without_sliding_layers_has_one_kv_figure():
    analysis = analyze_config(load("meta-llama__Llama-3.1-8B"))
    assert analysis.kv_cache_windowed is None
    assert analysis.kv_cache_bytes_at_max_context_kept == analysis.kv_cache_bytes_at_max_context


# --- model types only transformers knows: its own meta-device build -----------------------------


def _gemma4_text(**change) -> dict:
    config = {
        "model_type": "gemma4_text",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 256,
        "vocab_size_per_layer_input": 256,
        "hidden_size_per_layer_input": 8,
        "sliding_window": 32,
        "max_position_embeddings": 4096,
        **_NO_TOKEN_IDS,
    }
    config.update(change)
    return config


def test_gemma4_text_defaults_counted_as_transformers_builds_them():
    """Gemma4TextConfig's defaults (shrunk): per-layer input embeddings, per-layer head_dim
    (full-attention layers 512 wide), proportional RoPE on full layers only."""
    config = _gemma4_text()
    analysis = analyze_config(config)
    model = _transformers_model(config)
    expected = _param_count(model)
    assert analysis.params_source == "transformers meta-device build"
    assert analysis.family_known and not analysis.estimated
    assert abs(analysis.total_params - expected) <= 0.01 * expected
    assert analysis.total_params == expected
    tables = model.model.embed_tokens_per_layer.weight.numel()
    assert analysis.params_by_group["per_layer_embedding"] == tables
    assert analysis.embedding_params == tables + model.get_input_embeddings().weight.numel()
    # KV per token from each layer's own k_proj: 5 sliding layers of 2 x 2 x 16, one full
    # layer of 2 x 2 x 512 (Gemma4TextConfig's global head_dim), bf16.
    k_widths = [model.model.layers[i].self_attn.k_proj.out_features for i in range(6)]
    assert analysis.kv_cache_bytes_per_token == sum(2 * w * 2 for w in k_widths)
    rope = analysis.rope["per_layer_type"]
    assert rope["full_attention"]["type"] == "proportional"
    assert rope["full_attention"]["partial_rotary_factor"] == 0.25
    assert rope["sliding_attention"]["theta"] == 10_000.0


def test_gemma4_layers_that_reuse_kv_keep_none():
    types = ["sliding_attention", "full_attention"] * 3
    config = _gemma4_text(num_kv_shared_layers=2, layer_types=types)
    analysis = analyze_config(config)
    model = _transformers_model(config)
    assert analysis.total_params == _param_count(model)
    own = [
        layer.self_attn.k_proj.out_features
        for layer in model.model.layers
        if not layer.self_attn.is_kv_shared_layer
    ]
    assert len(own) == 4
    assert analysis.kv_cache_bytes_per_token == sum(2 * w * 2 for w in own)


def _deepseek_v4_small() -> dict:
    return {
        "model_type": "deepseek_v4",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "vocab_size": 256,
        "moe_intermediate_size": 32,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "head_dim": 32,
        "q_lora_rank": 32,
        "o_lora_rank": 32,
        "o_groups": 2,
        "index_n_heads": 4,
        "index_head_dim": 16,
        "index_topk": 8,
        "qk_rope_head_dim": 8,
        "sliding_window": 16,
        "max_position_embeddings": 4096,
        **_NO_TOKEN_IDS,
    }


def test_deepseek_v4_defaults_counted_as_transformers_builds_them():
    """DeepseekV4Config's defaults (shrunk): hash-routed and learned-router MoE layers,
    compressed attention, hyper-connections; the MTP module transformers does not build is
    estimated apart."""
    config = _deepseek_v4_small()
    analysis = analyze_config(config)
    model = _transformers_model(config)
    expected = _param_count(model)
    assert analysis.params_source == "transformers meta-device build"
    assert abs(analysis.total_params - expected) <= 0.01 * expected
    assert analysis.total_params == expected
    assert analysis.active_params == _active_from_model(model, dict.fromkeys(range(4), 2), 8, False)
    assert analysis.moe["moe_layers"] == 4  # hash_moe and moe layers are both routed
    assert analysis.mtp_layers == 1 and analysis.extra_params > 0
    assert any("hash_moe" in n for n in analysis.notes)
    assert sum(analysis.params_by_group.values()) == expected


def test_multimodal_wrapper_towers_are_counted_apart():
    """A transformers-only multimodal wrapper (GLM-5-Next: vision tower + text model) is built
    whole: the towers land in multimodal_tower_params, the language model in total_params."""
    text = {
        "hidden_size": 64,
        "intermediate_size": 96,
        "moe_intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 256,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "max_position_embeddings": 4096,
        **_NO_TOKEN_IDS,
    }
    defaults = transformers.CONFIG_MAPPING["glm5_next"]().to_dict()
    text = {**{k: v for k, v in defaults["text_config"].items() if k.endswith("head_dim")}, **text}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2}
    config = {
        "model_type": "glm5_next",
        "architectures": ["Glm5NextForConditionalGeneration"],
        "text_config": text,
        "vision_config": {**vision, "out_hidden_size": 64},
    }
    analysis = analyze_config(config)
    model = _transformers_model(config, "AutoModelForImageTextToText")
    assert analysis.params_source == "transformers meta-device build"
    assert analysis.multimodal_tower_params > 0
    assert analysis.total_params + analysis.multimodal_tower_params == _param_count(model)


def test_meta_build_past_its_bound_falls_back_to_an_estimate(monkeypatch):
    monkeypatch.setattr(meta_bounds, "MAX_MODULES", 5)
    meta_build_module._meta_build.cache_clear()
    try:
        analysis = analyze_config(_gemma4_text(num_hidden_layers=5))
    finally:
        meta_build_module._meta_build.cache_clear()
    assert analysis.estimated and analysis.params_source == "estimated"
    assert any("registers over 5 modules" in n for n in analysis.notes)
    assert analysis.assumptions


def test_meta_build_never_runs_remote_code():
    """`auto_map` (a release's own classes) is dropped before transformers sees the config."""
    config = _gemma4_text(auto_map={"AutoModelForCausalLM": "evil.EvilModel"})
    analysis = analyze_config(config)
    assert analysis.params_source == "transformers meta-device build"
    assert analysis.total_params == _param_count(_transformers_model(_gemma4_text()))


# --- unknown model types: estimated, with the assumptions ---------------------------------------


def test_unknown_model_type_is_estimated_with_its_assumptions():
    config = {
        "model_type": "zephyrine",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
    }
    analysis = analyze_config(config)
    assert analysis.estimated and analysis.params_source == "estimated"
    assert not analysis.family_known
    assumed = " | ".join(analysis.assumptions)
    for text in (
        "gated MLP",
        "num_key_value_heads absent",
        "head_dim absent",
        "tie_word_embeddings absent: tied",
        "attention_bias absent",
        "mlp_bias absent",
    ):
        assert text in assumed
    per_layer = 4 * 1024 * 1024 + 3 * 1024 * 4096 + 2 * 1024  # MHA, gated MLP, two norms
    assert analysis.total_params == 4 * per_layer + 1000 * 1024 + 1024  # tied LM head
    assert analysis.to_dict()["estimated"] is True


def test_unknown_moe_without_a_top_k_key_is_estimated_not_refused():
    config = {
        "model_type": "zephyrine_moe",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "num_experts": 4,
        "moe_intermediate_size": 32,
        "tie_word_embeddings": False,
    }
    analysis = analyze_config(config)
    assert analysis.estimated
    assert analysis.moe["experts_per_token"] == 4
    assert any("every expert counted active" in a for a in analysis.assumptions)
    assert any("every layer is an MoE layer" in a for a in analysis.assumptions)
    router_and_experts = 2 * (4 * 64 + 4 * 3 * 32 * 64)
    attention = 64 * 64 * 2 + 2 * 32 * 64
    assert (
        analysis.total_params == 2 * (attention + 2 * 64) + router_and_experts + 2 * 100 * 64 + 64
    )


# --- MiniMax-M1: its own model_type, transformers' MiniMax architecture ------------------------

# MiniMaxAI/MiniMax-M1's config.json as published (model_type minimax_m1, its own classes via
# auto_map; a softmax-attention layer after every 7 lightning-attention layers). Model card:
# 456B total parameters.
MINIMAX_M1 = {
    "architectures": ["MiniMaxM1ForCausalLM"],
    "attn_type_list": ([0] * 7 + [1]) * 10,
    "auto_map": {"AutoConfig": "configuration_minimax_m1.MiniMaxM1Config"},
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 6144,
    "intermediate_size": 9216,
    "max_position_embeddings": 10240000,
    "model_type": "minimax_m1",
    "num_attention_heads": 64,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000000,
    "rotary_dim": 64,
    "shared_intermediate_size": 0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "vocab_size": 200064,
    **_NO_TOKEN_IDS,
}


def test_minimax_m1_reads_attn_type_list_as_transformers_minimax_does():
    analysis = analyze_config(MINIMAX_M1)
    assert analysis.family == "minimax" and analysis.params_source == "family table"
    assert analysis.attention["linear_attention_layers"] == 70
    assert analysis.attention["full_layers"] == 10
    drop = ("model_type", "auto_map", "attn_type_list", "architectures")
    converted = {k: v for k, v in MINIMAX_M1.items() if k not in drop}
    converted["layer_types"] = [
        "full_attention" if t else "linear_attention" for t in MINIMAX_M1["attn_type_list"]
    ]
    model = _transformers_model({**converted, "model_type": "minimax"})
    assert analysis.total_params == _param_count(model) == 456_089_655_296
    # K/V only on the 10 softmax layers: 2 x 8 heads x 128 x 2 B each.
    assert analysis.kv_cache_bytes_per_token == 10 * 2 * 8 * 128 * 2


# --- per-layer FFN widths, wrappers transformers cannot build, MoE keys it reads its own way ----


def test_per_layer_intermediate_sizes_count_each_layer_at_its_width():
    config = {
        "model_type": "zephyrine",
        "hidden_size": 64,
        "intermediate_size": [96, 64, 96],
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 100,
        "tie_word_embeddings": False,
    }
    analysis = analyze_config(config)
    per_layer = 4 * 64 * 64 + 2 * 64
    mlps = 3 * 64 * (96 + 64 + 96)
    assert analysis.total_params == 3 * per_layer + mlps + 2 * 100 * 64 + 64
    assert analysis.intermediate_size == 96


def test_wrapper_without_its_tower_library_counts_the_text_model():
    """Gemma 3n's wrapper needs timm (and PIL) for its vision tower; when transformers cannot
    build it the text model is built alone. Either way total_params is the text model's, and
    its KV-sharing layers (num_kv_shared_layers) hold no KV of their own."""
    config = {
        "model_type": "gemma3n",
        "architectures": ["Gemma3nForConditionalGeneration"],
        "text_config": {"model_type": "gemma3n_text"},
    }
    analysis = analyze_config(config)
    text = _transformers_model({"model_type": "gemma3n_text"})
    assert analysis.params_source == "transformers meta-device build"
    assert analysis.total_params == _param_count(text)
    own = [
        layer.self_attn.k_proj.out_features
        for layer in text.model.layers
        if not layer.self_attn.is_kv_shared_layer
    ]
    assert len(own) < len(text.model.layers)
    assert analysis.kv_cache_bytes_per_token == sum(2 * w * 2 for w in own)


def test_moe_keys_transformers_reads_its_own_way_do_not_stop_the_count():
    """ERNIE-4.5-VL lists moe_intermediate_size per modality ([text, vision]), not per layer:
    the MoE summary is skipped with a note, the count is transformers' own."""
    analysis = analyze_config({"model_type": "ernie4_5_vl_moe"})
    model = _transformers_model({"model_type": "ernie4_5_vl_moe"}, "AutoModelForImageTextToText")
    assert analysis.moe is None and any("MoE keys not read" in n for n in analysis.notes)
    assert analysis.total_params + analysis.multimodal_tower_params == _param_count(model)
    assert analysis.multimodal_tower_params > 0
