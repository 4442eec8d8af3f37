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
