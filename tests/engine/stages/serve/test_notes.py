"""The serving engine's section of the release notes: `engine/stages/serve/notes.py` builds a
`ServeSection` from the stage's state, `templates/release_notes/sections/serve.md` words it.
Results shaped as docs/stages/serve.md gives them (tests/serve_results.py)."""

from __future__ import annotations

import copy
import dataclasses
import json

from django.template import engines

from engine.contract import PoolSpec, ReleaseRef
from engine.notes import NotesContext, StageState
from engine.stages.serve.notes import ServeSection, section
from tests.serve_results import (
    ENGINE_LINES,
    FAILED_AT_LAUNCH,
    LAUNCHED_COMMAND,
    NOT_CONFIGURED,
    served,
)

NOTES = NotesContext(
    release=ReleaseRef("huggingface", "https://huggingface.co", "meta-llama/Llama-3.1-8B", "r"),
    pool=PoolSpec(name="h200x2", backend="cuda", queue="pool.h200x2"),
)

# The contract the section template is written against (its comment says the same).
CONTRACT = {
    "status",
    "engine_name",
    "engine_version",
    "launched_command",
    "command_diff",
    "load_s",
    "peak_memory_bytes",
    "checkpoint_kind",
    "precision_passed",
    "token_agreement",
    "max_abs_logprob_diff",
    "kl_top_k",
    "dtype",
    "first_divergence",
    "knee_concurrency",
    "knee_output_tokens_per_s",
    "knee_tpot_s",
    "tp_planned",
    "tp_greedy_match",
    "failure_phase",
    "failure_reason",
    "engine_lines",
    "culprit",
}


def build(status: str, result: dict | None, reason: str = "") -> dict:
    return section(StageState("serve", status, result, reason), NOTES)


def markdown(data: dict) -> str:
    template = engines["markdown"].get_template("release_notes/sections/serve.md")
    return template.render({"section": data}).strip() + "\n"


def test_the_section_is_the_contracts_fields_as_json():
    assert {f.name for f in dataclasses.fields(ServeSection)} == CONTRACT
    data = build("succeeded", served())
    assert set(data) == CONTRACT
    assert json.loads(json.dumps(data)) == data  # stored as JSON by the release_notes stage
    assert data["status"] == "served"
    assert data["launched_command"] == LAUNCHED_COMMAND
    assert data["load_s"] == 84.2
    assert data["peak_memory_bytes"] == 2900000000
    assert data["token_agreement"] == 1.0
    assert data["knee_concurrency"] == 4
    assert data["tp_planned"] == 2 and data["tp_greedy_match"] is True
    assert data["failure_phase"] is None and data["engine_lines"] == []


def test_a_served_run_gives_the_command_load_time_precision_and_knee():
    assert markdown(build("succeeded", served())) == (
        "## Serving engine\n"
        "\n"
        "**Served** by `vllm` `0.32.0` from the plan's own command, on the scaled twin saved as "
        "a checkpoint; every figure below is measured (twin), through the engine.\n"
        "\n"
        "The command that served:\n"
        "\n"
        "```sh\n"
        f"{LAUNCHED_COMMAND}\n"
        "```\n"
        "\n"
        "Changed from the plan's command:\n"
        "\n"
        "| Flag | Planned | Launched | Why |\n"
        "|---|---|---|---|\n"
        "| `--model` | `meta-llama/Llama-3.1-8B` | `/var/day0/serve/job-7/ckpt` "
        "| the scaled twin's checkpoint folder |\n"
        "| `--max-model-len` | `32768` | `2048` | the twin's max_position_embeddings |\n"
        "| `--gpu-memory-utilization` | not set | `0.1` | the pool's memory_fraction |\n"
        "\n"
        "| Figure | Value |\n"
        "|---|---|\n"
        "| Load time | 84.2 s |\n"
        "| Peak memory | 2.7 GiB |\n"
        "| Precision through the engine (`bfloat16`) | passed: token agreement 100.0 %, "
        "max \\|Δ logprob\\| 1.20e-02, KL over the top-k 4.00e-04; first divergence: none |\n"
        "| Load sweep's knee | concurrency 4: 210 tokens/s output, TPOT p50 18 ms |\n"
        "| Tensor parallel | TP=2 against TP=1: greedy tokens match |\n"
    )


def test_real_weights_are_labelled_measured_at_full_size():
    result = served()
    result["checkpoint"] = {**result["checkpoint"], "kind": "real"}
    text = markdown(build("succeeded", result))
    assert (
        "on the release's real weights; every figure below is measured (full-size, real "
        "weights), through the engine." in text
    )


def test_a_launch_failure_says_what_failed_with_the_engines_lines():
    text = markdown(build("failed", copy.deepcopy(FAILED_AT_LAUNCH), "serve: launch failed"))
    assert text == (
        "## Serving engine\n"
        "\n"
        "**Failed** at launch: vllm exited with code 1 before answering /health. The release "
        "is at fault, not the pool or its engine.\n"
        "\n"
        "The engine's own error lines:\n"
        "\n"
        "```\n" + "\n".join(ENGINE_LINES) + "\n```\n"
        "\n"
        "The command that was launched:\n"
        "\n"
        "```sh\n"
        f"{LAUNCHED_COMMAND}\n"
        "```\n"
        "\n"
        "Changed from the plan's command:\n"
        "\n"
        "| Flag | Planned | Launched | Why |\n"
        "|---|---|---|---|\n"
        "| `--model` | `meta-llama/Llama-3.1-8B` | `/var/day0/serve/job-7/ckpt` "
        "| the scaled twin's checkpoint folder |\n"
    )


def test_engine_lines_with_backticks_keep_their_code_block_closed():
    result = copy.deepcopy(FAILED_AT_LAUNCH)
    result["failure"] |= {"culprit": "infrastructure", "engine_lines": ["bad ``` fence", "x"]}
    text = markdown(build("failed", result))
    assert "not the release: the release was not judged." in text
    assert "````\nbad ``` fence\nx\n````\n" in text


def test_a_precision_failure_names_the_first_divergence():
    result = served(status="failed", passed=False)
    result["precision"] |= {
        "passed": False,
        "token_agreement": 0.9375,
        "first_divergence": {"prompt": 3, "position": 7, "engine_token": 1, "reference_token": 2},
    }
    result["failure"] = {
        "phase": "precision",
        "reason": "max |Δ logprob| 0.61 above the limit 0.25.",
        "engine_lines": [],
        "culprit": "release",
    }
    data = build("failed", result)
    assert data["first_divergence"] == {"prompt": 3, "position": 7}
    text = markdown(data)
    assert text.startswith(
        "## Serving engine\n\n**Failed** at the precision check: max \\|Δ logprob\\| 0.61 above "
        "the limit 0.25. The release is at fault, not the pool or its engine.\n"
    )
    assert (
        "| Precision through the engine (`bfloat16`) | **failed**: token agreement 93.8 %, "
        "max \\|Δ logprob\\| 1.20e-02, KL over the top-k 4.00e-04; first divergence: prompt 3, "
        "token 7 |\n" in text
    )


def test_not_configured_and_not_run():
    assert markdown(build("succeeded", dict(NOT_CONFIGURED))) == (
        "## Serving engine\n\n"
        "Not configured: the pool names no serving engine, so no engine was launched or "
        "measured.\n"
    )
    assert markdown(build("skipped", None)) == (
        "## Serving engine\n\nNot run: the serve stage skipped.\n"
    )
    assert markdown(build("not run", None)) == (
        "## Serving engine\n\nNot run: this job has no serve stage.\n"
    )


def test_a_failed_run_without_a_result_gives_its_reason():
    data = build("failed", None, "serve: the worker lost its engine environment\nTraceback ...")
    assert data["status"] == "failed"
    assert data["failure_reason"] == "serve: the worker lost its engine environment"
    assert markdown(data) == (
        "## Serving engine\n\n**Failed**: serve: the worker lost its engine environment.\n"
    )
