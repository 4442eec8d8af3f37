"""Benchmark the `analyze` stage engine against building the model with transformers.

For each real config in tests/data/realconfigs: the best-of-N wall time of `analyze_config`,
the time transformers takes to build the same model on the `meta` device (what memory
calculators do), the analysis's peak Python memory (tracemalloc) and both parameter counts.
Checks the targets for a trillion-parameter config (Kimi-K2): analysis under 1 s and 300 MB.

Then the whole process, as a user runs it: the median of 5 runs of
`manage.py analyze demo/hub/moonshotai/Kimi-K2-Instruct` (Python's start, Django's settings,
the imports, reading the folder, the analysis, the output) against the median of 5 runs of a
script that builds the same config on transformers' meta device, and their ratio. Targets: under
0.5 s and at least 10x faster. The command's runs share a fresh DAY0_VAR_DIR whose defaults
cache a first, untimed run fills (its time is printed: a transformers version's first run
imports transformers).

Then the checkpoint's headers (`--only headers`): DeepSeek-V3 as published (its 91,000-odd
tensor names and shapes from transformers' meta-device build, FP8 with its scale tensors) in
64 header-only shards on the fake Hub: the time `fetch` takes to read every header (cold, then
from the per-commit cache), the requests it makes, and the time the analysis takes to count
and check those tensors. Target: at most two range requests per shard (one when a header is
under 100 kB) plus the release's five other requests, and the total parameters exactly the
checkpoint's.

Exits non-zero when a target fails.

Run: .venv/bin/python benchmarks/analyze.py [--only engine|process|headers]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from timing import best_time_s

from engine.architecture import analyze_config

CONFIGS = ROOT / "tests" / "data" / "realconfigs"
RUNS = 5
TARGET_CONFIG = "moonshotai__Kimi-K2-Instruct"
TARGET_TIME_S = 1.0
TARGET_PEAK_MB = 300.0
# Model types transformers does not know, mapped by their `architectures` entry.
ARCHITECTURE_MODEL_TYPES = {"DeepseekV3ForCausalLM": "deepseek_v3"}


def analysis_peak_mb(config: dict) -> float:
    """Peak Python heap of one `analyze_config` call, in MB (tracemalloc)."""
    tracemalloc.start()
    analyze_config(config)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 1e6


def meta_build(config: dict) -> tuple[float, int | None]:
    """Seconds to build the model on the meta device (best of two) and its param count."""
    try:
        import torch
        import transformers
    except ImportError:
        return float("nan"), None
    kwargs = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map")}
    model_type = kwargs.pop("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        arch = (config.get("architectures") or [""])[0]
        model_type = ARCHITECTURE_MODEL_TYPES.get(arch, model_type)
    transformers.logging.set_verbosity_error()
    cfg = transformers.AutoConfig.for_model(model_type, **kwargs)
    best = float("inf")
    for _ in range(2):  # the first build also pays for importing the modeling module
        start = time.perf_counter()
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
        best = min(best, time.perf_counter() - start)
    return best, sum(p.numel() for p in model.parameters())


# -- the whole process --------------------------------------------------------------------------

PROCESS_TARGET = "demo/hub/moonshotai/Kimi-K2-Instruct"
PROCESS_RUNS = 5
PROCESS_TARGET_S = 0.5
PROCESS_TARGET_RATIO = 10.0
# The meta-device build of the same config as a script of its own (argv[1]: config.json,
# argv[2]: ARCHITECTURE_MODEL_TYPES as JSON).
META_SCRIPT = """
import json, sys
import torch, transformers
config = json.load(open(sys.argv[1]))
kwargs = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map")}
model_type = kwargs.pop("model_type")
if model_type not in transformers.CONFIG_MAPPING:
    arch = (config.get("architectures") or [""])[0]
    model_type = json.loads(sys.argv[2]).get(arch, model_type)
transformers.logging.set_verbosity_error()
cfg = transformers.AutoConfig.for_model(model_type, **kwargs)
with torch.device("meta"):
    model = transformers.AutoModelForCausalLM.from_config(cfg)
print(sum(p.numel() for p in model.parameters()))
"""


def process_times_s(argv: list[str], *, runs: int, env: dict[str, str]) -> list[float]:
    """Wall times of `runs` runs of the process `argv`, each to its end (output discarded).
    Raises `RuntimeError` with its stderr when a run fails."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return times


def whole_process() -> list[str]:
    """The whole-process comparison; returns its failures."""
    python = sys.executable
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="day0-analyze-bench-") as var:
        env = os.environ | {"DAY0_VAR_DIR": var}
        command = [python, "manage.py", "analyze", PROCESS_TARGET]
        [cold_s] = process_times_s(command, runs=1, env=env)  # fills the defaults cache
        analyze_s = statistics.median(process_times_s(command, runs=PROCESS_RUNS, env=env))
    config = str(ROOT / PROCESS_TARGET / "config.json")
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print("whole process: transformers or torch is not installed; no comparison")
        return ["transformers or torch is not installed"]
    meta = [python, "-c", META_SCRIPT, config, json.dumps(ARCHITECTURE_MODEL_TYPES)]
    meta_s = statistics.median(process_times_s(meta, runs=PROCESS_RUNS, env=dict(os.environ)))
    ratio = meta_s / analyze_s
    time_ok = analyze_s < PROCESS_TARGET_S
    ratio_ok = ratio >= PROCESS_TARGET_RATIO
    print(f"whole process, median of {PROCESS_RUNS} runs, {PROCESS_TARGET}:")
    print(f"  manage.py analyze              {analyze_s:7.3f} s", end="")
    print(f"  (its first run, the defaults cache empty: {cold_s:.3f} s)")
    print(f"  transformers meta-device build {meta_s:7.3f} s")
    print(
        f"  time {analyze_s:.3f} s < {PROCESS_TARGET_S} s {'PASS' if time_ok else 'FAIL'}; "
        f"ratio {ratio:.1f}x >= {PROCESS_TARGET_RATIO:.0f}x {'PASS' if ratio_ok else 'FAIL'}"
    )
    if not time_ok:
        failures.append(f"manage.py analyze took {analyze_s:.3f} s as a whole process")
    if not ratio_ok:
        failures.append(f"manage.py analyze is only {ratio:.1f}x the meta-device build")
    return failures


def engine() -> list[str]:
    """The in-process comparison over every real config; returns its failures."""
    header = (
        f"{'config':40s} {'analysis ms':>11s} {'meta ms':>9s} {'ratio':>7s} "
        f"{'peak MB':>8s} {'analysis params':>17s} {'meta params':>17s}"
    )
    print(header)
    print("-" * len(header))
    failures: list[str] = []
    for path in sorted(CONFIGS.glob("*.json")):
        config = json.loads(path.read_text())
        analysis_s = best_time_s(runs=RUNS, fn=lambda config=config: analyze_config(config))
        peak_mb = analysis_peak_mb(config)
        params = analyze_config(config).total_params
        meta_s, meta_params = meta_build(config)
        ratio = meta_s / analysis_s if analysis_s else float("inf")
        print(
            f"{path.stem:40s} {analysis_s * 1e3:11.2f} {meta_s * 1e3:9.0f} {ratio:6.0f}x "
            f"{peak_mb:8.2f} {params:17,d} {meta_params or 0:17,d}"
        )
        if meta_params is not None and meta_params != params:
            failures.append(f"{path.stem}: {params:,} params vs transformers {meta_params:,}")
        if path.stem == TARGET_CONFIG:
            time_ok = analysis_s < TARGET_TIME_S
            mem_ok = peak_mb < TARGET_PEAK_MB
            print(
                f"  target {TARGET_CONFIG}: time {analysis_s:.4f} s < {TARGET_TIME_S} s "
                f"{'PASS' if time_ok else 'FAIL'}; peak {peak_mb:.2f} MB < {TARGET_PEAK_MB} MB "
                f"{'PASS' if mem_ok else 'FAIL'}"
            )
            if not time_ok:
                failures.append(f"{TARGET_CONFIG}: analysis took {analysis_s:.3f} s")
            if not mem_ok:
                failures.append(f"{TARGET_CONFIG}: analysis peaked at {peak_mb:.1f} MB")
    print()
    return failures


HEADER_CONFIG = "deepseek-ai__DeepSeek-V3"
HEADER_SHARDS = 64
# Two range requests per shard (a header over the 100 kB the first asks for), then model
# info and HEAD + GET for config.json and the index.
HEADER_MAX_REQUESTS = 2 * HEADER_SHARDS + 5


def headers() -> list[str]:
    """The header read of a 64-shard fake release; returns its failures."""
    from engine.architecture.checkpoint_analysis import with_checkpoint
    from engine.hubs import HubSpec
    from engine.hubs.huggingface import HuggingFaceSource
    from engine.stages.fetch.run import parse_release_files
    from tests.checkpoint_cases import fp8_blocks
    from tests.checkpoints import meta_build, shard
    from tests.fakehub import FakeHub

    config = json.loads((CONFIGS / f"{HEADER_CONFIG}.json").read_text())
    unquantized = {k: v for k, v in config.items() if k != "quantization_config"}
    table, params = meta_build(unquantized)
    table = fp8_blocks(table)
    files = {"config.json": json.dumps(config).encode(), **shard(table, HEADER_SHARDS, data=False)}
    header_kb = max(len(v) for k, v in files.items() if k.endswith(".safetensors")) / 1e3
    repo = "deepseek-ai/DeepSeek-V3"
    failures: list[str] = []
    saved = {name: os.environ.get(name) for name in ("DAY0_VAR_DIR", "HF_HUB_CACHE")}
    with tempfile.TemporaryDirectory(prefix="day0-headers-bench-") as var, FakeHub() as hub:
        # A fresh header cache and download cache: the first read is a cold one.
        os.environ["DAY0_VAR_DIR"] = var
        os.environ["HF_HUB_CACHE"] = os.path.join(var, "hf-cache")
        try:
            sha = hub.add_repo(repo, files)
            source = HuggingFaceSource(HubSpec(kind="huggingface", endpoint=hub.url))
            start = time.perf_counter()
            fetched = source.fetch_release(repo, sha)
            cold_s = time.perf_counter() - start
            requests = len(hub.requests)
            ranges = sum(1 for r in hub.requests if r.path.endswith(".safetensors"))
            hub.clear_log()
            start = time.perf_counter()
            source.fetch_release(repo, sha)
            warm_s = time.perf_counter() - start
            warm_ranges = sum(1 for r in hub.requests if r.path.endswith(".safetensors"))
            start = time.perf_counter()
            weights = parse_release_files(fetched)["weights"]
            fold_s = time.perf_counter() - start
            start = time.perf_counter()
            result = with_checkpoint(
                analyze_config(config, weights=weights).to_dict(), config, weights
            )
            analysis_s = time.perf_counter() - start
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    requests_ok = requests <= HEADER_MAX_REQUESTS
    total_ok = result["total_params"] == params
    print(
        f"headers: {HEADER_CONFIG}, {len(table):,} tensors in {HEADER_SHARDS} shards "
        f"(headers up to {header_kb:.0f} kB), fake Hub"
    )
    print(f"  header read, cold            {cold_s:7.3f} s  ({ranges} range requests)")
    print(f"  header read, cached          {warm_s:7.3f} s  ({warm_ranges} range requests)")
    print(f"  fold for the fetch result    {fold_s:7.3f} s  ({len(weights['tensors'])} entries)")
    print(f"  count and check (analysis)   {analysis_s:7.3f} s  (transformers' build included)")
    print(
        f"  requests {requests} <= {HEADER_MAX_REQUESTS} {'PASS' if requests_ok else 'FAIL'}; "
        f"total {result['total_params']:,} == transformers' {params:,} "
        f"{'PASS' if total_ok else 'FAIL'}"
    )
    if not requests_ok:
        failures.append(f"reading {HEADER_SHARDS} shards' headers took {requests} requests")
    if not total_ok:
        failures.append(f"checkpoint total {result['total_params']:,} != {params:,}")
    print()
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["engine", "process", "headers"], default=None)
    args = parser.parse_args()
    failures: list[str] = []
    if args.only in (None, "engine"):
        failures += engine()
    if args.only in (None, "process"):
        failures += whole_process()
    if args.only in (None, "headers"):
        failures += headers()
    for failure in failures:
        print(f"FAIL {failure}")
    print("PASS" if not failures else f"FAIL ({len(failures)} failed)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
