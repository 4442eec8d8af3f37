"""The precision stage's typed result (`engine/stages/precision/result.py`): it reads any stored
row without raising, writes back what it reads, and judges once which checks a dtype crossed
(for the stage's reason, its findings and the release page)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.stages.precision.result import (
    DtypeComparison,
    LayerDriftRow,
    PrecisionStageResult,
    RoutingFlips,
    check_rows,
)
from tests.typed_results import precision_result

THRESHOLDS = {
    "max_relative_logit_error": 0.0625,
    "max_row_relative_logit_error": 0.125,
    "min_cosine_similarity": 0.998,
    "max_local_relative_error": 0.0625,
    "min_top1_agreement": None,
    "max_kl_divergence": None,
    "max_mean_abs_error": None,
    "unit_roundoff": 2**-8,
    "source": "multiples of u",
}

FLOAT16 = DtypeComparison(
    "float16",
    passed=False,
    reason="float16: relative logit error 0.07 > 0.0625; first divergent layer 1 (norm)",
    relative_logit_error=0.07,
    max_relative_logit_error=0.1,
    cosine_similarity=0.999,
    min_cosine_similarity=0.997,
    top1_agreement=0.9,
    kl_divergence=0.001,
    mean_abs_error=0.02,
    positions=40,
    thresholds=THRESHOLDS,
    unit_roundoff=2**-11,
    first_divergent_layer=1,
    first_divergent_module="norm",
    first_divergent_name="model.layers.1.post_attention_layernorm",
    first_divergent_local_error=0.2,
    worst_local_relative_error=0.2,
    routing_flips=[RoutingFlips(layer=1, local=0, end_to_end=2, prefill_tokens=32)],
    layers=[
        LayerDriftRow(
            1, "norm", "model.layers.1.post_attention_layernorm", 0.5, 0.2, 0.4, 0.2, True
        )
    ],
)


@pytest.mark.parametrize(
    "stored",
    [
        None,
        "precision",
        {"dtypes": [1, 2]},
        {"dtypes": {"bfloat16": "passed", "float16": {"passed": "no", "layers": "all"}}},
        {"dtypes": {"int8": {"thresholds": [1], "routing_flips": {"0": 1}, "layers": [None, 3]}}},
        {"skipped_dtypes": ["int8"], "reference": "cpu", "prompt": 2, "twin": "seeded"},
    ],
)
def test_any_stored_row_reads_without_raising(stored):
    result = PrecisionStageResult.from_stored(stored)
    assert not result.every_dtype_passed
    assert result.failed == []  # a missing verdict is not a failure
    assert result.measured_on == "twin"
    for entry in result.compared:
        assert entry.crossed == [] and entry.judged_figures == []


def test_a_result_without_per_dtype_comparisons_is_told_from_an_empty_one():
    assert PrecisionStageResult.from_stored({"passed": False}).dtypes is None
    assert PrecisionStageResult.from_stored({"dtypes": {}}).dtypes == {}


def test_what_the_stage_writes_reads_back_as_it_was():
    assert DtypeComparison.from_stored("float16", FLOAT16.to_dict()) == FLOAT16
    stored = precision_result(
        FLOAT16,
        skipped_dtypes={"int8": "no int8 matmul"},
        reference_device="cpu",
        reference_dtype="float32",
        twin={"weights_source": "real"},
        passed=False,
    )
    result = PrecisionStageResult.from_stored(stored)
    assert result.to_dict() == stored
    assert result.dtypes == {"float16": FLOAT16}
    assert result.failed == [FLOAT16] and result.measured_on == "release"


def test_the_crossed_checks_are_those_over_a_set_limit():
    rows = FLOAT16.checks
    # CHECKS' order; top-1, KL and mean abs error have no limit set: reported, not enforced.
    assert [(row.label, row.crossed) for row in rows] == [
        ("relative logit error", True),
        ("worst row's relative logit error", False),
        ("cosine similarity", False),
    ]
    (crossed,) = FLOAT16.crossed
    assert (crossed.value, crossed.op, crossed.limit, crossed.bound) == (0.07, ">", 0.0625, "≤")


def test_a_min_check_is_crossed_under_its_limit_and_a_missing_value_crosses_nothing():
    [cosine] = check_rows({"cosine_similarity": 0.99}, {"min_cosine_similarity": 0.998})
    assert (cosine.crossed, cosine.op, cosine.bound) == (True, "<", "≥")
    [unmeasured] = check_rows({"cosine_similarity": None}, {"min_cosine_similarity": 0.998})
    assert unmeasured.crossed is False
    assert check_rows({"top1_agreement": 0.1}, {"min_top1_agreement": None}) == []


def test_the_page_lists_each_figure_with_a_value_and_a_limit():
    figures = {f.figure: f for f in FLOAT16.judged_figures}
    assert list(figures) == [
        "relative_logit_error",
        "max_relative_logit_error",
        "cosine_similarity",
        "worst_local_relative_error",
    ]
    assert not figures["relative_logit_error"].within
    # The stage judges the mean cosine (0.999), not the worst row's (0.997), against 0.998.
    assert figures["cosine_similarity"].within
    assert (figures["cosine_similarity"].value, figures["cosine_similarity"].op) == (0.999, ">=")
    assert figures["cosine_similarity"].similarity
    assert not figures["worst_local_relative_error"].within
    assert FLOAT16.limits_source == "multiples of u"
    assert FLOAT16.diverged and FLOAT16.limit("max_local_relative_error") == 0.0625


def test_a_dtype_passing_on_its_mean_cosine_with_one_worse_row_shows_its_cosine_within():
    """The stage passed the dtype: its mean cosine keeps `min_cosine_similarity` though one
    row's is under it. The page shows the figure the rule used, within its limit."""
    bfloat16 = DtypeComparison(
        "bfloat16",
        passed=True,
        reason="bfloat16: within thresholds; no module's local error exceeds the limit",
        relative_logit_error=0.03,
        max_relative_logit_error=0.09,
        cosine_similarity=0.9995,
        min_cosine_similarity=0.9971,
        thresholds=THRESHOLDS,
        worst_local_relative_error=0.01,
    )
    figures = {f.figure: f for f in bfloat16.judged_figures}
    cosine = figures["cosine_similarity"]
    assert (cosine.value, cosine.op, cosine.limit, cosine.within) == (0.9995, ">=", 0.998, True)
    assert "min_cosine_similarity" not in figures  # the worst row's cosine judges nothing
    assert all(f.within for f in figures.values()) and bfloat16.crossed == []


@pytest.mark.parametrize(
    "entry",
    [
        FLOAT16,
        replace(FLOAT16, relative_logit_error=0.01, first_divergent_layer=None),
        replace(FLOAT16, cosine_similarity=0.99, min_cosine_similarity=0.999),
        replace(FLOAT16, top1_agreement=0.5, thresholds=THRESHOLDS | {"min_top1_agreement": 0.9}),
    ],
)
def test_the_page_marks_exactly_the_figures_the_stage_failed(entry):
    """A figure is shown out of its limit when, and only when, the stage's rule failed it: a
    crossed check, or the modules' local error when one diverged."""
    out = {f.figure for f in entry.judged_figures if not f.within}
    crossed = {row.metric for row in entry.crossed}
    assert out == crossed | ({"worst_local_relative_error"} if entry.diverged else set())
