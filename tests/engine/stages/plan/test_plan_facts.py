"""Published facts about where models fit, pinned against `plan_release` (plain pytest).

Each test cites the source of its fact. Configs are the real ones in tests/data/realconfigs
or, where not there, written from the published config.json (source named at each builder).
"""

from __future__ import annotations

import copy

import pytest

from engine.architecture import analyze_config
from engine.stages.plan.errors import NoFittingPlan
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from tests.engine.stages.realconfigs import load


def analysis(config: dict) -> dict:
    return analyze_config(config).to_dict()


def llama_405b_config() -> dict:
    """meta-llama/Llama-3.1-405B config.json as published: hidden 16,384, 126 layers, 128
    heads, 8 KV heads, FFN 53,248, vocab 128,256 (Llama 3 paper Table 3; the HF config)."""
    config = load("meta-llama__Llama-3.1-8B")
    config.update(
        hidden_size=16384,
        num_hidden_layers=126,
        num_attention_heads=128,
        num_key_value_heads=8,
        intermediate_size=53248,
        vocab_size=128256,
    )
    return config


def gpt_oss_120b_config() -> dict:
    """openai/gpt-oss-120b config.json as published: the gpt-oss-20b file with 36 layers and
    128 experts (top-4), hidden 2,880, 64 heads, 8 KV heads, head_dim 64, sliding window 128
    alternating with full attention, MXFP4 experts (gpt-oss model card, Table 1)."""
    config = copy.deepcopy(load("openai__gpt-oss-20b"))
    config.update(
        num_hidden_layers=36,
        num_local_experts=128,
        layer_types=["sliding_attention", "full_attention"] * 18,
    )
    return config


H200_NODE = PoolLayout("h200", devices_per_node=8, nodes=1)
H100_NODE = PoolLayout("h100", devices_per_node=8, nodes=1)


def test_gpt_oss_120b_config_matches_the_published_size():
    # gpt-oss model card: 116.8B total parameters, 5.1B active per token.
    a = analysis(gpt_oss_120b_config())
    assert a["total_params"] == pytest.approx(116.8e9, rel=0.01)
    assert a["active_params_including_embedding"] == pytest.approx(5.7e9, rel=0.1)


def test_llama_405b_config_matches_the_published_size():
    # Llama 3.1 model card: 405B parameters.
    assert analysis(llama_405b_config())["total_params"] == pytest.approx(405.8e9, rel=0.01)


def test_deepseek_v3_fp8_fits_one_node_of_8_h200():
    # SGLang benchmark/deepseek_v3/README.md "Hardware Recommendation: 8 x NVIDIA H200 GPUs"
    # and SGLang docs "DeepSeek Usage": "Full precision FP8 (recommended): 8 x H200".
    plan = plan_release(analysis(load("deepseek-ai__DeepSeek-V3")), H200_NODE).to_dict()
    assert plan["fits"] and plan["devices"] == 8 and plan["nodes"] == 1
    assert plan["tp"] * plan["pp"] * plan["dp"] == 8


def test_deepseek_v3_fp8_does_not_fit_one_node_of_8_h100_but_two():
    # The same README: "If you do not have GPUs with large enough memory, please try
    # multi-node tensor parallelism" (its example serves on 2 x 8 H20/H100-class nodes);
    # SGLang docs list "2 x 8 x H100/800/20" for the FP8 weights.
    a = analysis(load("deepseek-ai__DeepSeek-V3"))
    with pytest.raises(NoFittingPlan) as err:
        plan_release(a, H100_NODE)
    assert err.value.suggestions.get("devices") == 16
    assert "16 x h100" in str(err.value)
    plan = plan_release(a, PoolLayout("h100", devices_per_node=8, nodes=2)).to_dict()
    assert plan["devices"] == 16 and plan["fits"]


def test_llama_405b_bf16_does_not_fit_8_h100_and_fp8_does():
    # "The Llama 3 Herd of Models" (2024) §6.1: the 405B model in BF16 "does not fit in the
    # GPU memory of a single machine with 8 Nvidia H100 GPUs"; §6.2 and Meta's Llama 3.1
    # announcement: quantized to FP8 it runs "within a single server node".
    a = analysis(llama_405b_config())
    with pytest.raises(NoFittingPlan) as err:
        plan_release(a, H100_NODE, dtype="bfloat16")
    assert err.value.suggestions.get("dtype") == "fp8"
    plan = plan_release(a, H100_NODE, dtype="fp8").to_dict()
    assert plan["fits"] and plan["devices"] == 8


def test_kimi_k2_needs_more_than_8_h100():
    # MoonshotAI/Kimi-K2 docs/deploy_guidance.md: the smallest deployment unit for the FP8
    # weights is 16 GPUs (H200/H20 platform); 1.03 TB of weights exceed 8 x 80 GB anyway.
    a = analysis(load("moonshotai__Kimi-K2-Instruct"))
    with pytest.raises(NoFittingPlan) as err:
        plan_release(a, H100_NODE)
    assert err.value.suggestions["devices"] > 8


def test_gpt_oss_120b_fits_a_single_80gb_device():
    # OpenAI, "Introducing gpt-oss": "gpt-oss-120b ... runs efficiently on a single 80 GB GPU".
    plan = plan_release(analysis(gpt_oss_120b_config()), H100_NODE).to_dict()
    assert plan["devices"] == 1 and plan["fits"]


def test_llama_31_8b_fits_a_single_24gb_device_at_bf16_with_a_short_context():
    # Hugging Face blog "Llama 3.1 - 405B, 70B & 8B with multilinguality and long context":
    # 8B at FP16 needs 16 GB for the weights; the KV cache at 128k tokens needs 15.62 GB more.
    a = analysis(load("meta-llama__Llama-3.1-8B"))
    l4 = PoolLayout("l4", devices_per_node=1, nodes=1)
    plan = plan_release(a, l4, context_tokens=8192, concurrency=1, dtype="bfloat16").to_dict()
    assert plan["devices"] == 1 and plan["fits"]
    with pytest.raises(NoFittingPlan) as err:
        plan_release(a, l4, context_tokens=131072, concurrency=1, dtype="bfloat16")
    assert err.value.suggestions["context_tokens"] < 131072
