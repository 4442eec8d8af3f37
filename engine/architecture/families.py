"""Known model families: what transformers builds for each, and how a config names its family.

`FAMILIES` holds one `FamilySpec` per transformers modeling implementation: the modules and
checkpoint names the config alone does not give, and `overrides`, the few defaults its
modeling code applies that its config class does not declare (each says why and where from).
Every other default is read from the installed transformers' config class when first needed
(transformers_defaults.py). `family_for` recognises a config's family.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from .family_spec import FamilySpec


def _d(**kwargs: Any) -> Mapping[str, Any]:
    return MappingProxyType(kwargs)


# DeepSeek-V3's router (and the routers built on it): sigmoid scores plus the
# e_score_correction_bias, topk by group (modeling_deepseek_v3.py DeepseekV3TopkRouter); its
# config class has no scoring_func/topk_method keys, which the published configs set so.
_SIGMOID_NOAUX_ROUTER = _d(scoring_func="sigmoid", topk_method="noaux_tc")

_BASE_FAMILIES: dict[str, FamilySpec] = {
    "llama": FamilySpec(name="llama"),
    "mistral": FamilySpec(name="mistral"),
    "mixtral": FamilySpec(
        name="mixtral",
        mlp_prefix="block_sparse_moe",
        experts_naming="mixtral",
    ),
    "qwen2": FamilySpec(
        name="qwen2",
        qkv_bias=True,
        o_bias_follows_attention_bias=False,
    ),
    "qwen2_moe": FamilySpec(
        name="qwen2_moe",
        qkv_bias=True,
        o_bias_follows_attention_bias=False,
        shared_expert_name="shared_expert",
    ),
    "qwen3": FamilySpec(
        name="qwen3",
        qk_norm="head",
    ),
    "qwen3_moe": FamilySpec(
        name="qwen3_moe",
        # Qwen3MoeConfig has no max_window_layers (v4's was 28): modeling_qwen3_moe.py gives
        # every layer the window when use_sliding_window.
        overrides=_d(max_window_layers=0),
        qk_norm="head",
    ),
    "qwen3_next": FamilySpec(
        name="qwen3_next",
        # Qwen3NextConfig.__post_init__: full attention every 4th layer when layer_types is absent.
        overrides=_d(full_attention_interval=4),
        qk_norm="head",
        attention_output_gate=True,
        shared_expert_name="shared_expert",
        mtp_layout="qwen3_next",
        hybrid_rule="interval",
    ),
    "deepseek_v2": FamilySpec(name="deepseek_v2"),
    "deepseek_v3": FamilySpec(
        name="deepseek_v3",
        overrides=_SIGMOID_NOAUX_ROUTER,
        router_score_bias_buffer=True,
        mtp_stores_embeddings=True,
    ),
    "gpt_oss": FamilySpec(
        name="gpt_oss",
        # GptOssConfig.__post_init__: sliding then full attention when layer_types is absent.
        overrides=_d(sliding_window_pattern=2),
        attention_sinks=True,
        router_bias=True,
        expert_bias=True,
        router_name="router",
        experts_naming="fused",
    ),
    "gemma": FamilySpec(name="gemma"),
    "gemma2": FamilySpec(
        name="gemma2",
        # Gemma2Config.__post_init__: sliding then full attention when layer_types is absent.
        overrides=_d(sliding_window_pattern=2),
        norms_per_layer=4,
    ),
    "gemma3": FamilySpec(
        name="gemma3",  # defaults: Gemma3Config's text_config class, Gemma3TextConfig
        # Gemma3TextConfig.__post_init__: sliding_window_pattern 6 when layer_types is absent.
        overrides=_d(sliding_window_pattern=6),
        qk_norm="head",
        norms_per_layer=4,
    ),
    "phi3": FamilySpec(name="phi3"),
    "glm4_moe": FamilySpec(
        name="glm4_moe",
        overrides=_SIGMOID_NOAUX_ROUTER,
        o_bias_follows_attention_bias=False,
        qk_norm="head",
        qk_norm_key="use_qk_norm",
        router_score_bias_buffer=True,
        mtp_stores_embeddings=True,
    ),
    "granite": FamilySpec(name="granite"),
    "granitemoe": FamilySpec(
        name="granitemoe",
        mlp_prefix="block_sparse_moe",
        router_name="router",
        experts_naming="fused",
    ),
    "olmo": FamilySpec(
        name="olmo",
        # OLMo 1 uses LayerNorm without learnable weights (modeling_olmo.py OlmoLayerNorm).
        norms_per_layer=0,
        final_norm=False,
    ),
    "olmo2": FamilySpec(
        name="olmo2",
        qk_norm="projection",
    ),
    "llama4": FamilySpec(
        name="llama4",  # defaults: Llama4Config's text_config class, Llama4TextConfig
        mlp_prefix="feed_forward",
        router_name="router",
        experts_naming="fused",
        shared_expert_name="shared_expert",
        always_shared_expert="expert",
    ),
    "jamba": FamilySpec(
        name="jamba",
        mlp_prefix="feed_forward",
        router_name="router",
        experts_naming="fused",
    ),
}

# Families transformers 5 ships that release-day configs use (added from their config classes
# and modeling files; held to meta-device builds in tests/engine/stages).
_MORE_FAMILIES: dict[str, FamilySpec] = {
    "qwen3_vl_text": FamilySpec(
        name="qwen3_vl_text",
        # Qwen3VLConfig, the wrapper that owns the LM head, does not tie (field default).
        overrides=_d(tie_word_embeddings=False),
        qk_norm="head",
    ),
    "qwen3_vl_moe_text": FamilySpec(
        name="qwen3_vl_moe_text",
        # Qwen3VLMoeConfig, the wrapper that owns the LM head, does not tie (field default);
        # the text class's own default (True) is not what the model gets.
        overrides=_d(tie_word_embeddings=False),
        qk_norm="head",
    ),
    "ernie4_5": FamilySpec(
        name="ernie4_5",
        bias_key="use_bias",
    ),
    "ernie4_5_moe": FamilySpec(
        name="ernie4_5_moe",
        bias_key="use_bias",
        lm_head_follows_bias_key=True,
        router_score_bias_param=True,
    ),
    "hunyuan_v1_dense": FamilySpec(
        name="hunyuan_v1_dense",
        qk_norm="head",
    ),
    "hunyuan_v1_moe": FamilySpec(
        name="hunyuan_v1_moe",
        qk_norm="head",
        router_name="gate.wg",
        shared_expert_name="shared_mlp",
        # transformers builds every expert and the one shared MLP at intermediate_size and
        # ignores moe_intermediate_size / num_shared_expert (modeling_hunyuan_v1_moe.py).
        always_shared_expert="intermediate_size",
    ),
    "minimax_m2": FamilySpec(
        name="minimax_m2",
        qk_norm="projection",
        router_score_bias_buffer=True,
        mlp_prefix="block_sparse_moe",
        experts_naming="mixtral",
    ),
    "dots1": FamilySpec(
        name="dots1",
        qk_norm="head",
        router_score_bias_buffer=True,
    ),
    "seed_oss": FamilySpec(
        name="seed_oss",
        o_bias_key="attention_out_bias",
    ),
    "apertus": FamilySpec(
        name="apertus",
        qk_norm="head",
        gated_mlp=False,
        mlp_act_params=2,
        norm_names=("attention_layernorm", "feedforward_layernorm"),
    ),
    "exaone4": FamilySpec(
        name="exaone4",
        qk_norm="head",
        norm_names=("post_attention_layernorm", "post_feedforward_layernorm"),
    ),
    "olmo3": FamilySpec(
        name="olmo3",
        # Olmo3Config.__post_init__: sliding except every 4th layer when layer_types is absent.
        overrides=_d(sliding_window_pattern=4),
        qk_norm="projection",
    ),
    "smollm3": FamilySpec(name="smollm3"),
}

# Families added for release-day model types of transformers 5 (modules from
# modeling_<type>.py; each held to a meta-device build in tests/engine/stages).
_RELEASE_FAMILIES: dict[str, FamilySpec] = {
    "deepseek_v32": FamilySpec(
        name="deepseek_v32",
        overrides=_SIGMOID_NOAUX_ROUTER,
        router_score_bias_buffer=True,
        mtp_stores_embeddings=True,
        mla_indexer=True,
    ),
    "glm4_moe_lite": FamilySpec(
        name="glm4_moe_lite",
        overrides=_d(
            **_SIGMOID_NOAUX_ROUTER,
            # Glm4MoeLiteConfig.__post_init__: mlp_layer_types dense then sparse when absent.
            first_k_dense_replace=1,
        ),
        router_score_bias_buffer=True,
        mtp_stores_embeddings=True,
    ),
    "glm": FamilySpec(
        name="glm",
        o_bias_follows_attention_bias=False,
    ),
    "glm4": FamilySpec(
        name="glm4",
        o_bias_follows_attention_bias=False,
        norm_names=(
            "input_layernorm",
            "post_attention_layernorm",
            "post_self_attn_layernorm",
            "post_mlp_layernorm",
        ),
    ),
    "qwen3_5_text": FamilySpec(
        name="qwen3_5_text",
        # Qwen3_5TextConfig.__post_init__: full attention every 4th layer without layer_types.
        overrides=_d(full_attention_interval=4),
        qk_norm="head",
        attention_output_gate=True,
        mtp_layout="qwen3_next",
        linear_mixer="gated_deltanet_split",
        hybrid_rule="interval",
    ),
    "qwen3_5_moe_text": FamilySpec(
        name="qwen3_5_moe_text",
        # Qwen3_5MoeTextConfig.__post_init__: full attention every 4th layer, as Qwen3.5.
        overrides=_d(full_attention_interval=4),
        qk_norm="head",
        attention_output_gate=True,
        shared_expert_name="shared_expert",
        mtp_layout="qwen3_next",
        linear_mixer="gated_deltanet_split",
        hybrid_rule="interval",
    ),
    "kimi_linear": FamilySpec(
        name="kimi_linear",
        # KimiLinearConfig.__post_init__: mlp_layer_types from first_k_dense_replace, default 1.
        overrides=_d(first_k_dense_replace=1),
        router_score_bias_buffer=True,
        linear_mixer="kimi_delta",
        hybrid_rule="kimi",
    ),
    "minimax": FamilySpec(
        name="minimax",
        mlp_prefix="block_sparse_moe",
        experts_naming="mixtral",
        linear_mixer="lightning",
        hybrid_rule="alternate",
    ),
    "cohere": FamilySpec(
        name="cohere",
        # Parallel attention and MLP after one LayerNorm (weight only); q/k norms of shape
        # (heads, head_dim) when use_qk_norm (modeling_cohere.py).
        qk_norm="projection",
        qk_norm_key="use_qk_norm",
        norms_per_layer=1,
    ),
    "cohere2": FamilySpec(
        name="cohere2",
        # Cohere2Config.__post_init__: sliding_window_pattern 4 when layer_types is absent.
        overrides=_d(sliding_window_pattern=4),
        norms_per_layer=1,
    ),
    "arcee": FamilySpec(
        name="arcee",
        gated_mlp=False,  # up_proj/down_proj with ReLU^2 (modeling_arcee.py)
    ),
    "ministral3": FamilySpec(name="ministral3"),
    "olmoe": FamilySpec(
        name="olmoe",
        qk_norm="projection",
    ),
    "flex_olmo": FamilySpec(
        name="flex_olmo",
        qk_norm="projection",
        norm_names=("post_attention_layernorm", "post_feedforward_layernorm"),
    ),
    "solar_open": FamilySpec(
        name="solar_open",
        o_bias_follows_attention_bias=False,
        router_score_bias_buffer=True,
    ),
    "exaone_moe": FamilySpec(
        name="exaone_moe",
        qk_norm="head",
        router_score_bias_buffer=True,
    ),
}

FAMILIES: Mapping[str, FamilySpec] = MappingProxyType(
    {**_BASE_FAMILIES, **_MORE_FAMILIES, **_RELEASE_FAMILIES}
)

# model_type → family, for model types that reuse another family's modeling code.
_MODEL_TYPE_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "gemma3_text": "gemma3",
        "llama4_text": "llama4",
        "kimi_k2": "deepseek_v3",
        # Multimodal wrappers whose text_config lacks a model_type.
        "qwen3_vl": "qwen3_vl_text",
        "qwen3_vl_moe": "qwen3_vl_moe_text",
        "qwen3_5": "qwen3_5_text",
        "qwen3_5_moe": "qwen3_5_moe_text",
    }
)

# `architectures` class name → family: a config whose model_type transformers does not know
# (Kimi-K2's "kimi_k2") still names the modeling class it runs with.
_ARCHITECTURE_FAMILIES: Mapping[str, str] = MappingProxyType(
    {
        "LlamaForCausalLM": "llama",
        "MistralForCausalLM": "mistral",
        "MixtralForCausalLM": "mixtral",
        "Qwen2ForCausalLM": "qwen2",
        "Qwen2MoeForCausalLM": "qwen2_moe",
        "Qwen3ForCausalLM": "qwen3",
        "Qwen3MoeForCausalLM": "qwen3_moe",
        "Qwen3NextForCausalLM": "qwen3_next",
        "DeepseekV2ForCausalLM": "deepseek_v2",
        "DeepseekV3ForCausalLM": "deepseek_v3",
        "GptOssForCausalLM": "gpt_oss",
        "GemmaForCausalLM": "gemma",
        "Gemma2ForCausalLM": "gemma2",
        "Gemma3ForCausalLM": "gemma3",
        "Gemma3ForConditionalGeneration": "gemma3",
        "Phi3ForCausalLM": "phi3",
        "Glm4MoeForCausalLM": "glm4_moe",
        "GraniteForCausalLM": "granite",
        "GraniteMoeForCausalLM": "granitemoe",
        "OlmoForCausalLM": "olmo",
        "Olmo2ForCausalLM": "olmo2",
        "Llama4ForCausalLM": "llama4",
        "Llama4ForConditionalGeneration": "llama4",
        "JambaForCausalLM": "jamba",
        "Qwen3VLForConditionalGeneration": "qwen3_vl_text",
        "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe_text",
        "Ernie4_5ForCausalLM": "ernie4_5",
        "Ernie4_5_MoeForCausalLM": "ernie4_5_moe",
        "HunYuanDenseV1ForCausalLM": "hunyuan_v1_dense",
        "HunYuanMoEV1ForCausalLM": "hunyuan_v1_moe",
        "MiniMaxM2ForCausalLM": "minimax_m2",
        "Dots1ForCausalLM": "dots1",
        "SeedOssForCausalLM": "seed_oss",
        "ApertusForCausalLM": "apertus",
        "Exaone4ForCausalLM": "exaone4",
        "Olmo3ForCausalLM": "olmo3",
        "SmolLM3ForCausalLM": "smollm3",
        "DeepseekV32ForCausalLM": "deepseek_v32",
        "Glm4MoeLiteForCausalLM": "glm4_moe_lite",
        "GlmForCausalLM": "glm",
        "Glm4ForCausalLM": "glm4",
        "Qwen3_5ForCausalLM": "qwen3_5_text",
        "Qwen3_5ForConditionalGeneration": "qwen3_5_text",
        "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text",
        "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe_text",
        "KimiLinearForCausalLM": "kimi_linear",
        "MiniMaxForCausalLM": "minimax",
        # MiniMax-Text-01 and MiniMax-M1 ship their own classes (model_type "minimax_m1"); the
        # architecture is transformers' MiniMax (lightning + softmax attention, attn_type_list).
        "MiniMaxText01ForCausalLM": "minimax",
        "MiniMaxM1ForCausalLM": "minimax",
        "CohereForCausalLM": "cohere",
        "Cohere2ForCausalLM": "cohere2",
        "ArceeForCausalLM": "arcee",
        "Ministral3ForCausalLM": "ministral3",
        "OlmoeForCausalLM": "olmoe",
        "FlexOlmoForCausalLM": "flex_olmo",
        "SolarOpenForCausalLM": "solar_open",
        "ExaoneMoeForCausalLM": "exaone_moe",
    }
)


def family_for(
    model_type: str | None, architectures: Sequence[str]
) -> tuple[FamilySpec | None, str]:
    """The known family of a config, and how it was recognised.

    The `model_type` decides when transformers knows it; otherwise the first `architectures`
    entry that names a known modeling class (Kimi-K2: `kimi_k2` → `DeepseekV3ForCausalLM`).
    Returns `(None, reason)` for an unknown family.
    """
    if model_type:
        key = _MODEL_TYPE_ALIASES.get(model_type, model_type)
        if key in FAMILIES:
            via = "model_type" if key == model_type else f"model_type {model_type!r}"
            return FAMILIES[key], via
    for arch in architectures:
        if arch in _ARCHITECTURE_FAMILIES:
            return FAMILIES[_ARCHITECTURE_FAMILIES[arch]], f"architectures entry {arch!r}"
    return None, "neither model_type nor architectures name a known family"
