"""Benchmark the `plan` engine: wall time per real config and for a 10-trillion-parameter
config (target: under 1 s each; see benchmarks/planner.md). The predictions' accuracy
against published serving results is benchmarks/planner_accuracy.py's. Prints PASS/FAIL per
target and exits non-zero when one fails.

Run: .venv/bin/python benchmarks/planner.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from timing import best_time_s

from engine.architecture import analyze_config
from engine.stages.plan.errors import NoFittingPlan
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release

CONFIGS = ROOT / "tests" / "data" / "realconfigs"
TARGET_TIME_S = 1.0
RUNS = 3


def plan_or_reason(analysis: dict, layout: PoolLayout) -> str:
    try:
        plan = plan_release(analysis, layout).to_dict()
    except NoFittingPlan as err:
        return f"no fit -> {err.suggestions}"
    return f"TP{plan['tp']} PP{plan['pp']} EP{plan['ep']} DP{plan['dp']} on {plan['devices']}"


def ten_trillion_config() -> dict:
    """DeepSeek-V3's shape with 4,096 routed experts (about 10.5T parameters)."""
    config = json.loads((CONFIGS / "deepseek-ai__DeepSeek-V3.json").read_text())
    config["n_routed_experts"] = 4096
    return config


def main() -> int:
    ok = True
    print("== planning time (best of 3), pool 8 x h100 per node ==")
    for path in sorted(CONFIGS.glob("*.json")):
        analysis = analyze_config(json.loads(path.read_text())).to_dict()
        layout = PoolLayout("h100", 8, nodes=4)
        seconds = best_time_s(runs=RUNS, fn=lambda a=analysis, lay=layout: plan_or_reason(a, lay))
        status = "PASS" if seconds < TARGET_TIME_S else "FAIL"
        ok &= status == "PASS"
        print(
            f"{status} {path.stem:45s} {seconds * 1000:8.1f} ms  {plan_or_reason(analysis, layout)}"
        )

    big = analyze_config(ten_trillion_config()).to_dict()
    for layout in (PoolLayout("h100", 8, nodes=1), PoolLayout("h100", 8, nodes=32)):
        seconds = best_time_s(runs=RUNS, fn=lambda lay=layout: plan_or_reason(big, lay))
        status = "PASS" if seconds < TARGET_TIME_S else "FAIL"
        ok &= status == "PASS"
        print(
            f"{status} 10T params ({big['total_params'] / 1e12:.1f}T) on {layout.devices:4d} h100"
            f" {seconds * 1000:8.1f} ms  {plan_or_reason(big, layout)}"
        )

    print("\nPASS" if ok else "\nFAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
