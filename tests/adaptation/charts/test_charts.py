"""The plotly figures the pages embed, built from stored rows."""

from __future__ import annotations

import pytest

from adaptation.charts import precision as precision_charts
from adaptation.models import LayerDrift, PrecisionResult
from tests.factories import make_job

pytestmark = pytest.mark.django_db


def precision_row(run, dtype: str, *, passed: bool, limit: float, layers) -> PrecisionResult:
    row = PrecisionResult.objects.create(
        stage_run=run,
        pool=run.job.pool,
        dtype=dtype,
        max_abs_error=0.1,
        mean_abs_error=0.01,
        cosine_similarity=0.999,
        top1_agreement=1.0,
        kl_divergence=1e-6,
        passed=passed,
        first_divergent_layer=None if passed else 1,
        first_divergent_module="" if passed else "norm",
        first_divergent_name="" if passed else "model.layers.1.post_attention_layernorm",
        max_local_relative_error=limit,
    )
    for layer, name, local in layers:
        LayerDrift.objects.create(
            precision=row,
            layer=layer,
            module="norm",
            name=name,
            max_abs_error=0.0,
            relative_error=local * 3,
            local_relative_error=local,
        )
    return row


def test_drift_figure_plots_local_errors_against_each_dtypes_limit():
    run = make_job(statuses={"fetch": "succeeded", "analyze": "succeeded"}).stage_runs.first()
    names = ["model.layers.0.input_layernorm", "model.layers.1.post_attention_layernorm"]
    precision_row(
        run, "bfloat16", passed=True, limit=0.1, layers=[(0, names[0], 0.004), (1, names[1], 0.005)]
    )
    precision_row(
        run, "float16", passed=False, limit=0.02, layers=[(0, names[0], 0.001), (1, names[1], 0.3)]
    )

    figure = precision_charts.layer_drift(PrecisionResult.objects.prefetch_related("layers"))
    traces = {trace["name"]: trace for trace in figure["data"]}
    assert list(traces["bfloat16 (passed)"]["y"]) == [0.004, 0.005]  # local, not accumulated
    assert list(traces["float16 (failed)"]["x"]) == names
    assert list(traces["float16 limit"]["y"]) == [0.02, 0.02]
    [note] = figure["layout"]["annotations"]
    assert (note["x"], note["text"]) == (names[1], "float16 diverges")


def test_no_figure_without_measured_layers():
    assert precision_charts.layer_drift([]) is None


def test_the_time_to_day0_chart_never_ticks_in_seconds():
    from datetime import UTC, datetime, timedelta

    from adaptation.charts.reports import time_to_day0 as report_time_to_day0

    at = datetime(2026, 11, 30, 6, 0, tzinfo=UTC)
    points = [
        {"at": at, "hours": 0.5, "repo_id": "acme/a", "basis": "publication"},
        {"at": at + timedelta(seconds=4), "hours": 1.5, "repo_id": "acme/b", "basis": "discovery"},
    ]
    axis = report_time_to_day0(points)["layout"]["xaxis"]
    assert axis["type"] == "date" and axis["tickformat"] == "%b %d, %H:%M"
    low, high = (datetime.fromisoformat(x) for x in axis["range"])
    assert high - low == timedelta(hours=2)  # padded around the 4 s the releases span
    assert low < at and high > at + timedelta(seconds=4)
    wide = [dict(points[0]), dict(points[1], at=at + timedelta(days=3))]
    assert "range" not in report_time_to_day0(wide)["layout"]["xaxis"]  # plotly's own


def test_a_table_header_names_its_unit_once():
    from adaptation.charts.performance_metrics import metric_info

    assert metric_info("decode_tokens_per_s").header == "decode tokens/s"
    assert metric_info("ttft_s").header == "TTFT (ms)"
    rss = metric_info("peak_process_rss_increase_bytes", "bytes")
    assert rss.header == "peak memory increase, process RSS (MiB)"
    assert rss.scale == 1 / 2**20  # drawn in MiB, stored in bytes
