"""Benchmark the `analyze` stage engine against building the model with transformers.

For each real config in tests/data/realconfigs: the best-of-N wall time of `analyze_config`,
the time transformers takes to build the same model on the `meta` device (what memory
calculators do), the analysis's peak Python memory (tracemalloc) and both parameter counts.
Checks the targets for a trillion-parameter config (Kimi-K2): analysis under 1 s and 300 MB.
Exits non-zero when a target fails.

Run: .venv/bin/python benchmarks/analyze.py
"""

from __future__ import annotations

import json
import sys
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


def main() -> int:
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
    for failure in failures:
        print(f"FAIL {failure}")
    print("PASS" if not failures else f"FAIL ({len(failures)} failed)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
