"""The release page's Performance and Stability sections, the performance CSV and the compare
view, fed results the engine measured on real twins (Llama-3.1-8B dense, DeepSeek-V3 MoE)
and the rows a job stores of them (`tests/performance_rows.py`)."""

from __future__ import annotations

import csv
import html as html_lib
import io
import json
import re

import pytest
from django.urls import reverse

from adaptation.models import PerformancePoint
from engine.formatting import ms, tokens_per_s
from engine.stages.plan.calibration import SUPERSEDED
from tests import dom
from tests.factories import make_job, make_release
from tests.performance_rows import DENSE, MOE, OOM_BATCH, engine_results, h200_pool, measured_job

# Measures a scaled twin's performance (tests/performance_rows.py): left out of test-fast.
pytestmark = [pytest.mark.django_db, pytest.mark.slow]

MIB = 2**20


@pytest.fixture(scope="module", autouse=True)
def measured_once():
    """The engine's sweeps and stability runs, made once (before the first test's clock)."""
    return engine_results()


# --- reading the page -----------------------------------------------------------------------


def page(client, job, query: str = "", **headers) -> str:
    url = reverse("adaptation:release_detail", args=[job.release_id])
    response = client.get(f"{url}{query}", **headers)
    assert response.status_code == 200
    return response.content.decode()


def figure(html: str, figure_id: str) -> dict:
    """The plotly figure embedded as JSON in the `<script>` whose id is `figure_id`."""
    return json.loads(dom.find(html, f'script#{figure_id}[type="application/json"]').raw_text)


def has_figure(html: str, figure_id: str) -> bool:
    return f'<script id="{figure_id}" type="application/json">' in html


def article(html: str, element_id: str) -> str:
    """The markup of the panel (an `<article>`) whose id is `element_id`."""
    return dom.find(html, f"article[class]#{element_id}").html


def curves(fig: dict, **meta) -> list[dict]:
    """The figure's curve traces whose meta has every given value."""
    return [
        t
        for t in fig["data"]
        if t.get("meta", {}).get("role") == "curve"
        and all(t["meta"].get(k) == v for k, v in meta.items())
    ]


def one_curve(fig: dict, **meta) -> dict:
    found = curves(fig, **meta)
    assert len(found) == 1, (meta, [t["name"] for t in found])
    return found[0]


def axis_of(fig: dict, trace: dict, letter: str) -> dict:
    """The layout axis a trace is drawn on ("x" → layout.xaxis, "x3" → layout.xaxis3)."""
    name = trace.get(f"{letter}axis", letter)
    return fig["layout"][f"{letter}axis{name[1:]}"]


def stored(job, **filters) -> list[PerformancePoint]:
    return list(
        PerformancePoint.objects.filter(job=job, **filters).order_by("batch_size", "prompt_len")
    )


# --- the performance section ----------------------------------------------------------------


def test_throughput_traces_are_the_stored_rows_per_dtype_in_batch_order(logged_in_client):
    job = measured_job(DENSE)
    html = page(logged_in_client, job)
    fig = figure(html, f"performance-job-{job.pk}-throughput-figure")
    # the panel's note says what predicted the full-size figures, naming the fit
    fit = engine_results()[DENSE]["plan"]["predicted"]["fit"]
    assert (fit["accelerator"], fit["engine"], fit["points"]) == ("*", "vllm", 8)
    assert (
        "Predicted for the full-size model by the planner's step-time model (fit every "
        f"accelerator x vllm, 8 points, x{fit['residual']:.2f} (published serving results)) on "
    ) in dom.text(html)

    for dtype in ("float32", "bfloat16"):
        for prompt_len in (16, 32):
            for metric in ("decode_tokens_per_s", "prefill_tokens_per_s"):
                rows = stored(
                    job, kind="measured", dtype=dtype, prompt_len=prompt_len, metric=metric
                )
                trace = one_curve(
                    fig, kind="measured", model="twin", metric=metric, dtype=dtype,
                    prompt_len=prompt_len,
                )  # fmt: skip
                assert [r.batch_size for r in rows] == [1, 2, 4]
                assert trace["x"] == [1, 2, 4]
                assert trace["y"] == [r.value for r in rows]
                assert trace["name"] == f"{dtype}, prompt {prompt_len}: measured, twin"
    # the full-size predictions: their own panel and axis, named as predictions
    decode = one_curve(
        fig, kind="predicted", model="full-size", variant="", metric="decode_tokens_per_s"
    )
    rows = stored(job, model="full-size", metric="decode_tokens_per_s")
    plan_curve = engine_results()[DENSE]["plan"]["predicted"]["decode_curve"]
    assert (
        decode["x"]
        == [r.batch_size for r in rows]
        == [p["concurrent_sequences"] for p in plan_curve]
    )
    assert decode["y"] == [r.value for r in rows]
    assert decode["name"] == "checkpoint (bfloat16), full context: predicted, full-size model"
    # ... and no prediction scaled by the twin's calibration beside it (it would count the
    # efficiency twice: engine/stages/plan/calibration.py)
    assert not curves(fig, model="full-size", variant="calibrated")
    assert not stored(job, model="full-size", metric="calibrated_decode_tokens_per_s")
    # dash says only measured (solid) or predicted (dotted)
    assert decode["line"]["dash"] == "dot"
    # the full-size prefill predictions (batch 1, one per prompt length) are not stacked at
    # batch 1: they are left for the prompt-length view, and the panel says so
    assert not curves(fig, kind="predicted", model="full-size", metric="prefill_tokens_per_s")
    assert "prefill tokens/s: full size, predicted (in the prompt-length view)" in [
        a["text"] for a in fig["layout"]["annotations"]
    ]
    # the full-size panel's batches are its own: no twin batch ticks, and the reverse
    full = axis_of(fig, decode, "x")
    assert set(full["tickvals"]) == {r.batch_size for r in stored(job, model="full-size")} - {None}
    measured = one_curve(
        fig, kind="measured", metric="decode_tokens_per_s", dtype="float32", prompt_len=16
    )
    assert decode["yaxis"] != measured.get("yaxis", "y")
    titles = [a["text"] for a in fig["layout"]["annotations"]]
    assert "decode tokens/s: full size, predicted" in titles
    assert "decode tokens/s: scaled twin" in titles
    # one colour per dtype, on every trace of it
    colours = {t["meta"]["dtype"]: t["line"]["color"] for t in curves(fig, kind="measured")}
    assert len(set(colours.values())) == 2
    assert all(
        t["line"]["color"] == colours[t["meta"]["dtype"]] for t in curves(fig, kind="measured")
    )
    # log-2 batch axis: a log axis ticked at the batch sizes
    x_axis = axis_of(fig, measured, "x")
    assert x_axis["type"] == "log" and x_axis["tickvals"][:3] == [1, 2, 4]
    assert x_axis["title"]["text"] == "batch size (sequences)"


def test_latency_traces_are_ttft_and_tpot_medians_with_p95_bars(logged_in_client):
    job = measured_job(DENSE, stability="")
    fig = figure(page(logged_in_client, job), f"performance-job-{job.pk}-latency-figure")

    for metric in ("ttft_s", "tpot_s"):
        medians = stored(job, kind="measured", dtype="bfloat16", prompt_len=32, metric=metric)
        p95s = stored(
            job,
            kind="measured",
            dtype="bfloat16",
            prompt_len=32,
            metric=metric.replace("_s", "_p95_s"),
        )
        trace = one_curve(fig, kind="measured", metric=metric, dtype="bfloat16", prompt_len=32)
        assert trace["y"] == [r.value * 1000 for r in medians]  # drawn in ms
        bars = trace["error_y"]
        assert bars["symmetric"] is False
        assert bars["array"] == pytest.approx(
            [max(p.value - m.value, 0.0) * 1000 for m, p in zip(medians, p95s, strict=True)]
        )
        assert re.search(r"\(ms(, log)?\)$", axis_of(fig, trace, "y")["title"]["text"])
    predicted = one_curve(fig, kind="predicted", model="full-size", variant="", metric="tpot_s")
    assert predicted["y"] == [
        r.value * 1000 for r in stored(job, model="full-size", metric="tpot_s")
    ]
    assert "error_y" not in predicted  # the roofline has no p95


def test_knee_shown_is_the_stage_result_s(logged_in_client):
    job = measured_job(DENSE, stability="")
    html = page(logged_in_client, job)
    panel = article(html, f"performance-job-{job.pk}")
    result = engine_results()[DENSE]["performance"]

    for dtype, knee in result["knee_by_dtype"].items():
        row = dom.find(panel, f'tr[data-dtype="{dtype}"]')
        batch = dom.text(row, "td.num.knee-batch")
        assert batch.split()[0] == str(knee["batch_size"])
        assert dom.text(row, "td.num.knee-tpot") == ms(knee["tpot_s"])
        assert html_lib.escape(knee["reason"], quote=False) in row.inner_html
    assert "Rule: " + html_lib.escape(result["knee_rule"]) in panel
    fig = figure(html, f"performance-job-{job.pk}-throughput-figure")
    stars = [t for t in fig["data"] if t.get("meta", {}).get("role") == "knee"]
    first = result["knee"]
    star = next(
        t
        for t in stars
        if t["meta"]["dtype"] == first["dtype"] and t["meta"]["metric"] == "decode_tokens_per_s"
    )
    assert star["x"] == [result["knee_batch_size"]]
    assert star["y"] == [first["decode_tokens_per_s"]]


def test_an_out_of_memory_stop_keeps_the_measured_points_and_is_shown(logged_in_client):
    job = measured_job(MOE, stability="")
    html = page(logged_in_client, job)
    panel = article(html, f"performance-job-{job.pk}")
    stop = engine_results()[MOE]["performance"]["stopped"][0]

    assert stop["batch_size"] == OOM_BATCH
    assert "Where the sweep stopped" in panel
    assert html_lib.escape(f"bfloat16, prompt 16: {stop['reason']}", quote=True) in panel
    fig = figure(html, f"performance-job-{job.pk}-throughput-figure")
    decode = one_curve(fig, kind="measured", metric="decode_tokens_per_s", dtype="bfloat16")
    assert decode["x"] == [1, 2]  # the points measured before memory ran out
    stops = [t for t in fig["data"] if t["meta"].get("role") == "stop"]
    assert len(stops) == 2  # on the decode and the prefill panel of the twin
    assert {t["xaxis"] for t in stops} == {decode.get("xaxis", "x"), "x2"}
    assert all(t["x"] == [OOM_BATCH, OOM_BATCH] for t in stops)
    # the line spans the panel's curves: the twin measured and the roofline's prediction for it
    panel = [t for t in curves(fig) if t.get("yaxis", "y") == decode.get("yaxis", "y")]
    values = [y for t in panel for y in t["y"]]
    assert {t["meta"]["kind"] for t in panel} == {"measured", "predicted"}
    if axis_of(fig, decode, "y")["type"] == "log":  # predicted over 30 x measured
        assert max(values) / min(values) > 30 and stops[0]["y"] == [min(values), max(values)]
    else:
        assert stops[0]["y"] == [0.0, max(values)]
    assert stops[0]["name"] == f"out of memory at batch {OOM_BATCH} (bfloat16, prompt 16)"


def test_table_view_holds_the_same_numbers(logged_in_client):
    job = measured_job(DENSE, stability="")
    panel = article(page(logged_in_client, job), f"performance-job-{job.pk}")
    table = dom.find(panel, "details.perf-table").html
    points = {(r.kind, r.model, r.dtype, r.batch_size, r.prompt_len) for r in stored(job)}

    assert f"({PerformancePoint.objects.filter(job=job).count()} stored figures)" in table
    assert table.count('<tr class="perf-') == len(points)
    row = stored(job, kind="measured", dtype="float32", batch_size=2, prompt_len=32)
    decode = next(r for r in row if r.metric == "decode_tokens_per_s")
    [line] = [
        cells
        for row in dom.find_all(table, 'tr[class="perf-measured"]')
        if (cells := [cell.text for cell in row.elements])[:4]
        == ["measured, twin", "float32", "2", "32"]
    ]
    # As the one writer writes it (whole numbers from 100 tokens/s, three figures below).
    assert tokens_per_s(decode.value) in line[4:]


def test_csv_download_is_the_stored_rows(logged_in_client, client):
    job = measured_job(DENSE, stability="")
    url = reverse("adaptation:job_performance_csv", args=[job.pk])
    response = logged_in_client.get(url)

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"] == (
        f'attachment; filename="day0-job-{job.pk}-meta-llama-llama-31-8b-h200x8-performance.csv"'
    )
    lines = list(csv.reader(io.StringIO(response.content.decode())))
    assert lines[0] == [
        "kind",
        "model",
        "dtype",
        "batch_size",
        "prompt_len",
        "metric",
        "value",
        "unit",
    ]
    got = [
        (k, m, d, int(b) if b else None, int(p) if p else None, metric, float(v), u)
        for k, m, d, b, p, metric, v, u in lines[1:]
    ]
    db = [
        (r.kind, r.model, r.dtype, r.batch_size, r.prompt_len, r.metric, r.value, r.unit)
        for r in PerformancePoint.objects.filter(job=job)
    ]
    assert sorted(got, key=repr) == sorted(db, key=repr)
    assert len(got) == len(db) > 50
    # integral values (bytes) are written as integers, not 1189212160.0
    integral = [line for line in lines[1:] if float(line[6]).is_integer()]
    assert integral and all("." not in line[6] for line in integral)
    # the page links to it
    assert f'href="{url}"' in page(logged_in_client, job)
    # a job without a performance run has no CSV; a reader must be logged in
    other = make_job()
    missing = logged_in_client.get(reverse("adaptation:job_performance_csv", args=[other.pk]))
    assert missing.status_code == 404
    client.logout()
    assert client.get(url).status_code == 302


def test_the_view_in_the_url_changes_the_x_axis_and_the_metric(logged_in_client):
    job = measured_job(DENSE, stability="")
    html = page(logged_in_client, job, "?perf_x=prompt_len&perf_metric=decode_tokens_per_s")
    stem = f"performance-job-{job.pk}"

    assert not has_figure(html, f"{stem}-throughput-figure")
    fig = figure(html, f"{stem}-decode-tokens-per-s-figure")
    for dtype in ("float32", "bfloat16"):
        for batch in (1, 2, 4):
            trace = one_curve(fig, kind="measured", dtype=dtype, batch_size=batch)
            rows = stored(
                job, kind="measured", dtype=dtype, batch_size=batch, metric="decode_tokens_per_s"
            )
            assert trace["x"] == [r.prompt_len for r in rows] == [16, 32]
            assert trace["y"] == [r.value for r in rows]
            assert trace["name"] == f"{dtype}, batch {batch}: measured, twin"
    assert axis_of(fig, trace, "x")["title"]["text"] == "prompt length (tokens)"
    assert curves(fig, model="full-size") == []  # decode predictions have no prompt length
    assert "Figures without a prompt length are not on this axis" in dom.text(html)
    assert '<option value="prompt_len" selected>' in html
    assert '<option value="decode_tokens_per_s" selected>' in html
    assert 'href="?perf_x=prompt_len&amp;perf_metric=decode_tokens_per_s#performance"' in html

    by_dtype = figure(page(logged_in_client, job, "?perf_x=dtype"), f"{stem}-latency-figure")
    trace = one_curve(by_dtype, kind="measured", metric="tpot_s", batch_size=4, prompt_len=16)
    assert trace["x"] == ["float32", "bfloat16"]
    assert axis_of(by_dtype, trace, "x")["type"] == "category"


def test_bad_view_values_fall_back_with_a_message(logged_in_client):
    job = measured_job(DENSE, stability="")
    html = page(logged_in_client, job, "?perf_x=temperature&perf_metric=%3Cscript%3Ex")

    assert has_figure(html, f"performance-job-{job.pk}-throughput-figure")
    assert "Unknown x axis &#x27;temperature&#x27; (perf_x): showing batch size" in html
    assert "Unknown metric &#x27;&lt;script&gt;x&#x27; (perf_metric)" in html
    assert "<script>x" not in html


def test_a_poll_keeps_the_view_of_the_page_it_refreshes(logged_in_client):
    job = measured_job(DENSE, stability="")
    current = f"http://testserver/releases/{job.release_id}/?perf_x=prompt_len"
    html = page(logged_in_client, job, HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL=current)

    assert dom.attr(html, "section#performance", "hx-swap-oob") == "true"
    fig = figure(html, f"performance-job-{job.pk}-throughput-figure")
    assert one_curve(
        fig, kind="measured", metric="decode_tokens_per_s", dtype="float32", batch_size=2
    )["x"] == [16, 32]


def test_calibration_rows_are_drawn_beside_the_twin_and_summed_up(logged_in_client):
    """The calibration's rows (the roofline's prediction for the twin on the device that
    measured it; measured / predicted efficiency) are drawn on the twin's panel, on its scale,
    and charted in percent; the run's medians are listed."""
    job = measured_job(DENSE, stability="")
    html = page(logged_in_client, job)
    fig = figure(html, f"performance-job-{job.pk}-throughput-figure")
    calibration = engine_results()[DENSE]["performance"]["calibration"]
    assert calibration["available"], calibration.get("reason")

    where = {"dtype": "bfloat16", "prompt_len": 16, "metric": "decode_tokens_per_s"}
    rows = stored(job, kind="predicted", model="twin", **where)
    assert [r.batch_size for r in rows] == [1, 2, 4]
    predicted = one_curve(fig, kind="predicted", model="twin", **where)
    twin = one_curve(fig, kind="measured", model="twin", **where)
    assert predicted["y"] == [r.value for r in rows]
    assert predicted["name"] == "bfloat16, prompt 16: predicted, twin (roofline on this device)"
    assert predicted["yaxis"] == twin.get("yaxis", "y")  # the twin's panel, the twin's scale
    assert predicted["line"]["dash"] == "dot" and twin["line"]["dash"] == "solid"

    efficiency = stored(
        job, model="twin", dtype="bfloat16", prompt_len=32, metric="decode_efficiency"
    )
    chart = figure(html, f"performance-job-{job.pk}-calibration-figure")
    trace = one_curve(chart, metric="decode_efficiency", dtype="bfloat16", prompt_len=32)
    assert trace["y"] == pytest.approx([r.value * 100 for r in efficiency])  # ratio → %
    assert efficiency[0].unit == "ratio"
    table = dom.find(html, "table.data-table.perf-calibration")
    median = calibration["decode_efficiency_median"]
    assert (
        f"Decode efficiency, twin (measured / predicted, median) {median * 100:,.1f} %"
        in dom.text(table)
    )
    # the twin's factor is reported, not applied to the full-size prediction
    assert f"Full-size prediction, calibrated none {SUPERSEDED}" in dom.text(table)


def test_points_above_the_roofline_are_said_to_be_probe_errors(logged_in_client):
    """A run whose calibration left points out as probe errors (efficiency over 100 %) says
    how many and why beside its medians."""
    job = measured_job(DENSE, stability="")
    run = job.stage_runs.get(stage="performance")
    result = dict(run.result)
    reason = "3 points ran above the roofline (efficiency over 100 %): a probe error"
    result["calibration"] = {**result["calibration"], "probe_errors": 3, "probe_error": reason}
    run.result = result
    run.save(update_fields=["result"])
    table = dom.find(page(logged_in_client, job), "table.data-table.perf-calibration")
    assert (
        "Left out: probe errors 3 points ran faster than the roofline allows (efficiency over "
        "100 %): the device figure it read was measured too low, so they are shown but not in "
        "the medians and never calibrate a prediction " + reason
    ) in dom.text(table)


def test_a_failed_sweep_without_rows_says_why(logged_in_client):
    release = make_release()
    job = make_job(
        release=release,
        stages=("fetch", "performance"),
        statuses={"fetch": "succeeded", "performance": "failed"},
        results={"performance": {"points": [], "stopped": []}},
        errors={"performance": "no point was measured: stopped at batch 1: out of memory"},
    )
    panel = article(page(logged_in_client, job), f"performance-job-{job.pk}")
    assert "The performance stage failed" in panel
    assert "no point was measured: stopped at batch 1: out of memory" in panel


def test_sections_of_stages_skipped_after_a_failed_plan_name_it_once(logged_in_client):
    """Each skipped stage's panel names the failed stage and links to its attempts on the
    stage timeline, where its reason is: said there, not once per skipped panel."""
    job = make_job(
        stages=("fetch", "plan", "performance", "stability"),
        statuses={
            "fetch": "succeeded",
            "plan": "failed",
            "performance": "skipped",
            "stability": "skipped",
        },
        results={"plan": {"reason": "the model does not fit this pool."}},
        errors={"plan": "the model does not fit this pool."},
    )
    html = page(logged_in_client, job)
    for section in ("performance", "stability"):
        panel = article(html, f"{section}-job-{job.pk}")
        skipped = dom.find(panel, f"#{section}-job-{job.pk}-skipped")
        assert dom.attr(skipped, "a", "href") == f"#job-{job.pk}-stage-plan"
        assert "the plan stage failed" in skipped.text
        assert "does not fit" not in skipped.text, section
    timeline = dom.find(html, f"section.stage-block#job-{job.pk}-stage-plan")
    assert "the model does not fit this pool." in timeline.text


def test_a_running_sweep_shows_its_status(logged_in_client):
    job = make_job(
        stages=("fetch", "performance"), statuses={"fetch": "succeeded", "performance": "running"}
    )
    panel = article(page(logged_in_client, job), f"performance-job-{job.pk}")
    assert "The <em>performance</em> stage is running." in panel


# --- the stability section ------------------------------------------------------------------


def test_stability_panel_charts_the_samples_and_shows_the_verdict(logged_in_client):
    job = measured_job(DENSE)
    html = page(logged_in_client, job)
    result = engine_results()[DENSE]["stability"]
    panel = article(html, f"stability-job-{job.pk}")

    memory = figure(html, f"stability-job-{job.pk}-memory-figure")
    samples = result["samples"]
    # Memory over time: seconds since the start, each point's step kept for its hover.
    assert memory["data"][0]["x"] == [s["elapsed_s"] for s in samples]
    assert memory["data"][0]["customdata"] == [s["step"] for s in samples]
    assert samples == sorted(samples, key=lambda s: s["elapsed_s"])
    assert 0 < samples[-1]["elapsed_s"] <= result["duration_s"]
    assert memory["layout"]["xaxis"]["title"]["text"] == "time since the start (s)"
    assert memory["data"][0]["y"] == [s["memory_bytes"] / MIB for s in samples]
    slope = memory["data"][1]
    assert slope["name"].startswith(
        f"fitted slope {result['memory_slope_bytes_per_step']:,.0f} bytes/step"
    )
    step_time = figure(html, f"stability-job-{job.pk}-step-time-figure")
    assert step_time["data"][0]["y"] == [s["step_time_s"] * 1000 for s in samples]

    assert "<strong>Passed</strong>: within every threshold" in panel
    limits = result["thresholds"]
    assert f"{result['memory_slope_bytes_per_step']:,.0f} bytes/step" in panel
    # The threshold shown is the one the verdict applied: both limits, over this run's steps.
    applied = max(limits["leak_bytes_per_step"], limits["leak_effective_bytes_per_step"])
    assert f"leak above {applied:,.0f} bytes/step" in panel
    assert f"{result['step_time_drift']:+.1%}" in panel
    assert f"at most {limits['max_step_time_drift']:+.0%}" in panel
    assert f"{result['duration_s']:,.1f} s" in dom.text(panel)
    assert f"Steps {result['steps']}" in dom.text(panel)
    assert "0 logit rows" in panel and "0 steps raised" in panel


def test_a_leak_fails_the_stability_panel_with_its_reason(logged_in_client):
    job = measured_job(DENSE, stability="stability_leak")
    panel = article(page(logged_in_client, job), f"stability-job-{job.pk}")
    result = engine_results()[DENSE]["stability_leak"]

    assert result["passed"] is False and result["reason"].startswith("memory leak")
    assert "<strong>Failed</strong>: " + html_lib.escape(result["reason"], quote=True) in panel
    crossed = [
        row for row in dom.find_all(panel, "tr.crossed") if dom.text(row, "th") == "Memory slope"
    ]
    assert crossed
    assert f"{result['memory_slope_bytes_per_step']:,.0f} bytes/step" in crossed[0].text


# --- compare --------------------------------------------------------------------------------


def test_compare_overlays_both_jobs_on_the_same_axes(logged_in_client):
    on_h200 = measured_job(DENSE, stability="")
    on_other = measured_job(
        DENSE, stability="", release=on_h200.release, pool=h200_pool("h200-east")
    )
    url = reverse("adaptation:compare_performance")
    response = logged_in_client.get(f"{url}?jobs={on_h200.pk},{on_other.pk}")
    assert response.status_code == 200
    html = response.content.decode()

    fig = figure(html, "compare-performance-throughput-figure")
    for source, job, pool in ((0, on_h200, "h200x8"), (1, on_other, "h200-east")):
        trace = one_curve(
            fig, source=source, kind="measured", metric="decode_tokens_per_s", dtype="float32",
            prompt_len=16,
        )  # fmt: skip
        rows = stored(
            job, kind="measured", dtype="float32", prompt_len=16, metric="decode_tokens_per_s"
        )
        assert trace["y"] == [r.value for r in rows]
        assert (
            trace["name"]
            == f"meta-llama/Llama-3.1-8B on {pool} · float32, prompt 16: measured, twin"
        )
    first, second = (
        one_curve(
            fig,
            source=s,
            kind="measured",
            metric="decode_tokens_per_s",
            dtype="float32",
            prompt_len=16,
        )
        for s in (0, 1)
    )
    assert first["xaxis"] == second["xaxis"] and first["yaxis"] == second["yaxis"]
    # the job is the colour family, the dash only measured vs predicted; a legend toggle
    # per job and dtype
    assert first["line"]["dash"] == second["line"]["dash"] == "solid"
    assert first["line"]["color"] != second["line"]["color"]
    assert first["legendgroup"] != second["legendgroup"] and not first["showlegend"]
    toggles = [t["name"] for t in fig["data"] if t.get("meta", {}).get("role") == "legend"]
    assert f"meta-llama/Llama-3.1-8B on {pool} · float32" in toggles
    assert len(toggles) == len(set(toggles)) < 12
    assert "the same release, meta-llama/Llama-3.1-8B, on pools h200x8 and h200-east" in dom.text(
        html
    )
    # the release page offers the comparison
    panel = article(page(logged_in_client, on_h200), f"performance-job-{on_h200.pk}")
    assert '<optgroup label="Same release, other pools">' in panel
    option = f"job {on_other.pk}: meta-llama/Llama-3.1-8B on h200-east"
    assert f'<option value="{on_other.pk}">{option}</option>' in panel


@pytest.mark.parametrize(
    ("query", "status", "message"),
    [
        ("", 400, "Name two jobs to compare"),
        ("?jobs=abc,2", 400, "Job ids are whole numbers; got &#x27;abc&#x27;"),
        ("?jobs={a}", 400, "Compare takes two jobs; got 1 ({a})."),
        ("?jobs={a},{a}", 400, "Compare takes two different jobs; got job {a} twice."),
        ("?jobs={a},{b}&jobs={a}", 400, "Compare takes two jobs; got 3 ({a}, {b}, {a})."),
        ("?jobs={a},999999", 404, "No job 999999."),
        ("?jobs={a},{empty}", 404, "has no stored performance rows"),
    ],
)
def test_compare_answers_bad_or_missing_ids_with_a_message(
    logged_in_client, query, status, message
):
    a = measured_job(MOE, stability="")
    empty = make_job()
    b = make_job()
    url = reverse("adaptation:compare_performance")
    response = logged_in_client.get(url + query.format(a=a.pk, b=b.pk, empty=empty.pk))
    assert response.status_code == status
    assert message.format(a=a.pk, b=b.pk) in response.content.decode()


def test_compare_accepts_two_jobs_values_and_keeps_the_view(logged_in_client):
    a = measured_job(DENSE, stability="")
    b = measured_job(MOE, stability="")
    url = reverse("adaptation:compare_performance")
    response = logged_in_client.get(
        f"{url}?jobs={a.pk}&perf_x=prompt_len&perf_metric=ttft_s&jobs={b.pk}"
    )
    assert response.status_code == 200
    html = response.content.decode()
    fig = figure(html, "compare-performance-ttft-s-figure")
    assert {t["meta"]["source"] for t in curves(fig)} == {0, 1}
    assert "two releases on pool h200x8" in dom.text(html)
    assert f'href="?jobs={a.pk},{b.pk}&amp;perf_x=prompt_len&amp;perf_metric=ttft_s"' in html


def test_compare_needs_a_login(client):
    response = client.get(reverse("adaptation:compare_performance") + "?jobs=1,2")
    assert response.status_code == 302
