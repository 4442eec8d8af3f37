"""The release page's "Serving engine" panel (`presenters.serve`, `panels/serve.html`) and its
charts (`charts.serve`), fed results shaped as docs/stages/serve.md gives them
(tests/serve_results.py): a twin served by vLLM, a launch that failed with the engine's
own error lines, a pool that names no engine."""

from __future__ import annotations

import copy

import pytest
from django.template.loader import render_to_string

from adaptation.charts import serve as serve_charts
from adaptation.models import AcceleratorPool
from adaptation.presenters.panels import Panel, panel_template
from adaptation.presenters.serve import serve_panels
from engine.architecture import analyze_config
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from engine.stages.serve.full_size_result import MetricsSample
from tests import dom
from tests.adaptation.presenters.test_plan_panel import figure
from tests.factories import make_job, make_release
from tests.serve_results import (
    ENGINE_LINES,
    FAILED_AT_LAUNCH,
    LAUNCHED_COMMAND,
    NOT_CONFIGURED,
    PLANNED_COMMAND,
    SERVED,
    served,
)

pytestmark = pytest.mark.django_db

REPO = "meta-llama/Llama-3.1-8B"
STAGES = ("fetch", "analyze", "plan", "serve")


@pytest.fixture(scope="module")
def llama_plan() -> dict:
    from tests.conftest import load_realconfig

    analysis = analyze_config(load_realconfig("meta-llama__Llama-3.1-8B")).to_dict()
    return plan_release(analysis, PoolLayout("h200", 2), release=REPO).to_dict()


def h200_pool() -> AcceleratorPool:
    return AcceleratorPool.objects.create(
        name="h200x2", backend="cuda", device="cuda:0", accelerator="h200", devices_per_node=2
    )


def serve_job(result: dict | None, *, status: str = "succeeded", error: str = "", plan=None):
    """A job on a pool of two H200s whose `serve` run ended in `status` with `result`, after a
    plan (`plan`, or none stored)."""
    return make_job(
        release=make_release(repo_id=REPO),
        pool=h200_pool(),
        stages=STAGES,
        statuses={"fetch": "succeeded", "analyze": "succeeded", "plan": "succeeded"}
        | {"serve": status},
        results={"plan": plan, "serve": result},
        errors={"serve": error} if error else None,
    )


def rendered(job) -> str:
    """The serve panel of `job`'s release as the release page includes it."""
    release = job.release
    values = serve_panels(release)
    panel = Panel("serve", "Serving engine", panel_template("serve"), values)
    return render_to_string(panel_template("serve"), {"panel": panel, "release": release})


def article(html: str, job) -> str:
    """The markup of `job`'s serve panel."""
    return dom.find(html, f"article.plan.serve-panel#serve-job-{job.pk}").html


def by_id(panel: str, element_id: str, tag: str) -> dom.Element:
    """The `<tag>` of `panel` whose id is `element_id`."""
    return dom.find(panel, f"{tag}#{element_id}")


def rows(table: dom.Element) -> list[list[str]]:
    """The body rows of `table`, each as its cells' texts."""
    return dom.rows(table, "tbody")


def fact(panel: str | dom.Element, label: str) -> str:
    """The text of the fact labelled `label`."""
    facts = dom.facts(panel)
    assert label in facts, f"no fact {label!r}"
    return facts[label]


def pre(panel: str, element_id: str) -> str:
    """The text of the `<pre>` whose id is `element_id`, as written, entities decoded."""
    return by_id(panel, element_id, "pre").raw_text


# --- served ----------------------------------------------------------------------------------


def test_a_served_run_shows_the_engine_the_commands_and_their_difference(llama_plan):
    job = serve_job(served(), plan=llama_plan)
    panel = article(rendered(job), job)
    stem = f"serve-job-{job.pk}"

    assert "serve-served" in panel
    assert by_id(panel, f"{stem}-verdict", "p").text == (
        "Served: vllm 0.32.0 loaded the scaled twin from the plan's command and answered the "
        "checks: passed."
    )
    assert pre(panel, f"{stem}-planned-command") == PLANNED_COMMAND
    assert pre(panel, f"{stem}-launched-command") == LAUNCHED_COMMAND
    assert f'data-copy-target="{stem}-launched-command"' in panel
    assert rows(by_id(panel, f"{stem}-command-diff", "table")) == [
        [
            "--model",
            "meta-llama/Llama-3.1-8B",
            "/var/day0/serve/job-7/ckpt",
            "the scaled twin's checkpoint folder",
        ],
        ["--max-model-len", "32768", "2048", "the twin's max_position_embeddings"],
        ["--gpu-memory-utilization", "not set", "0.1", "the pool's memory_fraction"],
    ]


def test_every_figure_of_a_served_run_is_labelled_measured_on_the_engine_serving_the_twin():
    job = serve_job(served())
    panel = article(rendered(job), job)

    assert fact(panel, "Engine") == "vllm 0.32.0 launched by day0"
    assert fact(panel, "Checkpoint") == (
        "the scaled twin, 70.0 M parameters, 0.130 GiB bfloat16, the release's fast tokenizer"
    )
    assert fact(panel, "Load time (measured, engine, twin)") == (
        "84.2 s from launch to the first answer of /health"
    )
    assert fact(panel, "Peak memory (measured, engine, twin)") == "2.7 GiB"
    headings = dom.texts(panel, "h4")
    assert headings == [
        "The commands",
        "What the launch changed from the plan's command",
        "Engine and checkpoint",
        "Precision through the engine (measured, engine, twin)",
        "Load sweep (measured, engine, twin)",
    ]
    # The tensor-parallel check is one line, its figures folded under it.
    assert dom.text(panel, f"details#serve-job-{job.pk}-tp-fold > summary") == (
        "Tensor parallel through the engine: TP=2 launched as planned; greedy tokens match "
        "TP=1 over 160 tokens (measured, engine, twin)"
    )


def test_real_weights_are_labelled_so():
    result = served()
    result["checkpoint"] = {**result["checkpoint"], "kind": "real"}
    job = serve_job(result)
    panel = article(rendered(job), job)

    assert fact(panel, "Peak memory (measured, engine, real weights)") == "2.7 GiB"
    assert "Load sweep (measured, engine, real weights)" in panel
    assert "(measured, engine, twin)" not in panel
    sweep = figure(panel, f"serve-job-{job.pk}-sweep-figure")
    assert sweep["data"][0]["name"] == "output tokens/s (measured, engine, real weights)"


def test_the_startup_log_is_folded_and_the_precision_is_judged_against_its_limits():
    job = serve_job(served())
    panel = article(rendered(job), job)
    stem = f"serve-job-{job.pk}"

    log = dom.find(panel, f"details.serve-startup-log#{stem}-startup-log")
    assert dom.text(log, "summary") == "The engine's startup log (excerpt, 3 lines)"
    assert dom.find(log, "pre").raw_text == "\n".join(SERVED["startup_log"])
    assert by_id(panel, f"{stem}-precision-verdict", "p").text == (
        "Passed: the engine's bfloat16 tokens and log-probabilities against transformers in "
        "float32 on the same checkpoint, 10 prompts, 160 tokens compared."
    )
    assert rows(by_id(panel, f"{stem}-precision", "table")) == [
        ["Token agreement", "100.0 %", "—", "—"],
        ["First divergence", "none", "—", "—"],
        ["Max |Δ logprob|", "1.20e-02", "2.50e-01", "yes"],
        ["KL over the top-k", "4.00e-04", "2.00e-02", "yes"],
    ]
    assert dom.text(panel, "p.note.serve-limits-source") == (
        "Limits: bfloat16 unit roundoff, measured margins (engine/stages/serve/precision.py)."
    )
    tp = by_id(panel, f"{stem}-tp", "dl")
    assert [
        (label, fact(tp, label))
        for label in ("TP planned", "TP launched", "Compared with", "Greedy tokens")
    ] == [
        ("TP planned", "2"),
        ("TP launched", "2"),
        ("Compared with", "TP=1"),
        ("Greedy tokens", "match 160 tokens compared"),
    ]
    assert fact(tp, "First divergence") == "none"


def test_the_sweep_table_and_its_knee():
    job = serve_job(served())
    panel = article(rendered(job), job)
    stem = f"serve-job-{job.pk}"

    assert rows(by_id(panel, f"{stem}-sweep", "table")) == [
        ["1", "50 ms", "70 ms", "11 ms", "12 ms", "460 ms", "80.1", "2.5", "0 of 4"],
        ["2", "62 ms", "81 ms", "12 ms", "14 ms", "520 ms", "148", "4.6", "0 of 8"],
        ["4 (knee)", "81 ms", "110 ms", "18 ms", "21 ms", "710 ms", "210", "6.6", "0 of 16"],
        ["8", "160 ms", "240 ms", "34 ms", "41 ms", "1.38 s", "226", "7.1", "0 of 32"],
    ]
    assert '<tr data-concurrency="4" class="knee">' in panel
    assert by_id(panel, f"{stem}-knee", "p").text == (
        "Knee: concurrency 4, 210 tokens/s at a TPOT p50 of 18 ms (measured, engine, twin): "
        "from there, output tokens/s grew less than 10.0 % per doubling of the requests in "
        "flight, to every larger concurrency measured (+7.8% at the next doubling)."
    )
    assert dom.text(panel, "p.meta.serve-sweep-settings") == (
        "Each request 128 prompt tokens and 32 output tokens, concurrency up to 8, driven by "
        "vllm.benchmarks.serve (vLLM 0.32.0)."
    )


BEYOND_SWEEP = (
    ": the largest concurrency measured, as output tokens/s kept growing at least 10.0 % per "
    "doubling up to it; the knee lies beyond the sweep."
)


@pytest.mark.parametrize(
    ("knee", "words"),
    [
        ({"found": False, "reason": "beyond_sweep", "growth_threshold": 0.1}, BEYOND_SWEEP),
        (
            {"found": False, "reason": "one_level", "growth_threshold": 0.1},
            ": the only concurrency measured, so where more requests in flight stop paying is "
            "not known.",
        ),
        # Results stored before the codes were renamed.
        ({"reason": "largest_measured", "growth_threshold": 0.1}, BEYOND_SWEEP),
        (
            {"reason": "growth_below_threshold"},
            ": from there, output tokens/s grew less than the stage's threshold per doubling of "
            "the requests in flight, to every larger concurrency measured.",
        ),
        # A code the panel does not know reads by `found`, else says nothing.
        ({"found": False, "reason": "a_new_code", "growth_threshold": 0.1}, BEYOND_SWEEP),
        ({"reason": "a_code_the_panel_does_not_know"}, "."),
    ],
)
def test_the_knee_is_worded_by_its_rule_never_shown_as_a_code(knee, words):
    result = served()
    result["knee"] = {"concurrency": 4, "output_tokens_per_s": 210.0, "tpot_s_p50": 0.018} | knee
    job = serve_job(result)
    panel = article(rendered(job), job)

    assert by_id(panel, f"serve-job-{job.pk}-knee", "p").text == (
        "Knee: concurrency 4, 210 tokens/s at a TPOT p50 of 18 ms (measured, engine, twin)" + words
    )
    assert knee["reason"] not in panel


@pytest.mark.parametrize(
    ("phase", "words"),
    [
        ("checkpoint", "Failed while saving the twin's checkpoint"),
        ("launch", "Failed at launch"),
        ("precision", "Failed at the precision check"),
        ("tp", "Failed at the tensor-parallel check against TP=1"),
        ("sweep", "Failed during the load sweep"),
        ("metrics", "Failed reading the engine's metrics"),
        ("a_phase_the_panel_does_not_know", "Failed"),
    ],
)
def test_each_failure_phase_is_worded_never_shown_as_a_code(phase, words):
    result = copy.deepcopy(FAILED_AT_LAUNCH)
    result["failure"]["phase"] = phase
    job = serve_job(result, status="failed", error=f"serve: {phase} failed")
    panel = article(rendered(job), job)

    assert dom.text(panel, 'p[class="verdict"]') == words
    assert 'data-phase="a_phase' not in panel


def test_a_launch_failure_of_an_attached_endpoint_says_it_was_reaching_it():
    result = {
        "status": "failed",
        "mode": "attached",
        "engine": {"name": "openai", "version": "", "mode": "attached"},
        "passed": False,
        "failure": {
            "phase": "launch",
            "reason": "the endpoint http://team.example/ does not answer",
            "engine_lines": [],
            "culprit": "infrastructure",
        },
    }
    job = serve_job(result, status="failed")
    panel = article(rendered(job), job)

    assert dom.text(panel, 'p[class="verdict"]') == ("Failed at launch (reaching the endpoint)")


def test_a_precision_failure_names_the_first_divergence():
    result = served(passed=False)
    result["precision"] |= {
        "token_agreement": 0.9375,
        "max_abs_logprob_diff": 0.61,
        "first_divergence": {
            "prompt": 3,
            "position": 7,
            "engine_token": 1234,
            "reference_token": 5678,
            "margin": 0.9,
            "tie": False,
        },
        "passed": False,
    }
    result["status"] = "failed"
    result["failure"] = {
        "phase": "precision",
        "reason": "the engine's max |Δ logprob| 0.61 is above the bfloat16 limit 0.25",
        "engine_lines": [],
        "culprit": "release",
    }
    job = serve_job(result, status="failed", error="serve: precision failed")
    panel = article(rendered(job), job)
    stem = f"serve-job-{job.pk}"

    assert dom.text(panel, 'p[class="verdict"]') == ("Failed at the precision check")
    assert rows(by_id(panel, f"{stem}-precision", "table"))[:3] == [
        ["Token agreement", "93.8 %", "—", "—"],
        [
            "First divergence",
            "prompt 3, token 7 the engine chose token id 1,234, the reference 5,678",
            "—",
            "—",
        ],
        ["Max |Δ logprob|", "6.10e-01", "2.50e-01", "NO"],
    ]
    assert '<tr data-figure="max_abs_logprob_diff" class="crossed">' in panel
    assert by_id(panel, f"{stem}-precision-verdict", "p").text.startswith("Failed: ")
    assert "The figures below were measured before the failure." in panel


# --- failed, not configured ------------------------------------------------------------------


def test_a_launch_that_failed_shows_the_engines_lines_and_who_is_at_fault():
    result = copy.deepcopy(FAILED_AT_LAUNCH)
    result["failure"]["engine_lines"] = [*ENGINE_LINES, "<b id='injected'>not markup</b>"]
    job = serve_job(result, status="failed", error="serve: launch failed")
    panel = article(rendered(job), job)
    stem = f"serve-job-{job.pk}"

    assert "serve-failed" in panel
    assert dom.text(panel, 'p[class="verdict"]') == "Failed at launch"
    assert dom.text(panel, 'p[class="reason"]') == (
        "vllm exited with code 1 before answering /health"
    )
    culprit = dom.find(panel, 'p[class="serve-culprit"][data-culprit]')
    assert culprit["data-culprit"] == "release"
    assert culprit.text.startswith("The release is at fault:")
    assert pre(panel, f"{stem}-engine-lines") == "\n".join(
        [*ENGINE_LINES, "<b id='injected'>not markup</b>"]
    )
    assert "<b id='injected'>" not in panel  # escaped
    assert rows(by_id(panel, f"{stem}-command-diff", "table")) == [
        [
            "--model",
            "meta-llama/Llama-3.1-8B",
            "/var/day0/serve/job-7/ckpt",
            "the scaled twin's checkpoint folder",
        ]
    ]
    assert "The command that was launched" in dom.text(panel)
    assert fact(panel, "Load time (measured, engine, twin)").startswith("— ")
    # Nothing was measured: no sweep, no charts, no "measured before the failure".
    assert "serve-sweep" not in panel and "-chart" not in panel
    assert "measured before the failure" not in panel


def test_an_infrastructure_failure_says_the_release_was_not_judged():
    result = copy.deepcopy(FAILED_AT_LAUNCH)
    result["failure"] |= {"culprit": "infrastructure", "reason": "no free port on the worker"}
    job = serve_job(result, status="failed")
    panel = article(rendered(job), job)

    culprit = dom.find(panel, 'p[class="serve-culprit"][data-culprit]')
    assert culprit["data-culprit"] == "infrastructure"
    assert culprit.text.startswith("The infrastructure is at fault, not the release:")


def test_a_failed_run_without_a_result_shows_its_error():
    job = serve_job(None, status="failed", error="serve: the worker lost its engine environment")
    panel = article(rendered(job), job)

    assert "serve-failed" in panel
    assert dom.text(panel, 'p[class="reason"]') == ("serve: the worker lost its engine environment")
    assert "serve-culprit" not in panel and "serve-command" not in panel


def test_a_pool_without_an_engine_says_it_is_not_configured():
    job = serve_job(dict(NOT_CONFIGURED))
    panel = article(rendered(job), job)

    assert "serve-not-configured" in panel
    assert by_id(panel, f"serve-job-{job.pk}-verdict", "p").text == (
        "Not configured: pool h200x2 names no serving engine, so nothing was launched or "
        "measured. Set the pool's engine (kind vllm, sglang, or openai to attach to a "
        "running endpoint) in the admin."
    )
    assert "serve-command" not in panel and "<h4>" not in panel


def test_a_release_without_a_serve_run_says_not_run_yet():
    job = make_job(release=make_release(repo_id=REPO))
    html = rendered(job)
    assert "serve-panel" not in html
    assert "Not run yet: the serve stage launches" in dom.text(html)


# --- charts ----------------------------------------------------------------------------------


def test_the_sweep_chart_draws_the_engines_curves_beside_the_plans_prediction(llama_plan):
    job = serve_job(served(), plan=llama_plan)
    panel = article(rendered(job), job)
    sweep = figure(panel, f"serve-job-{job.pk}-sweep-figure")

    curve = llama_plan["predicted"]["decode_curve"]
    split = "TP{tp} PP{pp} EP{ep} DP{dp}".format(**llama_plan)
    names = [(t["name"], t.get("xaxis", "x"), t.get("yaxis", "y")) for t in sweep["data"]]
    assert names == [
        ("output tokens/s (measured, engine, twin)", "x", "y"),
        ("TPOT p50 (measured, engine, twin)", "x2", "y2"),
        ("knee at concurrency 4 (measured, engine, twin)", "x", "y"),
        ("knee at concurrency 4 (measured, engine, twin)", "x2", "y2"),
        (f"decode tokens/s (predicted, full-size, {split})", "x3", "y3"),
        (f"TPOT (predicted, full-size, {split})", "x4", "y4"),
    ]
    measured, tpot, _, _, predicted, predicted_tpot = sweep["data"]
    assert measured["x"] == [1, 2, 4, 8]
    assert measured["y"] == [80.1, 148.3, 210.0, 226.4]
    assert tpot["y"] == pytest.approx([11.0, 12.0, 18.0, 34.0])
    assert predicted["x"] == [p["concurrent_sequences"] for p in curve]
    assert predicted["y"] == pytest.approx([p["decode_tokens_per_s"] for p in curve])
    assert predicted_tpot["y"] == pytest.approx([p["tpot_s"] * 1000 for p in curve])
    assert {t["meta"]["kind"] for t in sweep["data"][:4]} == {"measured"}
    assert {t["meta"]["kind"] for t in sweep["data"][4:]} == {"predicted"}
    titles = [a["text"] for a in sweep["layout"]["annotations"]]
    assert titles == [
        "Output tokens/s (measured, engine, twin)",
        "TPOT p50 (measured, engine, twin)",
        f"Decode tokens/s (predicted, full-size, {split})",
        f"TPOT (predicted, full-size, {split})",
    ]


def test_without_a_plan_prediction_the_sweep_chart_has_the_measured_panels_only():
    job = serve_job(served())
    panel = article(rendered(job), job)
    sweep = figure(panel, f"serve-job-{job.pk}-sweep-figure")
    assert {t["meta"]["kind"] for t in sweep["data"]} == {"measured"}
    assert len(sweep["layout"]["annotations"]) == 2


def test_the_metrics_chart_draws_kv_usage_in_percent_and_the_requests():
    job = serve_job(served())
    panel = article(rendered(job), job)
    metrics = figure(panel, f"serve-job-{job.pk}-metrics-figure")

    kv, running, waiting = metrics["data"]
    assert kv["name"] == "KV-cache usage (measured, engine, twin)"
    assert running["name"] == "running requests (measured, engine, twin)"
    assert waiting["name"] == "waiting requests (measured, engine, twin)"
    series = SERVED["metrics"]["series"]
    assert kv["x"] == [s["t_s"] for s in series]
    assert kv["y"] == pytest.approx([s["kv_cache_usage"] * 100 for s in series])
    assert kv["y"][-1] == pytest.approx(62.0)
    assert running["yaxis"] == waiting["yaxis"] == "y2"
    assert running["y"] == [s["running"] for s in series]
    assert metrics["layout"]["yaxis"]["rangemode"] == "tozero"  # auto-ranged: a twin uses <1 %


def test_charts_are_skipped_without_their_figures():
    assert serve_charts.sweep([], knee=None, predicted=[], checkpoint_kind="twin") is None
    assert serve_charts.engine_metrics([MetricsSample(t_s=0.0)], checkpoint_kind="twin") is None


def test_a_run_the_worker_refused_shows_only_its_failure():
    """docs/stages/serve.md: a run refused before the stage starts holds only its status,
    `passed` and `failure`."""
    result = {
        "status": "failed",
        "passed": False,
        "failure": {
            "phase": "launch",
            "reason": "the endpoint 10.0.0.5 is a private address",
            "engine_lines": [],
            "culprit": "infrastructure",
        },
    }
    job = serve_job(result, status="failed", error="the endpoint 10.0.0.5 is a private address")
    panel = article(rendered(job), job)

    assert dom.text(panel, 'p[class="verdict"]') == "Failed at launch"
    assert 'data-culprit="infrastructure"' in panel
    assert "serve-command" not in panel and "serve-facts" not in panel and "<h4>" not in panel
    assert "serve-engine-lines" not in panel
