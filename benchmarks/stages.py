"""Wall time and peak memory of the `operators` and `precision` stages on the CPU.

For each real config in tests/data/realconfigs, builds the scaled twin and runs both stages
on a CPU pool (bfloat16 and float16), printing wall seconds (time.perf_counter, twin build
included), the peak of Python allocations (tracemalloc; torch's tensor memory is not traced
there) and the process's peak resident set so far (ru_maxrss, KiB on Linux, MiB shown). Checks that
on the trillion-parameter config (Kimi-K2) both stages finish in under 60 s on 2 CPU threads;
prints PASS/FAIL and exits 0/1.

    .venv/bin/python benchmarks/stages.py
"""

from __future__ import annotations

import json
import resource
import sys
import time
import tracemalloc
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch

from engine.contract import PoolSpec, ReleaseRef, StageContext
from engine.stages.operators import run as operators
from engine.stages.precision import run as precision

CONFIGS = ROOT / "tests" / "data" / "realconfigs"
NAMES = (
    "meta-llama__Llama-3.1-8B",
    "Qwen__Qwen2.5-72B-Instruct",
    "Qwen__Qwen3-235B-A22B-Instruct-2507",
    "deepseek-ai__DeepSeek-V3",
    "moonshotai__Kimi-K2-Instruct",
    "openai__gpt-oss-20b",
)
TRILLION = "moonshotai__Kimi-K2-Instruct"
LIMIT_S = 60.0
THREADS = 2


def measure(stage, ctx: StageContext) -> tuple[float, float, float]:
    """(wall s, tracemalloc peak MiB, process peak RSS MiB) of one stage run."""
    tracemalloc.start()
    start = time.perf_counter()
    stage.run(ctx)
    wall = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return wall, peak / 2**20, rss


def main() -> int:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(THREADS)
    pool = PoolSpec(name="cpu", backend="cpu", queue="cpu")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    start = time.perf_counter()
    from engine.twin import build_twin

    build_twin(json.loads((CONFIGS / f"{NAMES[0]}.json").read_text()))
    print(
        "one-time import of transformers' modeling code + "
        f"first twin: {time.perf_counter() - start:.2f} s"
    )
    print(f"{'config':40} {'stage':10} {'wall s':>8} {'py peak MiB':>12} {'RSS MiB':>9}")
    ok = True
    for name in NAMES:
        config = json.loads((CONFIGS / f"{name}.json").read_text())
        ctx = StageContext(
            release=ReleaseRef("mirror", str(CONFIGS), name.replace("__", "/"), "main"),
            pool=pool,
            previous={"fetch": {"config": config}},
        )
        for stage in (operators, precision):
            wall, py_peak, rss = measure(stage, ctx)
            print(
                f"{name:40} {stage.__name__.rsplit('.', 1)[-1]:10} {wall:8.2f} "
                f"{py_peak:12.1f} {rss:9.0f}"
            )
            if name == TRILLION and wall >= LIMIT_S:
                ok = False
    verdict = "PASS" if ok else "FAIL"
    print(
        f"{verdict}: {TRILLION} operators and precision "
        f"each under {LIMIT_S:g} s on {THREADS} threads"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
