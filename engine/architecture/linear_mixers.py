"""Token mixers without a KV cache: Gated DeltaNet (Qwen3-Next, Qwen3.5), Kimi Delta Attention
(Kimi Linear), lightning attention (MiniMax-01) and Mamba (Jamba).

Their layers keep a fixed-size recurrent state per sequence instead of per-token K/V.
"""

from __future__ import annotations

from math import ceil

from .config_reader import ModelConfig, check_int
from .tensors import LINEAR_MIXER, NORM, TensorGroup, linear, vector


def linear_mixer_tensors(cfg: ModelConfig, layers: tuple[int, ...]) -> list[TensorGroup]:
    """The linear-attention module of `layers`, as the family builds it (`linear_mixer`)."""
    if not layers:
        return []
    kind = cfg.family.linear_mixer if cfg.family else "gated_deltanet"
    if kind == "kimi_delta":
        return kimi_delta_tensors(cfg, layers)
    if kind == "lightning":
        return lightning_tensors(cfg, layers)
    return gated_deltanet_tensors(cfg, layers, split=kind == "gated_deltanet_split")


def gated_deltanet_tensors(
    cfg: ModelConfig, layers: tuple[int, ...], *, split: bool = False
) -> list[TensorGroup]:
    """Qwen3-Next linear-attention layer (transformers modeling_qwen3_next.py
    `Qwen3NextGatedDeltaNet`; Yang et al. 2024, "Gated Delta Networks").

    key_dim = linear_num_key_heads x linear_key_head_dim, value_dim likewise for values:
    in_proj_qkvz (2*key_dim + 2*value_dim) x hidden, in_proj_ba 2*v_heads x hidden, depthwise
    conv1d over q/k/v channels (2*key_dim + value_dim) x kernel, dt_bias and A_log per value
    head, a gated RMSNorm over linear_value_head_dim, out_proj hidden x value_dim. Qwen3.5
    (`split`) stores the same projections unfused: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a.
    """
    if not layers:
        return []
    v = cfg.view
    h = cfg.hidden_size
    k_heads, v_heads = v.int("linear_num_key_heads"), v.int("linear_num_value_heads")
    k_dim = k_heads * v.int("linear_key_head_dim")  # type: ignore[operator]
    v_head = v.int("linear_value_head_dim")
    v_dim = v_heads * v_head  # type: ignore[operator]
    kernel = v.int("linear_conv_kernel_dim")
    p = "model.layers.{layer}.linear_attn."
    if split:
        projections = [
            *linear(p + "in_proj_qkv", 2 * k_dim + v_dim, h, LINEAR_MIXER, layers),
            *linear(p + "in_proj_z", v_dim, h, LINEAR_MIXER, layers),
            *linear(p + "in_proj_b", v_heads, h, LINEAR_MIXER, layers),  # type: ignore[arg-type]
            *linear(p + "in_proj_a", v_heads, h, LINEAR_MIXER, layers),  # type: ignore[arg-type]
        ]
    else:
        projections = [
            *linear(p + "in_proj_qkvz", 2 * k_dim + 2 * v_dim, h, LINEAR_MIXER, layers),
            *linear(p + "in_proj_ba", 2 * v_heads, h, LINEAR_MIXER, layers),  # type: ignore[operator]
        ]
    return [
        *projections,
        TensorGroup(p + "conv1d", "weight", (2 * k_dim + v_dim, 1, kernel), LINEAR_MIXER, layers),  # type: ignore[arg-type]
        vector(p + "dt_bias", v_heads, LINEAR_MIXER, layers, param="dt_bias"),  # type: ignore[arg-type]
        vector(p + "A_log", v_heads, LINEAR_MIXER, layers, param="A_log"),  # type: ignore[arg-type]
        vector(p + "norm", v_head, NORM, layers),  # type: ignore[arg-type]
        *linear(p + "out_proj", h, v_dim, LINEAR_MIXER, layers),
    ]


def mamba_tensors(cfg: ModelConfig, layers: tuple[int, ...]) -> list[TensorGroup]:
    """Mamba mixer (Gu & Dao 2023) as Jamba builds it (transformers modeling_jamba.py).

    inner = mamba_expand x hidden; in_proj 2*inner x hidden, depthwise conv1d inner x d_conv
    (+ bias), x_proj (dt_rank + 2*d_state) x inner, dt_proj inner x dt_rank + bias, A_log
    inner x d_state, D inner, out_proj hidden x inner, and Jamba's dt/B/C RMSNorms.
    dt_rank "auto" = ceil(hidden / 16).
    """
    if not layers:
        return []
    v = cfg.view
    h = cfg.hidden_size
    inner = (v.int("mamba_expand", 2) or 2) * h
    d_state = v.int("mamba_d_state", 16) or 16
    d_conv = v.int("mamba_d_conv", 4) or 4
    raw_rank = v.value("mamba_dt_rank", "auto")
    dt_rank = ceil(h / 16) if raw_rank == "auto" else v.int("mamba_dt_rank")
    conv_bias = v.bool("mamba_conv_bias", True)
    proj_bias = v.bool("mamba_proj_bias", False)
    p = "model.layers.{layer}.mamba."
    groups = [
        *linear(p + "in_proj", 2 * inner, h, LINEAR_MIXER, layers, bias=proj_bias),
        TensorGroup(p + "conv1d", "weight", (inner, 1, d_conv), LINEAR_MIXER, layers),
        *linear(p + "x_proj", dt_rank + 2 * d_state, inner, LINEAR_MIXER, layers),  # type: ignore[operator]
        *linear(p + "dt_proj", inner, dt_rank, LINEAR_MIXER, layers, bias=True),  # type: ignore[arg-type]
        TensorGroup(p + "A_log", "A_log", (inner, d_state), LINEAR_MIXER, layers),
        vector(p + "D", inner, LINEAR_MIXER, layers, param="D"),
        *linear(p + "out_proj", h, inner, LINEAR_MIXER, layers, bias=proj_bias),
        vector(p + "dt_layernorm", dt_rank, NORM, layers),  # type: ignore[arg-type]
        vector(p + "b_layernorm", d_state, NORM, layers),
        vector(p + "c_layernorm", d_state, NORM, layers),
    ]
    if conv_bias:
        groups.append(vector(p + "conv1d", inner, LINEAR_MIXER, layers, param="bias"))
    return groups


def kimi_delta_tensors(cfg: ModelConfig, layers: tuple[int, ...]) -> list[TensorGroup]:
    """Kimi Delta Attention (transformers modeling_kimi_linear.py `KimiLinearDeltaAttention`):
    a gated delta rule with per-channel decay.

    heads and head_dim from `linear_attn_config` (`num_heads`, `head_dim`,
    `short_conv_kernel_size`, as the checkpoint stores them) or `linear_num_heads`/
    `linear_head_dim`/`linear_conv_kernel_dim`; d = heads x head_dim: q/k/v_proj d x hidden,
    a depthwise conv1d over q/k/v (3d x kernel), the forget gate (dt_bias d, A_log per head,
    low-rank f_a_proj head_dim x hidden and f_b_proj d x head_dim), b_proj heads x hidden, the
    low-rank output gate g_a_proj/g_b_proj, a gated RMSNorm o_norm over head_dim and o_proj.
    """
    v = cfg.view
    h = cfg.hidden_size
    sub = v.raw.get("linear_attn_config")
    sub = sub if isinstance(sub, dict) else {}
    heads = check_int("num_heads", sub.get("num_heads", v.int("linear_num_heads")))
    head_dim = check_int("head_dim", sub.get("head_dim", v.int("linear_head_dim")))
    kernel = check_int(
        "short_conv_kernel_size", sub.get("short_conv_kernel_size", v.int("linear_conv_kernel_dim"))
    )
    d = heads * head_dim
    p = "model.layers.{layer}.self_attn."
    g = p + "forget_gate."
    return [
        *linear(p + "q_proj", d, h, LINEAR_MIXER, layers),
        *linear(p + "k_proj", d, h, LINEAR_MIXER, layers),
        *linear(p + "v_proj", d, h, LINEAR_MIXER, layers),
        TensorGroup(p + "conv1d", "weight", (3 * d, 1, kernel), LINEAR_MIXER, layers),
        vector(g + "dt_bias", d, LINEAR_MIXER, layers, param="dt_bias"),
        TensorGroup(g + "A_log", "A_log", (1, 1, heads, 1), LINEAR_MIXER, layers),
        *linear(g + "f_a_proj", head_dim, h, LINEAR_MIXER, layers),
        *linear(g + "f_b_proj", d, head_dim, LINEAR_MIXER, layers),
        *linear(p + "b_proj", heads, h, LINEAR_MIXER, layers),
        *linear(p + "g_a_proj", head_dim, h, LINEAR_MIXER, layers),
        *linear(p + "g_b_proj", d, head_dim, LINEAR_MIXER, layers),
        vector(p + "o_norm", head_dim, NORM, layers),
        *linear(p + "o_proj", h, d, LINEAR_MIXER, layers),
    ]


def lightning_tensors(cfg: ModelConfig, layers: tuple[int, ...]) -> list[TensorGroup]:
    """MiniMax-01 lightning attention (transformers modeling_minimax.py
    `MiniMaxLightningAttention`): fused qkv_proj 3d x hidden (d = heads x head_dim), an RMSNorm
    over d, out_proj hidden x d and a sigmoid output_gate d x hidden; no biases."""
    h = cfg.hidden_size
    d = cfg.num_attention_heads * cfg.head_dim
    p = "model.layers.{layer}.self_attn."
    return [
        *linear(p + "qkv_proj", 3 * d, h, LINEAR_MIXER, layers),
        vector(p + "norm", d, NORM, layers),
        *linear(p + "out_proj", h, d, LINEAR_MIXER, layers),
        *linear(p + "output_gate", d, h, LINEAR_MIXER, layers),
    ]
