"""compare_with_known: what a release has that earlier releases did not."""

from __future__ import annotations

from engine.architecture import analyze_config, compare_with_known
from tests.engine.stages.realconfigs import load


def _analysis(name: str) -> dict:
    return analyze_config(load(name)).to_dict()


def test_nothing_known_reports_each_aspect_once():
    result = compare_with_known(_analysis("deepseek-ai__DeepSeek-V3"), [])
    aspects = [r["aspect"] for r in result]
    assert aspects == ["family", "attention", "MoE layout", "checkpoint quantization", "RoPE type"]
    assert "MLA" in result[1]["detail"] and "fp8" in result[3]["detail"]


def test_same_release_is_not_new_against_itself():
    llama = _analysis("meta-llama__Llama-3.1-8B")
    assert compare_with_known(llama, [llama]) == []


def test_deepseek_against_llama_and_qwen():
    known = [
        _analysis("meta-llama__Llama-3.1-8B"),
        _analysis("Qwen__Qwen3-235B-A22B-Instruct-2507"),
    ]
    result = {
        r["aspect"]: r["detail"]
        for r in compare_with_known(_analysis("deepseek-ai__DeepSeek-V3"), known)
    }
    assert result["family"] == "family deepseek_v3 has not been seen before"
    assert result["attention"] == "attention not seen before: MLA"
    assert (
        "sigmoid router, grouped top-k, shared experts, leading dense layers"
        in result["MoE layout"]
    )
    assert result["checkpoint quantization"] == "checkpoint quantization not seen before: fp8"
    assert result["RoPE type"] == "RoPE type not seen before: yarn"
    new_keys = result["config keys"]
    for key in ("kv_lora_rank", "q_lora_rank", "num_nextn_predict_layers", "first_k_dense_replace"):
        assert key in new_keys
    # Bookkeeping keys are never news.
    assert "transformers_version" not in new_keys and "bos_token_id" not in new_keys


def test_kimi_against_deepseek_only_brings_nothing_structural():
    result = compare_with_known(
        _analysis("moonshotai__Kimi-K2-Instruct"), [_analysis("deepseek-ai__DeepSeek-V3")]
    )
    aspects = {r["aspect"] for r in result}
    # Same family, attention, quantization and RoPE; n_group 1 makes its top-k flat.
    assert "family" not in aspects and "attention" not in aspects
    assert "checkpoint quantization" not in aspects and "RoPE type" not in aspects
    assert "MoE layout" in aspects


def test_gpt_oss_sliding_window_attention_is_new_against_llama():
    result = compare_with_known(
        _analysis("openai__gpt-oss-20b"), [_analysis("meta-llama__Llama-3.1-8B")]
    )
    details = {r["aspect"]: r["detail"] for r in result}
    assert details["attention"] == "attention not seen before: GQA + sliding-window layers"
    assert "layer_types" in details["config keys"] and "sliding_window" in details["config keys"]
