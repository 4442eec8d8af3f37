"""analyze_config on small inline configs: each pins one rule with an exact integer."""

from __future__ import annotations

import pytest

from engine.architecture import AnalysisError, analyze_config

MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "rope_theta": 1e6,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

QWEN3_4B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}

# google/gemma-3-4b-it: the text model sits in text_config and leans on Gemma3TextConfig
# defaults (8 heads, 4 KV heads, head_dim 256, vocab 262208, tied embeddings).
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "mm_tokens_per_image": 256,
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"},
}

STANDARD_UNKNOWN = {
    "architectures": ["NovaForCausalLM"],
    "model_type": "nova",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


def test_mixtral_8x7b_total_exact():
    a = analyze_config(MIXTRAL_8X7B)
    assert a.total_params == 46_702_792_704
    # Active: everything but the input embedding, 2 of 8 experts per layer.
    expert = 3 * 4096 * 14336
    assert a.active_params == 46_702_792_704 - 32000 * 4096 - 32 * 6 * expert
    assert a.moe is not None and a.moe["num_experts"] == 8 and a.moe["experts_per_token"] == 2
    assert a.moe["num_shared_experts"] == 0 and a.moe["expert_intermediate_size"] == 14336
    assert a.attention["kind"] == "GQA" and a.attention["sliding_layers"] == 0


def test_explicit_head_dim_wins_for_kv_cache():
    a = analyze_config(QWEN3_4B)
    assert a.head_dim == 128  # not 2560 / 32 = 80
    assert a.kv_cache_bytes_per_token == 147_456  # 2 x 8 x 128 x 2 bytes x 36 layers
    assert a.kv_cache_bytes_at_max_context == 147_456 * 40960


def test_missing_kv_heads_means_mha():
    config = {k: v for k, v in STANDARD_UNKNOWN.items() if k != "num_key_value_heads"}
    config["model_type"] = "llama"
    a = analyze_config(config)
    assert a.attention["kind"] == "MHA"
    assert a.num_kv_heads == 16
    assert a.kv_cache_bytes_per_token == 2 * 16 * 64 * 2 * 4


def test_mqa_when_one_kv_head():
    a = analyze_config({**STANDARD_UNKNOWN, "model_type": "llama", "num_key_value_heads": 1})
    assert a.attention["kind"] == "MQA"
    assert a.kv_cache_bytes_per_token == 2 * 1 * 64 * 2 * 4


def test_multimodal_config_analyses_the_text_model():
    a = analyze_config(GEMMA3_4B).to_dict()
    assert a["architecture"] == "Gemma3ForConditionalGeneration"
    assert a["family"] == "gemma3" and a["family_known"]
    assert (a["num_attention_heads"], a["num_kv_heads"], a["head_dim"]) == (8, 4, 256)
    assert a["vocab_size"] == 262_208 and a["tie_word_embeddings"] is True
    # Per layer: q/k/v/o 2560 x (2048+1024+1024+2048), q/k norms 2 x 256, gated MLP
    # 3 x 2560 x 10240, four norms; plus the tied embedding and the final norm.
    per_layer = 2560 * 6144 + 512 + 3 * 2560 * 10240 + 4 * 2560
    assert a["total_params"] == 34 * per_layer + 262_208 * 2560 + 2560 == 3_880_263_168
    # Every sixth layer is global: 5 full, 29 sliding (window 1024).
    assert (a["attention"]["full_layers"], a["attention"]["sliding_layers"]) == (5, 29)
    assert a["kv_cache_bytes_per_token"] == 34 * 4096
    assert a["kv_cache_bytes_at_max_context"] == 5 * 4096 * 131_072 + 29 * 4096 * 1024
    assert a["rope"]["type"] == "linear" and a["rope"]["factor"] == 8.0
    assert a["rope"]["theta"] == 1_000_000.0 and a["rope"]["local_theta"] == 10000.0
    assert any("text_config" in n for n in a["notes"])
    assert any("num_attention_heads=8" in n for n in a["notes"])


def test_unknown_model_type_with_standard_keys():
    a = analyze_config(STANDARD_UNKNOWN).to_dict()
    assert a["family_known"] is False and a["family"] == "nova"
    assert any("unknown model_type 'nova'" in n for n in a["notes"])
    attn = 1024 * 1024 * 2 + 1024 * 256 * 2
    per_layer = attn + 3 * 1024 * 4096 + 2 * 1024
    assert a["total_params"] == 4 * per_layer + 2 * 1000 * 1024 + 1024
    assert a["kv_cache_bytes_per_token"] == 2 * 4 * 64 * 2 * 4


def test_unknown_model_type_missing_hidden_size_names_it():
    config = {k: v for k, v in STANDARD_UNKNOWN.items() if k != "hidden_size"}
    with pytest.raises(AnalysisError, match="hidden_size") as err:
        analyze_config(config)
    assert "vocab_size" not in str(err.value)


def test_several_missing_keys_are_named_together():
    with pytest.raises(AnalysisError, match="hidden_size, num_hidden_layers"):
        analyze_config({"model_type": "nova", "num_attention_heads": 8, "vocab_size": 10})


def test_aliases_of_standard_keys_are_read():
    config = {
        "model_type": "nova",
        "n_embd": 256,
        "n_layer": 2,
        "n_head": 4,
        "vocab_size": 100,
        "intermediate_size": 512,
        "n_positions": 1024,
        "tie_word_embeddings": True,
    }
    a = analyze_config(config)
    assert (a.hidden_size, a.num_layers, a.num_attention_heads) == (256, 2, 4)
    assert a.max_position_embeddings == 1024


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": 0}, "hidden_size must be at least 1"),
        ({"hidden_size": -4096}, "hidden_size must be at least 1"),
        ({"hidden_size": "4096"}, "hidden_size must be an integer"),
        ({"hidden_size": 4096.5}, "hidden_size must be an integer"),
        ({"num_hidden_layers": True}, "num_hidden_layers must be an integer"),
        ({"vocab_size": 10**12}, "vocab_size = 1000000000000 is implausibly large"),
        ({"num_attention_heads": 24}, "not divisible by num_attention_heads"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings must be true or false"),
        ({"rope_scaling": {"type": "linear", "factor": -2}}, "factor must be a positive number"),
        ({"rope_theta": "big"}, "rope_theta must be a positive number"),
        ({"layer_types": ["full_attention"]}, "one entry per layer"),
        ({"num_local_experts": 4, "num_experts_per_tok": 8}, "exceeds the number of experts"),
        ({"quantization_config": "fp8"}, "quantization_config must be an object"),
    ],
)
def test_malformed_values_raise_one_clear_reason(change, message):
    config = {**STANDARD_UNKNOWN, **change}
    with pytest.raises(AnalysisError, match=message):
        analyze_config(config)


def test_not_a_dict_is_an_analysis_error():
    with pytest.raises(AnalysisError, match="JSON object"):
        analyze_config(["not", "a", "config"])  # type: ignore[arg-type]


def test_sliding_window_everywhere_for_mistral_v01():
    config = {**MIXTRAL_8X7B, "model_type": "mistral", "architectures": ["MistralForCausalLM"]}
    del config["num_local_experts"], config["num_experts_per_tok"]
    config.update(sliding_window=4096, max_position_embeddings=32768)
    a = analyze_config(config)
    assert a.attention["sliding_layers"] == 32 and a.attention["sliding_window"] == 4096
    assert a.kv_cache_bytes_at_max_context == 32 * (2 * 8 * 128 * 2) * 4096


def test_qwen2_sliding_window_on_upper_layers_when_enabled():
    config = {
        **STANDARD_UNKNOWN,
        "model_type": "qwen2",
        "use_sliding_window": True,
        "sliding_window": 512,
        "max_window_layers": 3,
    }
    a = analyze_config(config)
    assert a.attention["layer_types"] == ["full_attention"] * 3 + ["sliding_attention"]
    per_layer = 2 * 4 * 64 * 2
    assert a.kv_cache_bytes_at_max_context == 3 * per_layer * 4096 + per_layer * 512


def test_qwen3_next_linear_attention_layers_keep_no_kv():
    config = {
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "vocab_size": 151936,
        "max_position_embeddings": 262144,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "intermediate_size": 5120,
        "full_attention_interval": 4,
    }
    a = analyze_config(config).to_dict()
    assert a["attention"]["linear_attention_layers"] == 36 and a["attention"]["full_layers"] == 12
    assert a["kv_cache_bytes_per_token"] == 12 * 2 * 2 * 256 * 2
    assert a["moe"]["num_shared_experts"] == 1
    assert any("recurrent state" in n for n in a["notes"])


def test_jamba_attention_period_and_expert_period():
    config = {
        "model_type": "jamba",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 65536,
        "intermediate_size": 14336,
        "num_experts": 16,
        "num_experts_per_tok": 2,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "max_position_embeddings": 262144,
    }
    a = analyze_config(config).to_dict()
    assert (a["attention"]["full_layers"], a["attention"]["ssm_layers"]) == (4, 28)
    assert a["kv_cache_bytes_per_token"] == 4 * 2 * 8 * 128 * 2
    assert (a["moe"]["moe_layers"], a["moe"]["dense_layers"]) == (16, 16)


def test_awq_int4_bytes():
    config = {
        **STANDARD_UNKNOWN,
        "model_type": "llama",
        "torch_dtype": "float16",
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128},
    }
    a = analyze_config(config).to_dict()
    q = a["quantization"]
    assert (q["method"], q["bits"], q["group_size"]) == ("awq", 4, 128)
    # Per layer Linear weights (out, in): q,o (1024,1024), k,v (256,1024), gate/up (4096,1024),
    # down (1024,4096): values at 4 bits, per 128 inputs one fp16 scale and a 4-bit zero.
    shapes = [(1024, 1024)] * 2 + [(256, 1024)] * 2 + [(4096, 1024)] * 2 + [(1024, 4096)]
    per_layer = sum(o * i // 2 + o * (i // 128) * 2 + o * (i // 128) // 2 for o, i in shapes)
    rest = (2 * 1000 * 1024 + 1024 + 4 * 2 * 1024) * 2  # embedding, head, norms in fp16
    assert a["weight_bytes"] == 4 * per_layer + rest
    assert q["quantized_params"] == 4 * sum(o * i for o, i in shapes)


def test_compressed_tensors_ignore_patterns():
    config = {
        **STANDARD_UNKNOWN,
        "model_type": "llama",
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "strategy": "group",
                        "group_size": 32,
                    },
                }
            },
            "ignore": ["lm_head", "re:.*self_attn.*"],
        },
    }
    a = analyze_config(config).to_dict()
    mlp_values = 4 * 3 * 1024 * 4096
    assert a["quantization"]["quantized_params"] == mlp_values
    assert a["quantization"]["modules_not_converted"] == ["lm_head", "re:.*self_attn.*"]


def test_fp8_tensors_without_quantization_config_are_flagged():
    weights = {"source": "safetensors_headers", "total_size": 10, "dtypes": {"F8_E4M3": 8}}
    a = analyze_config(STANDARD_UNKNOWN, weights=weights)
    assert any("holds F8 tensors" in n for n in a.notes)


def test_disagreeing_experts_per_token_keys_are_noted():
    config = {**MIXTRAL_8X7B, "experts_per_token": 4}
    a = analyze_config(config)
    assert a.moe is not None and a.moe["experts_per_token"] == 2
    assert any("experts_per_token = 4 disagrees" in n for n in a.notes)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('{"rope_theta": NaN}', "rope_theta"),
        ('{"rope_scaling": {"type": "linear", "factor": Infinity}}', "rope_scaling.factor"),
        ('{"hidden_size": -Infinity}', "hidden_size"),
        ('{"rope_scaling": {"type": "longrope", "long_factor": [1.0, NaN]}}', "long_factor"),
    ],
)
def test_non_finite_numbers_are_rejected_naming_the_key(text, key):
    import json

    config = {**STANDARD_UNKNOWN, **json.loads(text)}  # Python's json accepts NaN/Infinity
    with pytest.raises(AnalysisError, match=rf"{key}.*finite"):
        analyze_config(config)


def test_active_params_including_embedding_for_untied_and_tied():
    untied = analyze_config(STANDARD_UNKNOWN)
    assert untied.active_params_including_embedding == untied.active_params + 1000 * 1024
    d = untied.to_dict()
    assert d["active_params_including_embedding"] == untied.active_params_including_embedding
    assert "excluding the input embedding table" in d["conventions"]["active_params"]
    assert "Llama-4-Scout" in d["conventions"]["active_params"]
    tied = analyze_config({**STANDARD_UNKNOWN, "tie_word_embeddings": True})
    assert tied.active_params_including_embedding == tied.active_params
