"""NVFP4 (compressed-tensors and NVIDIA ModelOpt) and ModelOpt FP8 checkpoint bytes.

Expected bytes come from the formats' definitions, tensor by tensor: compressed-tensors
`nvfp4-pack-quantized` stores `weight_packed` (U8, two FP4 values per byte), `weight_scale`
(F8-E4M3, one per 16 input columns), `weight_global_scale` (F32 scalar) and, with quantized
activations, `input_global_scale` (F32 scalar); ModelOpt NVFP4 stores `weight` (U8 packed),
`weight_scale` (F8-E4M3 per 16), `weight_scale_2` and `input_scale` (F32 scalars); ModelOpt
FP8 stores `weight` (F8-E4M3), `weight_scale` and `input_scale` (F32 scalars).
"""

from __future__ import annotations

import pytest

from engine.architecture import analyze_config

# A Llama-shaped model with exact small numbers: 2 layers, hidden 256, MLP 512, 4 heads of
# 64, 2 KV heads, vocab 1000, untied.
H, FF, KV, V, L = 256, 512, 128, 1000, 2
BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": H,
    "intermediate_size": FF,
    "num_hidden_layers": L,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": V,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# (out, in) of every Linear in one decoder layer: q, k, v, o, gate, up, down.
LAYER_LINEARS = [(H, H), (KV, H), (KV, H), (H, H), (FF, H), (FF, H), (H, FF)]
# Unquantized tensors: embedding, LM head, 2 norms per layer, final norm (bf16).
BF16_PARAMS = V * H + V * H + L * 2 * H + H


def nvfp4_bytes(out_f: int, in_f: int, *, input_scale: bool) -> int:
    return out_f * in_f // 2 + out_f * in_f // 16 + 4 + (4 if input_scale else 0)


def expected_nvfp4_total(*, input_scale: bool) -> int:
    per_layer = sum(nvfp4_bytes(o, i, input_scale=input_scale) for o, i in LAYER_LINEARS)
    return L * per_layer + 2 * BF16_PARAMS


def _ct_nvfp4(*, activations: bool) -> dict:
    group = {
        "targets": ["Linear"],
        "weights": {
            "num_bits": 4,
            "type": "float",
            "strategy": "tensor_group",
            "group_size": 16,
            "symmetric": True,
            "dynamic": False,
        },
        "input_activations": {
            "num_bits": 4,
            "type": "float",
            "strategy": "tensor_group",
            "group_size": 16,
            "dynamic": "local",
        }
        if activations
        else None,
    }
    return {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "config_groups": {"group_0": group},
        "ignore": ["lm_head"],
        "quantization_status": "compressed",
    }


@pytest.mark.parametrize("activations", [True, False])
def test_compressed_tensors_nvfp4_bytes(activations):
    a = analyze_config({**BASE, "quantization_config": _ct_nvfp4(activations=activations)})
    assert a.weight_bytes == expected_nvfp4_total(input_scale=activations)
    q = a.quantization
    assert q is not None and q["bits"] == 4 and q["group_size"] == 16
    assert q["activations_quantized"] is activations
    linears = L * sum(o * i for o, i in LAYER_LINEARS)
    assert q["quantized_params"] == linears
    assert a.weight_bytes_by_dtype["U8"] == linears // 2
    assert a.weight_bytes_by_dtype["F8_E4M3"] == linears // 16
    assert a.weight_bytes_by_dtype["F32"] == L * 7 * 4 * (2 if activations else 1)


def test_modelopt_nvfp4_flat_and_hf_quant_config_block_agree():
    flat = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "exclude_modules": ["lm_head"],
        "kv_cache_quant_algo": None,
    }
    nested = {
        "quant_method": "modelopt",
        "producer": {"name": "modelopt", "version": "0.29.0"},
        "quantization": {
            "quant_algo": "NVFP4",
            "kv_cache_quant_algo": None,
            "group_size": 16,
            "exclude_modules": ["lm_head"],
        },
    }
    expected = expected_nvfp4_total(input_scale=True)
    for qc in (flat, nested):
        a = analyze_config({**BASE, "quantization_config": qc})
        assert a.weight_bytes == expected
        assert a.quantization is not None and a.quantization["quant_algo"] == "NVFP4"


def test_modelopt_exclude_modules_glob_keeps_layer_zero_attention_bf16():
    qc = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "exclude_modules": ["lm_head", "model.layers.0.self_attn*"],
    }
    a = analyze_config({**BASE, "quantization_config": qc})
    attn = LAYER_LINEARS[:4]
    expected = expected_nvfp4_total(input_scale=True)
    expected -= sum(nvfp4_bytes(o, i, input_scale=True) for o, i in attn)
    expected += sum(2 * o * i for o, i in attn)
    assert a.weight_bytes == expected


def test_modelopt_fp8_bytes():
    qc = {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head"]}
    a = analyze_config({**BASE, "quantization_config": qc})
    per_layer = sum(o * i + 4 + 4 for o, i in LAYER_LINEARS)
    assert a.weight_bytes == L * per_layer + 2 * BF16_PARAMS
    assert a.weight_bytes_by_dtype["F8_E4M3"] == L * sum(o * i for o, i in LAYER_LINEARS)


def test_modelopt_unknown_algo_is_noted_and_counted_unquantized():
    qc = {"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}
    a = analyze_config({**BASE, "quantization_config": qc})
    assert a.quantization is None
    assert a.weight_bytes == 2 * a.total_params
    assert any("W4A8_AWQ" in note for note in a.notes)
