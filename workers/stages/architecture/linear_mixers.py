"""Token mixers without a KV cache: Gated DeltaNet (Qwen3-Next) and Mamba (Jamba).

Their layers keep a fixed-size recurrent state per sequence instead of per-token K/V.
"""

from __future__ import annotations

from math import ceil

from .config_reader import ModelConfig
from .tensors import LINEAR_MIXER, NORM, TensorGroup, linear, vector


def gated_deltanet_tensors(cfg: ModelConfig, layers: tuple[int, ...]) -> list[TensorGroup]:
    """Qwen3-Next linear-attention layer (transformers modeling_qwen3_next.py
    `Qwen3NextGatedDeltaNet`; Yang et al. 2024, "Gated Delta Networks").

    key_dim = linear_num_key_heads x linear_key_head_dim, value_dim likewise for values:
    in_proj_qkvz (2*key_dim + 2*value_dim) x hidden, in_proj_ba 2*v_heads x hidden, depthwise
    conv1d over q/k/v channels (2*key_dim + value_dim) x kernel, dt_bias and A_log per value
    head, a gated RMSNorm over linear_value_head_dim, out_proj hidden x value_dim.
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
    return [
        *linear(p + "in_proj_qkvz", 2 * k_dim + 2 * v_dim, h, LINEAR_MIXER, layers),
        *linear(p + "in_proj_ba", 2 * v_heads, h, LINEAR_MIXER, layers),  # type: ignore[operator]
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
