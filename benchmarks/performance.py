"""The `performance` stage on the local CPU: the measured curve of one twin, and the stage's time.

Runs `engine.stages.performance.run.run` (twin build included) with default settings for one
real config of tests/data/realconfigs (default DeepSeek-V3's twin: MLA + MoE, the slowest of
the real configs' twins) on a CPU pool declaring bfloat16 and float16, with
DAY0_TORCH_THREADS torch threads (default 1, as a worker process runs; `--threads 2` for one
process on both cores). Prints every measured point (TTFT and TPOT median/p95 in ms, prefill
and decode tokens/s, peak process RSS in MiB), the knee per dtype and prompt length, and the
stage's wall time (time.perf_counter); checks that the stage finishes in under 60 s and prints
PASS/FAIL, exit status 0/1. The figures are the scaled twin's, not the full-size model's.

    .venv/bin/python benchmarks/performance.py [config name] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch

from engine.contract import PoolSpec, ReleaseRef, StageContext
from engine.registry import get_stage
from engine.stages.performance import run as performance

CONFIGS = ROOT / "tests" / "data" / "realconfigs"
DEFAULT_NAME = "deepseek-ai__DeepSeek-V3"
LIMIT_S = 60.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", default=DEFAULT_NAME, help="a realconfigs file stem")
    parser.add_argument(
        "--threads", type=int, default=int(os.environ.get("DAY0_TORCH_THREADS", "1"))
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=float(get_stage("performance").time_limits_s()[0]),
        help="the stage's time budget in seconds (its soft limit; default the registry's)",
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    config = json.loads((CONFIGS / f"{args.name}.json").read_text())
    ctx = StageContext(
        release=ReleaseRef("mirror", str(CONFIGS), args.name.replace("__", "/"), "main"),
        pool=PoolSpec(name="cpu", backend="cpu", queue="cpu"),
        previous={"fetch": {"config": config}},
        soft_time_limit_s=args.budget,
    )
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"{os.cpu_count()} CPU(s); twin of {args.name}"
    )
    start = time.perf_counter()
    result = performance.run(ctx)
    wall = time.perf_counter() - start
    print(f"timer: {result['timer']}; memory: {result['memory_method']}")
    print(
        f"{'dtype':9} {'prompt':>6} {'batch':>5} {'TTFT ms':>8} {'p95':>8} {'TPOT ms':>8} "
        f"{'p95':>7} {'prefill tok/s':>13} {'decode tok/s':>12} {'RSS MiB':>8}"
    )
    for p in result["points"]:
        if p["kind"] != "measured":
            continue
        print(
            f"{p['dtype']:9} {p['prompt_len']:6d} {p['batch_size']:5d} "
            f"{p['ttft_s'] * 1e3:8.2f} {p['ttft_p95_s'] * 1e3:8.2f} "
            f"{p['tpot_s'] * 1e3:8.2f} {p['tpot_p95_s'] * 1e3:7.2f} "
            f"{p['prefill_tokens_per_s']:13,.0f} {p['decode_tokens_per_s']:12,.0f} "
            f"{p['peak_memory_bytes'] / 2**20:8.0f}"
        )
    for knee in result["knees"]:
        print(
            f"knee {knee['dtype']} prompt {knee['prompt_len']}: batch {knee['batch_size']} "
            f"(TPOT {knee['tpot_s'] * 1e3:.2f} ms, {knee['decode_tokens_per_s']:,.0f} tokens/s, "
            f"found={knee['found']}): {knee['reason']}"
        )
    for stop in result["stopped"]:
        print(f"{stop['dtype']} prompt {stop['prompt_len']}: {stop['reason']}")
    budget = result["time_budget"]
    print(
        f"time budget {budget['budget_s']:g} s ({budget['source']}): sweep deadline "
        f"{budget['sweep_budget_s']:.1f} s in, {budget['points_timed']} points in "
        f"{budget['sweep_s']:.1f} s; stopped: {budget['stopped'] or 'no'}"
        + (f" at {budget['stopped_at']}" if budget["stopped_at"] else "")
    )
    device = (result.get("calibration") or {}).get("device") or {}
    for dtype, flops in (device.get("flops") or {}).items():
        print(
            f"probe {dtype}: {flops / 1e9:,.1f} GFLOP/s at n={device['matmul_n'][dtype]} "
            f"(stable: {device.get('flops_stable', {}).get(dtype)})"
        )
    print(
        f"recommended: batch {result['knee_batch_size']} at TPOT "
        f"{result['knee_tpot_s'] * 1e3:.2f} ms ({result['knee']['dtype']})"
    )
    ok = wall < LIMIT_S
    print(
        f"{'PASS' if ok else 'FAIL'}: the performance stage took {wall:.1f} s "
        f"(measuring {result['duration_s']:.1f} s, the rest the twin build), "
        f"limit {LIMIT_S:g} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
