"""The serve stage's typed result (`engine/stages/serve/result.py`): it reads any stored row
without raising, reads rows older versions wrote, writes back what it reads, and makes each
judgement (the precision rule and its figures, the failed checks, the knee) in one place."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.stages.serve.result import (
    EngineMetrics,
    Failure,
    Knee,
    PrecisionCheck,
    PromptAgreement,
    ServeResult,
    TokenDivergence,
    TPCheck,
)
from engine.stages.serve.verdict import failed_checks
from tests.serve_results import FAILED_AT_LAUNCH, SERVED, full_size, served

# A check every figure of which is within its limits: 160 tokens, 4 disagreements, each a tie.
PASSING = PrecisionCheck(
    dtype="bfloat16",
    passed=None,
    prompts=10,
    tokens_compared=160,
    token_agreement=156 / 160,
    tokens_until_divergence=160,
    first_divergence=TokenDivergence(
        3, 5, engine_token=17, reference_token=18, margin=0.01, tie=True
    ),
    max_abs_logprob_diff=0.05,
    kl_top_k=0.001,
    ties=4,
    non_finite=0,
    limit_max_abs_logprob_diff=0.25,
    limit_kl_top_k=0.005,
    limits_source="64u of bfloat16",
    per_prompt=[PromptAgreement(0, 16, 1.0, None, 16, None)],
)


@pytest.mark.parametrize(
    "stored",
    [
        None,
        3,
        "served",
        [],
        {},
        {"status": 5, "passed": "yes", "failure": "launch", "engine": ["vllm"]},
        {
            "status": "served",
            "precision": {"limits": [0.25], "first_divergence": 7, "per_prompt": {"0": 1}},
            "sweep": "all of them",
            "knee": {"concurrency": "four"},
            "tp": {"planned": "2", "greedy_match": "yes"},
            "metrics": {"series": [None, {"t_s": "0"}], "interval_s": True},
            "full_size": {"status": "measured", "sweep": 5, "workloads": [3]},
            "checkpoint": {"kind": ["real"], "parameters": "many"},
            "sweep_settings": {"levels": "1,2", "input_tokens": 12.5},
        },
        {"status": "failed", "sweep": [None, {"concurrency": None}, {"concurrency": 2.5}]},
    ],
)
def test_any_stored_row_reads_without_raising(stored):
    result = ServeResult.from_stored(stored)
    assert result.status in ("", "served", "failed")
    assert result.failed_checks  # no sweep level read: the sweep check is failed
    assert result.sweep == [] and result.knee_level is None
    assert result.precision_passed is None and result.tp_matched is None


def test_wrong_types_read_as_missing_never_as_a_verdict():
    result = ServeResult.from_stored(
        {
            "status": "served",
            "passed": 1,
            "precision": {"dtype": "bfloat16", "passed": "False", "max_abs_logprob_diff": "0.1"},
            "tp": {"planned": 2.0, "launched": 2, "greedy_match": 0},
            "checkpoint": {"kind": "twin", "dtype": 16},
        }
    )
    assert result.passed is None
    assert result.precision is not None
    assert (result.precision.passed, result.precision.max_abs_logprob_diff) == (None, None)
    assert result.tp == TPCheck(planned=2, launched=2)  # 2.0 is a whole number, 0 no verdict
    assert result.dtype == "bfloat16"


def test_a_row_from_before_the_knee_codes_were_renamed_reads_by_todays_rule():
    def rule(knee):
        return ServeResult.from_stored({"knee": knee}).knee.rule

    assert rule({"concurrency": 4, "reason": "growth_below_threshold"}) == "found"
    assert rule({"concurrency": 8, "reason": "largest_measured"}) == "beyond_sweep"
    assert rule({"concurrency": 8, "found": False}) == "beyond_sweep"  # no code, a verdict
    assert rule({"concurrency": 8, "reason": "magic"}) == ""
    assert ServeResult.from_stored({"knee": {"output_tokens_per_s": 9.0}}).knee is None


def test_a_row_without_the_later_precision_figures_keeps_its_stored_verdict():
    """docs/stages/serve.md's row has no `ties`, `non_finite` or `per_prompt`: its verdict is
    the one its run made, and the figures it has are judged against their limits."""
    stored = SERVED["precision"] | {"passed": True}
    for key in ("ties", "non_finite", "per_prompt", "tokens_until_divergence"):
        stored.pop(key)
    check = ServeResult.from_stored(served(precision=stored)).precision
    assert check.passed is True and check.per_prompt == []
    assert (check.logprob_within, check.kl_within) == (True, True)
    assert check.disagreements_beyond_tie is None
    assert check.within_limits is False  # the rule cannot be made again without its figures


def test_what_the_run_writes_reads_back_as_it_was():
    assert PrecisionCheck.from_stored(PASSING.to_dict()) == PASSING
    not_measured = PrecisionCheck("float32", None, "no_reference")
    assert not_measured.to_dict() == {"dtype": "float32", "passed": None, "reason": "no_reference"}
    assert PrecisionCheck.from_stored(not_measured.to_dict()) == not_measured
    knee = Knee(4, 210.0, 0.018, "found", True, 0.1, 0.078)
    assert Knee.from_stored(knee.to_dict()) == knee
    tp = TPCheck(2, 2, 1, False, 160, TokenDivergence(1, 4), "", "")
    assert TPCheck.from_stored(tp.to_dict()) == tp
    failure = Failure("sweep", "the engine died", ["Killed"], "infrastructure")
    assert Failure.from_stored(failure.to_dict()) == failure


def test_the_precision_rule_passes_a_check_within_every_limit():
    assert PASSING.disagreements_beyond_tie == 0
    assert PASSING.within_limits is True
    assert PASSING.judged().passed is True


@pytest.mark.parametrize(
    ("change", "failed_figure"),
    [
        ({"ties": 3}, "a disagreement beyond a tie"),
        ({"non_finite": 1}, "a logprob that is not finite"),
        ({"max_abs_logprob_diff": 0.26}, "the largest |Δ logprob|"),
        ({"kl_top_k": 0.0051}, "the KL over the top-k"),
        ({"tokens_compared": 0, "token_agreement": 0.0, "ties": 0}, "no token compared"),
        ({"limit_kl_top_k": None}, "a figure without its limit"),
    ],
)
def test_the_precision_rule_fails_a_check_off_any_one_limit(change, failed_figure):
    check = replace(PASSING, **change)
    assert check.within_limits is False, failed_figure
    assert check.judged().passed is False


def test_each_figure_is_judged_against_its_own_limit():
    check = replace(PASSING, max_abs_logprob_diff=0.3)
    assert (check.logprob_within, check.kl_within) == (False, True)
    unjudged = replace(PASSING, limit_max_abs_logprob_diff=None, kl_top_k=None)
    assert (unjudged.logprob_within, unjudged.kl_within) == (None, None)


def test_the_failed_checks_come_in_the_stages_order():
    passing = ServeResult.from_stored(SERVED)
    assert passing.failed_checks == [] and passing.precision_passed is True
    off = served(
        precision=replace(PASSING, max_abs_logprob_diff=0.3).judged().to_dict(),
        tp=TPCheck(2, 2, 1, False, 160).to_dict(),
        sweep=[level | {"errors": 1} for level in SERVED["sweep"]],
    )
    assert ServeResult.from_stored(off).failed_checks == ["precision", "tp", "sweep"]
    assert failed_checks(off) == ["precision", "tp", "sweep"]  # the run asks the same
    assert ServeResult.from_stored(served(sweep=[])).failed_checks == ["sweep"]


def test_the_knee_level_is_the_sweep_level_at_the_knees_concurrency():
    result = ServeResult.from_stored(SERVED)
    assert [level.knee for level in result.sweep] == [False, False, True, False]
    assert result.knee_level is not None and result.knee_level.concurrency == 4
    assert result.knee_level.ttft_s_p95 == pytest.approx(0.110)


def test_what_the_figures_were_measured_on():
    twin = ServeResult.from_stored(SERVED)
    assert (twin.measured_on, twin.checkpoint_kind, twin.dtype) == ("twin", "twin", "bfloat16")
    real = ServeResult.from_stored(
        served(checkpoint=SERVED["checkpoint"] | {"kind": "real", "dtype": "float16"})
    )
    assert (real.measured_on, real.dtype) == ("release", "bfloat16")  # the precision check's
    assert ServeResult.from_stored(served(precision=None)).dtype == "bfloat16"  # checkpoint's
    assert twin.engine_label == "vllm 0.32.0"
    assert ServeResult.from_stored({"status": "failed"}).engine_label == "the engine"


def test_who_a_sweep_failure_blames():
    errors = [level | {"errors": 2} for level in SERVED["sweep"]]
    blamed = ServeResult.from_stored(served(sweep=errors))
    assert blamed.requests_failed == 8 and blamed.sweep_failure_blames_release
    died = ServeResult.from_stored(
        served(sweep=errors, failure=Failure("sweep", "died", [], "infrastructure").to_dict())
    )
    assert not died.sweep_failure_blames_release and not died.sweep_judged
    launch = ServeResult.from_stored(FAILED_AT_LAUNCH)
    assert launch.failed_before_serving and launch.failure.release_blamed


def test_the_engines_metrics_give_peaks_and_last_counts():
    metrics = ServeResult.from_stored(SERVED).metrics
    assert metrics is not None and len(metrics.samples) == 30
    assert metrics.peak("kv_cache_usage") == pytest.approx(0.62)
    assert metrics.peak("running") == 8
    assert metrics.last("prefix_cache_queries") == 128 * 30
    assert metrics.prefix_cache_hit_ratio == 0.0
    assert EngineMetrics(interval_s=None, samples=[]).prefix_cache_hit_ratio is None


def test_the_full_size_run_is_read_by_its_own_reader():
    result = ServeResult.from_stored(served(full_size=full_size()))
    assert result.full_size is not None and result.full_size.measured
    assert result.full_size.tp == 2
    assert ServeResult.from_stored(SERVED).full_size is None
