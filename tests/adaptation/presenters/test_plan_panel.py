"""The release page's "Distributed plan" panel and the compare-pools page, fed real plans
made by the engine from published configs."""

from __future__ import annotations

import html as html_lib
import itertools
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from adaptation.models import AcceleratorPool
from engine.architecture import analyze_config
from engine.catalog import load_catalog
from engine.formatting import MISSING, gib, ms, tokens_per_s
from engine.stages.plan.errors import NoFittingPlan
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from engine.stages.plan.run import no_fit_result
from tests import dom
from tests.conftest import load_realconfig
from tests.factories import make_job, make_release

pytestmark = pytest.mark.django_db

REPO = "deepseek-ai/DeepSeek-V3"
STAGES = ("fetch", "analyze", "plan")


@pytest.fixture(scope="module")
def deepseek_analysis() -> dict:
    return analyze_config(load_realconfig("deepseek-ai__DeepSeek-V3")).to_dict()


def make_pool(name: str, kind: str, *, per_node: int = 8, nodes: int = 1) -> AcceleratorPool:
    return AcceleratorPool.objects.create(
        name=name,
        backend="cuda",
        device="cuda:0",
        accelerator=kind,
        devices_per_node=per_node,
        nodes=nodes,
    )


def planned_release(analysis: dict, pool: AcceleratorPool, plan: dict, *, status="succeeded"):
    release = make_release(repo_id=REPO)
    job = make_job(
        release=release,
        pool=pool,
        stages=STAGES,
        statuses={"fetch": "succeeded", "analyze": "succeeded", "plan": status},
        results={"analyze": analysis, "plan": plan},
        errors={"plan": plan.get("reason", "")} if status == "failed" else None,
    )
    return release, job


def section(html: str, element_id: str) -> str:
    """The markup of the panel (an `<article class="plan ...">`) whose id is `element_id`."""
    return dom.find(html, f'article[class^="plan"]#{element_id}').html


def figure(html: str, figure_id: str) -> dict:
    """The plotly figure embedded as JSON in the `<script>` whose id is `figure_id`."""
    return json.loads(dom.find(html, f'script#{figure_id}[type="application/json"]').raw_text)


@pytest.fixture
def h200_plan(deepseek_analysis) -> dict:
    return plan_release(deepseek_analysis, PoolLayout("h200", 8), release=REPO).to_dict()


@pytest.fixture
def h100_no_fit(deepseek_analysis) -> dict:
    """The result the plan stage keeps when DeepSeek-V3 does not fit one node of 8 H100s."""
    layout = PoolLayout("h100", 8)
    with pytest.raises(NoFittingPlan) as caught:
        plan_release(deepseek_analysis, layout, release=REPO)
    return no_fit_result(caught.value, deepseek_analysis, layout, load_catalog(), {}, release=REPO)


def page(client, release) -> str:
    response = client.get(reverse("adaptation:release_detail", args=[release.pk]))
    assert response.status_code == 200
    return response.content.decode()


def fact(html: str, label: str) -> str:
    """The text of the fact (`<dd>`) labelled `label` (its `<dt>`)."""
    facts = dom.facts(html)
    assert label in facts, f"no fact {label!r}"
    return facts[label]


def table_row(html: str, label: str) -> str:
    """The cells (text) of the table row headed `label`."""
    return " ".join(dom.row(html, label))


# --- the panel of a succeeded plan -----------------------------------------------------------


def test_panel_shows_the_chosen_split_of_the_stored_plan(
    logged_in_client, deepseek_analysis, h200_plan
):
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")

    assert "Pool <strong>h200x8</strong>" in panel and "NVIDIA H200" in panel
    assert fact(panel, "Tensor parallel (TP)") == str(h200_plan["tp"])
    assert fact(panel, "Pipeline parallel (PP)") == str(h200_plan["pp"])
    assert fact(panel, "Expert parallel (EP)") == str(h200_plan["ep"])
    assert fact(panel, "Data parallel (DP)") == str(h200_plan["dp"])
    assert fact(panel, "Devices") == f"{h200_plan['devices']} of the pool's 8"
    assert fact(panel, "Nodes") == f"{h200_plan['nodes']} node of 8"
    assert fact(panel, "Serving dtype") == h200_plan["dtype_label"]
    # DeepSeek-V3 on one H200 node: expert parallel over all eight, attention data-parallel.
    assert (h200_plan["ep"], h200_plan["devices"]) == (8, 8)


def test_panel_shows_memory_per_device_in_gib(logged_in_client, deepseek_analysis, h200_plan):
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    memory = h200_plan["memory_per_device_bytes"]

    for label, key in (
        ("Weights", "weights"),
        ("KV cache", "kv_cache"),
        ("Activations + workspace", "activations_workspace"),
        ("Runtime overhead", "runtime_overhead"),
        ("Used", "total_used"),
        ("Budget", "budget"),
        ("Capacity", "capacity"),
    ):
        assert table_row(panel, label) == f"{memory[key] / 2**30:,.1f} GiB", label
    for label, size in h200_plan["memory_weights_by_dtype_bytes"].items():
        assert table_row(panel, label) == gib(size)


def test_memory_chart_stacks_the_parts_in_gib_under_the_budget(
    logged_in_client, deepseek_analysis, h200_plan
):
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    html = page(logged_in_client, release)
    chart = figure(html, f"plan-job-{job.pk}-memory-figure")
    memory = h200_plan["memory_per_device_bytes"]

    assert f'id="plan-job-{job.pk}-memory-chart"' in html
    assert "(predicted)" in chart["layout"]["title"]["text"]
    assert chart["layout"]["barmode"] == "stack"
    bars = {trace["name"]: trace["x"][0] for trace in chart["data"]}
    assert bars == pytest.approx(
        {
            "weights (predicted)": memory["weights"] / 2**30,
            "KV cache (predicted)": memory["kv_cache"] / 2**30,
            "activations + workspace (predicted)": memory["activations_workspace"] / 2**30,
            "runtime overhead (predicted)": memory["runtime_overhead"] / 2**30,
            "free (predicted)": memory["free"] / 2**30,
        }
    )
    # the stack reaches the device's capacity; the budget is a line below it
    assert sum(bars.values()) == pytest.approx(memory["capacity"] / 2**30)
    lines = sorted(shape["x0"] for shape in chart["layout"]["shapes"])
    assert lines == pytest.approx([memory["budget"] / 2**30, memory["capacity"] / 2**30])


def test_predicted_speeds_and_curves_are_labelled_predicted(
    logged_in_client, deepseek_analysis, h200_plan
):
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    html = page(logged_in_client, release)
    panel = section(html, f"plan-job-{job.pk}")
    predicted = h200_plan["predicted"]
    batch_1, largest = predicted["batch_1"], predicted["largest_batch"]

    assert table_row(panel, "Decode at batch 1 (predicted)") == (
        f"{tokens_per_s(batch_1['decode_tokens_per_s'])} TPOT {ms(batch_1['tpot_s'])}"
    )
    row = table_row(
        panel,
        f"Decode at {largest['concurrent_sequences']} concurrent sequences, the largest batch "
        "that fits (predicted)",
    )
    assert row.startswith(f"{tokens_per_s(largest['decode_tokens_per_s'])} TPOT ")
    for point in predicted["prefill"]:
        assert table_row(panel, f"{point['prompt_tokens']:,} prompt tokens") == ms(point["ttft_s"])

    decode = figure(html, f"plan-job-{job.pk}-decode-figure")
    prefill = figure(html, f"plan-job-{job.pk}-prefill-figure")
    scaling = figure(html, f"plan-job-{job.pk}-scaling-figure")
    for chart in (decode, prefill, scaling):
        assert "(predicted)" in chart["layout"]["title"]["text"]
        assert all(trace["name"].endswith("(predicted)") for trace in chart["data"])
    curve = predicted["decode_curve"]
    assert decode["data"][0]["x"] == [p["concurrent_sequences"] for p in curve]
    assert decode["data"][0]["y"] == pytest.approx([p["decode_tokens_per_s"] for p in curve])
    assert decode["data"][1]["y"] == pytest.approx([p["tpot_s"] * 1000 for p in curve])
    # TTFT up to several seconds: drawn in seconds, the unit in the axis title.
    assert prefill["layout"]["yaxis"]["title"]["text"] == "TTFT (s)"
    assert prefill["data"][0]["y"] == pytest.approx([p["ttft_s"] for p in predicted["prefill"]])
    assert prefill["data"][0]["customdata"] == [ms(p["ttft_s"]) for p in predicted["prefill"]]
    assert scaling["data"][0]["x"] == [p["devices"] for p in h200_plan["scaling"]]
    assert scaling["data"][1]["y"] == pytest.approx(
        [p["efficiency_per_device"] for p in h200_plan["scaling"]]
    )


def test_scaling_communication_and_runners_up(logged_in_client, deepseek_analysis, h200_plan):
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    comm = h200_plan["communication"]

    assert table_row(panel, "EP all-to-all") == (
        f"{comm['ep_alltoall_bytes_per_token']:,} bytes/token no"
    )
    assert table_row(panel, "TP all-reduce") == "0 bytes/token not used by this split"
    assert "Crosses nodes: no" in dom.text(panel)
    for point in h200_plan["scaling"]:
        assert f"{tokens_per_s(point['decode_tokens_per_s'])}" in dom.text(panel)
    runners = dom.find(panel, 'table[aria-label="Splits not chosen"]')
    assert len(runners.select("tr")) == len(h200_plan["runners_up"]) + 1  # + the header
    for runner in h200_plan["runners_up"]:
        split = f"TP{runner['tp']} PP{runner['pp']} EP{runner['ep']} DP{runner['dp']}"
        assert runner["why_lost"] in runners.text
        assert split in dom.texts(runners, 'th[scope="row"]')


def test_artifacts_are_in_pre_blocks_with_copy_buttons(
    logged_in_client, deepseek_analysis, h200_plan
):
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    html = page(logged_in_client, release)
    artifacts = h200_plan["artifacts"]

    assert "copy.js" in html
    for key in ("vllm", "sglang", "kubernetes_deployment"):
        element = f"plan-job-{job.pk}-artifact-{key.replace('_', '-')}"
        assert dom.find(html, f"pre.artifact-text#{element}").raw_text == artifacts[key]
        assert f'data-copy-target="{element}"' in html


def test_panel_says_when_the_plan_can_start(logged_in_client, deepseek_analysis, h200_plan):
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    job.status = "running"  # a later stage runs: the job is still active
    job.save(update_fields=["status"])
    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")

    assert "When can it run on h200x8" in panel
    assert fact(panel, "Can start now") == "no"  # no worker of the pool has registered
    assert fact(panel, "Devices needed").startswith(
        f"{h200_plan['devices']}; live workers report 0"
    )


@pytest.mark.parametrize("status", ["succeeded", "failed"])
def test_a_finished_job_says_nothing_about_when_it_can_run(
    logged_in_client, deepseek_analysis, h200_plan, status
):
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    job.status = status
    job.save(update_fields=["status"])
    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    assert "When can it run" not in panel and "Can start now" not in panel
    assert "Figures: speeds predicted on the accelerator catalog's (datasheet) figures" in dom.text(
        panel
    )


CALIBRATION = {
    "available": True,
    "decode_factor": 0.25,
    "prefill_factor": 0.5,
    "runs": 3,
    "basis": "median decode efficiency of 3 performance runs on pool h200x8",
    "caveat": "the factor is the scaled twin's efficiency",
    "warning": "the twins ran at 25.000% of their decode roofline",
}


def test_the_twins_calibration_is_said_not_applied_beside_the_prediction(
    logged_in_client, deepseek_analysis, h200_plan
):
    from engine.stages.plan.calibration import SUPERSEDED, calibrated_predictions

    predicted = h200_plan["predicted"]
    predicted["calibrated"] = calibrated_predictions(predicted, CALIBRATION)
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    assert dom.text(panel, "p.muted.plan-calibrated-reason") == SUPERSEDED
    assert "(calibrated prediction)" not in panel
    # the prediction is there, unchanged
    assert table_row(panel, "Decode at batch 1 (predicted)").startswith(
        f"{tokens_per_s(predicted['batch_1']['decode_tokens_per_s'])}"
    )


def test_without_calibration_the_panel_says_why(logged_in_client, deepseek_analysis, h200_plan):
    from engine.stages.plan.calibration import calibrated_predictions

    h200_plan["predicted"]["calibrated"] = calibrated_predictions(
        h200_plan["predicted"], {"available": False, "reason": "no calibration yet: pool h200x8"}
    )
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    assert "(calibrated prediction)" not in panel
    assert dom.text(panel, "p.muted.plan-calibrated-reason") == "no calibration yet: pool h200x8"


def test_efficiency_above_one_is_explained_where_it_occurs(logged_in_client):
    """Qwen3-235B-A22B on 8 H200s predicts more tokens/s per device than on 4 (its weights
    leave 4 devices little KV room): the panel says why, next to the rows where it happens."""
    qwen = analyze_config(load_realconfig("Qwen__Qwen3-235B-A22B-Instruct-2507")).to_dict()
    plan = plan_release(qwen, PoolLayout("h200", 8), release=REPO).to_dict()
    release, job = planned_release(qwen, make_pool("h200x8", "h200"), plan)
    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    above = [p for p in plan["scaling"] if round(p["efficiency_per_device"], 2) > 1]
    assert above  # the fact the note explains
    table = dom.find(panel, 'table[aria-label="Multi-device scaling (predicted)"]')
    assert len(table.select("sup")) == len(above)
    assert (
        "* Efficiency per device above 1: more devices leave more memory for the KV cache, so "
        "a larger batch fits per device." in dom.text(panel)
    )


def test_no_efficiency_note_when_scaling_is_at_most_linear(logged_in_client, deepseek_analysis):
    plan = plan_release(deepseek_analysis, PoolLayout("h200", 8), release=REPO).to_dict()
    for point in plan["scaling"]:
        point["efficiency_per_device"] = min(point["efficiency_per_device"], 1.0)
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), plan)
    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    assert "leave more memory for the KV cache" not in panel and "<sup" not in panel


def test_a_plan_without_prediction_draws_no_empty_scaling_chart(logged_in_client):
    """On the cpu pool no datasheet gives bandwidth or FLOP/s: no speed is predicted, so the
    scaling chart and table would be empty. The panel says why instead."""
    from engine.catalog import cpu_accelerator

    analysis = analyze_config(load_realconfig("meta-llama__Llama-3.1-8B")).to_dict()
    catalog = load_catalog().with_cpu(cpu_accelerator(cores=16, memory_bytes=64 * 2**30))
    plan = plan_release(analysis, PoolLayout("cpu", 1), release=REPO, catalog=catalog).to_dict()
    reason = plan["predicted"]["reason"]
    assert plan["scaling"] and not plan["predicted"]["available"]
    release = make_release(repo_id=REPO)
    job = make_job(
        release=release,
        stages=STAGES,
        statuses=dict.fromkeys(STAGES, "succeeded"),
        results={"analyze": analysis, "plan": plan},
    )
    html = page(logged_in_client, release)
    panel = section(html, f"plan-job-{job.pk}")

    assert f"plan-job-{job.pk}-scaling-chart" not in html
    assert "plan-scaling" not in panel  # no table of dashes
    assert f"No scaling curve: {reason}." in dom.text(panel)
    assert reason.startswith("cpu has no published memory bandwidth")
    assert f'id="plan-job-{job.pk}-memory-chart"' in html  # memory is still predicted


@pytest.mark.parametrize("busy", [True, False])
def test_a_cpu_plan_says_when_its_figures_were_measured_on_a_busy_host(logged_in_client, busy):
    from engine.catalog import cpu_accelerator

    analysis = analyze_config(load_realconfig("meta-llama__Llama-3.1-8B")).to_dict()
    measured = {
        "memory_bandwidth_bytes_per_s": 2.8e9,
        "flops": {"bfloat16": 1e10},
        "source": "median of 1 performance run (stage runs 7)",
        "host_busy": busy,
    }
    cpu = cpu_accelerator(cores=16, memory_bytes=64 * 2**30, measured_figures=measured)
    catalog = load_catalog().with_cpu(cpu)
    plan = plan_release(
        analysis, PoolLayout("cpu", 1), context_tokens=4096, release=REPO, catalog=catalog
    ).to_dict()
    assert plan["measured_device"]["host_busy"] is busy
    release = make_release(repo_id=REPO)
    job = make_job(
        release=release,
        stages=STAGES,
        statuses=dict.fromkeys(STAGES, "succeeded"),
        results={"analyze": analysis, "plan": plan},
    )
    figures = dom.text(section(page(logged_in_client, release), f"plan-job-{job.pk}"))
    assert "cpu memory bandwidth 2.8 GB/s and BF16 FLOP/s 0.01 TFLOP/s are measured" in figures
    assert ("not a datasheet's; measured on a busy host" in figures) is busy
    busy_words = "no probe on the pool was taken on a quiet host yet, so these speeds read low"
    assert (busy_words in figures) is busy


@pytest.mark.parametrize("status", ["queued", "pending"])
def test_a_waiting_plan_says_no_live_worker_serves_its_pool(
    logged_in_client, deepseek_analysis, status
):
    from tests.worker_rows import cuda_devices, make_worker

    pool = make_pool("h200x8", "h200")
    release, job = planned_release(deepseek_analysis, pool, {}, status=status)
    if status == "pending":  # its job is active: an earlier stage is queued
        job.stage_runs.filter(stage="analyze").update(status="queued")
    waiting = "waiting: no live worker for pool h200x8 (queue pool.h200x8)"

    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    assert waiting in dom.text(panel)
    assert f'<span class="badge status-{status}">{waiting}</span>' in panel

    make_worker(queues=("pool.h200x8",), devices=cuda_devices(8))
    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    assert waiting not in panel
    assert f"The <em>plan</em> stage is {status}." in panel


def test_plan_charts_have_readable_ticks(logged_in_client, deepseek_analysis, h200_plan):
    """Counts in full ("32,768", not plotly's "32.768k"), speeds with an SI suffix,
    milliseconds with their unit, efficiency with two decimals at most."""
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    html = page(logged_in_client, release)
    decode = figure(html, f"plan-job-{job.pk}-decode-figure")["layout"]
    prefill = figure(html, f"plan-job-{job.pk}-prefill-figure")["layout"]
    scaling = figure(html, f"plan-job-{job.pk}-scaling-figure")["layout"]
    for layout in (decode, prefill, scaling):
        assert layout["xaxis"]["tickformat"] == ",d"
    assert decode["yaxis"]["tickformat"] == scaling["yaxis"]["tickformat"] == "~s"
    assert decode["yaxis2"]["ticksuffix"] == " ms" and decode["yaxis2"]["tickformat"] == ",.3~r"
    assert prefill["yaxis"]["title"]["text"] == "TTFT (s)"
    assert prefill["yaxis"]["tickformat"] == ",.3~r"
    assert scaling["yaxis2"]["tickformat"] == ".2~f"
    # the right-hand axes pick round ticks of their own, not the left axis's count
    assert decode["yaxis2"]["tickmode"] == scaling["yaxis2"]["tickmode"] == "auto"
    assert 32768 in prefill["xaxis"]["tickvals"]


def test_a_manifest_pools_start_facts_count_its_declared_devices(
    logged_in_client, deepseek_analysis, h200_plan
):
    from tests.worker_rows import make_worker

    pool = AcceleratorPool.objects.create(
        name="h200-remote", backend="manifest", accelerator="h200", devices_per_node=8, nodes=2
    )
    make_worker(queues=("pool.h200-remote",))  # its worker: a cpu machine, not an H200
    release, job = planned_release(deepseek_analysis, pool, h200_plan)
    job.status = "pending"
    job.save(update_fields=["status"])
    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    assert fact(panel, "Can start now") == "yes"
    assert fact(panel, "Devices needed") == (
        "8; 16 declared (manifest pool: its accelerators are not attached to a worker here), "
        "16 free"
    )


# --- a failed plan ---------------------------------------------------------------------------


def test_failed_plan_shows_the_reason_and_what_would_fit(
    logged_in_client, deepseek_analysis, h100_no_fit
):
    release, job = planned_release(
        deepseek_analysis, make_pool("h100x8", "h100"), h100_no_fit, status="failed"
    )
    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    devices = h100_no_fit["suggestions"]["devices"]

    assert devices == 16  # the engine's answer: two nodes of eight H100s
    assert 'role="alert"' in panel
    assert f"Does not fit this pool; would fit: {devices} x h100 (2 nodes of 8)." in dom.text(panel)
    assert html_lib.escape(h100_no_fit["reason"]) in panel
    compare = reverse("adaptation:release_compare_pools", args=[release.pk])
    assert f'href="{compare}?context=32768&amp;concurrency=4&amp;dtype=checkpoint"' in panel
    assert "plan-memory" not in panel  # no split, no charts


def test_failed_plan_without_a_result_shows_its_error(logged_in_client, deepseek_analysis):
    release = make_release(repo_id=REPO)
    job = make_job(
        release=release,
        pool=make_pool("nokind", ""),
        stages=STAGES,
        statuses={"fetch": "succeeded", "analyze": "succeeded", "plan": "failed"},
        results={"analyze": deepseek_analysis},
        errors={"plan": "pool 'nokind' (backend cuda) names no accelerator kind"},
    )
    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    assert "The plan failed." in panel
    assert "names no accelerator kind" in panel
    assert "Does not fit" not in panel


def test_release_without_plan_links_to_compare_pools(logged_in_client, deepseek_analysis):
    release = make_release(repo_id=REPO)
    make_job(
        release=release,
        statuses={"fetch": "succeeded", "analyze": "succeeded"},
        results={"analyze": deepseek_analysis},
    )
    html = page(logged_in_client, release)
    assert "Not planned yet" in html
    assert f'href="{reverse("adaptation:release_compare_pools", args=[release.pk])}"' in html


def test_live_refresh_swaps_the_plan_panel_too(logged_in_client, deepseek_analysis, h200_plan):
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    response = logged_in_client.get(
        reverse("adaptation:release_detail", args=[release.pk]), HTTP_HX_REQUEST="true"
    )
    html = response.content.decode()
    assert (
        '<section id="plans" class="plans" aria-labelledby="plans-title" hx-swap-oob="true">'
        in html
    )
    assert f'id="plan-job-{job.pk}-memory-figure"' in html


# --- compare pools ---------------------------------------------------------------------------


def compare_url(release, query: str = "") -> str:
    url = reverse("adaptation:release_compare_pools", args=[release.pk])
    return f"{url}?{query}" if query else url


def analysed(analysis: dict):
    release = make_release(repo_id=REPO)
    make_job(
        release=release,
        statuses={"fetch": "succeeded", "analyze": "succeeded"},
        results={"analyze": analysis},
    )
    return release


def compare_rows(html: str) -> list[dict]:
    """The compare table's rows: each cell's text by its class ("verdict", "devices",
    "decode-batch-1", "no-prediction", ...), the row header's text as "header", and its
    classes as flags."""
    out = []
    for row in dom.find_all(html, "tr[class][data-name][data-source]"):
        cells = {cell.classes[-1]: cell.text for cell in row.select("td[class]")}
        marks = row.classes
        out.append(
            {
                "name": row["data-name"],
                "source": row["data-source"],
                "fits": "no-fit" not in marks,
                "fewest_devices": "fewest-devices" in marks,
                "most_per_device": "most-per-device" in marks,
                "header": dom.text(row, 'th[scope="row"]'),
                "body": row.inner_html,
                "batch_1": cells.get("decode-batch-1"),
                "largest": cells.get("decode-largest"),
                "per_device": cells.get("per-device"),
                **cells,
            }
        )
    return out


def test_compare_pools_requires_login(client):
    response = client.get(compare_url(make_release()))
    assert response.status_code == 302 and response.url.startswith(reverse("login"))


def test_compare_pools_plans_every_kind_and_pool(logged_in_client, deepseek_analysis):
    release = analysed(deepseek_analysis)
    make_pool("h200x8", "h200")
    response = logged_in_client.get(compare_url(release))
    assert response.status_code == 200
    rows = compare_rows(response.content.decode())
    by_kind = {r["name"]: r for r in rows if r["source"] == "catalog kind"}

    assert set(by_kind) == set(load_catalog().kinds())
    assert {r["name"] for r in rows if r["source"] == "pool"} == {"cpu", "h200x8"}
    h200 = plan_release(deepseek_analysis, PoolLayout("h200", 8), release=REPO).to_dict()
    assert by_kind["h200"]["fits"] and by_kind["h200"]["devices"] == "8"
    assert by_kind["h200"]["split"] == "TP1 PP1 EP8 DP8"
    assert by_kind["h200"]["batch_1"] == (
        f"{tokens_per_s(h200['predicted']['batch_1']['decode_tokens_per_s'])}"
    )
    assert by_kind["h200"]["memory"] == (
        f"{gib(h200['memory_per_device_bytes']['total_used'])} of "
        f"{gib(h200['memory_per_device_bytes']['capacity'])}"
    )
    # one node of eight H100s is too small: the row plans two
    assert by_kind["h100"]["verdict"] == "needs 2 nodes (16 devices)"
    assert (by_kind["h100"]["devices"], by_kind["h100"]["nodes"]) == ("16", "2")
    h100 = plan_release(deepseek_analysis, PoolLayout("h100", 8, nodes=2), release=REPO).to_dict()
    assert by_kind["h100"]["largest"].startswith(
        f"{tokens_per_s(h100['predicted']['largest_batch']['decode_tokens_per_s'])}"
    )
    pool = next(r for r in rows if r["name"] == "h200x8")
    assert pool["fits"] and pool["verdict"] == "fits the pool on 8 of its 8 devices"
    cpu = next(r for r in rows if r["name"] == "cpu")
    assert not cpu["fits"] and cpu["verdict"].startswith("does not fit the pool")
    assert "does not fit 1 x cpu" in cpu["reason"]


def per_device(row: dict) -> float:
    return float(row["per_device"].removesuffix(" tokens/s").replace(",", ""))


def test_compare_pools_ranks_by_nodes_then_tokens_per_device(logged_in_client, deepseek_analysis):
    """No "best choice" across kinds by device count: four MI300X (716 tokens/s predicted)
    are not better than eight H200 (5,776 tokens/s). Fitting rows come first, by fewest
    nodes, then by predicted decode tokens/s per device at the largest batch; two marks say
    which row needs the fewest devices and which predicts the most tokens/s per device."""
    html = logged_in_client.get(compare_url(analysed(deepseek_analysis))).content.decode()
    rows = compare_rows(html)
    fitting = [r for r in rows if r["fits"]]

    assert "best choice" not in html and ' best"' not in html
    assert rows[: len(fitting)] == fitting  # every fitting row before the others
    nodes = [int(r["nodes"]) for r in fitting]
    assert nodes == sorted(nodes)
    for first, second in itertools.pairwise(fitting):
        if first["nodes"] == second["nodes"] and second["per_device"] != MISSING:
            assert per_device(first) >= per_device(second), (first["name"], second["name"])
    by_name = {r["name"]: r for r in rows if r["source"] == "catalog kind"}
    h200, mi300x = by_name["h200"], by_name["mi300x"]
    # DeepSeek-V3 fits four MI300X (192 GiB each), the fewest devices of any kind, but eight
    # H200 predict more per device: H200 ranks above MI300X and the marks say why each leads.
    assert mi300x["devices"] == "4" and mi300x["fewest_devices"]
    assert "fewest devices" in mi300x["header"]
    assert [r["name"] for r in rows if r["fewest_devices"]] == ["mi300x"]
    assert per_device(h200) > per_device(mi300x)
    assert rows.index(h200) < rows.index(mi300x)
    leaders = [r for r in rows if r["most_per_device"]]
    assert leaders and all("most tokens/s per device" in r["header"] for r in leaders)
    assert per_device(leaders[0]) == max(per_device(r) for r in fitting if r["batch_1"])
    # the per-device column is the largest batch's tokens/s over the split's devices
    plan = plan_release(deepseek_analysis, PoolLayout("h200", 8), release=REPO).to_dict()
    assert h200["per_device"] == (
        f"{tokens_per_s(plan['predicted']['largest_batch']['decode_tokens_per_s'] / 8)}"
    )


def test_compare_pools_predicts_the_cpu_pool_on_its_measured_figures(logged_in_client):
    """The cpu pool is planned on the median of its performance runs' probes, as the plan
    stage is, and its note says so; "1 device", not "1 devices"."""
    from adaptation.models import AcceleratorPool
    from tests.adaptation.test_catalog_rows import probed_run
    from tests.worker_rows import make_worker

    analysis = analyze_config(load_realconfig("meta-llama__Llama-3.1-8B")).to_dict()
    release = analysed(analysis)
    pool = AcceleratorPool.objects.get(name="cpu")
    make_worker(queues=("pool.cpu",))  # 64 GiB
    runs = [probed_run(pool, bw * 1e9, 5e11) for bw in (30, 10, 20)]
    rows = compare_rows(logged_in_client.get(compare_url(release)).content.decode())
    cpu = next(r for r in rows if r["name"] == "cpu" and r["source"] == "pool")
    assert cpu["fits"] and cpu["batch_1"] and "no-prediction" not in cpu
    assert "(1 device)" in cpu["header"] and "1 devices" not in cpu["body"]
    notes = dom.text(cpu["body"])
    assert "memory bandwidth 20.0 GB/s and BF16 0.50 TFLOP/s measured" in notes
    assert f"median of 3 performance runs (stage runs {runs[-1].pk}, " in notes


def test_compare_pools_shows_why_a_fitting_row_has_no_prediction(
    logged_in_client, deepseek_analysis
):
    """L4 publishes no interconnect bandwidth: its row fits but says why it has no speeds,
    instead of a row of dashes."""
    rows = compare_rows(
        logged_in_client.get(compare_url(analysed(deepseek_analysis))).content.decode()
    )
    l4 = next(r for r in rows if r["name"] == "l4")
    assert l4["fits"]
    assert l4["no-prediction"] == "no prediction: l4 has no published interconnect bandwidth"
    assert l4["batch_1"] is None and l4["per_device"] is None
    assert 'colspan="4"' in l4["body"]


def test_compare_pools_cells_stay_short(logged_in_client, deepseek_analysis):
    """The dtype cell is short with the planner's full label in its title; a failure's long
    reason is folded in a <details>, its short verdict visible."""
    release = analysed(deepseek_analysis)
    rows = compare_rows(logged_in_client.get(compare_url(release)).content.decode())
    h200 = next(r for r in rows if r["name"] == "h200")
    assert h200["dtype"] == "fp8 (checkpoint)"
    assert 'title="checkpoint (fp8 e4m3 (128x128 blocks))"' in h200["body"]
    cpu = next(r for r in rows if r["name"] == "cpu")
    assert cpu["verdict"].startswith("does not fit the pool")
    [reason] = [d for d in dom.find_all(cpu["body"], "details") if dom.text(d, "summary") == "why"]
    assert "does not fit 1 x cpu" in reason.text
    assert cpu["verdict"].count("does not fit 1 x cpu") == 0


def test_compare_pools_options_live_in_the_url(logged_in_client, deepseek_analysis):
    release = analysed(deepseek_analysis)
    response = logged_in_client.get(compare_url(release, "context=4096&concurrency=16&dtype=fp8"))
    html = response.content.decode()
    assert response.status_code == 200
    assert 'name="context" value="4096"' in html and 'name="concurrency" value="16"' in html
    assert '<option value="fp8" selected>' in html
    assert (
        "Planned for 4,096 tokens of context x 16 concurrent sequences, serving dtype fp8."
        in dom.text(html)
    )
    h200 = plan_release(
        deepseek_analysis,
        PoolLayout("h200", 8),
        release=REPO,
        context_tokens=4096,
        concurrency=16,
        dtype="fp8",
    ).to_dict()
    row = next(r for r in compare_rows(html) if r["name"] == "h200")
    assert row["devices"] == str(h200["devices"]) and row["split"] == (
        f"TP{h200['tp']} PP{h200['pp']} EP{h200['ep']} DP{h200['dp']}"
    )


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("context=abc", "Context (tokens)"),
        ("context=0", "Context (tokens)"),
        ("context=1000000000000", "Context (tokens)"),
        ("concurrency=-3", "Concurrent sequences"),
        ("dtype=fp4", "Serving dtype"),
    ],
)
def test_compare_pools_refuses_bad_options(logged_in_client, deepseek_analysis, query, field):
    response = logged_in_client.get(compare_url(analysed(deepseek_analysis), query))
    html = response.content.decode()
    assert response.status_code == 400
    assert f'<div class="field-error" role="alert">{field}: ' in html
    assert "compare-pools-table" not in html


def test_compare_pools_without_analysis(logged_in_client):
    release = make_release()
    make_job(release=release, statuses={"fetch": "succeeded", "analyze": "failed"})
    html = logged_in_client.get(compare_url(release)).content.decode()
    assert "No analysis yet" in html and "compare-pools-table" not in html


def test_compare_pools_loads_the_catalog_once(logged_in_client, deepseek_analysis):
    """Three pools or one: the accelerator kinds are read once per page, not per pool."""
    release = analysed(deepseek_analysis)

    def kind_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert logged_in_client.get(compare_url(release)).status_code == 200
        return sum('"adaptation_acceleratorkind"' in q["sql"] for q in queries.captured_queries)

    make_pool("h200x8", "h200")
    assert kind_queries() == 1
    make_pool("h100x16", "h100", nodes=2)
    make_pool("mi300x", "mi300x")
    assert kind_queries() == 1


def test_compare_pools_row_that_cannot_be_planned_says_why(logged_in_client, deepseek_analysis):
    release = analysed(deepseek_analysis)
    make_pool("bare", "")  # a cuda pool naming no accelerator kind
    response = logged_in_client.get(compare_url(release))
    assert response.status_code == 200
    bare = next(r for r in compare_rows(response.content.decode()) if r["name"] == "bare")
    assert bare["verdict"] == "cannot plan" and "names no accelerator kind" in bare["reason"]


def test_fewest_devices_is_not_a_badge_when_every_fitting_row_needs_as_many():
    from adaptation.presenters.compare_pools import CompareRow, _marked

    def row(name, devices):
        return CompareRow(
            name=name, source="catalog kind", accelerator=name, fits=True,
            verdict="fits-node", devices=devices,
        )  # fmt: skip

    assert not any(r.fewest_devices for r in _marked([row("a", 1), row("b", 1)]))
    marked = _marked([row("a", 1), row("b", 2)])
    assert [r.fewest_devices for r in marked] == [True, False]
