"""The served workload (engine/stages/plan/steady_state.py, workload.py) against values
worked by hand, and `predict_workload`'s errors (plain pytest).

With a device of practically infinite bandwidth and FLOP/s and a fixed 10 ms a step, every
step takes 10 ms whatever it holds, so the steady state reads off Little's law: B requests
in flight, each living TTFT + (OSL - 1) steps, finish B / life a second.
"""

from __future__ import annotations

import pytest

from engine.architecture import analyze_config
from engine.catalog import Accelerator, load_catalog
from engine.stages.plan.communication import Links
from engine.stages.plan.errors import NoFittingPlan, PlanInputError
from engine.stages.plan.fits import Fit
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.model import ModelShape
from engine.stages.plan.steady_state import EngineLimits, Workload, engine_limits, solve
from engine.stages.plan.step_time import INTRA_NODE_LATENCY_S, Device, Efficiency, StepTokens
from engine.stages.plan.validity import Split, check_split
from engine.stages.plan.workload import predict_workload
from tests.engine.stages.realconfigs import load

FAST = Accelerator(
    kind="fast",
    name="Unbounded",
    vendor="test",
    memory_bytes=80 * 2**30,
    memory_bandwidth_bytes_per_s=1e30,
    dense_bf16_flops=1e30,
    dense_fp8_flops=None,
    dtypes=("bfloat16",),
    intra_node_bandwidth_bytes_per_s=1e30,
    inter_node_bandwidth_bytes_per_s=1e30,
    devices_per_node=8,
)
TEN_MS = Efficiency(bandwidth=1.0, flops=1.0, step_s=0.010, layer_s=0.0)
LIMITS = EngineLimits(max_running_sequences=1024, max_batched_tokens=8192, source="test")
LLAMA = "meta-llama__Llama-3.1-8B"
TP1 = Split(tp=1, pp=1, dp=1, ep=1)


def llama_analysis() -> dict:
    return analyze_config(load(LLAMA)).to_dict()


def fast_device(split: Split = TP1) -> Device:
    shape = ModelShape.from_analysis(llama_analysis())
    return Device(
        shape, split, check_split(shape, split), "bfloat16", "bfloat16", FAST,
        Links(8, 1e30, 1e30), TEN_MS,
    )  # fmt: skip


def test_littles_law_with_a_fixed_step():
    state = solve(fast_device(), Workload(100, 11, 4), kv_room_bytes=1e12, limits=LIMITS)
    # one step of prefill (100 <= 8,192 tokens), then 10 decode steps: life 0.11 s
    assert state["ttft_s"] == pytest.approx(0.010)
    assert state["tpot_s"] == pytest.approx(0.010)
    assert state["e2e_s"] == pytest.approx(0.110)
    assert state["output_tokens_per_s"] == pytest.approx(4 * 11 / 0.110)
    assert state["input_tokens_per_s"] == pytest.approx(4 * 100 / 0.110)
    assert state["batch"] == 4


def test_a_long_prompt_takes_a_chunk_a_step():
    state = solve(fast_device(), Workload(20_000, 11, 1), kv_room_bytes=1e12, limits=LIMITS)
    # 8,192 - 1 decoding token of room a step: 3 steps of prefill
    assert state["ttft_s"] == pytest.approx(0.030)
    assert state["e2e_s"] == pytest.approx(0.030 + 0.100)


def test_requests_beyond_the_kv_cache_wait_their_turn():
    # KV room for exactly 2 sequences at ISL + OSL/2 = 105.5 tokens -> 106 tokens
    device = fast_device()
    room = 2 * device.kv_bytes(105.5)
    state = solve(device, Workload(100, 11, 6), kv_room_bytes=room, limits=LIMITS)
    assert state["batch"] == 2
    assert state["bound"] == "kv_cache"
    # 4 requests ahead wait 4 x life / 2 = 0.22 s, then 0.01 s of prefill
    assert state["ttft_s"] == pytest.approx(0.22 + 0.010)
    assert state["output_tokens_per_s"] == pytest.approx(2 * 11 / 0.110)


def test_max_load_is_what_the_memory_holds():
    device = fast_device()
    room = 37 * device.kv_bytes(1000 + 500)
    state = solve(device, Workload(1000, 1000, None), kv_room_bytes=room, limits=LIMITS)
    assert state["batch"] == 37
    assert state["concurrency"] == 37


def test_max_load_stops_at_the_engine_cap():
    small = EngineLimits(max_running_sequences=8, max_batched_tokens=8192, source="test")
    state = solve(fast_device(), Workload(100, 100, None), kv_room_bytes=1e12, limits=small)
    assert state["batch"] == 8
    assert state["bound"] == "engine"


def test_pipeline_stages_multiply_the_time_a_token_takes():
    state = solve(
        fast_device(Split(tp=1, pp=2, dp=1, ep=1)),
        Workload(100, 11, 4),
        kv_room_bytes=1e12,
        limits=LIMITS,
    )
    # two stages, each 10 ms and one point-to-point hop's latency
    assert state["tpot_s"] == pytest.approx(2 * (0.010 + INTRA_NODE_LATENCY_S))


def test_data_parallel_replicas_add_up():
    one = solve(fast_device(), Workload(100, 11, 4), kv_room_bytes=1e12, limits=LIMITS)
    two = solve(
        fast_device(Split(tp=1, pp=1, dp=2, ep=1)),
        Workload(100, 11, 8),
        kv_room_bytes=1e12,
        limits=LIMITS,
    )
    assert two["output_tokens_per_s"] == pytest.approx(2 * one["output_tokens_per_s"])


def test_a_decode_pool_decodes_only():
    state = solve(
        fast_device(), Workload(1000, 100, 32, "decode"), kv_room_bytes=1e12, limits=LIMITS
    )
    assert state["output_tokens_per_s"] == pytest.approx(32 / 0.010)
    assert state["ttft_s"] is None


def test_a_prefill_pool_fills_its_token_budget():
    state = solve(
        fast_device(), Workload(4096, 1, 64, "prefill"), kv_room_bytes=1e12, limits=LIMITS
    )
    assert state["input_tokens_per_s"] == pytest.approx(8192 / 0.010)
    assert state["output_tokens_per_s"] is None


def test_engine_limits_follow_the_device():
    catalog = load_catalog()
    assert engine_limits("vllm", catalog.accelerator("h100"), 1).max_running_sequences == 1024
    assert engine_limits("vllm", catalog.accelerator("l4"), 1).max_running_sequences == 256
    assert engine_limits("tensorrt-llm", catalog.accelerator("h100"), 1).max_running_sequences == (
        2048
    )


FIXED_FIT = Fit("h100", "vllm", Efficiency(0.8, 0.6, 0.002, 2e-5, 0.5), 0, None, "prior", "t")


def test_predict_workload_names_its_fit_and_split():
    out = predict_workload(
        llama_analysis(),
        PoolLayout("h100", 8),
        Workload(1000, 1000, 64),
        split=Split(tp=1, pp=1, dp=1, ep=1),
        dtype="fp8",
        kv_dtype="fp8",
        fit=FIXED_FIT,
    ).to_dict()
    assert out["split"] == "TP1 PP1 EP1 DP1"
    assert out["fit"]["scope"] == "prior"
    assert out["kv_dtype"] == "fp8"
    assert out["output_tokens_per_s_per_device"] == pytest.approx(out["output_tokens_per_s"])
    assert out["e2e_s"] == pytest.approx(out["ttft_s"] + 999 * out["tpot_s"])


def test_fp8_kv_holds_twice_the_sequences():
    args = (llama_analysis(), PoolLayout("h100", 1), Workload(1000, 1000, None))
    bf16 = predict_workload(*args, dtype="fp8", fit=FIXED_FIT)
    fp8 = predict_workload(*args, dtype="fp8", kv_dtype="fp8", fit=FIXED_FIT)
    assert fp8.kv_capacity_sequences == pytest.approx(2 * bf16.kv_capacity_sequences, abs=1)


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        (Workload(0, 10, 1), "input_tokens"),
        (Workload(10, 10, 0), "concurrency"),
        (Workload(10, 10, 1, "both-ways"), "phase"),
        (Workload(10**9, 10, 1), "implausibly large"),
    ],
)
def test_bad_workloads_are_refused(workload, message):
    with pytest.raises(PlanInputError, match=message):
        predict_workload(llama_analysis(), PoolLayout("h100", 8), workload, fit=FIXED_FIT)


def test_a_split_that_does_not_fit_is_refused():
    with pytest.raises(NoFittingPlan):
        predict_workload(
            analyze_config(load("deepseek-ai__DeepSeek-V3")).to_dict(),
            PoolLayout("h100", 8),
            Workload(1000, 1000, 8),
            split=Split(tp=1, pp=1, dp=1, ep=1),
            fit=FIXED_FIT,
        )


def test_unknown_kv_dtype_is_refused():
    with pytest.raises(PlanInputError, match="KV-cache dtype"):
        predict_workload(
            llama_analysis(), PoolLayout("h100", 8), Workload(10, 10, 1), kv_dtype="int3"
        )


def test_a_lone_request_decodes_without_prefill_and_its_ttft_is_its_prompts_step():
    """At batch 1 no other prompt shares the decode steps: TPOT is a decode step, and TTFT
    the step that prefills the whole 8,000-token prompt (Llama-3.1-8B on an H100's figures)."""
    shape = ModelShape.from_analysis(llama_analysis())
    h100 = load_catalog().accelerator("h100")
    device = Device(
        shape, TP1, check_split(shape, TP1), "bfloat16", "bfloat16", h100,
        Links(8, 450e9, 50e9), Efficiency(0.8, 0.6, 0.002, 2e-5),
    )  # fmt: skip
    state = solve(device, Workload(8000, 100, 1), kv_room_bytes=40 * 2**30, limits=LIMITS)
    decoding = 99 * state["tpot_s"] / state["e2e_s"]  # the share of its life spent decoding
    decode_step = device.step(StepTokens(decode=decoding, decode_context=8050))
    assert state["tpot_s"] == pytest.approx(decode_step.total)
    prompt = device.step(StepTokens(decode=0, decode_context=0, prefill=8000, prefill_span=4000))
    assert state["ttft_s"] >= prompt.total > 5 * state["tpot_s"]
