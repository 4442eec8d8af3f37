"""What the config alone does not say about one model family: modules, names and defaults.

A family is one transformers modeling implementation (`modeling_<family>.py`). Its entry
(families.py) gives the modules of a decoder layer that vary between families (biases, extra
norms, attention sinks, module names in the checkpoint); the defaults for absent keys come from
transformers' own config class (`configuration_<family>.py`) when first asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .transformers_defaults import FamilyDefaults, class_defaults


@dataclass(frozen=True)
class FamilySpec:
    """What one transformers modeling implementation builds from a config.

    `defaults`: the values transformers applies for keys a config leaves out, read on first use
    from the installed transformers' config class for `name` (see transformers_defaults.py),
    with `overrides` on top: defaults the family's modeling code applies that its config class
    does not declare (each with its source in the table).
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
    overrides: Mapping[str, Any] = field(default_factory=dict)
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

    @cached_property
    def defaults(self) -> FamilyDefaults:
        """The family's config defaults (transformers' class, then `overrides`); loaded once."""
        return class_defaults(self.name).with_overrides(self.overrides)
