"""The release page's "Multi-device validation" panel, and the measured scaling point on the
plan's scaling chart, fed the results the `distributed` stage stored (tests/data/distributed:
a Qwen3-MoE twin passing at TP=2 EP=2, a wrong shard caught at a module, a rank killed
mid-run, an architecture without a tensor-parallel plan)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from adaptation.charts import plan as plan_charts
from adaptation.models import AcceleratorPool
from adaptation.presenters.plan import measured_scaling, plan_panel
from engine.architecture import analyze_config
from engine.stages.distributed.result import MeasuredScaling
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from engine.stages.plan.result import PlanResult
from tests import dom
from tests.adaptation.presenters.test_plan_panel import figure, page, section, table_row
from tests.factories import make_job, make_release

pytestmark = pytest.mark.django_db

DATA = Path(__file__).resolve().parents[2] / "data" / "distributed"
REPO = "deepseek-ai/DeepSeek-V3"
STAGES = ("fetch", "analyze", "plan", "distributed")


def stored(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def deepseek_analysis() -> dict:
    from tests.conftest import load_realconfig

    return analyze_config(load_realconfig("deepseek-ai__DeepSeek-V3")).to_dict()


@pytest.fixture(scope="module")
def h200_plan(deepseek_analysis) -> dict:
    return plan_release(deepseek_analysis, PoolLayout("h200", 8), release=REPO).to_dict()


def h200_pool() -> AcceleratorPool:
    return AcceleratorPool.objects.create(
        name="h200x8",
        backend="cuda",
        device="cuda:0",
        accelerator="h200",
        devices_per_node=8,
    )


def validated_job(
    analysis: dict,
    plan: dict,
    distributed: dict | None,
    *,
    status: str = "succeeded",
    error: str = "",
    release=None,
    pool=None,
):
    """A job planned on one node of eight H200s whose `distributed` run ended in `status`
    with the stored `distributed` result (None: the stage only planned)."""
    stages = STAGES if distributed is not None or status != "succeeded" else STAGES[:3]
    return make_job(
        release=release or make_release(repo_id=REPO),
        pool=pool or h200_pool(),
        stages=stages,
        statuses={"fetch": "succeeded", "analyze": "succeeded", "plan": "succeeded"}
        | ({"distributed": status} if "distributed" in stages else {}),
        results={"analyze": analysis, "plan": plan, "distributed": distributed},
        errors={"distributed": error} if error else None,
    )


def failed(name: str) -> tuple[dict, str]:
    """A failed run's stored result and the reason stored as its error."""
    data = stored(name)
    return data["result"], data["reason"]


def rank_rows(html: str) -> list[list[str]]:
    """The body rows of the rank table, each as its cells' texts."""
    return dom.rows(html, "table.data-table.distributed-ranks tbody")


def distributed_article(html: str, job) -> str:
    """The markup of `job`'s distributed panel."""
    return dom.find(html, f"article.plan.distributed-panel#distributed-job-{job.pk}").html


def verdict(panel: str) -> str:
    """The panel's verdict line as read ("Passed: ..."): the verdict paragraph, or the first
    line of a failure's block."""
    verdict_id = '[id^="distributed-job-"][id$="-verdict"]'
    return dom.text(panel, f"p{verdict_id}, div{verdict_id} > p.verdict")


# --- each run's panel, as the page renders it ---------------------------------------------------


def fact(html: str, label: str) -> str:
    """The text of the fact labelled `label`."""
    facts = dom.facts(html)
    assert label in facts, f"no fact {label!r}"
    return facts[label]


def headline(panel: str, label: str) -> str:
    """The figure of the headline fact `label`, without its note."""
    for term in dom.find_all(panel, "dt"):
        if term.text == label and term.next_element and term.next_element.tag == "dd":
            return term.next_element.text_without("div.note")
    raise AssertionError(f"no headline row {label!r}")


def labels(facts: str) -> list[str]:
    """The labels of a list of facts, in order."""
    return dom.texts(facts, "dt")


def logged_ranks(panel: str) -> list[tuple[str, str]]:
    """(rank, how it ended) of each rank's log in the folded "every rank's log": each log's
    heading reads "Rank 1 (killed by SIGKILL)", or "Rank 1" alone."""
    logs = dom.find(panel, "details.distributed-logs")
    ranks = []
    for heading in dom.texts(logs, 'p[class="meta"]'):
        rank, _, ended = heading.removeprefix("Rank ").partition(" (")
        ranks.append((rank, ended.removesuffix(")")))
    return ranks


def test_panel_of_a_passed_run(logged_in_client, deepseek_analysis, h200_plan):
    job = validated_job(deepseek_analysis, h200_plan, stored("pass"))
    panel = distributed_article(page(logged_in_client, job.release), job)

    assert "distributed-passed" in panel
    assert verdict(panel).startswith(
        "Passed: TP=2 EP=2 on 2 gloo processes matches the float32 reference"
    )
    assert [h for h in dom.texts(panel, "h4") if h.startswith("Validated split")] == [
        "Validated split TP=2 EP=2"
    ]
    split = dom.find(panel, "dl.facts.distributed-split").html
    assert [(label, fact(split, label)) for label in labels(split)] == [
        ("Tensor parallel (TP)", "2"),
        ("Expert parallel (EP)", "2"),
        ("World size", "2 processes"),
        ("Backend", "gloo on cpu"),
        ("Threads per rank", "1"),
    ]
    planned = dom.find(panel, "dl.facts.distributed-plan-split").html
    assert [(label, fact(planned, label)) for label in labels(planned)] == [
        ("The plan's split", "TP8 PP1 EP8 DP1"),
        ("Devices on the worker", "2"),
    ]
    degree = dom.text(panel, "p.note.degree-reason")
    assert degree.startswith("the plan's TP=8 needs more than the worker's 2 devices")
    assert {
        label: headline(panel, label)
        for label in (
            "Decode step at TP=2 (measured, twin)",
            "Decode step at TP=1 (measured, twin)",
            "Decode at TP=2 (measured, twin)",
            "Decode at TP=1 (measured, twin)",
            "Time in collectives (measured, twin)",
            "Scaling efficiency (measured, twin)",
        )
    } == {
        "Decode step at TP=2 (measured, twin)": "16.4 ms",
        "Decode step at TP=1 (measured, twin)": "5.49 ms",
        "Decode at TP=2 (measured, twin)": "122 tokens/s",
        "Decode at TP=1 (measured, twin)": "364 tokens/s",
        "Time in collectives (measured, twin)": "11.1 %",
        "Scaling efficiency (measured, twin)": "16.7 % (0.17 x linear)",
    }
    assert [row[:5] for row in rank_rows(panel)] == [
        ["0", "7.45e-07", "1.28e-04", "100.0 %", "none"],
        ["1", "7.45e-07", "1.28e-04", "100.0 %", "none"],
    ]
    assert [row[5:] for row in rank_rows(panel)] == [["16.4 ms", "12.5 %"], ["16.3 ms", "9.7 %"]]
    assert table_row(panel, "query heads / TP") == "64 (divisible) 32 (divisible) 2 yes"
    assert "failed-log" not in panel and "Failed" not in verdict(panel)
    assert [rank for rank, _ in logged_ranks(panel)] == ["0", "1"]


def test_panel_of_a_wrong_shard_names_the_rank_and_module(
    logged_in_client, deepseek_analysis, h200_plan
):
    result, reason = failed("mismatch")
    job = validated_job(deepseek_analysis, h200_plan, result, status="failed", error=reason)
    panel = distributed_article(page(logged_in_client, job.release), job)

    assert "distributed-failed" in panel
    assert dom.text(panel, 'p[class="reason"]') == reason
    assert verdict(panel).startswith("Failed on rank 0 (TP=2)")  # the first rank off
    log = dom.find(panel, 'pre[id^="distributed-job-"][id$="-failed-log"]').raw_text
    assert log.startswith("[rank 0] joined gloo group of 2")
    first = rank_rows(panel)[0]
    assert first[1:5] == [
        "9.03e-01",
        "9.89e-05",
        "5.0 %",
        "model.layers.1.self_attn (layer 1, attention; error 2.32e-01 > 2.97e-05)",
    ]
    assert '<tr class="crossed">' in panel  # rank 0 did not pass
    # The timings are still measured: a wrong shard is as fast as a right one.
    assert headline(panel, "Scaling efficiency (measured, twin)") == "6.8 % (0.07 x linear)"
    assert dom.text(panel, "p.note.injected") == (
        "Broken on purpose by the job's inject option "
        "(wrong_shard model.layers.1.self_attn.o_proj.weight)."
    )
    notes = dom.find_all(panel, 'ul[class="notes"]')
    assert dom.texts(notes[-1], "li") == [
        "model.layers.1.self_attn.o_proj.weight: shard split on dim 0 instead of dim 1",
    ]


def test_panel_of_a_killed_rank_shows_its_log(logged_in_client, deepseek_analysis, h200_plan):
    result, reason = failed("crash")
    job = validated_job(deepseek_analysis, h200_plan, result, status="failed", error=reason)
    panel = distributed_article(page(logged_in_client, job.release), job)

    assert "distributed-failed" in panel
    assert verdict(panel).startswith("Failed on rank 1")
    assert "Rank 1's log (killed by SIGKILL):" in dom.text(panel)
    log = dom.find(panel, 'pre[id^="distributed-job-"][id$="-failed-log"]')
    assert log.raw_text == (
        "[rank 1] joined gloo group of 2 (pid 7168)\n"
        "[rank 1] loaded LlamaForCausalLM with tp=2 ep=1\n"
        "[rank 1] injected: killing this rank with SIGKILL"
    )
    assert "distributed-ranks" not in panel and "distributed-headline" not in panel
    assert logged_ranks(panel) == [("0", "killed by SIGTERM"), ("1", "killed by SIGKILL")]
    assert measured_scaling(job.stage_runs.get(stage="distributed")) is None


def test_panel_of_a_split_that_could_not_be_validated(
    logged_in_client, deepseek_analysis, h200_plan
):
    job = validated_job(deepseek_analysis, h200_plan, stored("not_validated"))
    panel = distributed_article(page(logged_in_client, job.release), job)

    assert "distributed-not-validated" in panel
    assert verdict(panel).startswith(
        "Not validated: transformers' FooForCausalLM has no tensor-parallel plan"
    )
    assert "distributed-split" not in panel and "distributed-ranks" not in panel
    assert "distributed-headline" not in panel
    planned = dom.find(panel, "dl.facts.distributed-plan-split").html
    assert [(label, fact(planned, label)) for label in labels(planned)] == [
        ("The plan's split", "TP1 PP1 EP1 DP1"),
        ("Devices on the worker", "2"),
    ]
    assert measured_scaling(job.stage_runs.get(stage="distributed")) is None


def test_panel_of_a_run_that_failed_before_launching(
    logged_in_client, deepseek_analysis, h200_plan
):
    error = "the plan stage produced no split to validate"
    job = validated_job(deepseek_analysis, h200_plan, None, status="failed", error=error)
    panel = distributed_article(page(logged_in_client, job.release), job)

    assert "distributed-failed" in panel
    assert dom.text(panel, 'p[class="reason"]') == error
    assert "distributed-split" not in panel and "distributed-plan-split" not in panel
    assert "failed-log" not in panel


def test_a_degree_below_two_is_said_once(logged_in_client, deepseek_analysis, h200_plan):
    why = "the pool's worker holds 1 device: a split needs at least 2"
    result = stored("not_validated") | {"reason": why, "degree_reason": why}
    job = validated_job(deepseek_analysis, h200_plan, result)
    panel = distributed_article(page(logged_in_client, job.release), job)

    assert "distributed-not-validated" in panel
    assert verdict(panel) == f"Not validated: {why}"
    assert "degree-reason" not in panel


@pytest.mark.parametrize(
    ("code", "shown"),
    [(-9, "killed by SIGKILL"), (-15, "killed by SIGTERM"), (1, "exit code 1"), (None, "")],
)
def test_how_a_rank_ended(logged_in_client, deepseek_analysis, h200_plan, code, shown):
    result, reason = failed("crash")
    result = copy.deepcopy(result)
    result["rank_logs"][0]["exit_code"] = code
    job = validated_job(deepseek_analysis, h200_plan, result, status="failed", error=reason)
    panel = distributed_article(page(logged_in_client, job.release), job)
    assert logged_ranks(panel)[0] == ("0", shown)


# --- the release page ------------------------------------------------------------------------


def test_page_shows_a_passed_validation_beside_the_plans_split(
    logged_in_client, deepseek_analysis, h200_plan
):
    job = validated_job(deepseek_analysis, h200_plan, stored("pass"))
    html = page(logged_in_client, job.release)
    panel = distributed_article(html, job)

    assert '<h2 id="distributed-title">Run the split (measured)</h2>' in html
    assert "Measured on the scaled twin, not the full-size model" in dom.text(html)
    assert f"Job {job.pk} on pool h200x8 Succeeded" in dom.text(panel)
    assert verdict(panel) == "Passed: " + stored("pass")["reason"]
    assert fact(panel, "Tensor parallel (TP)") == "2"
    assert fact(panel, "Expert parallel (EP)") == "2"
    assert fact(panel, "World size") == "2 processes"
    assert fact(panel, "Backend") == "gloo on cpu"
    assert fact(panel, "Threads per rank") == "1"
    assert fact(panel, "The plan's split") == "TP8 PP1 EP8 DP1"
    assert "TP=2, the largest divisor of 8 the worker holds, is the split to validate" in panel
    assert headline(panel, "Decode step at TP=2 (measured, twin)").startswith("16.4 ms")
    assert headline(panel, "Decode step at TP=1 (measured, twin)").startswith("5.49 ms")
    assert headline(panel, "Decode at TP=2 (measured, twin)").startswith("122 tokens/s")
    assert headline(panel, "Decode at TP=1 (measured, twin)").startswith("364 tokens/s")
    assert headline(panel, "Time in collectives (measured, twin)").startswith("11.1 %")
    assert headline(panel, "Scaling efficiency (measured, twin)").startswith("16.7 %")
    assert rank_rows(panel) == [
        ["0", "7.45e-07", "1.28e-04", "100.0 %", "none", "16.4 ms", "12.5 %"],
        ["1", "7.45e-07", "1.28e-04", "100.0 %", "none", "16.3 ms", "9.7 %"],
    ]
    assert table_row(panel, "query heads / TP") == "64 (divisible) 32 (divisible) 2 yes"
    assert "Qwen3MoeForCausalLM, 6.1 M parameters" in dom.text(panel)
    assert 'class="plan-failure"' not in panel


def test_page_shows_the_wrong_shard_and_the_failing_ranks_log(
    logged_in_client, deepseek_analysis, h200_plan
):
    result, reason = failed("mismatch")
    job = validated_job(deepseek_analysis, h200_plan, result, status="failed", error=reason)
    panel = distributed_article(page(logged_in_client, job.release), job)

    failure = dom.find(panel, "div.plan-failure").html
    assert dom.text(failure).startswith("Failed on rank 0 (TP=2) " + reason)
    assert "[rank 0] injected: model.layers.1.self_attn.o_proj.weight" in failure
    rows = rank_rows(panel)
    assert rows[0][:5] == [
        "0",
        "9.03e-01",
        "9.89e-05",
        "5.0 %",
        "model.layers.1.self_attn (layer 1, attention; error 2.32e-01 > 2.97e-05)",
    ]
    assert '<tr class="crossed">' in panel


def test_page_shows_a_killed_ranks_log_escaped(logged_in_client, deepseek_analysis, h200_plan):
    result, reason = failed("crash")
    result = copy.deepcopy(result)
    result["rank_logs"][1]["excerpt"] += "\n<script>alert(1)</script>"
    job = validated_job(deepseek_analysis, h200_plan, result, status="failed", error=reason)
    panel = distributed_article(page(logged_in_client, job.release), job)

    # The log as the page wrote it: the script escaped.
    log = dom.find(panel, 'pre.log.rank-log[id^="distributed-job-"][id$="-failed-log"]').inner_html
    assert log.startswith("[rank 1] joined gloo group of 2 (pid 7168)\n")
    assert log.endswith("&lt;script&gt;alert(1)&lt;/script&gt;")
    assert "<script>alert(1)" not in panel
    assert "Rank 1's log (killed by SIGKILL):" in panel
    assert "distributed-ranks" not in panel  # no rank compared
    # The reason's first line above the log; the log itself once there (and once in the
    # folded "every rank's log"), not again inside the reason.
    assert (
        "the distributed run failed (torchrun exited with code 1): rank 1 was killed by "
        "SIGKILL</p>" in panel
    )
    assert panel.count("[rank 1] injected: killing this rank with SIGKILL") == 2
    injected = dom.find(panel, 'p.note.injected[id^="distributed-job-"][id$="-injected"]')
    assert injected.text == ("Broken on purpose by the job's inject option (kill_rank 1).")
    assert panel.index("-injected") < panel.index("distributed-split")  # under the verdict


def test_page_says_why_a_split_was_not_validated(logged_in_client, deepseek_analysis, h200_plan):
    job = validated_job(deepseek_analysis, h200_plan, stored("not_validated"))
    panel = distributed_article(page(logged_in_client, job.release), job)

    assert "distributed-not-validated" in panel
    assert verdict(panel) == "Not validated: " + stored("not_validated")["reason"]
    assert "Validated split" not in panel and "distributed-ranks" not in panel


def test_a_split_not_validated_says_which_it_would_have_run(
    logged_in_client, deepseek_analysis, h200_plan
):
    result = stored("not_validated") | {
        "degree_reason": "the plan serves on one device (TP=1); TP=2, the next point of its "
        "scaling curve, is the split to validate"
    }
    job = validated_job(deepseek_analysis, h200_plan, result)
    panel = distributed_article(page(logged_in_client, job.release), job)
    assert "The split it would have run: the plan serves on one device (TP=1); TP=2" in panel


@pytest.mark.parametrize("status", ["pending", "queued", "running"])
def test_page_shows_a_waiting_run(logged_in_client, deepseek_analysis, h200_plan, status):
    job = validated_job(deepseek_analysis, h200_plan, None, status=status)
    panel = distributed_article(page(logged_in_client, job.release), job)
    assert "distributed-waiting" in panel
    if status == "running":
        assert "The distributed stage is running." in dom.text(panel)


def test_page_shows_the_ep_note(logged_in_client, deepseek_analysis, h200_plan):
    result = stored("pass") | {"ep_note": "expert parallelism could not be validated: no ep_plan"}
    job = validated_job(deepseek_analysis, h200_plan, result)
    panel = distributed_article(page(logged_in_client, job.release), job)
    assert "expert parallelism could not be validated: no ep_plan" in panel


def test_release_without_distributed_run_says_so(logged_in_client, deepseek_analysis, h200_plan):
    job = validated_job(deepseek_analysis, h200_plan, None)
    html = page(logged_in_client, job.release)
    # No job holds the stage: no panel, its title in the page's one line of the rest.
    assert '<section id="distributed"' not in html
    assert "Run the split (measured)" in dom.text(html, "p.rest-summary#panel-gaps")


def test_live_refresh_swaps_the_distributed_panel_too(
    logged_in_client, deepseek_analysis, h200_plan
):
    from django.urls import reverse

    job = validated_job(deepseek_analysis, h200_plan, None, status="running")
    response = logged_in_client.get(
        reverse("adaptation:release_detail", args=[job.release.pk]), HTTP_HX_REQUEST="true"
    )
    html = response.content.decode()
    assert dom.attr(html, "section#distributed", "hx-swap-oob") == "true"
    assert f'id="distributed-job-{job.pk}"' in html


def test_the_panel_costs_no_queries(logged_in_client, deepseek_analysis, h200_plan):
    """Distributed runs come with the plan runs the page prefetches: a release whose jobs
    validated their splits costs as many queries as one whose jobs only planned."""
    planned = make_release(repo_id=REPO)
    validated = make_release(repo_id="Qwen/Qwen3-235B-A22B")
    pool = h200_pool()
    for _ in range(3):
        validated_job(deepseek_analysis, h200_plan, None, release=planned, pool=pool)
        validated_job(deepseek_analysis, h200_plan, stored("pass"), release=validated, pool=pool)
    page(logged_in_client, planned)  # warm per-process caches
    with CaptureQueriesContext(connection) as only_planned:
        page(logged_in_client, planned)
    with CaptureQueriesContext(connection) as with_validation:
        html = page(logged_in_client, validated)
    # The newest job's panel only; the two older jobs fold into the job history.
    assert html.count('class="plan distributed-panel distributed-passed"') == 1
    assert html.count('id="history-job-') == 3
    assert len(with_validation) == len(only_planned), [
        q["sql"] for q in with_validation.captured_queries
    ]


# --- the measured point on the plan's scaling chart ------------------------------------------


def test_scaling_chart_draws_the_measured_efficiency_on_its_own_axis(
    logged_in_client, deepseek_analysis, h200_plan
):
    job = validated_job(deepseek_analysis, h200_plan, stored("pass"))
    html = page(logged_in_client, job.release)
    chart = figure(html, f"plan-job-{job.pk}-scaling-figure")

    measured = [t for t in chart["data"] if "measured" in t["name"]]
    assert len(measured) == 1
    trace = measured[0]
    assert trace["name"] == "scaling efficiency measured on the twin (TP=2 EP=2 vs TP=1)"
    assert trace["x"] == [2]
    assert trace["y"] == [stored("pass")["scaling_efficiency"]]
    assert trace["yaxis"] == "y2" and trace["mode"] == "markers"
    first = h200_plan["scaling"][0]["devices"]
    assert f"against {first} devices, the curve's first count" in trace["hovertemplate"]
    predicted = [t for t in chart["data"] if t.get("yaxis") == "y2" and t is not trace]
    assert predicted[0]["name"] == f"efficiency per device vs {first} devices (predicted)"
    assert 2 in chart["layout"]["xaxis"]["tickvals"]  # the measured count has its tick

    plan = section(html, f"plan-job-{job.pk}")
    line = dom.text(plan, "p.note.measured-scaling")
    assert line.startswith(
        "Measured on the scaled twin (Run the split): TP=2 EP=2 on 2 gloo processes, "
        "scaling efficiency 0.17 x linear (16.7 %"
    )
    assert f"against {first} devices, the first count" in line


def test_a_failed_comparison_still_draws_its_measured_timing(
    logged_in_client, deepseek_analysis, h200_plan
):
    result, reason = failed("mismatch")
    job = validated_job(deepseek_analysis, h200_plan, result, status="failed", error=reason)
    job = type(job).objects.prefetch_related("stage_runs").select_related("pool").get(pk=job.pk)
    panel = plan_panel(job)
    chart = next(slot.figure for slot in panel.charts if slot.stem.endswith("-scaling"))
    trace = next(t for t in chart["data"] if "measured" in t["name"])
    assert trace["y"] == [result["scaling_efficiency"]]
    assert trace["name"] == "scaling efficiency measured on the twin (TP=2 vs TP=1)"
    assert "did not match the reference" in trace["hovertemplate"]
    plan = section(page(logged_in_client, job.release), f"plan-job-{job.pk}")
    measured = dom.text(plan, "p.note.measured-scaling")
    assert "its outputs did not match the float32 reference" in measured


@pytest.mark.parametrize("name", ["crash", "not_validated"])
def test_no_measured_point_without_a_measured_efficiency(
    logged_in_client, deepseek_analysis, h200_plan, name
):
    result = stored(name)
    status, error = "succeeded", ""
    if "result" in result:
        result, error = result["result"], result["reason"]
        status = "failed"
    job = validated_job(deepseek_analysis, h200_plan, result, status=status, error=error)
    html = page(logged_in_client, job.release)
    chart = figure(html, f"plan-job-{job.pk}-scaling-figure")
    assert not [t for t in chart["data"] if "measured" in t["name"]]
    assert chart["layout"]["title"]["text"] == "Multi-device scaling (predicted)"
    assert "measured-scaling" not in section(html, f"plan-job-{job.pk}")


def test_plan_scaling_curve_keeps_the_two_ratios_apart(h200_plan):
    measured = MeasuredScaling(devices=4, efficiency=0.61, tp=4, ep=1, backend="", passed=True)
    scaling = PlanResult.from_stored(h200_plan).scaling
    chart = plan_charts.scaling_curve(scaling, measured)
    trace = chart["data"][-1]
    assert (trace["x"], trace["y"], trace["yaxis"]) == ([4], [0.61], "y2")
    assert trace["marker"]["symbol"] == "diamond"
    assert "did not match" not in trace["hovertemplate"]
    assert chart["layout"]["xaxis"]["tickvals"][0] == 4
    # Without a measured point the chart is the planner's alone.
    plain = plan_charts.scaling_curve(scaling)
    assert [t["name"] for t in plain["data"]] == [
        "decode tokens/s (predicted)",
        f"efficiency per device vs {h200_plan['scaling'][0]['devices']} devices (predicted)",
    ]
