"""analyze_config on every real published config in tests/data/realconfigs."""

from __future__ import annotations

import json

import pytest

from engine.architecture import analyze_config
from tests.engine.stages.realconfigs import PUBLISHED, REALCONFIGS_DIR, load

NAMES = sorted(PUBLISHED)


def test_every_real_config_has_published_figures():
    on_disk = {p.stem for p in REALCONFIGS_DIR.glob("*.json")}
    assert on_disk == set(PUBLISHED)


@pytest.mark.parametrize("name", NAMES)
def test_total_params_match_the_published_exact_total(name):
    analysis = analyze_config(load(name))
    assert analysis.total_params == PUBLISHED[name].total_params


@pytest.mark.parametrize("name", NAMES)
def test_active_params_match_published_activated_figure(name):
    analysis = analyze_config(load(name))
    assert analysis.active_params == PUBLISHED[name].active_params


@pytest.mark.parametrize("name", NAMES)
def test_kv_cache_bytes_per_token_exact(name):
    analysis = analyze_config(load(name))
    assert analysis.kv_cache_bytes_per_token == PUBLISHED[name].kv_bytes_per_token


@pytest.mark.parametrize("name", [n for n in NAMES if PUBLISHED[n].weight_bytes])
def test_weight_bytes_within_2_percent_of_checkpoint(name):
    published = PUBLISHED[name].weight_bytes
    analysis = analyze_config(load(name))
    assert abs(analysis.weight_bytes - published) / published < 0.02


def test_weight_bytes_exact_for_bf16_checkpoints():
    assert analyze_config(load("meta-llama__Llama-3.1-8B")).weight_bytes == 16_060_522_496
    assert analyze_config(load("Qwen__Qwen2.5-72B-Instruct")).weight_bytes == 145_412_407_296
    qwen3 = analyze_config(load("Qwen__Qwen3-235B-A22B-Instruct-2507"))
    assert qwen3.weight_bytes == 2 * 235_093_634_560


def test_fp8_checkpoints_land_within_a_millionth_of_the_tensor_bytes():
    # Kimi-K2's figure is the sum of tensor sizes from its shard headers.
    kimi = analyze_config(load("moonshotai__Kimi-K2-Instruct"))
    assert abs(kimi.weight_bytes - 1_029_173_256_720) < 10_000
    # DeepSeek-V3's figure is the files on disk: tensors plus 163 safetensors JSON headers.
    v3 = analyze_config(load("deepseek-ai__DeepSeek-V3"))
    assert 0 < 688_586_727_753 - v3.weight_bytes < 20_000_000


def test_deepseek_v3_fp8_trap_mla_and_mtp():
    a = analyze_config(load("deepseek-ai__DeepSeek-V3")).to_dict()
    assert a["family"] == "deepseek_v3" and a["family_known"]
    assert a["attention"]["kind"] == "MLA"
    assert a["attention"]["q_lora_rank"] == 1536
    assert a["attention"]["kv_lora_rank"] == 512
    assert a["attention"]["qk_nope_head_dim"] == 128
    assert a["attention"]["qk_rope_head_dim"] == 64
    assert a["attention"]["v_head_dim"] == 128
    assert a["kv_cache_bytes_per_token"] == (512 + 64) * 2 * 61
    assert a["kv_cache_bytes_at_max_context"] == 70_272 * 163_840
    moe = a["moe"]
    assert (moe["num_experts"], moe["experts_per_token"], moe["num_shared_experts"]) == (256, 8, 1)
    assert (moe["dense_layers"], moe["moe_layers"]) == (3, 58)
    assert moe["expert_intermediate_size"] == 2048
    assert (moe["scoring"], moe["n_group"], moe["topk_group"]) == ("sigmoid", 8, 4)
    assert moe["topk_method"] == "noaux_tc"
    q = a["quantization"]
    assert q["method"] == "fp8" and q["weight_block_size"] == [128, 128]
    assert any(
        "torch_dtype says bfloat16 but quantization_config says fp8" in n for n in a["notes"]
    )
    assert a["weight_bytes_by_dtype"]["F8_E4M3"] > 600_000_000_000
    # One MTP layer: a MoE decoder layer, enorm/hnorm/eh_proj/shared_head.norm and the stored
    # copies of embed_tokens and shared_head.head.
    assert a["mtp_layers"] == 1
    assert a["extra_params"] == 13_463_426_304
    assert a["total_params"] + a["extra_params"] == 684_489_830_656
    # 256 experts x 58 MoE layers of e_score_correction_bias, a buffer in transformers.
    assert a["router_score_bias_params"] == 14_848
    assert a["rope"]["type"] == "yarn" and a["rope"]["factor"] == 40.0
    assert a["rope"]["theta"] == 10000.0


def test_kimi_k2_is_recognised_as_deepseek_v3_by_its_architecture():
    a = analyze_config(load("moonshotai__Kimi-K2-Instruct")).to_dict()
    assert a["model_type"] == "kimi_k2"
    assert a["family"] == "deepseek_v3" and a["family_known"]
    assert a["moe"]["num_experts"] == 384 and a["moe"]["dense_layers"] == 1
    assert a["mtp_layers"] == 0 and a["extra_params"] == 0
    assert a["rope"]["theta"] == 50000.0


def test_gpt_oss_window_sinks_and_mxfp4():
    a = analyze_config(load("openai__gpt-oss-20b")).to_dict()
    attn = a["attention"]
    assert attn["kind"] == "GQA"
    assert (attn["sliding_layers"], attn["full_layers"], attn["sliding_window"]) == (12, 12, 128)
    assert attn["layer_pattern"] == "(sliding, full) x 12"
    # 12 full layers hold all 131072 tokens, 12 sliding layers at most 128.
    per_layer = 2 * 8 * 64 * 2
    assert a["kv_cache_bytes_at_max_context"] == 12 * per_layer * 131_072 + 12 * per_layer * 128
    assert a["kv_cache_bytes_at_max_context"] == 3_224_371_200
    assert a["moe"]["num_experts"] == 32 and a["moe"]["experts_per_token"] == 4
    q = a["quantization"]
    assert q["method"] == "mxfp4"
    # Expert weights: 24 layers x 32 experts x (2*2880*2880 + 2880*2880) values at 4.25 bits.
    expert_values = 24 * 32 * 3 * 2880 * 2880
    assert q["quantized_params"] == expert_values
    assert a["weight_bytes_by_dtype"]["U8"] == expert_values // 2 + expert_values // 32
    bf16 = (a["total_params"] - expert_values) * 2
    assert a["weight_bytes"] == bf16 + expert_values // 2 + expert_values // 32
    assert a["rope"] == {
        "type": "yarn",
        "factor": 32.0,
        "theta": 150000.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }


def test_qwen25_sliding_window_switched_off():
    a = analyze_config(load("Qwen__Qwen2.5-72B-Instruct")).to_dict()
    assert a["attention"]["sliding_layers"] == 0
    assert a["attention"]["sliding_window"] is None
    assert a["kv_cache_bytes_at_max_context"] == 327_680 * 32_768
    assert any("use_sliding_window is false" in n for n in a["notes"])
    assert a["moe"] is None and a["quantization"] is None


def test_llama31_rope_and_active_convention():
    a = analyze_config(load("meta-llama__Llama-3.1-8B")).to_dict()
    assert a["rope"]["type"] == "llama3" and a["rope"]["factor"] == 8.0
    assert a["rope"]["theta"] == 500000.0
    assert a["total_params"] - a["active_params"] == 128_256 * 4096  # the input embedding
    assert "excluding the input embedding table" in a["conventions"]["active_params"]


def test_qwen3_moe_layout():
    a = analyze_config(load("Qwen__Qwen3-235B-A22B-Instruct-2507")).to_dict()
    assert a["head_dim"] == 128 and a["num_kv_heads"] == 4
    assert a["moe"]["moe_layers"] == 94 and a["moe"]["dense_layers"] == 0
    assert a["moe"]["num_shared_experts"] == 0
    assert a["rope"]["type"] == "default" and a["rope"]["theta"] == 5_000_000.0


@pytest.mark.parametrize("name", NAMES)
def test_to_dict_is_json_and_weights_summary_is_reported(name):
    weights = {
        "source": "index",
        "total_size": 123_456,
        "shard_count": 2,
        "tensor_count": 10,
        "dtypes": {"BF16": 123_456},
    }
    a = analyze_config(load(name), weights=weights).to_dict()
    assert json.loads(json.dumps(a)) == a
    assert a["checkpoint_total_size_bytes"] == 123_456
    assert analyze_config(load(name)).to_dict()["checkpoint_total_size_bytes"] is None
