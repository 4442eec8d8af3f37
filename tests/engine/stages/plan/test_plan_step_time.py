"""Each term of the step-time model against a value computed by hand (plain pytest).

The device is a made-up accelerator with round figures (1e12 bytes/s, 1e15 FLOP/s BF16,
2e15 FP8, 100 GB/s inside a node, 10 GB/s across) and the efficiencies at 1, so every
expected value below is the formula of engine/stages/plan/step_time.py worked by hand on
Llama-3.1-8B (32 layers, hidden 4,096, 32 heads, 8 KV heads of 128, vocabulary 128,256,
untied: body 6,979,588,096 params) or Qwen3-235B-A22B (94 MoE layers, 128 experts, top 8,
expert FFN 1,536, hidden 4,096).
"""

from __future__ import annotations

import math

import pytest

from engine.architecture import analyze_config
from engine.catalog import Accelerator
from engine.stages.plan.communication import Links
from engine.stages.plan.model import ModelShape
from engine.stages.plan.step_time import (
    INTER_NODE_LATENCY_S,
    INTRA_NODE_LATENCY_S,
    LINK_EFFICIENCY,
    Device,
    Efficiency,
    StepTokens,
)
from engine.stages.plan.validity import Split, check_split
from tests.engine.stages.realconfigs import load

ROUND = Accelerator(
    kind="round",
    name="Round numbers",
    vendor="test",
    memory_bytes=80 * 2**30,
    memory_bandwidth_bytes_per_s=1e12,
    dense_bf16_flops=1e15,
    dense_fp8_flops=2e15,
    dtypes=("bfloat16", "float8_e4m3fn"),
    intra_node_bandwidth_bytes_per_s=100e9,
    inter_node_bandwidth_bytes_per_s=10e9,
    devices_per_node=8,
)
EXACT = Efficiency(bandwidth=1.0, flops=1.0, step_s=0.0, layer_s=0.0, moe=1.0)
LLAMA_BODY = 6_979_588_096
LLAMA_VOCAB_ROWS = 128_256 * 4096


def device(name: str, split: Split, *, dtype="bfloat16", kv="bfloat16", eff=EXACT, nodes=1):
    shape = ModelShape.from_analysis(analyze_config(load(name)).to_dict())
    links = Links(8, ROUND.intra_node_bandwidth_bytes_per_s, ROUND.inter_node_bandwidth_bytes_per_s)
    return Device(shape, split, check_split(shape, split), dtype, kv, ROUND, links, eff)


TP1 = Split(tp=1, pp=1, dp=1, ep=1)
LLAMA = "meta-llama__Llama-3.1-8B"


def test_the_body_count_the_terms_use():
    shape = device(LLAMA, TP1).shape
    assert shape.body_params + shape.shared_expert_params == LLAMA_BODY


def test_dense_gemms_read_the_weights_at_small_batch_and_compute_at_large():
    d = device(LLAMA, TP1)
    small = d.step(StepTokens(decode=10, decode_context=1000))
    # 6,979,588,096 params x 2 bytes / 1e12 bytes/s
    assert small.dense == pytest.approx(2 * LLAMA_BODY / 1e12)
    large = d.step(StepTokens(decode=4000, decode_context=1))
    # 2 x params x 4,000 tokens / 1e15 FLOP/s
    assert large.dense == pytest.approx(2 * LLAMA_BODY * 4000 / 1e15)


def test_fp8_weights_halve_the_bytes_and_use_the_8_bit_unit():
    d = device(LLAMA, TP1, dtype="fp8")
    assert d.step(StepTokens(decode=10, decode_context=1)).dense == pytest.approx(LLAMA_BODY / 1e12)
    assert d.step(StepTokens(decode=8000, decode_context=1)).dense == pytest.approx(
        2 * LLAMA_BODY * 8000 / 2e15
    )


def test_lm_head_reads_its_rows_once_a_step():
    d = device(LLAMA, TP1)
    assert d.step(StepTokens(decode=10, decode_context=1)).lm_head == pytest.approx(
        2 * LLAMA_VOCAB_ROWS / 1e12
    )


def test_decode_attention_reads_each_sequence_kv_at_its_context():
    # 131,072 bytes of bf16 KV per token (32 layers x 8 heads x 128 x K,V x 2 bytes)
    d = device(LLAMA, TP1)
    step = d.step(StepTokens(decode=10, decode_context=1000))
    assert step.attention == pytest.approx(10 * 1000 * 131_072 / 1e12)
    fp8 = device(LLAMA, TP1, kv="fp8").step(StepTokens(decode=10, decode_context=1000))
    assert fp8.attention == pytest.approx(10 * 1000 * 65_536 / 1e12)


def test_prefill_attention_computes_over_half_the_prompt():
    d = device(LLAMA, TP1)
    step = d.step(StepTokens(decode=0, decode_context=0, prefill=1000, prefill_span=500))
    # 2 x 32 heads x (2 x 128) x (32 layers x 500) x 1,000 tokens / 1e15
    assert step.attention == pytest.approx(2 * 32 * 256 * 32 * 500 * 1000 / 1e15)


def test_tp_all_reduces_two_a_layer_over_the_node_links():
    d = device(LLAMA, Split(tp=2, pp=1, dp=1, ep=1))
    step = d.step(StepTokens(decode=100, decode_context=1))
    per = 100 * 4096 * 2 * (2 * 1 / 2) / (100e9 * LINK_EFFICIENCY) + INTRA_NODE_LATENCY_S
    assert step.communication == pytest.approx(64 * per)


def test_tp_across_nodes_adds_a_ring_of_the_nodes():
    d = device(LLAMA, Split(tp=16, pp=1, dp=1, ep=1))
    step = d.step(StepTokens(decode=100, decode_context=1))
    buffer = 100 * 4096 * 2
    per = (
        2 * 7 / 8 * buffer / (100e9 * LINK_EFFICIENCY)
        + INTRA_NODE_LATENCY_S
        + 2 * 1 / 2 * buffer / (10e9 * LINK_EFFICIENCY)
        + INTER_NODE_LATENCY_S
    )
    assert step.communication == pytest.approx(64 * per)


def test_fixed_costs_per_step_and_per_layer():
    eff = Efficiency(bandwidth=1.0, flops=1.0, step_s=0.003, layer_s=0.0001)
    step = device(LLAMA, TP1, eff=eff).step(StepTokens(decode=1, decode_context=1))
    assert step.fixed == pytest.approx(0.003 + 32 * 0.0001)
    halved = device(LLAMA, Split(tp=1, pp=2, dp=1, ep=1), eff=eff)
    assert halved.step(StepTokens(decode=1, decode_context=1)).fixed == pytest.approx(
        0.003 + 16 * 0.0001
    )


def test_step_is_the_sum_of_its_kernels():
    step = device(LLAMA, Split(tp=2, pp=1, dp=1, ep=1)).step(
        StepTokens(decode=64, decode_context=2000, prefill=512, prefill_span=256)
    )
    parts = step.to_dict()
    assert parts["step_s"] == pytest.approx(
        sum(v for k, v in parts.items() if k != "step_s"), rel=1e-12
    )


QWEN = "Qwen__Qwen3-235B-A22B-Instruct-2507"
EXPERT_PARAMS = 3 * 4096 * 1536


def test_experts_touched_follow_the_global_tokens_of_the_ep_group():
    ep8 = Split(tp=1, pp=1, dp=8, ep=8)
    d = device(QWEN, ep8)
    step = d.step(StepTokens(decode=1, decode_context=1))
    # 16 experts x 94 layers on the device, bf16; 8 tokens reach the layer (one per rank)
    touched = 1 - (1 - 8 / 128) ** 8
    weights = 16 * 94 * EXPERT_PARAMS * 2
    assert step.experts == pytest.approx(weights * touched / 1e12)
    # 6.45x what one replica's single token touches (the per-replica reading)
    per_replica = weights * (8 / 128) / 1e12
    assert step.experts / per_replica == pytest.approx(touched / (8 / 128))
    assert step.experts / per_replica > 6.4


def test_expert_gemms_compute_their_share_of_the_global_tokens():
    d = device(QWEN, Split(tp=1, pp=1, dp=8, ep=8))
    step = d.step(StepTokens(decode=2000, decode_context=1))
    flops = 2 * EXPERT_PARAMS * 8 * (2000 * 8) / 8 * 94
    assert step.experts == pytest.approx(flops / 1e15)


def test_moe_efficiency_slows_the_expert_path_only():
    slow = Efficiency(bandwidth=1.0, flops=1.0, step_s=0.0, layer_s=0.0, moe=0.5)
    tokens = StepTokens(decode=2000, decode_context=1)
    exact = device(QWEN, Split(tp=1, pp=1, dp=8, ep=8)).step(tokens)
    halved = device(QWEN, Split(tp=1, pp=1, dp=8, ep=8), eff=slow).step(tokens)
    assert halved.experts == pytest.approx(2 * exact.experts)
    assert halved.communication == pytest.approx(2 * exact.communication)
    assert halved.dense == pytest.approx(exact.dense)


def test_all_to_all_inside_a_node():
    d = device(QWEN, Split(tp=1, pp=1, dp=8, ep=8))
    step = d.step(StepTokens(decode=100, decode_context=1))
    # 100 tokens x 8 experts x 7/8 leave the device, dispatch + combine at bf16
    per_layer = 100 * 8 * (7 / 8) * 4096 * 4 / (100e9 * LINK_EFFICIENCY)
    per_layer += 2 * INTRA_NODE_LATENCY_S
    assert step.communication == pytest.approx(94 * per_layer)


def test_all_to_all_across_nodes_sends_once_per_remote_node():
    d = device(QWEN, Split(tp=1, pp=1, dp=16, ep=16))
    step = d.step(StepTokens(decode=100, decode_context=1))
    intra = 100 * 8 * (7 / 16) * 4096 * 4 / (100e9 * LINK_EFFICIENCY)
    remote_nodes = 1 * (1 - (1 - 1 / 2) ** 8)
    inter = 100 * remote_nodes * 4096 * 4 / (10e9 * LINK_EFFICIENCY)
    per_layer = intra + inter + 2 * INTRA_NODE_LATENCY_S + 2 * INTER_NODE_LATENCY_S
    assert step.communication == pytest.approx(94 * per_layer)
    assert math.isclose(remote_nodes, 255 / 256)
