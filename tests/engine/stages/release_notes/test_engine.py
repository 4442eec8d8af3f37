"""The notes engine (`engine.stages.release_notes.run`, with each stage's `notes` section) on
gpt-oss-20b's real analysis and plan, and the document the app writes from it
(`release_notes_markdown`, the templates): the plan's launch commands and the measured knee
are in the notes, each figure labelled measured on the twin or predicted at full size;
precision per dtype; limitations by severity; what was not validated; a plan that fits
nothing. No database."""

from __future__ import annotations

import json
import subprocess
import sys

from adaptation.services.release_notes import release_notes_markdown, release_notes_summary
from engine.contract import PoolSpec, ReleaseRef, StageContext
from engine.markdown import code, first_line, text
from engine.notes import MEASURED_TWIN, PREDICTED_FULL
from engine.registry import STAGES
from engine.stages.release_notes.run import build_release_notes, run
from tests.release_notes_results import (
    KNEE_BATCH,
    MEASURED_TOKENS_PER_S,
    REPO_ID,
    analysis,
    failed_plan,
    full_results,
    performance,
    plan,
    precision,
    stability,
)

RELEASE = ReleaseRef(
    hub_kind="huggingface",
    hub_endpoint="https://huggingface.co",
    repo_id=REPO_ID,
    revision="6cee5e81ee83917806bbde320786a8fb61efebee",
)
H200 = PoolSpec(
    name="h200x8",
    backend="cuda",
    queue="pool.h200x8",
    device="cuda:0",
    accelerator="h200",
    devices_per_node=8,
)


def notes_for(results=None, **kwargs):
    """The engine's notes for `results` (default: every stage passing), with the document
    and the one-line summary the app writes from them under "markdown" and "summary"."""
    notes = build_release_notes(
        release=RELEASE,
        pool=H200,
        results=full_results() if results is None else results,
        stages=STAGES,
        **kwargs,
    )
    json.dumps(notes, allow_nan=False)  # stored as JSON: no NaN, no Infinity
    return notes | {
        "markdown": release_notes_markdown(notes),
        "summary": release_notes_summary(notes),
    }


def section(markdown: str, title: str) -> str:
    """The text of the `## title` section (up to the next `## `)."""
    start = markdown.index(f"\n## {title}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end != -1 else None]


def not_validated_lines(markdown: str) -> list[str]:
    """The items of the document's "What was not validated" as written, one line each
    without its "- " (the engine stores them as values: `sections["not_validated"]`)."""
    text = section(markdown, "What was not validated")
    return [line[2:] for line in text.splitlines() if line.startswith("- ")]


def test_the_notes_carry_the_plans_launch_commands_and_the_measured_knee():
    results = full_results()
    notes = notes_for(results)
    markdown = notes["markdown"]
    artifacts = results["plan"]["artifacts"]
    # The commands as the plan wrote them, each in its own code block.
    assert f"```sh\n{artifacts['vllm']}\n```" in markdown
    assert f"```sh\n{artifacts['sglang']}\n```" in markdown
    assert "--max-num-seqs 148" in artifacts["vllm"]  # what the plan sized: 148 sequences
    config = notes["sections"]["configuration"]
    assert config["split"] == {"tp": 1, "pp": 1, "ep": 1, "dp": 1}
    assert (config["devices"], config["context_tokens"], config["concurrency"]) == (1, 32768, 4)
    assert config["max_concurrency"] == 148
    assert config["dtype_label"] == "checkpoint (mxfp4)"
    configuration = section(markdown, "Configuration")
    assert "| Recommended pool | `h200x8`: NVIDIA H200 SXM 141GB" in configuration
    assert "| Parallel split | TP1 PP1 EP1 DP1 on 1 device" in configuration
    assert "| Context | 32,768 tokens per sequence |" in configuration
    max_concurrency = "| Max concurrency | 148 sequences at 32,768 tokens each (sized for 4) |"
    assert max_concurrency in configuration

    # The knee the performance stage found on the twin: batch 4, where tokens/s stop growing.
    perf = notes["sections"]["performance"]
    knee_tpot = KNEE_BATCH / MEASURED_TOKENS_PER_S[KNEE_BATCH]
    assert perf["knee_batch_size"] == KNEE_BATCH == results["performance"]["knee_batch_size"]
    assert perf["measured"]["label"] == MEASURED_TWIN
    assert perf["measured"]["tpot_s"] == knee_tpot
    recommendations = section(markdown, "Performance recommendations")
    assert f"Recommended batch size: **{KNEE_BATCH}** sequences, the knee" in recommendations
    assert "| **measured (twin)** | 4 | 12.1 ms | 330 |" in recommendations


def test_measured_and_predicted_figures_are_labelled_and_come_from_their_stages():
    results = full_results()
    perf = notes_for(results)["sections"]["performance"]
    predicted = perf["predicted"]
    # The plan's step-time model for the full model at the knee's batch (4 sequences).
    [curve_point] = [
        p
        for p in results["plan"]["predicted"]["decode_curve"]
        if p["concurrent_sequences"] == KNEE_BATCH
    ]
    assert predicted["label"] == PREDICTED_FULL
    assert predicted["batch_size"] == KNEE_BATCH
    assert predicted["tpot_s"] == curve_point["tpot_s"]
    assert predicted["decode_tokens_per_s"] == curve_point["decode_tokens_per_s"]
    # each sequence's KV cache read at the workload's average context: input + half the output
    workload = results["plan"]["predicted"]["workload"]
    average = workload["input_tokens"] + workload["output_tokens"] / 2
    assert predicted["accelerator"] == "h200" and predicted["context_tokens"] == average
    markdown = notes_for(results)["markdown"]
    row = next(
        line for line in markdown.splitlines() if line.startswith("| **predicted (full-size)")
    )
    assert f"{curve_point['tpot_s'] * 1000:.3g} ms" in row and "step-time model on h200" in row
    largest = results["plan"]["predicted"]["largest_batch"]
    assert perf["largest_batch"]["concurrent_sequences"] == largest["concurrent_sequences"] == 148
    assert "Largest batch that fits, predicted (full-size): 148 sequences" in markdown


def test_without_a_performance_run_the_prediction_comes_from_the_plan():
    results = full_results()
    results["performance"] = performance(None)  # a run that carried no predictions
    perf = notes_for(results)["sections"]["performance"]
    assert perf["predicted"]["tpot_s"] == results["plan"]["predicted"]["decode_curve"][2]["tpot_s"]


def test_sweeps_stopped_early_and_a_missing_knee_are_values_the_template_words():
    results = full_results()
    results["performance"]["stopped"] = [
        {"dtype": "bfloat16", "prompt_len": 128, "batch_size": 8, "reason": "OOM: *x*\nmore"}
    ]
    notes = notes_for(results)
    assert notes["sections"]["performance"]["stopped"] == [
        {"dtype": "bfloat16", "prompt_len": 128, "batch_size": 8, "reason": "OOM: *x*"}
    ]
    assert "- bfloat16 prompt 128: stopped at batch 8 (OOM: \\*x\\*)\n" in notes["markdown"]

    results["performance"]["knee"] = None
    notes = notes_for(results)
    assert notes["sections"]["performance"] == {
        "available": False,
        "status": "succeeded",
        "reason": "",
        "no_knee": True,
    }
    assert (
        "No recommendation: the performance stage succeeded: no knee was found on the "
        "measured points." in notes["markdown"]
    )


def test_without_a_prediction_the_notes_give_the_stages_reason_or_say_there_is_none():
    results = full_results()
    results["performance"]["points"] = [
        p for p in results["performance"]["points"] if p["kind"] != "predicted"
    ]
    results["plan"]["predicted"] = {"kind": "predicted", "available": False}
    results["performance"]["predicted"] = {"available": False, "reason": "no <roofline>"}
    notes = notes_for(results)
    assert notes["sections"]["performance"]["predicted_reason"] == "no <roofline>"
    assert "No full-size prediction: no \\<roofline\\>." in notes["markdown"]
    results["performance"]["predicted"] = {"available": False}
    notes = notes_for(results)
    assert notes["sections"]["performance"]["predicted_reason"] == ""
    assert "No full-size prediction: the plan made no full-size prediction." in notes["markdown"]


def test_the_precision_summary_gives_each_dtypes_verdict_agreement_and_error():
    results = full_results()
    results["precision"] = precision(float16_passes=False)
    notes = notes_for(results, states=_states(results, failed={"precision": results["precision"]}))
    rows = {row["dtype"]: row for row in notes["sections"]["precision"]["dtypes"]}
    assert rows["bfloat16"]["passed"] and rows["bfloat16"]["top1_agreement"] == 1.0
    assert not rows["float16"]["passed"] and rows["float16"]["max_abs_error"] == 3.75
    table = section(notes["markdown"], "Precision")
    assert "| `bfloat16` | passed | 100.0 % | 0.0312 | 0.99991 | 2.5e-05 |" in table
    assert "| `float16` | **failed** | 81.2 % | 3.75 | 0.97 | 0.03 |" in table
    assert "first divergent layer 2 (mlp)" in table
    not_validated = not_validated_lines(notes["markdown"])
    assert "`precision`: failed: float16: top-1 agreement 0.8125 under 0.9." in not_validated[0]
    assert any("Precision in `int8` was not checked" in item for item in not_validated)


def _states(results, *, failed=None, skipped=(), missing=()):
    """Every stage's state as `release_notes_regenerate` passes them."""
    failed = failed or {}
    states = {}
    for name in results:
        if name in missing:
            continue
        if name in failed:
            states[name] = {"status": "failed", "error": failed[name].get("reason", "it failed")}
            states[name]["result"] = failed[name]
            if name == "precision":
                states[name]["error"] = "float16: top-1 agreement 0.8125 under 0.9"
        elif name in skipped:
            states[name] = {"status": "skipped", "error": "", "result": None}
        else:
            states[name] = {"status": "succeeded", "error": "", "result": None}
    return states


def test_the_stability_verdict_and_a_failed_run_with_its_reason():
    notes = notes_for()
    assert notes["sections"]["stability"]["verdict"] == "passed"
    assert "**Passed**: within every threshold." in notes["markdown"]
    results = full_results()
    leak = stability(passed=False)
    notes = notes_for(
        {k: v for k, v in results.items() if k != "stability"},
        states=_states(results, failed={"stability": leak}),
    )
    assert notes["sections"]["stability"]["verdict"] == "failed"
    assert "**Failed**: memory leak: slope 9,000 bytes/step over the threshold" in notes["markdown"]


def test_limitations_are_listed_by_severity_with_their_scope_and_markdown_body():
    limitations = [
        {"title": "Sliding window", "body": "", "severity": "minor", "stage": "", "pool": None},
        {
            "title": "No MXFP4 <script>alert(1)</script> kernel",
            "body": "Serve in **bf16**:\n\n```sh\nvllm serve --dtype bfloat16\n```",
            "severity": "blocker",
            "stage": "operators",
            "pool": "h200x8",
        },
        {"title": "Long prompts", "body": "Cap at 32k.", "severity": "major", "stage": "plan"},
    ]
    notes = notes_for(limitations=limitations)
    assert [item["severity"] for item in notes["sections"]["limitations"]] == [
        "blocker",
        "major",
        "minor",
    ]
    known = section(notes["markdown"], "Known limitations")
    assert known.index("### Blocker") < known.index("### Major") < known.index("### Minor")
    escaped = "No MXFP4 \\<script\\>alert(1)\\</script\\> kernel"
    assert f"- **{escaped}** (pool h200x8; raised by `operators`)" in known
    assert "  ```sh\n  vllm serve --dtype bfloat16\n  ```" in known  # the body inside its item
    assert "- **Sliding window** (every pool; added by a person)" in known
    assert "No open known limitation." in notes_for()["markdown"]


def test_what_was_not_validated_names_the_twin_one_device_and_short_prompts():
    items = not_validated_lines(notes_for()["markdown"])
    assert items[0].startswith(
        "The full-size weights were never run: `operators`, `precision`, `distributed`, "
        "`performance`, `stability` ran a scaled twin"
    )
    assert "(2.3 M parameters, seeded weights)" in items[0]
    # the plan serves on one device; the distributed stage ran its next point, TP=2
    assert (
        "Serving on more than one device was validated on the twin only (TP=2 across 2 "
        "`nccl` processes)." in items
    )
    dtype = "serving dtype checkpoint (mxfp4) was not checked by `precision`"
    assert any(dtype in i for i in items)
    assert any("the planned context of 32,768 tokens was not exercised" in i for i in items)
    assert any(i.startswith("Stability ran for 20.0 s on the twin") for i in items)


def test_what_was_not_validated_is_stored_as_values_the_template_words():
    notes = notes_for()
    items = notes["sections"]["not_validated"]
    assert [item["kind"] for item in items] == [
        "twin",
        "multi_device",
        "serving_dtype",
        "full_size_speed",
        "context",
        "skipped_dtype",
        "stability_duration",
    ]
    assert items[1] == {
        "kind": "multi_device",
        "outcome": "passed",
        "devices": 1,
        "plan_split": {"tp": 1, "pp": 1, "ep": 1, "dp": 1},
        "split": notes["sections"]["distributed"]["split"],
        "reason": "",
    }
    assert items[4] == {"kind": "context", "prompt_tokens": 128, "context_tokens": 32768}
    assert "`" not in json.dumps(items)  # no Markdown: the template writes each sentence
    assert len(not_validated_lines(notes["markdown"])) == len(items)


def test_a_multi_device_plan_is_not_validated_on_many_devices():
    name = "deepseek-ai__DeepSeek-V3"
    results = full_results(plan(name))
    results["analyze"] = analysis(name)
    notes = notes_for(results)
    assert notes["sections"]["configuration"]["split"] == {"tp": 1, "pp": 1, "ep": 8, "dp": 8}
    assert (
        "Multi-device serving was validated on the twin only (TP=2 across 2 `nccl` "
        "processes); the plan's split TP1 PP1 EP8 DP8 on 8 devices was not run at "
        "full size, its communication and scaling are predicted only."
    ) in not_validated_lines(notes["markdown"])

    del results["distributed"]  # a job without the distributed stage
    assert any(
        i.startswith("Multi-device serving was not run: the split TP1 PP1 EP8 DP8 on 8")
        for i in not_validated_lines(notes_for(results)["markdown"])
    )


def test_a_plan_that_fits_nothing_says_why_and_what_would_fit():
    """Notes written for a job that failed at `plan` (`release_notes_regenerate`)."""
    name = "moonshotai__Kimi-K2-Instruct"
    error, kept = failed_plan(name)
    results = {"fetch": {}, "analyze": analysis(name)}
    states = {
        "fetch": {"status": "succeeded"},
        "analyze": {"status": "succeeded"},
        "operators": {"status": "succeeded"},
        "precision": {"status": "succeeded"},
        "plan": {"status": "failed", "error": error, "result": kept, "failure_class": "release"},
        "distributed": {"status": "skipped", "error": ""},
        "serve": {"status": "skipped", "error": ""},
        "performance": {"status": "skipped", "error": ""},
        "stability": {"status": "skipped", "error": ""},
    }
    results |= {"operators": full_results()["operators"], "precision": precision()}
    notes = notes_for(results, states=states)
    config = notes["sections"]["configuration"]
    assert config["available"] is False and config["suggestions"]["devices"] > 1
    configuration = section(notes["markdown"], "Configuration")
    assert "No serving configuration: the plan stage failed: " in configuration
    assert f"- {kept['suggestions']['devices']:,} devices" in configuration
    assert "No recommendation: the performance stage skipped." in notes["markdown"]
    assert "Not run: the distributed stage skipped.\n" in notes["markdown"]
    items = not_validated_lines(notes["markdown"])
    assert items[:5] == [
        f"`plan`: failed: {text(first_line(error))}.",
        "`distributed`: skipped.",
        "`serve`: skipped.",
        "`performance`: skipped.",
        "`stability`: skipped.",
    ]
    assert notes["summary"].startswith("blocked at plan (release); no fitting plan")
    assert notes["sections"]["blocked"] == {
        "stage": "plan",
        "failure_class": "release",
        "reason": first_line(error),
        "skipped": ["distributed", "serve", "performance", "stability"],
    }
    blocked = section("\n" + notes["markdown"], "What blocked this release")
    assert f"The `plan` stage failed: {text(first_line(error)).rstrip('.:; ')}." in blocked
    assert "This is a release failure" in blocked
    assert "The later stages did not run: `distributed`, `serve`" in blocked
    assert notes["markdown"].startswith("## What blocked this release")


def test_a_stage_the_job_does_not_run_is_listed_as_not_run():
    results = full_results()
    del results["operators"], results["stability"], results["distributed"]
    items = not_validated_lines(notes_for(results)["markdown"])
    assert "`operators`: not run in this job." in items
    assert "`distributed`: not run in this job." in items
    assert "`stability`: not run in this job." in items


def test_the_stage_reads_its_context():
    lines = []
    ctx = StageContext(
        release=RELEASE,
        pool=H200,
        previous=full_results(),
        limitations=({"title": "T", "body": "", "severity": "info", "stage": "", "pool": None},),
        stages=STAGES,
        log=lines.append,
    )
    result = run(ctx)
    assert result["sections"]["limitations"][0]["title"] == "T"
    markdown = release_notes_markdown(result)
    assert markdown.startswith(f"# Release notes: {REPO_ID} on pool h200x8\n")
    assert lines == ["release notes: 8 sections, 7 items not validated, 1 open limitation"]
    # The summary as values; the app writes its line (templates/release_notes/summary.txt).
    assert "summary" not in result
    assert result["sections"]["summary"] == {
        "plan": {
            "split": {"tp": 1, "pp": 1, "ep": 1, "dp": 1},
            "devices": 1,
            "dtype_label": "checkpoint (mxfp4)",
        },
        "knee": {"batch_size": 4, "label": MEASURED_TWIN, "capped_at": None},
        "precision_passed": True,
        "multi_device": {
            "validated": True,
            "split": result["sections"]["distributed"]["split"],
            "verdict": "passed",
        },
        "stability_verdict": "passed",
        "open_limitations": 1,
        "blocked": None,
    }
    assert release_notes_summary(result) == (
        "TP1 PP1 EP1 DP1 on 1 device, checkpoint (mxfp4); knee batch 4 (measured (twin)); "
        "precision passed; multi-device TP=2 passed; stability passed; 1 open limitation"
    )


def test_markdown_helpers_escape_what_would_become_markup():
    assert text("a | b <img src=x> *c* [d](e) _f_ snake_case") == (
        "a \\| b \\<img src=x\\> \\*c\\* \\[d\\](e) \\_f\\_ snake_case"
    )
    assert text("# not a heading") == "\\# not a heading"
    assert code("a`b") == "``a`b``"


def test_the_engine_imports_neither_django_nor_torch():
    code_line = (
        "import sys, engine.stages.release_notes.run; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'torch', 'transformers')]; "
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code_line], check=False).returncode == 0


def test_what_is_new_against_known_families_is_said_once_per_aspect():
    results = full_results()
    results["analyze"] = results["analyze"] | {
        "new_against_known": [
            {"aspect": "attention", "detail": "attention not seen before: MLA"},
            {"aspect": "config keys", "detail": "keys no known family uses: q_lora_rank"},
        ]
    }
    markdown = notes_for(results)["markdown"]
    assert "- attention not seen before: MLA\n" in markdown
    assert "- keys no known family uses: q_lora_rank" in markdown
    assert "attention: attention" not in markdown


def test_the_recommended_batch_never_exceeds_what_the_plan_fits():
    results = full_results()
    results["plan"]["predicted"]["largest_batch_sequences"] = KNEE_BATCH - 1
    notes = notes_for(results)
    perf = notes["sections"]["performance"]
    assert (perf["knee_batch_size"], perf["recommended_batch_size"]) == (KNEE_BATCH, 3)
    assert perf["capped_by_plan"] == {"sequences": 3, "context_tokens": 32768}
    assert (
        "Recommended batch size: **3** sequences, the most the plan fits at its context of "
        "32,768 tokens; on the twin, the knee of the `bfloat16` curve at prompt length"
    ) in notes["markdown"]


def test_max_concurrency_comes_from_memory_when_the_plan_predicts_no_speed():
    results = full_results()
    fits = results["plan"]["max_sequences_at_context"]
    results["plan"]["predicted"] = {"kind": "predicted", "available": False, "reason": "cpu"}
    configuration = notes_for(results)["sections"]["configuration"]
    assert fits >= 1 and configuration["max_concurrency"] == fits


def test_the_longest_prompt_counts_the_full_size_workloads():
    """A prefill-heavy full-size workload sent longer prompts than the twin's sweep: the
    notes name the longest prompt measured anywhere, not the twin's."""
    from engine.stages.release_notes.not_validated import not_validated

    sections = {"plan": {"available": True, "context_tokens": 8192}, "performance": {}}
    sections["performance"]["prompt_lens"] = [16, 128]
    measured = {"status": "measured", "workloads": [{"input_tokens": 128}, {"input_tokens": 256}]}

    def context(full_size):
        items = not_validated({}, sections, [], None, False, full_size=full_size)
        return next(item for item in items if item["kind"] == "context")

    assert context(measured)["prompt_tokens"] == 256
    assert context(None)["prompt_tokens"] == 128  # the twin's alone
    assert (
        context({"status": "failed", "workloads": [{"input_tokens": 4096}]})["prompt_tokens"] == 128
    )
