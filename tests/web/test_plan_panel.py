"""The release page's "Distributed plan" panel and the compare-pools page, fed real plans
made by the engine from published configs."""

from __future__ import annotations

import html as html_lib
import json
import re

import pytest
from django.urls import reverse

from adaptation.models import AcceleratorPool
from adaptation.templatetags.day0_format import gib
from tests.conftest import load_realconfig
from tests.factories import make_job, make_release
from workers.catalog import load_catalog
from workers.stages.architecture import analyze_config
from workers.stages.plan import NoFittingPlan, PoolLayout, no_fit_result, plan_release

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


def text(fragment: str) -> str:
    return " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def section(html: str, element_id: str) -> str:
    match = re.search(rf'<article class="plan[^"]*" id="{element_id}".*?</article>', html, re.S)
    assert match, f"no article {element_id}"
    return match[0]


def figure(html: str, figure_id: str) -> dict:
    match = re.search(
        rf'<script id="{re.escape(figure_id)}" type="application/json">(.*?)</script>', html, re.S
    )
    assert match, f"no figure {figure_id}"
    return json.loads(match[1])


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
    match = re.search(rf"<dt>{re.escape(label)}</dt><dd>(.*?)</dd>", html, re.S)
    assert match, f"no fact {label!r}"
    return text(match[1])


def table_row(html: str, label: str) -> str:
    """The cells (text) of the table row headed `label`."""
    match = re.search(rf'<th scope="row">{re.escape(label)}</th>(.*?)</tr>', html, re.S)
    assert match, f"no row {label!r}"
    return text(match[1])


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
        f"{batch_1['decode_tokens_per_s']:,.0f} tokens/s TPOT {batch_1['tpot_s'] * 1000:,.1f} ms"
    )
    row = table_row(
        panel,
        f"Decode at {largest['concurrent_sequences']} concurrent sequences, the largest batch "
        "that fits (predicted)",
    )
    assert row.startswith(f"{largest['decode_tokens_per_s']:,.0f} tokens/s TPOT ")
    for point in predicted["prefill"]:
        assert table_row(panel, f"{point['prompt_tokens']:,} prompt tokens") == (
            f"{point['ttft_s'] * 1000:,.1f} ms"
        )

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
    assert prefill["data"][0]["y"] == pytest.approx(
        [p["ttft_s"] * 1000 for p in predicted["prefill"]]
    )
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
    assert "Crosses nodes: no" in text(panel)
    for point in h200_plan["scaling"]:
        assert f"{point['decode_tokens_per_s']:,.0f} tokens/s" in text(panel)
    runners = re.search(r'aria-label="Splits not chosen">.*?</table>', panel, re.S)[0]
    assert runners.count("<tr>") == len(h200_plan["runners_up"]) + 1  # + the header
    for runner in h200_plan["runners_up"]:
        split = f"TP{runner['tp']} PP{runner['pp']} EP{runner['ep']} DP{runner['dp']}"
        assert html_lib.escape(runner["why_lost"]) in runners
        assert f'<th scope="row">{split}</th>' in runners


def test_artifacts_are_in_pre_blocks_with_copy_buttons(
    logged_in_client, deepseek_analysis, h200_plan
):
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    html = page(logged_in_client, release)
    artifacts = h200_plan["artifacts"]

    assert "copy.js" in html
    for key in ("vllm", "sglang", "kubernetes_deployment"):
        element = f"plan-job-{job.pk}-artifact-{key.replace('_', '-')}"
        pre = re.search(rf'<pre class="artifact-text" id="{element}">(.*?)</pre>', html, re.S)
        assert pre and html_lib.unescape(pre[1]) == artifacts[key]
        assert f'data-copy-target="{element}"' in html


def test_panel_says_when_the_plan_can_start(logged_in_client, deepseek_analysis, h200_plan):
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    panel = section(page(logged_in_client, release), f"plan-job-{job.pk}")

    assert "When can it run on h200x8" in panel
    assert fact(panel, "Can start now") == "no"  # no worker of the pool has registered
    assert fact(panel, "Devices needed").startswith(
        f"{h200_plan['devices']}; live workers report 0"
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
    assert f"Does not fit this pool ; would fit: {devices} x h100 (2 nodes of 8)." in text(panel)
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
    rows = re.findall(
        r'<tr class="([^"]*)" data-name="([^"]*)" data-source="([^"]*)">(.*?)</tr>', html, re.S
    )
    out = []
    for classes, name, source, body in rows:
        cells = [text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)]
        out.append(
            {
                "name": name,
                "source": source,
                "fits": "no-fit" not in classes,
                "best": "best" in classes.split(),
                "verdict": cells[0],
                "devices": cells[1],
                "nodes": cells[2],
                "split": cells[3],
                "batch_1": cells[5],
                "largest": cells[6],
                "memory": cells[8],
                "reason": cells[9],
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
        f"{h200['predicted']['batch_1']['decode_tokens_per_s']:,.0f} tokens/s"
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
        f"{h100['predicted']['largest_batch']['decode_tokens_per_s']:,.0f} tokens/s"
    )
    pool = next(r for r in rows if r["name"] == "h200x8")
    assert pool["fits"] and pool["verdict"] == "fits the pool on 8 of its 8 devices"
    cpu = next(r for r in rows if r["name"] == "cpu")
    assert not cpu["fits"] and cpu["verdict"].startswith("does not fit the pool")
    assert "does not fit 1 x cpu" in cpu["reason"]


def test_compare_pools_puts_the_best_choice_first(logged_in_client, deepseek_analysis):
    rows = compare_rows(
        logged_in_client.get(compare_url(analysed(deepseek_analysis))).content.decode()
    )
    fitting = [r for r in rows if r["fits"]]

    assert rows[0]["best"] and sum(r["best"] for r in rows) == 1
    assert rows[: len(fitting)] == fitting  # every fitting row before the others
    devices = [int(r["devices"]) for r in fitting]
    assert devices == sorted(devices)
    # DeepSeek-V3 fits four MI300X (192 GiB each): the fewest devices of any kind
    assert (rows[0]["name"], rows[0]["devices"]) == ("mi300x", "4")


def test_compare_pools_options_live_in_the_url(logged_in_client, deepseek_analysis):
    release = analysed(deepseek_analysis)
    response = logged_in_client.get(compare_url(release, "context=4096&concurrency=16&dtype=fp8"))
    html = response.content.decode()
    assert response.status_code == 200
    assert 'name="context" value="4096"' in html and 'name="concurrency" value="16"' in html
    assert '<option value="fp8" selected>' in html
    assert (
        "Planned for 4,096 tokens of context x 16 concurrent sequences, serving dtype fp8."
        in text(html)
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


def test_compare_pools_row_that_cannot_be_planned_says_why(logged_in_client, deepseek_analysis):
    release = analysed(deepseek_analysis)
    make_pool("bare", "")  # a cuda pool naming no accelerator kind
    response = logged_in_client.get(compare_url(release))
    assert response.status_code == 200
    bare = next(r for r in compare_rows(response.content.decode()) if r["name"] == "bare")
    assert bare["verdict"] == "cannot plan" and "names no accelerator kind" in bare["reason"]
