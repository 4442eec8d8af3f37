"""The performance, stability and serve stages in the registry: order, titles, option checkers
and time limits that follow the stability run's duration, all without loading torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.contract import StageDefinition
from engine.registry import get_stage, stage_names
from engine.stages.serve.options import SERVE_SOFT_TIME_LIMIT_S, SERVE_TIME_LIMIT_S
from engine.stages.stability.options import (
    STABILITY_HARD_GRACE_S,
    STABILITY_SETUP_S,
    stability_time_limits,
)


def test_performance_and_stability_run_after_the_plan():
    assert stage_names() == [
        "fetch", "analyze", "operators", "precision", "plan", "distributed", "serve",
        "performance", "stability", "release_notes",
    ]  # fmt: skip
    performance, stability = get_stage("performance"), get_stage("stability")
    assert (performance.title, stability.title) == ("Performance", "Stability run")
    assert performance.description and stability.description
    assert performance.time_limits_s({}) == (180, 240)
    assert performance.time_limits_s({"max_batch_size": 4}) == (180, 240)
    assert get_stage("plan").reads_pool_calibration is True
    distributed = get_stage("distributed")
    assert distributed.title == "Run the split (measured)"
    assert distributed.time_limits_s({}) == (240, 300)
    assert distributed.time_limits_s({"timeout_s": 900}) == (960, 1020)
    assert distributed.checked_options({"processes": 4})["processes"] == 4
    assert not performance.reads_pool_calibration


def test_their_options_are_checked_by_the_stages_own_checkers():
    performance, stability = get_stage("performance"), get_stage("stability")
    assert performance.checked_options({"max_batch_size": 4, "prompt_lens": [16]}) == {
        "max_batch_size": 4,
        "prompt_lens": [16],
    }
    assert stability.checked_options({"duration_s": 3}) == {"duration_s": 3.0}
    with pytest.raises(ValueError, match="unknown performance option"):
        performance.checked_options({"batch": 4})
    with pytest.raises(ValueError, match="duration_s must be a number"):
        stability.checked_options({"duration_s": 0})


def test_the_serve_stage_runs_between_distributed_and_performance():
    serve = get_stage("serve")
    assert stage_names().index("serve") == stage_names().index("distributed") + 1
    assert serve.title == "Serving engine" and serve.description
    # The twin's 1,500 s and the full-size run's default budget of 1,200 s.
    assert serve.time_limits_s({}) == (SERVE_SOFT_TIME_LIMIT_S, SERVE_TIME_LIMIT_S) == (2700, 2760)
    assert serve.time_limits_s({"full_size": False}) == (1500, 1560)
    assert serve.checked_options({"max_concurrency": 4, "compare_tp": False}) == {
        "max_concurrency": 4,
        "compare_tp": False,
    }
    with pytest.raises(ValueError, match="unknown serve option"):
        serve.checked_options({"warp": 1})
    assert (serve.run, serve.findings, serve.unjudged_keys, serve.notes) == (
        "engine.stages.serve.run:run",
        "engine.stages.serve.findings:findings",
        "engine.stages.serve.findings:unjudged_keys",
        "engine.stages.serve.notes:section",
    )
    assert serve.findings_read_analysis is True and not serve.reads_pool_calibration


def test_the_stability_limits_follow_its_duration():
    stability = get_stage("stability")
    soft, hard = stability.time_limits_s({"duration_s": 4 * 3600})
    assert soft == round(4 * 3600 * 1.1) + STABILITY_SETUP_S == 15_960
    assert hard == soft + STABILITY_HARD_GRACE_S
    assert stability.time_limits_s({"duration_s": 3}) == (124, 184)
    # the default run's are the definition's fixed limits, and a refused value falls back
    default = (stability.soft_time_limit_s, stability.time_limit_s)
    assert stability.time_limits_s({}) == stability.time_limits_s(None) == default
    assert default == stability_time_limits({}) == (142, 202)
    assert stability.time_limits_s({"duration_s": "long"}) == default
    # a stage without a limits function keeps its fixed limits whatever its options
    fixed = StageDefinition(name="x", title="x", run=lambda ctx: {}, soft_time_limit_s=5,
                            time_limit_s=9)  # fmt: skip
    assert fixed.time_limits_s({"duration_s": 10_000}) == (5, 9)
    custom = StageDefinition(
        name="y", title="y", run=lambda ctx: {}, limits_for_options=lambda o: (o["n"], 2 * o["n"])
    )
    assert custom.time_limits_s({"n": 7}) == (7, 14)


def test_reading_the_registry_and_checking_options_does_not_load_torch():
    code = (
        "import sys; from engine.registry import STAGES, get_stage; "
        "[s.time_limits_s({'duration_s': 60}) for s in STAGES]; "
        "get_stage('performance').checked_options({'max_batch_size': 8}); "
        "get_stage('stability').checked_options({'duration_s': 5}); "
        "get_stage('serve').checked_options({'max_concurrency': 4}); "
        "import engine.stages.plan.calibration; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"
