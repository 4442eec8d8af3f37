"""Step time and share of time in collectives at TP 1 and 2, dense and MoE twins, local CPU.

For the Llama-3.1-8B twin (dense) and the Qwen3-235B-A22B twin (MoE, EP=2 at TP=2) runs the
distributed stage's engine (`engine.stages.distributed.validate_split`: torchrun, gloo,
transformers' tp_plan/ep_plan) with 1 and with 2 processes, and prints per run the median
decode step (seconds, batch 2, measured), decode tokens/s, the profiled share of the run
spent in collectives, the worst max |logit error| against the float32 reference, and the
measured scaling efficiency (TP=1 step / (2 x TP=2 step)). Every process gets the same share
of the host's cores, half of them (1 thread on 2 cores), at TP=1 as at TP=2: one "device".
Checks that every run matches the reference and that one validation, launch to verdict,
takes under 60 s (the stage's default limit is 180 s for the ranks); prints PASS/FAIL and
exits 0/1.

    .venv/bin/python benchmarks/distributed.py
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.stages.distributed.run import validate_split
from engine.twin import build_twin

CONFIGS = ROOT / "tests" / "data" / "realconfigs"
TWINS = (
    ("dense", "meta-llama__Llama-3.1-8B", False),
    ("MoE", "Qwen__Qwen3-235B-A22B-Instruct-2507", True),
)
LIMIT_S = 60.0
THREADS = max(1, len(os.sched_getaffinity(0)) // 2)


def main() -> int:
    warnings.filterwarnings("ignore")
    ok = True
    header = (
        f"{'twin':<6} {'TP':>2} {'EP':>2} {'step ms':>8} {'tokens/s':>9} {'comm %':>7} "
        f"{'max |err|':>10} {'efficiency':>10} {'wall s':>7}"
    )
    print(header)
    print("-" * len(header))
    for label, name, moe in TWINS:
        config = json.loads((CONFIGS / f"{name}.json").read_text())
        twin = build_twin(config, parallel_degree=2)
        for tp in (1, 2):
            ep = tp if moe else 1
            start = time.perf_counter()
            result = validate_split(twin, tp=tp, ep=ep, threads_per_rank=THREADS)
            wall = time.perf_counter() - start
            comm = result["comm_fraction"]
            efficiency = result["scaling_efficiency"] if tp > 1 else None
            print(
                f"{label:<6} {tp:>2} {ep:>2} {result['step_time_s'] * 1e3:>8.2f} "
                f"{result['tokens_per_s']:>9.0f} {comm * 100 if comm is not None else 0:>7.1f} "
                f"{result['max_abs_error']:>10.2e} "
                f"{efficiency if efficiency is not None else float('nan'):>10.3f} {wall:>7.1f}"
            )
            ok &= bool(result["passed"]) and wall < LIMIT_S
    print(
        "\nstep = median decode step of batch 2 (measured); comm % = profiled self time of "
        "c10d collectives and waits over the run's wall time; efficiency = TP=1 step / "
        "(2 x TP=2 step), 1 = linear."
    )
    verdict = "PASS" if ok else "FAIL"
    print(f"{verdict}: every run matches the reference, each under {LIMIT_S:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
