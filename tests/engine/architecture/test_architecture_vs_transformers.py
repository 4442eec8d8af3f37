"""Parameter totals against transformers itself: models built on the meta device (no memory)."""

from __future__ import annotations

import pytest

from engine.architecture import analyze_config
from tests.engine.stages.realconfigs import load

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Keys that make transformers quantize or load remote code; irrelevant to the shapes.
_DROP = ("quantization_config", "auto_map")


def meta_param_count(config: dict, model_type: str | None = None) -> int:
    """Sum of numel over the parameters of the model transformers builds from `config`."""
    kwargs = {k: v for k, v in config.items() if k not in _DROP and k != "model_type"}
    cfg = transformers.AutoConfig.for_model(model_type or config["model_type"], **kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "model_type"),
    [
        ("meta-llama__Llama-3.1-8B", None),
        ("Qwen__Qwen2.5-72B-Instruct", None),
        ("Qwen__Qwen3-235B-A22B-Instruct-2507", None),
        ("openai__gpt-oss-20b", None),
        ("deepseek-ai__DeepSeek-V3", None),
        # kimi_k2 is not a transformers model_type; its architectures entry is DeepseekV3.
        ("moonshotai__Kimi-K2-Instruct", "deepseek_v3"),
    ],
)
def test_real_config_total_equals_transformers(name, model_type):
    config = load(name)
    assert analyze_config(config).total_params == meta_param_count(config, model_type)


def test_mixtral_total_equals_transformers():
    from .test_architecture_cases import MIXTRAL_8X7B

    assert analyze_config(MIXTRAL_8X7B).total_params == meta_param_count(MIXTRAL_8X7B)


def test_gemma3_text_config_total_equals_transformers():
    from .test_architecture_cases import GEMMA3_4B

    text = dict(GEMMA3_4B["text_config"])
    assert analyze_config(GEMMA3_4B).total_params == meta_param_count(text)


# Small shapes that switch on each family's particular modules (biases, q/k norms, MLA without
# q_lora, shared experts with a gate, mlp_only layers, output gates, Mamba mixers...).
_SMALL = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "pad_token_id": None,
    "bos_token_id": None,
    "eos_token_id": None,
}
_MLA = {"kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8}
# Gated DeltaNet heads for the Qwen3-Next/Qwen3.5 hybrids.
_GDN = {
    "head_dim": 16,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
}
_FAMILY_CASES = {
    "llama": {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
    "mistral": {},
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen2": {},
    "qwen2_moe": {
        "num_experts": 8,
        "moe_intermediate_size": 24,
        "shared_expert_intermediate_size": 48,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
    },
    "qwen3": {},
    "qwen3_moe": {"num_experts": 8, "moe_intermediate_size": 24, "num_experts_per_tok": 2},
    "qwen3_next": {
        "num_experts": 8,
        "moe_intermediate_size": 24,
        "shared_expert_intermediate_size": 48,
        "num_experts_per_tok": 2,
        "head_dim": 16,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
    },
    "deepseek_v2": {
        **_MLA,
        "q_lora_rank": None,
        "n_routed_experts": 8,
        "moe_intermediate_size": 24,
        "first_k_dense_replace": 1,
        "num_experts_per_tok": 2,
        "n_shared_experts": 2,
    },
    "deepseek_v3": {
        **_MLA,
        "q_lora_rank": 32,
        "n_routed_experts": 8,
        "moe_intermediate_size": 24,
        "first_k_dense_replace": 1,
        "n_group": 2,
        "topk_group": 1,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "num_nextn_predict_layers": 1,
    },
    "gpt_oss": {"num_local_experts": 8, "num_experts_per_tok": 2, "head_dim": 16},
    "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 16},
    "gemma3_text": {"head_dim": 16},
    "phi3": {},
    "glm4_moe": {
        "n_routed_experts": 8,
        "moe_intermediate_size": 24,
        "first_k_dense_replace": 1,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "use_qk_norm": True,
        "attention_bias": True,
        "head_dim": 16,
    },
    "granite": {},
    "granitemoe": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "olmo": {},
    "olmo2": {},
    "llama4_text": {
        "num_local_experts": 4,
        "intermediate_size_mlp": 80,
        "interleave_moe_layer_step": 2,
        "head_dim": 16,
        "num_experts_per_tok": 1,
    },
    "jamba": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "mamba_d_state": 8,
    },
}


@pytest.mark.parametrize("model_type", sorted(_FAMILY_CASES))
def test_family_modules_match_transformers(model_type):
    config = {**_SMALL, **_FAMILY_CASES[model_type], "model_type": model_type}
    assert analyze_config(config).total_params == meta_param_count(config)


# Model types transformers ships that release-day configs are likely to use. Each case sets the
# family's own spellings of the MoE keys (small sizes) and leaves the rest to the family's
# defaults, so the engine's defaults, aliases, biases and norms are all held to transformers.
_RELEASE_DAY_CASES = {
    "ernie4_5": {"use_bias": True},
    "ernie4_5_moe": {
        "moe_num_experts": 8,
        "moe_k": 2,
        "moe_intermediate_size": 24,
        "moe_num_shared_experts": 1,
        "moe_layer_start_index": 1,
        "moe_layer_end_index": 2,
        "moe_layer_interval": 1,
        "use_bias": True,
    },
    "hunyuan_v1_dense": {
        "head_dim": 16,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0},
    },
    "hunyuan_v1_moe": {
        "head_dim": 16,
        "num_experts": 4,
        "moe_topk": 2,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0},
    },
    "minimax_m2": {"num_local_experts": 8, "num_experts_per_tok": 2, "head_dim": 16},
    "dots1": {
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_intermediate_size": 24,
    },
    "bailing_moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 24},
    "bailing_moe_v2": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 24},
    "seed_oss": {"attention_out_bias": True, "head_dim": 16},
    "apertus": {},
    "olmo3": {},
    "granitemoe": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "exaone4": {"sliding_window": 64},
    "smollm3": {},
    # MLA + DeepSeek Sparse Attention indexer (wq_b, wk, k_norm with bias, weights_proj).
    "deepseek_v32": {
        **_MLA,
        "q_lora_rank": 32,
        "n_routed_experts": 8,
        "moe_intermediate_size": 24,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "index_n_heads": 2,
        "index_head_dim": 16,
        "index_topk": 8,
    },
    "glm4_moe_lite": {
        **_MLA,
        "q_lora_rank": 32,
        "n_routed_experts": 8,
        "moe_intermediate_size": 24,
        "num_experts_per_tok": 2,
        "mlp_layer_types": ["dense", "sparse", "dense", "sparse"],
    },
    "glm": {},
    "glm4": {},
    "qwen3_5_text": {**_GDN},
    "qwen3_5_moe_text": {
        **_GDN,
        "num_experts": 8,
        "moe_intermediate_size": 24,
        "shared_expert_intermediate_size": 48,
        "num_experts_per_tok": 2,
    },
    # Kimi Delta Attention on the kda_layers, NoPE MLA on the full_attn_layers (1-indexed, as
    # the checkpoint's linear_attn_config lists them).
    "kimi_linear": {
        **_MLA,
        "num_hidden_layers": 6,
        "num_experts": 8,
        "moe_intermediate_size": 24,
        "num_experts_per_token": 2,
        "num_shared_experts": 1,
        "linear_attn_config": {
            "full_attn_layers": [3, 6],
            "kda_layers": [1, 2, 4, 5],
            "num_heads": 4,
            "head_dim": 8,
            "short_conv_kernel_size": 4,
        },
    },
    "minimax": {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 16},
    "cohere": {"use_qk_norm": True},
    "cohere2": {"sliding_window": 64, "head_dim": 16},
    "arcee": {"mlp_bias": True},
    "ministral3": {"head_dim": 16},
    "olmoe": {"num_experts": 8, "num_experts_per_tok": 2},
    "flex_olmo": {"num_experts": 4, "num_experts_per_tok": 2},
    "solar_open": {
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 24,
        "head_dim": 16,
    },
    "exaone_moe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 24,
        "num_shared_experts": 2,
        "sliding_window": 64,
    },
}


@pytest.mark.parametrize("model_type", sorted(_RELEASE_DAY_CASES))
def test_release_day_family_total_equals_transformers(model_type):
    if model_type not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no model_type {model_type!r}")
    config = {**_SMALL, **_RELEASE_DAY_CASES[model_type], "model_type": model_type}
    analysis = analyze_config(config)
    assert analysis.family == model_type and analysis.family_known
    assert analysis.total_params == meta_param_count(config)


def _cache_bytes_per_token(config: dict, tokens: int = 5) -> int:
    """bf16 bytes per token of transformers' own KV cache after a forward pass of `tokens`
    tokens through a tiny randomly initialised model (fewer tokens than any sliding window)."""
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        cache = model(torch.arange(tokens)[None], use_cache=True).past_key_values
    elements = 0
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                elements += t.numel()
    return elements * 2 // tokens


@pytest.mark.parametrize(
    "model_type", ["qwen3_5_text", "qwen3_5_moe_text", "minimax", "cohere2", "exaone_moe", "glm4"]
)
def test_release_day_kv_bytes_per_token_equal_transformers_cache(model_type):
    """KV bytes/token against the cache transformers fills: only full/sliding attention layers
    hold K/V (the Gated DeltaNet and lightning-attention layers of the hybrids hold none)."""
    config = {**_SMALL, **_RELEASE_DAY_CASES[model_type], "model_type": model_type}
    assert analyze_config(config).kv_cache_bytes_per_token == _cache_bytes_per_token(config)


def test_deepseek_v32_indexer_kv_and_layout():
    """DeepSeek-V3.2: the MLA latent and RoPE key plus the indexer's one key of
    index_head_dim per token and layer (transformers DynamicIndexedLayer.indexer_keys)."""
    config = {**_SMALL, **_RELEASE_DAY_CASES["deepseek_v32"], "model_type": "deepseek_v32"}
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model("deepseek_v32", **kwargs)
    analysis = analyze_config(config)
    per_layer = cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.index_head_dim
    assert analysis.kv_cache_bytes_per_token == 2 * per_layer * cfg.num_hidden_layers
    attention = analysis.attention
    assert attention["kind"] == "MLA" and attention["index_head_dim"] == 16
    assert attention["index_n_heads"] == 2 and attention["index_topk"] == 8
    assert analysis.moe["dense_layer_indices"] == [0, 1, 2]  # first_k_dense_replace default 3


def test_kimi_linear_layout_reads_linear_attn_config():
    config = {**_SMALL, **_RELEASE_DAY_CASES["kimi_linear"], "model_type": "kimi_linear"}
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model("kimi_linear", **kwargs)
    analysis = analyze_config(config)
    assert analysis.attention["layer_types"] == list(cfg.layer_types)
    assert analysis.attention["kv_cache_layers"] == 2 and analysis.attention["kind"] == "MLA"
    # MLA latent + RoPE key on the two full-attention layers only.
    assert analysis.kv_cache_bytes_per_token == 2 * 2 * (16 + 4)
    assert analysis.moe["experts_per_token"] == 2 and analysis.moe["num_shared_experts"] == 1
    assert analysis.moe["dense_layer_indices"] == [0]


@pytest.mark.parametrize("model_type", ["kimi_linear", "minimax", "qwen3_5_text"])
def test_hybrid_default_layer_types_equal_transformers(model_type):
    """Without layer_types, each hybrid places its linear-attention layers as its config
    class does."""
    case = {k: v for k, v in _RELEASE_DAY_CASES[model_type].items() if k != "linear_attn_config"}
    config = {**_SMALL, **case, "num_hidden_layers": 9, "model_type": model_type}
    if model_type == "kimi_linear":
        config.update(linear_num_heads=4, linear_head_dim=8)
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model(model_type, **kwargs)
    analysis = analyze_config(config)
    assert analysis.attention["layer_types"] == list(cfg.layer_types)
    assert analysis.total_params == meta_param_count(config)


def _vl_text_param_count(config: dict) -> int:
    """Params of the language model and LM head of a transformers VLM built on meta."""
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(cfg)
    return sum(
        p.numel()
        for name, p in model.named_parameters()
        if name.startswith(("model.language_model.", "lm_head."))
    )


_SMALL_VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2}


@pytest.mark.parametrize(
    ("wrapper", "text_type", "moe"),
    [
        ("qwen3_vl", "qwen3_vl_text", {}),
        (
            "qwen3_vl_moe",
            "qwen3_vl_moe_text",
            {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 24},
        ),
        # Qwen3.5: the hybrid Gated DeltaNet text model inside the multimodal wrapper.
        ("qwen3_5", "qwen3_5_text", _GDN),
        ("qwen3_5_moe", "qwen3_5_moe_text", _RELEASE_DAY_CASES["qwen3_5_moe_text"]),
    ],
)
@pytest.mark.parametrize("tie", [False, None])
def test_qwen3_vl_text_model_equals_transformers(wrapper, text_type, moe, tie):
    """Qwen3-VL(-MoE), Qwen3.5(-MoE): the text model (q/k norms, fused experts, linear
    attention) plus the wrapper's LM head, tied or not as the wrapper says (default untied)."""
    text = {**_SMALL, "head_dim": 16, **moe, "model_type": text_type}
    classes = {
        "qwen3_vl": "Qwen3VLForConditionalGeneration",
        "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
        "qwen3_5": "Qwen3_5ForConditionalGeneration",
        "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    }
    config = {
        "model_type": wrapper,
        "architectures": [classes[wrapper]],
        "text_config": text,
        "vision_config": {**_SMALL_VISION, "out_hidden_size": _SMALL["hidden_size"]},
    }
    if tie is not None:
        config["tie_word_embeddings"] = tie
    analysis = analyze_config(config)
    assert analysis.family == text_type
    assert analysis.total_params == _vl_text_param_count(config)


def test_qwen3_next_mtp_block_equals_transformers_decoder_layer():
    """Qwen3-Next's MTP block (`mtp_num_hidden_layers`): one full-attention decoder layer with
    the sparse-MoE block, as transformers' Qwen3NextDecoderLayer builds it, plus `mtp.fc`
    (hidden x 2*hidden) and three hidden-size norms (vLLM qwen3_next_mtp.py); no embedding."""
    from transformers.models.qwen3_next import modeling_qwen3_next

    config = {
        **_SMALL,
        **_FAMILY_CASES["qwen3_next"],
        "model_type": "qwen3_next",
        "mtp_num_hidden_layers": 1,
        "torch_dtype": "bfloat16",
    }
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model("qwen3_next", **kwargs)
    full_layer = cfg.layer_types.index("full_attention")
    with torch.device("meta"):
        layer = modeling_qwen3_next.Qwen3NextDecoderLayer(cfg, layer_idx=full_layer)
    h = config["hidden_size"]
    expected = sum(p.numel() for p in layer.parameters()) + 2 * h * h + 3 * h
    analysis = analyze_config(config)
    assert analysis.mtp_layers == 1
    assert analysis.extra_params == expected
    assert analysis.total_params == meta_param_count(config)  # MTP stays out of the total
    assert analysis.weight_bytes == 2 * (analysis.total_params + expected)
    assert any("mtp.*" in note for note in analysis.notes)


def test_qwen3_next_80b_mtp_params_equal_transformers_layer():
    """Qwen/Qwen3-Next-80B-A3B-Instruct's config (a copy written from memory): the
    MTP block adds one 512-expert decoder layer, fc and norms to the checkpoint; the expected
    value is transformers' own decoder layer at that size."""
    from transformers.models.qwen3_next import modeling_qwen3_next

    config = {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "intermediate_size": 5120,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "vocab_size": 151936,
        "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_value_head_dim": 128,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "mtp_num_hidden_layers": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model("qwen3_next", **kwargs)
    with torch.device("meta"):
        layer = modeling_qwen3_next.Qwen3NextDecoderLayer(cfg, layer_idx=3)
    h = 2048
    expected = sum(p.numel() for p in layer.parameters()) + 2 * h * h + 3 * h
    analysis = analyze_config(config)
    assert analysis.extra_params == expected
    assert analysis.total_params == meta_param_count(config)


def test_longrope_factor_and_attention_factor_as_transformers_derives_them():
    """Phi-3.5-mini-instruct's RoPE block (review copy, written from memory: longrope without
    `factor`, original_max_position_embeddings only at the top level). transformers derives
    factor = 131072 / 4096 and the attention factor from it."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = {
        **_SMALL,
        "model_type": "phi3",
        "hidden_size": 3072,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"long_factor": [1.0] * 48, "short_factor": [1.0] * 48, "type": "longrope"},
    }
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model("phi3", **kwargs)
    _, attention_factor = ROPE_INIT_FUNCTIONS["longrope"](cfg, "cpu")
    rope = analyze_config(config).rope
    assert rope["type"] == "longrope"
    original = cfg.rope_parameters["original_max_position_embeddings"]
    assert rope["original_max_position_embeddings"] == original == 4096
    assert rope["factor"] == cfg.max_position_embeddings / original == 32.0
    assert rope["attention_factor"] == pytest.approx(attention_factor, rel=1e-12)


def test_exaone4_string_sliding_pattern_matches_transformers_layer_types():
    """EXAONE 4 may spell its pattern "LLLG", which configuration_exaone4.py documents as the
    same as 4 (its __post_init__ only computes layer_types from the integer form, so the
    expected layer types come from that)."""
    config = {**_SMALL, "model_type": "exaone4", "sliding_window": 64}
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model("exaone4", **kwargs, sliding_window_pattern=4)
    analysis = analyze_config({**config, "sliding_window_pattern": "LLLG"})
    assert analysis.attention["layer_types"] == list(cfg.layer_types)
