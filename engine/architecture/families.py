"""Known model families: how transformers builds each one, and the defaults it applies.

A family is one transformers modeling implementation (`modeling_<family>.py`). Its entry says
what the config alone does not: the defaults the family's config class fills in for absent
keys (transformers 5 `configuration_<family>.py`), and the modules of a decoder layer that vary
between families (biases, extra norms, attention sinks, module names in the checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class FamilySpec:
    """What one transformers modeling implementation builds from a config.

    `qkv_bias`: True when q/k/v projections always carry a bias (Qwen2 family), None when
    `attention_bias` decides. `o_bias_follows_attention_bias`: whether o_proj also carries the
    bias (Llama, gpt-oss) or never does (Qwen2, GLM-4.5). `qk_norm`: "head" for RMSNorm over
    head_dim on q and k (Qwen3, Gemma 3), "projection" for a norm over the whole q/k
    projection (OLMo 2, Cohere), None otherwise; `qk_norm_key` names a flag that switches it
    on (GLM-4.5 and Cohere `use_qk_norm`).
    `norms_per_layer`: hidden-size norms per decoder layer. `mlp_prefix`/`router_name`/
    `experts_naming`/`shared_expert_name`: module names as in the published checkpoints, used
    to match quantization exclusion patterns.

    Less common layouts: `bias_key` names one flag that puts a bias on every projection and the
    shared-expert MLP (Ernie 4.5 `use_bias`), and on the LM head where
    `lm_head_follows_bias_key` (Ernie 4.5 MoE, not the dense model); `o_bias_key` one that
    decides o_proj's bias alone (Seed-OSS `attention_out_bias`). `gated_mlp` False: up/down only
    (Apertus), with `mlp_act_params` learned scalars per layer (xIELU alpha_p/alpha_n).
    `norm_names`: the hidden-size norms of a layer when they are not the first `norms_per_layer`
    standard ones (EXAONE 4 post-norms). `router_score_bias_param`: the router score-correction
    bias is a parameter (Ernie 4.5 `moe_statics`), not a buffer. `always_shared_expert`: one
    shared expert whatever the config says, of the routed width ("expert", Llama 4) or of
    `intermediate_size` (Hunyuan). `mtp_layout`: "deepseek" (MTP blocks stored as extra decoder
    layers) or "qwen3_next" (`mtp.*`: fc, pre-fc norms, decoder layers, final norm; embeddings
    shared).

    Hybrid and sparse attention: `linear_mixer` is the module of the family's linear-attention
    layers ("gated_deltanet": Qwen3-Next fused in_proj_qkvz/in_proj_ba; "gated_deltanet_split":
    Qwen3.5 in_proj_qkv/z/b/a; "kimi_delta": Kimi Delta Attention; "lightning": MiniMax-01),
    `hybrid_rule` how its config class places them when `layer_types` is absent (see
    attention.py). `mla_indexer`: MLA with DeepSeek-V3.2's sparse-attention indexer (its own
    wq_b/wk/k_norm/weights_proj and a per-token indexer key in the cache).
    """

    name: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    qkv_bias: bool | None = None
    o_bias_follows_attention_bias: bool = True
    qk_norm: str | None = None
    norms_per_layer: int = 2
    final_norm: bool = True
    attention_sinks: bool = False
    attention_output_gate: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    router_score_bias_buffer: bool = False
    mlp_prefix: str = "mlp"
    router_name: str = "gate"
    experts_naming: str = "per_expert"  # "per_expert" gate/up/down, "mixtral" w1/w3/w2, "fused"
    shared_expert_name: str = "shared_experts"
    mtp_stores_embeddings: bool = False
    bias_key: str | None = None
    lm_head_follows_bias_key: bool = False
    o_bias_key: str | None = None
    gated_mlp: bool = True
    mlp_act_params: int = 0
    norm_names: tuple[str, ...] | None = None
    router_score_bias_param: bool = False
    always_shared_expert: str | None = None
    mtp_layout: str = "deepseek"
    qk_norm_key: str | None = None
    linear_mixer: str = "gated_deltanet"
    hybrid_rule: str | None = None
    mla_indexer: bool = False


def _d(**kwargs: Any) -> Mapping[str, Any]:
    return MappingProxyType(kwargs)


# Defaults copied from the transformers 5 config classes (the values used when a key is absent).
_LLAMA_DEFAULTS = _d(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
    rope_theta=10000.0,
)

_BASE_FAMILIES: dict[str, FamilySpec] = {
    "llama": FamilySpec(name="llama", defaults=_LLAMA_DEFAULTS),
    "mistral": FamilySpec(
        name="mistral",
        defaults=_d(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
            sliding_window=4096,
            rope_theta=10000.0,
            attention_bias=False,
        ),
    ),
    "mixtral": FamilySpec(
        name="mixtral",
        defaults=_d(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
            num_local_experts=8,
            num_experts_per_tok=2,
            rope_theta=1000000.0,
            attention_bias=False,
        ),
        mlp_prefix="block_sparse_moe",
        experts_naming="mixtral",
    ),
    "qwen2": FamilySpec(
        name="qwen2",
        defaults=_d(
            vocab_size=151936,
            hidden_size=4096,
            intermediate_size=22016,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=32768,
            tie_word_embeddings=False,
            use_sliding_window=False,
            sliding_window=4096,
            max_window_layers=28,
            rope_theta=10000.0,
        ),
        qkv_bias=True,
        o_bias_follows_attention_bias=False,
    ),
    "qwen2_moe": FamilySpec(
        name="qwen2_moe",
        defaults=_d(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=24,
            num_attention_heads=16,
            num_key_value_heads=16,
            max_position_embeddings=32768,
            tie_word_embeddings=False,
            use_sliding_window=False,
            sliding_window=4096,
            max_window_layers=28,
            decoder_sparse_step=1,
            moe_intermediate_size=1408,
            shared_expert_intermediate_size=5632,
            num_experts_per_tok=4,
            num_experts=60,
            norm_topk_prob=False,
            rope_theta=10000.0,
        ),
        qkv_bias=True,
        o_bias_follows_attention_bias=False,
        shared_expert_name="shared_expert",
    ),
    "qwen3": FamilySpec(
        name="qwen3",
        defaults=_d(
            vocab_size=151936,
            hidden_size=4096,
            intermediate_size=22016,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            head_dim=128,
            max_position_embeddings=32768,
            tie_word_embeddings=False,
            attention_bias=False,
            use_sliding_window=False,
            sliding_window=4096,
            max_window_layers=28,
            rope_theta=10000.0,
        ),
        qk_norm="head",
    ),
    "qwen3_moe": FamilySpec(
        name="qwen3_moe",
        defaults=_d(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=24,
            num_attention_heads=32,
            num_key_value_heads=4,
            max_position_embeddings=32768,
            tie_word_embeddings=False,
            attention_bias=False,
            use_sliding_window=False,
            sliding_window=4096,
            max_window_layers=28,
            decoder_sparse_step=1,
            moe_intermediate_size=768,
            num_experts_per_tok=8,
            num_experts=128,
            norm_topk_prob=False,
            rope_theta=10000.0,
        ),
        qk_norm="head",
    ),
    "qwen3_next": FamilySpec(
        name="qwen3_next",
        defaults=_d(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=48,
            num_attention_heads=16,
            num_key_value_heads=2,
            head_dim=256,
            max_position_embeddings=32768,
            tie_word_embeddings=False,
            attention_bias=False,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_num_key_heads=16,
            linear_num_value_heads=32,
            decoder_sparse_step=1,
            moe_intermediate_size=512,
            shared_expert_intermediate_size=512,
            num_experts_per_tok=10,
            num_experts=512,
            norm_topk_prob=True,
            full_attention_interval=4,
            rope_theta=10000.0,
            partial_rotary_factor=0.25,
        ),
        qk_norm="head",
        attention_output_gate=True,
        shared_expert_name="shared_expert",
        mtp_layout="qwen3_next",
        hybrid_rule="interval",
    ),
    "deepseek_v2": FamilySpec(
        name="deepseek_v2",
        defaults=_d(
            vocab_size=102400,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
            first_k_dense_replace=0,
            kv_lora_rank=512,
            q_lora_rank=1536,
            n_routed_experts=64,
            n_shared_experts=2,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            routed_scaling_factor=1.0,
            topk_method="greedy",
            norm_topk_prob=False,
            v_head_dim=128,
            moe_intermediate_size=1407,
            rope_theta=10000.0,
            scoring_func="softmax",
            moe_layer_freq=1,
        ),
    ),
    "deepseek_v3": FamilySpec(
        name="deepseek_v3",
        defaults=_d(
            vocab_size=129280,
            hidden_size=7168,
            intermediate_size=18432,
            moe_intermediate_size=2048,
            num_hidden_layers=61,
            num_attention_heads=128,
            num_key_value_heads=128,
            n_shared_experts=1,
            n_routed_experts=256,
            routed_scaling_factor=2.5,
            kv_lora_rank=512,
            q_lora_rank=1536,
            qk_rope_head_dim=64,
            v_head_dim=128,
            qk_nope_head_dim=128,
            n_group=8,
            topk_group=4,
            num_experts_per_tok=8,
            first_k_dense_replace=3,
            norm_topk_prob=True,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            attention_bias=False,
            rope_theta=10000.0,
            scoring_func="sigmoid",
            topk_method="noaux_tc",
            moe_layer_freq=1,
        ),
        router_score_bias_buffer=True,
        mtp_stores_embeddings=True,
    ),
    "gpt_oss": FamilySpec(
        name="gpt_oss",
        defaults=_d(
            num_hidden_layers=36,
            num_local_experts=128,
            vocab_size=201088,
            hidden_size=2880,
            intermediate_size=2880,
            head_dim=64,
            num_attention_heads=64,
            num_key_value_heads=8,
            sliding_window=128,
            tie_word_embeddings=False,
            max_position_embeddings=131072,
            num_experts_per_tok=4,
            attention_bias=True,
            rope_theta=150000.0,
            sliding_window_pattern=2,
        ),
        attention_sinks=True,
        router_bias=True,
        expert_bias=True,
        router_name="router",
        experts_naming="fused",
    ),
    "gemma": FamilySpec(
        name="gemma",
        defaults=_d(
            vocab_size=256000,
            hidden_size=3072,
            intermediate_size=24576,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=16,
            head_dim=256,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            attention_bias=False,
            rope_theta=10000.0,
        ),
    ),
    "gemma2": FamilySpec(
        name="gemma2",
        defaults=_d(
            vocab_size=256000,
            hidden_size=2304,
            intermediate_size=9216,
            num_hidden_layers=26,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            attention_bias=False,
            sliding_window=4096,
            sliding_window_pattern=2,
            rope_theta=10000.0,
        ),
        norms_per_layer=4,
    ),
    "gemma3": FamilySpec(
        name="gemma3",
        defaults=_d(
            vocab_size=262208,
            hidden_size=2304,
            intermediate_size=9216,
            num_hidden_layers=26,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
            attention_bias=False,
            sliding_window=4096,
            sliding_window_pattern=6,
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
        ),
        qk_norm="head",
        norms_per_layer=4,
    ),
    "phi3": FamilySpec(
        name="phi3",
        defaults=_d(
            vocab_size=32064,
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            rope_theta=10000.0,
            attention_bias=False,
        ),
    ),
    "glm4_moe": FamilySpec(
        name="glm4_moe",
        defaults=_d(
            vocab_size=151552,
            hidden_size=4096,
            intermediate_size=10944,
            num_hidden_layers=46,
            num_attention_heads=96,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
            attention_bias=False,
            moe_intermediate_size=1408,
            num_experts_per_tok=8,
            n_shared_experts=1,
            n_routed_experts=128,
            routed_scaling_factor=1.0,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            norm_topk_prob=True,
            use_qk_norm=False,
            rope_theta=10000.0,
            partial_rotary_factor=0.5,
            scoring_func="sigmoid",
            topk_method="noaux_tc",
            num_nextn_predict_layers=1,
        ),
        o_bias_follows_attention_bias=False,
        qk_norm="head",
        qk_norm_key="use_qk_norm",
        router_score_bias_buffer=True,
        mtp_stores_embeddings=True,
    ),
    "granite": FamilySpec(name="granite", defaults=_LLAMA_DEFAULTS),
    "granitemoe": FamilySpec(
        name="granitemoe",
        defaults=_d(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            attention_bias=False,
            num_local_experts=8,
            num_experts_per_tok=2,
            rope_theta=10000.0,
        ),
        mlp_prefix="block_sparse_moe",
        router_name="router",
        experts_naming="fused",
    ),
    "olmo": FamilySpec(
        name="olmo",
        defaults=_d(
            vocab_size=50304,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            attention_bias=False,
            rope_theta=10000.0,
        ),
        # OLMo 1 uses LayerNorm without learnable weights (modeling_olmo.py OlmoLayerNorm).
        norms_per_layer=0,
        final_norm=False,
    ),
    "olmo2": FamilySpec(
        name="olmo2",
        defaults=_d(
            vocab_size=50304,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            attention_bias=False,
            rope_theta=10000.0,
        ),
        qk_norm="projection",
    ),
    "llama4": FamilySpec(
        name="llama4",
        defaults=_d(
            vocab_size=202048,
            hidden_size=5120,
            intermediate_size=8192,
            intermediate_size_mlp=16384,
            num_hidden_layers=48,
            num_attention_heads=40,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
            num_experts_per_tok=1,
            num_local_experts=16,
            interleave_moe_layer_step=1,
            no_rope_layer_interval=4,
            attention_chunk_size=8192,
            attention_bias=False,
            rope_theta=500000.0,
        ),
        mlp_prefix="feed_forward",
        router_name="router",
        experts_naming="fused",
        shared_expert_name="shared_expert",
        always_shared_expert="expert",
    ),
    "jamba": FamilySpec(
        name="jamba",
        defaults=_d(
            vocab_size=65536,
            tie_word_embeddings=False,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=262144,
            num_experts_per_tok=2,
            num_experts=16,
            expert_layer_period=2,
            expert_layer_offset=1,
            attn_layer_period=8,
            attn_layer_offset=4,
            mamba_d_state=16,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_dt_rank="auto",
            mamba_conv_bias=True,
            mamba_proj_bias=False,
            rope_theta=10000.0,
        ),
        mlp_prefix="feed_forward",
        router_name="router",
        experts_naming="fused",
    ),
}

_QWEN3_VL_DEFAULTS = dict(
    vocab_size=151936,
    head_dim=128,
    max_position_embeddings=128000,
    # Qwen3VL(Moe)Config, the wrapper that owns the LM head, does not tie by default.
    tie_word_embeddings=False,
    attention_bias=False,
    rope_theta=500000.0,
)

# Families transformers 5 ships that release-day configs use (added from their config classes
# and modeling files; held to meta-device builds in tests/stages).
_MORE_FAMILIES: dict[str, FamilySpec] = {
    "qwen3_vl_text": FamilySpec(
        name="qwen3_vl_text",
        defaults=_d(
            **_QWEN3_VL_DEFAULTS,
            hidden_size=4096,
            intermediate_size=22016,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
        ),
        qk_norm="head",
    ),
    "qwen3_vl_moe_text": FamilySpec(
        name="qwen3_vl_moe_text",
        defaults=_d(
            **_QWEN3_VL_DEFAULTS,
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=24,
            num_attention_heads=16,
            num_key_value_heads=16,
            decoder_sparse_step=1,
            moe_intermediate_size=1408,
            num_experts_per_tok=4,
            num_experts=60,
        ),
        qk_norm="head",
    ),
    "ernie4_5": FamilySpec(
        name="ernie4_5",
        defaults=_d(
            vocab_size=103424,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=18,
            num_attention_heads=16,
            num_key_value_heads=2,
            head_dim=128,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
            use_bias=False,
            rope_theta=500000.0,
        ),
        bias_key="use_bias",
    ),
    "ernie4_5_moe": FamilySpec(
        name="ernie4_5_moe",
        defaults=_d(
            vocab_size=103424,
            hidden_size=2560,
            intermediate_size=12288,
            num_hidden_layers=28,
            num_attention_heads=20,
            num_key_value_heads=4,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
            use_bias=False,
            moe_intermediate_size=1536,
            moe_k=6,
            moe_num_experts=64,
            moe_num_shared_experts=2,
            moe_layer_start_index=1,
            moe_layer_end_index=27,
            moe_layer_interval=1,
            rope_theta=500000.0,
        ),
        bias_key="use_bias",
        lm_head_follows_bias_key=True,
        router_score_bias_param=True,
    ),
    "hunyuan_v1_dense": FamilySpec(
        name="hunyuan_v1_dense",
        defaults=_d(
            vocab_size=290943,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            attention_bias=False,
            rope_theta=10000.0,
        ),
        qk_norm="head",
    ),
    "hunyuan_v1_moe": FamilySpec(
        name="hunyuan_v1_moe",
        defaults=_d(
            vocab_size=290943,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            attention_bias=False,
            num_experts=1,
            moe_topk=1,
            rope_theta=10000.0,
        ),
        qk_norm="head",
        router_name="gate.wg",
        shared_expert_name="shared_mlp",
        # transformers builds every expert and the one shared MLP at intermediate_size and
        # ignores moe_intermediate_size / num_shared_expert (modeling_hunyuan_v1_moe.py).
        always_shared_expert="intermediate_size",
    ),
    "minimax_m2": FamilySpec(
        name="minimax_m2",
        defaults=_d(
            vocab_size=200064,
            hidden_size=3072,
            intermediate_size=1536,
            num_hidden_layers=62,
            num_attention_heads=48,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=196608,
            tie_word_embeddings=False,
            num_experts_per_tok=8,
            num_local_experts=256,
            rope_theta=5000000.0,
        ),
        qk_norm="projection",
        router_score_bias_buffer=True,
        mlp_prefix="block_sparse_moe",
        experts_naming="mixtral",
    ),
    "dots1": FamilySpec(
        name="dots1",
        defaults=_d(
            vocab_size=152064,
            hidden_size=4608,
            intermediate_size=10944,
            moe_intermediate_size=1408,
            num_hidden_layers=62,
            num_attention_heads=32,
            num_key_value_heads=32,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=0,
            norm_topk_prob=False,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            attention_bias=False,
            routed_scaling_factor=1.0,
            rope_theta=10000.0,
        ),
        qk_norm="head",
        router_score_bias_buffer=True,
    ),
    "seed_oss": FamilySpec(
        name="seed_oss",
        defaults=_d(
            vocab_size=155136,
            hidden_size=4096,
            intermediate_size=27648,
            num_hidden_layers=64,
            num_attention_heads=80,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=524288,
            tie_word_embeddings=False,
            attention_bias=True,
            attention_out_bias=False,
            mlp_bias=False,
            rope_theta=10000.0,
        ),
        o_bias_key="attention_out_bias",
    ),
    "apertus": FamilySpec(
        name="apertus",
        defaults=_d(
            vocab_size=131072,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=65536,
            tie_word_embeddings=False,
            attention_bias=False,
            rope_theta=12000000.0,
        ),
        qk_norm="head",
        gated_mlp=False,
        mlp_act_params=2,
        norm_names=("attention_layernorm", "feedforward_layernorm"),
    ),
    "exaone4": FamilySpec(
        name="exaone4",
        defaults=_d(
            vocab_size=102400,
            hidden_size=4096,
            intermediate_size=16384,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            sliding_window=4096,
            sliding_window_pattern=4,
            rope_theta=10000.0,
        ),
        qk_norm="head",
        norm_names=("post_attention_layernorm", "post_feedforward_layernorm"),
    ),
    "olmo3": FamilySpec(
        name="olmo3",
        defaults=_d(
            vocab_size=50304,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            attention_bias=False,
            sliding_window=4096,
            # Olmo3Config: sliding attention except every 4th layer when layer_types is absent.
            sliding_window_pattern=4,
            rope_theta=500000.0,
        ),
        qk_norm="projection",
    ),
    "smollm3": FamilySpec(
        name="smollm3",
        defaults=_d(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=11008,
            num_hidden_layers=36,
            num_attention_heads=16,
            num_key_value_heads=4,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
            attention_bias=False,
            mlp_bias=False,
            use_sliding_window=False,
            rope_theta=2000000.0,
        ),
    ),
}

_QWEN3_5_DEFAULTS = dict(
    vocab_size=248320,
    max_position_embeddings=32768,
    tie_word_embeddings=False,
    attention_bias=False,
    head_dim=256,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    # Qwen3_5TextConfig: full attention every 4th layer when layer_types is absent.
    full_attention_interval=4,
    rope_theta=10000.0,
    partial_rotary_factor=0.25,
)

# DeepSeek-V3.2 keeps V3's defaults (configuration_deepseek_v32.py) except its context, the
# sparse-attention indexer's sizes, and no `moe_layer_freq`.
_DEEPSEEK_V32_DEFAULTS = {
    **{k: v for k, v in _BASE_FAMILIES["deepseek_v3"].defaults.items() if k != "moe_layer_freq"},
    "max_position_embeddings": 163840,
    "mlp_bias": False,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 64,
}

# Families added for release-day model types of transformers 5 (configuration_<type>.py
# defaults, modules from modeling_<type>.py; each held to a meta-device build in tests/stages).
_RELEASE_FAMILIES: dict[str, FamilySpec] = {
    "deepseek_v32": FamilySpec(
        name="deepseek_v32",
        defaults=_d(**_DEEPSEEK_V32_DEFAULTS),
        router_score_bias_buffer=True,
        mtp_stores_embeddings=True,
        mla_indexer=True,
    ),
    "glm4_moe_lite": FamilySpec(
        name="glm4_moe_lite",
        defaults=_d(
            vocab_size=154880,
            hidden_size=2048,
            intermediate_size=10240,
            moe_intermediate_size=1536,
            num_hidden_layers=47,
            num_attention_heads=20,
            num_key_value_heads=20,
            n_shared_experts=1,
            n_routed_experts=64,
            routed_scaling_factor=1.8,
            kv_lora_rank=512,
            q_lora_rank=768,
            qk_rope_head_dim=64,
            v_head_dim=256,
            qk_nope_head_dim=192,
            n_group=1,
            topk_group=1,
            num_experts_per_tok=4,
            # Glm4MoeLiteConfig: mlp_layer_types = dense then sparse when absent.
            first_k_dense_replace=1,
            norm_topk_prob=True,
            max_position_embeddings=202752,
            tie_word_embeddings=False,
            attention_bias=False,
            rope_theta=10000.0,
            scoring_func="sigmoid",
            topk_method="noaux_tc",
        ),
        router_score_bias_buffer=True,
        mtp_stores_embeddings=True,
    ),
    "glm": FamilySpec(
        name="glm",
        defaults=_d(
            vocab_size=151552,
            hidden_size=4096,
            intermediate_size=13696,
            num_hidden_layers=40,
            num_attention_heads=32,
            num_key_value_heads=2,
            head_dim=128,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
            attention_bias=True,
            rope_theta=10000.0,
            partial_rotary_factor=0.5,
        ),
        o_bias_follows_attention_bias=False,
    ),
    "glm4": FamilySpec(
        name="glm4",
        defaults=_d(
            vocab_size=151552,
            hidden_size=4096,
            intermediate_size=13696,
            num_hidden_layers=40,
            num_attention_heads=32,
            num_key_value_heads=2,
            head_dim=128,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
            attention_bias=True,
            rope_theta=10000.0,
            partial_rotary_factor=0.5,
        ),
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
        defaults=_d(
            **_QWEN3_5_DEFAULTS,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=32,
            num_attention_heads=16,
            num_key_value_heads=4,
        ),
        qk_norm="head",
        attention_output_gate=True,
        mtp_layout="qwen3_next",
        linear_mixer="gated_deltanet_split",
        hybrid_rule="interval",
    ),
    "qwen3_5_moe_text": FamilySpec(
        name="qwen3_5_moe_text",
        defaults=_d(
            **_QWEN3_5_DEFAULTS,
            hidden_size=2048,
            num_hidden_layers=40,
            num_attention_heads=16,
            num_key_value_heads=2,
            moe_intermediate_size=512,
            shared_expert_intermediate_size=512,
            num_experts_per_tok=8,
            num_experts=256,
        ),
        qk_norm="head",
        attention_output_gate=True,
        shared_expert_name="shared_expert",
        mtp_layout="qwen3_next",
        linear_mixer="gated_deltanet_split",
        hybrid_rule="interval",
    ),
    "kimi_linear": FamilySpec(
        name="kimi_linear",
        defaults=_d(
            vocab_size=163840,
            hidden_size=2304,
            intermediate_size=9216,
            moe_intermediate_size=1024,
            num_hidden_layers=27,
            num_attention_heads=32,
            num_key_value_heads=32,
            num_shared_experts=1,
            routed_scaling_factor=2.446,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            v_head_dim=128,
            qk_nope_head_dim=128,
            n_group=1,
            topk_group=1,
            num_experts_per_token=8,
            norm_topk_prob=True,
            max_position_embeddings=1048576,
            tie_word_embeddings=False,
            attention_bias=False,
            num_experts=256,
            first_k_dense_replace=1,
            linear_head_dim=128,
            linear_num_heads=32,
            linear_conv_kernel_dim=4,
            rope_theta=10000.0,
        ),
        router_score_bias_buffer=True,
        linear_mixer="kimi_delta",
        hybrid_rule="kimi",
    ),
    "minimax": FamilySpec(
        name="minimax",
        defaults=_d(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
            num_experts_per_tok=2,
            num_local_experts=8,
            rope_theta=1000000.0,
        ),
        mlp_prefix="block_sparse_moe",
        experts_naming="mixtral",
        linear_mixer="lightning",
        hybrid_rule="alternate",
    ),
    "cohere": FamilySpec(
        name="cohere",
        defaults=_d(
            vocab_size=256000,
            hidden_size=8192,
            intermediate_size=22528,
            num_hidden_layers=40,
            num_attention_heads=64,
            num_key_value_heads=64,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            attention_bias=False,
            use_qk_norm=False,
            rope_theta=500000.0,
        ),
        # Parallel attention and MLP after one LayerNorm (weight only); q/k norms of shape
        # (heads, head_dim) when use_qk_norm (modeling_cohere.py).
        qk_norm="projection",
        qk_norm_key="use_qk_norm",
        norms_per_layer=1,
    ),
    "cohere2": FamilySpec(
        name="cohere2",
        defaults=_d(
            vocab_size=256000,
            hidden_size=8192,
            intermediate_size=22528,
            num_hidden_layers=40,
            num_attention_heads=64,
            num_key_value_heads=64,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            attention_bias=False,
            sliding_window=4096,
            sliding_window_pattern=4,
            rope_theta=10000.0,
        ),
        norms_per_layer=1,
    ),
    "arcee": FamilySpec(
        name="arcee",
        defaults=_d(
            vocab_size=32000,
            hidden_size=2560,
            intermediate_size=18432,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
            rope_theta=10000.0,
        ),
        gated_mlp=False,  # up_proj/down_proj with ReLU^2 (modeling_arcee.py)
    ),
    "ministral3": FamilySpec(
        name="ministral3",
        defaults=_d(
            vocab_size=131072,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=34,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=262144,
            tie_word_embeddings=False,
            rope_theta=1000000.0,
        ),
    ),
    "olmoe": FamilySpec(
        name="olmoe",
        defaults=_d(
            vocab_size=50304,
            hidden_size=2048,
            intermediate_size=2048,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_key_value_heads=16,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            attention_bias=False,
            num_experts_per_tok=8,
            num_experts=64,
            norm_topk_prob=False,
            rope_theta=10000.0,
        ),
        qk_norm="projection",
    ),
    "flex_olmo": FamilySpec(
        name="flex_olmo",
        defaults=_d(
            vocab_size=100352,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            attention_bias=False,
            num_experts_per_tok=5,
            num_experts=7,
            norm_topk_prob=False,
            rope_theta=500000.0,
        ),
        qk_norm="projection",
        norm_names=("post_attention_layernorm", "post_feedforward_layernorm"),
    ),
    "solar_open": FamilySpec(
        name="solar_open",
        defaults=_d(
            vocab_size=196608,
            hidden_size=4096,
            num_hidden_layers=48,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
            attention_bias=False,
            moe_intermediate_size=1280,
            num_experts_per_tok=8,
            n_shared_experts=1,
            n_routed_experts=128,
            routed_scaling_factor=1.0,
            n_group=1,
            topk_group=1,
            norm_topk_prob=True,
            rope_theta=1000000.0,
        ),
        o_bias_follows_attention_bias=False,
        router_score_bias_buffer=True,
    ),
    "exaone_moe": FamilySpec(
        name="exaone_moe",
        defaults=_d(
            vocab_size=102400,
            hidden_size=4096,
            intermediate_size=16384,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            sliding_window=4096,
            sliding_window_pattern=4,
            first_k_dense_replace=1,
            moe_intermediate_size=1024,
            num_experts=64,
            num_experts_per_tok=8,
            num_shared_experts=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            n_group=1,
            topk_group=1,
            rope_theta=10000.0,
        ),
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
