"""The release page's precision table (`adaptation/presenters/validation.py`): what a dtype's
verdict is shown resting on is what the stage judged it by (`DtypeComparison.judged_figures`)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from adaptation.models import StageRun
from adaptation.services.stage_results import store_precision
from engine.stages.precision.result import DtypeComparison
from tests import dom
from tests.factories import make_job, make_release
from tests.typed_results import precision_result

pytestmark = pytest.mark.django_db

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

# Passed by the stage: its mean cosine keeps the limit, though one row's (0.9971) does not.
BFLOAT16 = DtypeComparison(
    "bfloat16",
    passed=True,
    reason="bfloat16: within thresholds; no module's local error exceeds the limit",
    max_abs_error=0.02,
    mean_abs_error=0.004,
    relative_logit_error=0.03,
    max_relative_logit_error=0.09,
    cosine_similarity=0.9995,
    min_cosine_similarity=0.9971,
    top1_agreement=1.0,
    kl_divergence=0.0001,
    positions=40,
    thresholds=THRESHOLDS,
    worst_local_relative_error=0.01,
)


def test_a_dtype_passing_on_its_mean_cosine_shows_its_cosine_within(logged_in_client):
    release = make_release()
    result = precision_result(
        BFLOAT16, reference_device="cpu", reference_dtype="float32", passed=True
    )
    job = make_job(
        release=release,
        stages=("fetch", "analyze", "precision"),
        statuses={"fetch": "succeeded", "analyze": "succeeded", "precision": "succeeded"},
        results={"precision": result},
    )
    store_precision(StageRun.objects.get(job=job, stage="precision"), result)

    page = logged_in_client.get(reverse("adaptation:release_detail", args=[release.pk]))

    judged = dom.find(page, "#precision-bfloat16-judged")
    assert judged.get("open") is None  # a dtype that passed folds what it rests on
    figures = dom.texts(judged, "ul.judged li")
    assert figures == [
        "mean relative logit error 0.03 <= 0.0625",
        "worst row 0.09 <= 0.125",
        "mean cosine (mean-centred) 0.999500 >= 0.998000",
        "worst module's own error 0.01 <= 0.0625",
    ]
    assert not any("✗" in figure for figure in figures)
