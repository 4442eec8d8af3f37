"""Parameter totals against transformers itself: models built on the meta device (no memory)."""

from __future__ import annotations

import pytest

from workers.stages.architecture import analyze_config

from .realconfigs import load

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
}


@pytest.mark.parametrize("model_type", sorted(_RELEASE_DAY_CASES))
def test_release_day_family_total_equals_transformers(model_type):
    if model_type not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no model_type {model_type!r}")
    config = {**_SMALL, **_RELEASE_DAY_CASES[model_type], "model_type": model_type}
    analysis = analyze_config(config)
    assert analysis.family == model_type and analysis.family_known
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
    ],
)
@pytest.mark.parametrize("tie", [False, None])
def test_qwen3_vl_text_model_equals_transformers(wrapper, text_type, moe, tie):
    """Qwen3-VL(-MoE): the text model (q/k norms, fused experts) plus the wrapper's LM head,
    tied or not as the wrapper says (its default is untied)."""
    text = {**_SMALL, "head_dim": 16, **moe, "model_type": text_type}
    config = {
        "model_type": wrapper,
        "architectures": [
            "Qwen3VLMoeForConditionalGeneration" if moe else "Qwen3VLForConditionalGeneration"
        ],
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
    """Qwen/Qwen3-Next-80B-A3B-Instruct's config (the review's copy, written from memory): the
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
