"""Split validity as vLLM/SGLang enforce it (plain pytest; sources in each test)."""

from __future__ import annotations

import pytest

from engine.architecture import analyze_config
from engine.stages.plan.memory import kv_bytes_per_sequence, weights_per_device
from engine.stages.plan.model import ModelShape
from engine.stages.plan.validity import (
    Split,
    check_split,
    padded_vocab,
    splits_for,
    valid_tp_sizes,
)
from tests.engine.stages.realconfigs import load


def shape_of(name: str, **overrides) -> ModelShape:
    config = load(name)
    config.update(overrides)
    return ModelShape.from_analysis(analyze_config(config).to_dict())


def qwen2_7b() -> ModelShape:
    """Qwen/Qwen2-7B's published shape: hidden 3,584, 28 layers, 28 heads, 4 KV heads,
    FFN 18,944, vocab 152,064 (its config.json), built on the Qwen2.5-72B file."""
    return shape_of(
        "Qwen__Qwen2.5-72B-Instruct",
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        vocab_size=152064,
    )


def test_qwen2_7b_on_8_devices_gets_tp_1_2_4_never_8():
    # vLLM QKVParallelLinear asserts TP divides the heads (28 % 8 != 0) and the KV heads or
    # is a multiple of them (vllm/model_executor/layers/linear.py).
    assert valid_tp_sizes(qwen2_7b(), 8) == [1, 2, 4]
    reasons = check_split(qwen2_7b(), Split(tp=8, pp=1, dp=1, ep=1)).reasons
    assert any("28 attention heads" in r for r in reasons)


def test_tp_between_kv_heads_must_divide_them():
    # 28 heads, 4 KV heads: TP 7 divides the heads but neither divides nor is a multiple of 4.
    validity = check_split(qwen2_7b(), Split(tp=7, pp=1, dp=1, ep=1))
    assert not validity.valid
    assert any("KV heads" in r for r in validity.reasons)


def test_kv_heads_replicated_past_their_count_cost_memory():
    # vLLM replicates a KV head on TP / kv_heads ranks when TP > kv_heads (linear.py
    # QKVParallelLinear: "num_kv_head_replicas"): Llama-3.1-8B (8 KV heads) at TP 16.
    shape = shape_of("meta-llama__Llama-3.1-8B")
    tp8, tp16 = Split(8, 1, 1, 1), Split(16, 1, 1, 1)
    v8, v16 = check_split(shape, tp8), check_split(shape, tp16)
    assert v16.valid and v16.kv_replication == 2
    assert any("replicated" in f for f in v16.flags)
    w8 = weights_per_device(shape, tp8, v8, "checkpoint")
    w16 = weights_per_device(shape, tp16, v16, "checkpoint")
    assert w16 > w8 / 2  # the replicated K/V projections are counted
    # Each rank holds one whole KV head: the cache per rank stops shrinking past 8.
    assert kv_bytes_per_sequence(shape, tp16, v16, 4096) == kv_bytes_per_sequence(
        shape, tp8, v8, 4096
    )


def test_mla_kv_cache_is_the_same_on_every_tp_rank():
    # DeepSeek-V2 paper §2.1: the compressed latent is shared by all heads; vLLM's MLA
    # backends keep it whole on every TP rank (not divided).
    shape = shape_of("deepseek-ai__DeepSeek-V3")
    per_seq = {
        tp: kv_bytes_per_sequence(
            shape, Split(tp, 1, 1, 1), check_split(shape, Split(tp, 1, 1, 1)), 1000
        )
        for tp in (1, 8, 16)
    }
    assert per_seq[1] == per_seq[8] == per_seq[16] == 70_272 * 1000


def test_gqa_kv_cache_divides_over_tp():
    shape = shape_of("meta-llama__Llama-3.1-8B")
    s1, s8 = Split(1, 1, 1, 1), Split(8, 1, 1, 1)
    one = kv_bytes_per_sequence(shape, s1, check_split(shape, s1), 1000)
    eight = kv_bytes_per_sequence(shape, s8, check_split(shape, s8), 1000)
    assert one == 131_072 * 1000 and eight == one / 8


def test_deepseek_v3_fp8_on_32_devices_gets_at_most_tp_16():
    # vLLM fp8.py validate_fp8_block_shape: each TP shard of a 128x128-blocked width must be
    # a multiple of 128; the dense FFN 18,432 / 32 = 576 and expert FFN 2,048 / 32 = 64 are not.
    shape = shape_of("deepseek-ai__DeepSeek-V3")
    valid = [s for s in splits_for(shape, 32) if check_split(shape, s).valid]
    assert max(s.tp for s in valid) == 16
    assert all(s.pp * s.dp > 1 for s in valid if s.tp == 16)  # PP or EP/DP for the rest
    reasons = " ".join(check_split(shape, Split(32, 1, 1, 1)).reasons)
    assert "not a multiple of the FP8 quantization block 128x128" in reasons


def test_every_sharded_width_must_divide():
    # vLLM `divide()` asserts exact division of each ColumnParallel/RowParallel width.
    shape = shape_of("meta-llama__Llama-3.1-8B", intermediate_size=14337)
    reasons = check_split(shape, Split(2, 1, 1, 1)).reasons
    assert any("dense FFN" in r for r in reasons)


def test_vocab_padded_to_64_as_vllm_does():
    # vLLM vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE = 64.
    assert padded_vocab(151_936) == 151_936
    assert padded_vocab(129_280) == 129_280
    assert padded_vocab(100) == 128


def test_ep_not_dividing_routed_experts_is_flagged_with_redundant_experts():
    # vLLM EPLB (--num-redundant-experts) balances uneven expert placement: 128 experts over
    # EP 6 need 22 per rank, 4 redundant.
    shape = shape_of("Qwen__Qwen3-235B-A22B-Instruct-2507")
    validity = check_split(shape, Split(tp=2, pp=1, dp=3, ep=6))
    assert validity.valid
    assert validity.redundant_experts == 4
    assert any("uneven EP" in f and "4 redundant" in f for f in validity.flags)


def test_pp_needs_a_layer_per_stage_and_places_embedding_and_head():
    shape = shape_of("meta-llama__Llama-3.1-8B")
    assert not check_split(shape, Split(1, 33, 1, 1)).valid  # 32 layers
    s1, s2 = Split(1, 1, 1, 1), Split(1, 2, 1, 1)
    v1, v2 = check_split(shape, s1), check_split(shape, s2)
    full = weights_per_device(shape, s1, v1, "checkpoint")
    half = weights_per_device(shape, s2, v2, "checkpoint")
    vocab_bytes = 128256 * 4096 * 2
    # half the layers plus the embedding (first stage) or the LM head (last stage)
    assert half == pytest.approx((full - 2 * vocab_bytes) / 2 + vocab_bytes, rel=1e-6)
