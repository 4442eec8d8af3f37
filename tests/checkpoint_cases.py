"""Real-shaped checkpoints of several families, shrunk, for the checkpoint count and check
tests and the header benchmark.

Each case starts from a real published config (tests/data/realconfigs) or transformers' own
default config for a model type, shrunk to a few layers at width 64, builds it on the meta
device (`tests.checkpoints.meta_build`) and stores it as the family publishes it: FP8 with
128x128 `weight_scale_inv` blocks and an MTP layer past `num_hidden_layers` (DeepSeek-V3),
MXFP4 `*_blocks`/`*_scales` experts (gpt-oss), AWQ `qweight`/`qzeros`/`scales`, DeepSeek-V4's
own names (no `model.` prefix, `embed`, `head`, `mtp.0.*`). `params` is the parameter count
of the model transformers builds (`model.parameters()`): what the checkpoint's total must
be; `mtp_params` the elements of the MTP tensors the case adds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tests.checkpoints import Table, meta_build
from tests.engine.stages.realconfigs import load

SMALL = {"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 256}


@dataclass
class Case:
    """A family's shrunk config (as published: quantization included) and its checkpoint."""

    name: str
    config: dict[str, Any]
    table: Table
    params: int
    mtp_params: int = 0
    notes: list[str] = field(default_factory=list)


def _unquantized(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "quantization_config"}


def llama() -> Case:
    config = load("meta-llama__Llama-3.1-8B")
    config.update(SMALL, intermediate_size=128, num_hidden_layers=3, num_key_value_heads=2)
    config.update(bos_token_id=0, eos_token_id=1)
    table, params = meta_build(config)
    return Case("llama", config, table, params)


def qwen3_moe() -> Case:
    config = load("Qwen__Qwen3-235B-A22B-Instruct-2507")
    config.update(SMALL, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3)
    config.update(num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2)
    config.update(bos_token_id=0, eos_token_id=1)
    table, params = meta_build(config)
    return Case("qwen3_moe", config, table, params)


def _deepseek_v3_config(name: str) -> dict[str, Any]:
    config = load(name)
    config.update(SMALL, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4)
    config.update(first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2)
    config.update(n_group=2, topk_group=1, num_key_value_heads=4, q_lora_rank=32)
    config.update(kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    config.update(bos_token_id=0, eos_token_id=1, pad_token_id=None)
    return config


def fp8_blocks(table: Table) -> Table:
    """Decoder-layer Linear weights (not the MTP eh_proj) as F8 with one F32
    `weight_scale_inv` per 128x128 block, as DeepSeek-V3 publishes them."""
    out: Table = {}
    for name, (dtype, shape) in table.items():
        linear = ".layers." in name and name.endswith("proj.weight") and len(shape) == 2
        if linear and "eh_proj" not in name:
            out[name] = ("F8_E4M3", shape)
            blocks = (math.ceil(shape[0] / 128), math.ceil(shape[1] / 128))
            out[name.replace(".weight", ".weight_scale_inv")] = ("F32", blocks)
        else:
            out[name] = (dtype, shape)
    return out


def deepseek_v3() -> Case:
    """FP8 blocks, and one MTP layer stored as layer 4 (a copy of the last MoE layer plus
    enorm, hnorm, eh_proj, shared_head and its own embedding copy)."""
    config = _deepseek_v3_config("deepseek-ai__DeepSeek-V3")
    table, params = meta_build(_unquantized(config))
    n, h, v = config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]
    mtp: Table = {
        name.replace(f".layers.{n - 1}.", f".layers.{n}."): entry
        for name, entry in table.items()
        if f".layers.{n - 1}." in name
    }
    mtp.update(
        {
            f"model.layers.{n}.enorm.weight": ("BF16", (h,)),
            f"model.layers.{n}.hnorm.weight": ("BF16", (h,)),
            f"model.layers.{n}.eh_proj.weight": ("BF16", (h, 2 * h)),
            f"model.layers.{n}.shared_head.norm.weight": ("BF16", (h,)),
            f"model.layers.{n}.embed_tokens.weight": ("BF16", (v, h)),
            f"model.layers.{n}.shared_head.head.weight": ("BF16", (v, h)),
        }
    )
    mtp_params = sum(math.prod(shape) for _, shape in mtp.values())
    return Case("deepseek_v3", config, fp8_blocks({**table, **mtp}), params, mtp_params)


def kimi_k2() -> Case:
    """`model_type` kimi_k2 (transformers knows only its architecture, DeepseekV3)."""
    config = _deepseek_v3_config("moonshotai__Kimi-K2-Instruct")
    config.update(num_hidden_layers=3, n_group=1)
    table, params = meta_build(dict(_unquantized(config), model_type="deepseek_v3"))
    return Case("kimi_k2", config, fp8_blocks(table), params)


def gpt_oss() -> Case:
    """Experts as gpt-oss publishes them: MXFP4 `*_blocks` (U8, two FP4 values a byte, 32
    values a block of 16 bytes) with one U8 E8M0 scale a block in `*_scales`; the rest
    BF16."""
    config = load("openai__gpt-oss-20b")
    config.update(SMALL, intermediate_size=64, num_hidden_layers=2, num_key_value_heads=2)
    config.update(head_dim=16, num_local_experts=4, num_experts_per_tok=2, experts_per_token=2)
    config.update(pad_token_id=0, eos_token_id=1, layer_types=config["layer_types"][:2])
    table, params = meta_build(_unquantized(config))
    out: Table = {}
    for name, (dtype, shape) in table.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            experts, rows_in, cols_out = shape  # transformers keeps (experts, in, out)
            out[f"{name}_blocks"] = ("U8", (experts, cols_out, rows_in // 32, 16))
            out[f"{name}_scales"] = ("U8", (experts, cols_out, rows_in // 32))
        else:
            out[name] = (dtype, shape)
    return Case("gpt_oss", config, out, params)


def _default_config(model_type: str, **changes: Any) -> dict[str, Any]:
    import transformers

    config = transformers.AutoConfig.for_model(model_type).to_dict()
    config.update(changes)
    return config


def glm4_moe() -> Case:
    """GLM-4.5-style: a dense first layer, 8 experts, one MTP layer stored as layer 3."""
    config = _default_config(
        "glm4_moe",
        **SMALL,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        num_key_value_heads=2,
        head_dim=16,
        num_nextn_predict_layers=1,
        architectures=["Glm4MoeForCausalLM"],
    )
    table, params = meta_build(config)
    n, h = config["num_hidden_layers"], config["hidden_size"]
    mtp: Table = {
        name.replace(f".layers.{n - 1}.", f".layers.{n}."): entry
        for name, entry in table.items()
        if f".layers.{n - 1}." in name
    }
    mtp[f"model.layers.{n}.eh_proj.weight"] = ("BF16", (h, 2 * h))
    mtp[f"model.layers.{n}.enorm.weight"] = ("BF16", (h,))
    mtp[f"model.layers.{n}.hnorm.weight"] = ("BF16", (h,))
    mtp[f"model.layers.{n}.shared_head.norm.weight"] = ("BF16", (h,))
    mtp_params = sum(math.prod(shape) for _, shape in mtp.values())
    return Case("glm4_moe", config, {**table, **mtp}, params, mtp_params)


def minimax_m2() -> Case:
    """MiniMax-M2: Mixtral-style `block_sparse_moe.experts.N.w1/w2/w3`."""
    config = _default_config(
        "minimax_m2",
        **SMALL,
        intermediate_size=32,
        num_hidden_layers=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        num_key_value_heads=2,
        head_dim=16,
        architectures=["MiniMaxM2ForCausalLM"],
    )
    table, params = meta_build(config)
    return Case("minimax_m2", config, table, params)


# DeepSeek-V4's own names for the tensors transformers keeps under other ones.
_V4_TOP_LEVEL = {
    "embed_tokens.weight": "embed.weight",
    "hc_head.hc_base": "hc_head_base",
    "hc_head.hc_fn": "hc_head_fn",
    "hc_head.hc_scale": "hc_head_scale",
}


def deepseek_v4() -> Case:
    """DeepSeek-V4 as its checkpoint names it (no `model.` prefix, `embed`, `head`,
    `layers.N.attn/ffn`, hash-routing `tid2eid` tables) with one `mtp.0.*` module."""
    config = _default_config(
        "deepseek_v4",
        **SMALL,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        head_dim=32,
        q_lora_rank=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        o_groups=2,
        o_lora_rank=16,
        index_n_heads=2,
        index_head_dim=16,
        index_topk=8,
        qk_rope_head_dim=8,
        sliding_window=16,
        architectures=["DeepseekV4ForCausalLM"],
    )
    for key in ("layer_types", "mlp_layer_types"):
        config[key] = config[key][:3]
    table, params = meta_build(config)
    renamed: Table = {}
    for name, entry in table.items():
        short = name.removeprefix("model.")
        renamed[_V4_TOP_LEVEL.get(short, short)] = entry
    last = config["num_hidden_layers"] - 1
    mtp = {
        name.replace(f"layers.{last}.", "mtp.0."): entry
        for name, entry in renamed.items()
        if name.startswith(f"layers.{last}.")
    }
    h = config["hidden_size"]
    mtp["mtp.0.e_proj.weight"] = ("BF16", (h, h))
    mtp["mtp.0.h_proj.weight"] = ("BF16", (h, h))
    mtp_params = sum(math.prod(shape) for _, shape in mtp.values())
    return Case("deepseek_v4", config, {**renamed, **mtp}, params, mtp_params)


def llama_awq() -> Case:
    """Llama with AWQ 4-bit decoder Linears: `qweight` I32 (in, out/8), `qzeros` I32
    (in/group, out/8), `scales` F16 (in/group, out)."""
    case = llama()
    group = 32
    case.config["quantization_config"] = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group,
        "zero_point": True,
        "version": "gemm",
    }
    out: Table = {}
    for name, (_, shape) in case.table.items():
        if ".layers." in name and name.endswith("proj.weight"):
            rows_out, cols_in = shape
            module = name.removesuffix(".weight")
            out[f"{module}.qweight"] = ("I32", (cols_in, rows_out // 8))
            out[f"{module}.qzeros"] = ("I32", (cols_in // group, rows_out // 8))
            out[f"{module}.scales"] = ("F16", (cols_in // group, rows_out))
        else:
            out[name] = ("F16", shape)
    case.name, case.table = "llama_awq", out
    return case


CASES = {
    "llama": llama,
    "qwen3_moe": qwen3_moe,
    "deepseek_v3": deepseek_v3,
    "kimi_k2": kimi_k2,
    "gpt_oss": gpt_oss,
    "glm4_moe": glm4_moe,
    "minimax_m2": minimax_m2,
    "deepseek_v4": deepseek_v4,
    "llama_awq": llama_awq,
}
