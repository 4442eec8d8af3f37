"""Calibration against probe errors (no Django): device probes sized until their figure is
stable, and an efficiency above the roofline flagged as a probe error, kept on its point and
never used to calibrate. Fixed numbers throughout (a fake timer for the probe)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from engine import device_probe
from engine.architecture import analyze_config
from engine.stages.plan.calibration import (
    MAX_EFFICIENCY,
    calibrated_predictions,
    running_calibration,
    twin_calibration,
    usable_efficiency,
)

SMALL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def table_seconds(flops_by_n: dict[int, float]):
    """A stand-in for the probe's `_best_seconds`: a matmul of size n takes 2 n^3 /
    flops_by_n[n] seconds (the product is not run): what a host whose small products are
    set-up bound reports."""

    def best(_timer, fn, _repeats):
        n = fn.args[0].shape[0]
        return 2 * n**3 / flops_by_n[n]

    return best


def test_the_matmul_probe_grows_until_two_sizes_agree(monkeypatch):
    """A float16 probe: 1.17 GFLOP/s at n = 256 (a product long enough to stop the old
    probe there), then 40, 68, 71.5 GFLOP/s: the probe goes on to 2,048, where two sizes
    agree within 10%, and reports 71.5 GFLOP/s, stable."""
    table = {256: 1.17e9, 512: 40e9, 1024: 68e9, 2048: 71.5e9, 4096: 72e9}
    monkeypatch.setattr(device_probe, "_best_seconds", table_seconds(table))
    matmul = device_probe.measure_matmul_flops(torch.device("cpu"), torch.float16, repeats=1)
    assert matmul["flops"] == pytest.approx(71.5e9) and matmul["n"] == 2048
    assert matmul["stable"] is True and matmul["stopped"] == "stable"
    assert [s["n"] for s in matmul["sizes"]] == [256, 512, 1024, 2048]
    # 2 x 256^3 / 1.17e9 = 28.7 ms: the old rule (one product of 10 ms) stopped at 256
    assert matmul["sizes"][0]["seconds"] > device_probe.MIN_MATMUL_S


def test_a_probe_that_never_agrees_is_flagged_unstable(monkeypatch):
    table = {256: 1e9, 512: 4e9, 1024: 16e9, 2048: 64e9, 4096: 256e9}
    monkeypatch.setattr(device_probe, "_best_seconds", table_seconds(table))
    matmul = device_probe.measure_matmul_flops(torch.device("cpu"), torch.float32, repeats=1)
    assert matmul["stable"] is False and matmul["stopped"] == "largest size"
    assert matmul["n"] == device_probe.CPU_MATMUL_MAX_N
    # a time cap ends the sizing early, unstable, with what it had
    capped = device_probe.measure_matmul_flops(
        torch.device("cpu"), torch.float32, repeats=1, time_cap_s=0.0
    )
    assert capped["stopped"] == "time cap" and capped["n"] == 256 and not capped["stable"]


def test_the_probe_reports_per_dtype_stability(monkeypatch):
    calls = []

    def fake_matmul(device, dtype, *, repeats, time_cap_s):
        calls.append(time_cap_s)
        flops = {torch.bfloat16: 71.5e9, torch.float16: 1.17e9}[dtype]
        return {
            "flops": flops,
            "n": 2048,
            "stable": dtype == torch.bfloat16,
            "sizes": [{"n": 2048, "flops": flops, "seconds": 0.2}],
            "stopped": "stable" if dtype == torch.bfloat16 else "time cap",
        }

    monkeypatch.setattr(device_probe, "measure_matmul_flops", fake_matmul)

    class FrozenTime:
        """The module's `time` with the probe's own clock stopped, so the shares of the cap
        do not depend on how long the real bandwidth measurement took on a busy host."""

        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def perf_counter() -> float:
            return 100.0

    monkeypatch.setattr(device_probe, "time", FrozenTime())
    probe = device_probe.probe_device(
        torch.device("cpu"), ["bfloat16", "float16"], repeats=1, array_bytes=4 * 2**20,
        time_cap_s=6.0,
    )  # fmt: skip
    json.dumps(probe, allow_nan=False)
    assert probe["flops_stable"] == {"bfloat16": True, "float16": False}
    assert probe["matmul_n"] == {"bfloat16": 2048, "float16": 2048}
    # shared out: a third to the bandwidth, then half the rest to bfloat16, all to float16
    assert probe["time_cap_s"] == 6.0 and calls == [3.0, 6.0]
    # the bandwidth is measured from half the size up, doubling (how many sizes fit its share
    # of the cap depends on the host's speed), and reports its last size
    measured = [s["array_bytes"] for s in probe["sizes"]]
    assert measured == [2 * 2**20 * 2**i for i in range(len(measured))]
    assert isinstance(probe["stable"], bool) and probe["array_bytes"] == measured[-1]


FIGURES = {
    "kind": "measured",
    "name": "cpu (pool cpu)",
    "memory_bandwidth_bytes_per_s": 20e9,
    # float16's FLOP/s probed 60x too low: its prefill efficiencies come out over 1
    "flops": {"bfloat16": 71.5e9, "float16": 1.17e9},
    "source": "a test",
}


def test_an_efficiency_above_the_roofline_is_a_flagged_probe_error():
    measured = [
        {"dtype": "bfloat16", "batch_size": 1, "prompt_len": 16,
         "decode_tokens_per_s": 500.0, "prefill_tokens_per_s": 4000.0},
        {"dtype": "float16", "batch_size": 1, "prompt_len": 16,
         "decode_tokens_per_s": 450.0, "prefill_tokens_per_s": 4000.0},
        {"dtype": "float16", "batch_size": 2, "prompt_len": 16,
         "decode_tokens_per_s": 800.0, "prefill_tokens_per_s": 7000.0},
    ]  # fmt: skip
    calibration = twin_calibration(
        analyze_config(SMALL).to_dict(), measured, FIGURES, warmup=2, repeats=5
    )
    json.dumps(calibration, allow_nan=False)
    bf16, *fp16 = calibration["points"]
    assert "probe_error" not in bf16 and bf16["prefill_efficiency"] <= MAX_EFFICIENCY
    for point in fp16:
        # kept, with the flag and the figure that was measured too low
        assert point["prefill_efficiency"] > 1
        assert "prefill_efficiency" in point["probe_error"]
        assert "above the roofline" in point["probe_error_reason"]
        assert "1.17e+09 FLOP/s in float16" in point["probe_error_reason"]
    assert calibration["probe_errors"] == 2
    assert calibration["probe_error"].startswith("2 of 3 points measured above the roofline")
    # never used: the prefill median is bfloat16's alone; float16 has none
    assert calibration["prefill_efficiency_median"] == pytest.approx(bf16["prefill_efficiency"])
    assert calibration["by_dtype"]["float16"]["prefill_efficiency_median"] is None
    assert calibration["by_dtype"]["float16"]["probe_errors"] == 2
    # the decode efficiencies at or under the roofline are used as before
    usable = [p["decode_efficiency"] for p in calibration["points"] if p["decode_efficiency"] <= 1]
    assert bf16["decode_efficiency"] in usable
    assert calibration["decode_efficiency_median"] == pytest.approx(
        sorted(usable)[len(usable) // 2] if len(usable) % 2 else sum(usable) / 2
    )
    assert usable_efficiency(1.0) == 1.0 and usable_efficiency(1.598) is None
    assert usable_efficiency(0) is None and usable_efficiency(None) is None


def run(stage_run: int, decode: list[float], prefill: list[float], **extra) -> dict:
    return {
        "stage_run": stage_run,
        "job": stage_run,
        "release": "org/m",
        "finished_at": "2025-01-01T00:00:00+00:00",
        "worker_host": "cpu@box",
        "decode_efficiency": decode,
        "prefill_efficiency": prefill,
        "dtypes": ["float16"],
        "twin_params": 1000,
        "device": None,
    } | extra


def test_efficiencies_above_1_never_reach_the_plans_factors():
    """A pool's stored runs with prefill efficiencies of 2.61, 3.53 and 6.73 carried
    a prefill_factor of 1.598 into the next plan, a TTFT faster than the roofline. Left out,
    the factor is the runs' efficiencies at or under 1, and none where there are none."""
    runs = [
        run(3, [0.2], [2.61, 0.5]),
        run(2, [0.3], [3.53, 6.73]),
        run(1, [0.25, 1.2], [0.4], probe_errors=1),  # the caller dropped one already
    ]
    calibration = running_calibration("cpu", runs)
    json.dumps(calibration, allow_nan=False)
    assert calibration["prefill_factor"] == pytest.approx(0.45)  # median of 0.5 and 0.4
    assert calibration["decode_factor"] == pytest.approx(0.25)  # 1.2 left out of run 1
    assert [r["probe_errors"] for r in calibration["per_run"]] == [1, 2, 2]
    assert calibration["probe_errors"] == 5
    assert "5 efficiencies above the roofline" in calibration["probe_error"]
    predicted = {
        "available": True,
        "batch_1": {"tpot_s": 0.01, "decode_tokens_per_s": 100.0},
        "prefill": [{"prompt_tokens": 128, "ttft_s": 0.1}],
    }
    calibrated = calibrated_predictions(predicted, calibration)
    assert calibrated["prefill_factor"] == pytest.approx(0.45)  # reported, never above 1
    only_errors = running_calibration("cpu", [run(1, [1.5], [2.61])])
    assert only_errors["available"] is False and only_errors["runs"] == 0
    assert only_errors["reason"].endswith("at or under the roofline")
