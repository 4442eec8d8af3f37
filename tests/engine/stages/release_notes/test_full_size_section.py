"""The release notes' full-size figures: `engine/stages/release_notes/full_size.py` builds the
section from the serve stage's full-size run and the plan's prediction,
`templates/release_notes/full_size.md` words it, after the serving engine's section. Results
shaped as docs/stages/serve.md gives them (tests/serve_results.py `FULL_SIZE`)."""

from __future__ import annotations

import json

import pytest
from django.template import engines

from adaptation.services.release_notes import release_notes_markdown
from engine.architecture import analyze_config
from engine.contract import PoolSpec, ReleaseRef
from engine.notes import MEASURED_ENGINE_FULL, PREDICTED_FULL, StageState
from engine.registry import STAGES
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from engine.stages.release_notes.full_size import full_size_section
from engine.stages.release_notes.run import build_release_notes
from tests.serve_results import (
    FULL_SIZE_TP2,
    PREDICTED_BEFORE,
    PREDICTED_PREFILL_HEAVY,
    full_size,
    served,
)

REPO = "meta-llama/Llama-3.1-8B"


@pytest.fixture(scope="module")
def llama_plan() -> dict:
    """The plan of Llama-3.1-8B on two H200s, as the plan stage stores it."""
    from tests.conftest import load_realconfig

    analysis = analyze_config(load_realconfig("meta-llama__Llama-3.1-8B")).to_dict()
    return plan_release(analysis, PoolLayout("h200", 2), release=REPO).to_dict()


def states(serve_result: dict | None, plan: dict | None) -> dict[str, StageState]:
    return {
        "plan": StageState("plan", "succeeded" if plan else "not run", plan),
        "serve": StageState("serve", "succeeded" if serve_result else "not run", serve_result),
    }


def markdown(section: dict) -> str:
    template = engines["markdown"].get_template("release_notes/full_size.md")
    return template.render({"section": section}).strip() + "\n"


def test_the_section_keeps_each_level_beside_its_prediction_as_json(llama_plan):
    section = full_size_section(states(served(full_size=full_size()), llama_plan))
    assert json.loads(json.dumps(section)) == section  # stored as JSON
    assert section["status"] == "measured" and section["label"] == MEASURED_ENGINE_FULL
    assert section["tp"] == 2 and section["load_format"] == "dummy"
    primary = section["workloads"][0]
    assert (primary["input_tokens"], primary["output_tokens"]) == (1000, 1000)
    assert [level["output_tokens_per_s"] for level in primary["levels"]] == [
        tokens for _, tokens, *_ in FULL_SIZE_TP2
    ]
    assert [level["predicted_output_tokens_per_s"] for level in primary["levels"]] == [
        tokens for _, tokens, *_ in PREDICTED_BEFORE
    ]
    assert primary["predicted"]["label"] == PREDICTED_FULL
    assert primary["predicted"]["made"] == "before"
    assert primary["predicted"]["fit"]["basis"] == "published"
    assert primary["predicted"]["split"] == "TP2 PP1 EP1 DP1"
    # the prefill-heavy pair beside the prediction kept for its own lengths; the decode-heavy
    # pair had none kept, and the plan predicted other lengths
    prefill = section["workloads"][1]
    assert [level["predicted_output_tokens_per_s"] for level in prefill["levels"]] == [
        tokens for _, tokens, *_ in PREDICTED_PREFILL_HEAVY
    ]
    assert section["workloads"][2]["predicted"] is None
    best = llama_plan["predicted"]["workload"]["max_load"]
    assert section["predicted"]["output_tokens_per_s"] == best["output_tokens_per_s"]
    assert section["predicted"]["concurrency"] == best["concurrency"]


def test_the_notes_give_the_full_size_figures_with_their_labels(llama_plan):
    text = markdown(full_size_section(states(served(full_size=full_size()), llama_plan)))
    assert text.startswith("## Full size: measured on the engine and predicted\n\n")
    assert (
        "Measured on `vllm` `0.32.0` serving the full-size model (`LlamaForCausalLM`, 32 layers, "
        "hidden size 4,096, 8.03 B parameters) with dummy weights (`--load-format dummy`: random "
        "weights from its config, nothing downloaded) at TP=2 in `bfloat16`, ready in 41.7 s. "
        "These figures are **measured (engine, full size, dummy weights)**" in text
    )
    assert "Dummy weights say nothing about precision" in text
    assert "### Primary workload: 1,000 + 1,000 tokens a request, TP=2\n" in text
    assert (
        "| Concurrency | Output tokens/s | TTFT p50 | TPOT p50 | Predicted output tokens/s | "
        "Predicted TTFT | Predicted TPOT |\n|---|---|---|---|---|---|---|\n"
        "| 1 | 161 | 31 ms | 6.2 ms | 150 | 28 ms | 6.6 ms |\n" in text
    )
    assert (
        "Predicted columns: **predicted (full-size)**, fit h200 x vllm, 8 points, x1.26 (published "
        "serving results), made before the measurement at TP2 PP1 EP1 DP1." in text
    )
    assert "### Prefill-heavy workload: 2,048 + 128 tokens a request, TP=2\n" in text
    assert "| 2 | 180 | 70 ms | 6.6 ms | 170 | 81 ms | 7 ms |\n" in text
    assert "The plan made no prediction for these lengths. The sweep stopped early" in text
    assert "The sweep stopped early: time budget." in text
    assert "| 2 | 4 | 590 | x1.46 over TP=1 | 73.1 % |" in text
    assert "The plan's own workload, **predicted (full-size)**: " in text


def test_a_skipped_run_says_why_and_the_prediction_stays(llama_plan):
    skipped = {
        "status": "skipped",
        "reason": "too_few_devices",
        "load_format": "dummy",
        "devices_needed": 8,
        "devices_held": 2,
    }
    text = markdown(full_size_section(states(served(full_size=skipped), llama_plan)))
    assert (
        "Not measured at full size on the engine: the plan's split needs 8 devices and the "
        "worker holds 2." in text
    )
    assert "Dummy weights" not in text and "| Concurrency |" not in text
    assert "The plan's own workload, **predicted (full-size)**" in text


def test_a_prediction_the_serve_stage_could_not_make_says_why(llama_plan):
    reason = "TP2 PP1 EP1 DP1 runs on more devices than the pool's layout counts (1)"
    result = full_size(predicted_before={"available": False, "reason": reason})
    text = markdown(full_size_section(states(served(full_size=result), llama_plan)))
    # the primary workload keeps the plan's own curve for its lengths; the pairs say why
    assert "the plan's curve for the same lengths." in text
    assert (
        "No prediction was made for it before the measurement: TP2 PP1 EP1 DP1 runs on more "
        "devices than the pool's layout counts (1)." in text
    )


def test_no_run_and_no_prediction_makes_no_section():
    assert full_size_section(states(served(), None)) is None


def test_the_document_puts_the_figures_after_the_serving_engine_and_retires_never_measured(
    llama_plan,
):
    notes = build_release_notes(
        release=ReleaseRef("huggingface", "https://huggingface.co", REPO, "r"),
        pool=PoolSpec(name="h200x2", backend="cuda", queue="pool.h200x2"),
        results={"plan": llama_plan, "serve": served(full_size=full_size())},
        stages=STAGES,
    )
    document = release_notes_markdown(notes)
    serving = document.index("## Serving engine")
    figures = document.index("## Full size: measured on the engine and predicted")
    assert serving < figures < document.index("## What was not validated")
    assert document.count("## Full size: measured on the engine and predicted") == 1
    assert "- Full-size speed was measured on the engine with dummy weights only" in document
    assert (
        "Full-size speed is predicted by the plan's step-time model, never measured here."
        not in (document)
    )


def test_without_a_measurement_full_size_speed_is_said_to_be_the_plans_prediction():
    template = engines["markdown"].get_template("release_notes/not_validated.md")
    item = {"kind": "full_size_speed", "predicted": True, "measured_on_engine": False}
    lines = template.render({"section": [item]}).splitlines()
    assert lines[-1] == (
        "- Full-size speed is predicted by the plan's step-time model, never measured here."
    )
