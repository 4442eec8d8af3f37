"""The notes' "Multi-device validation" section and what it leaves unvalidated, from the
`distributed` stage's recorded runs (`tests.release_notes_results.recorded_distributed`):
the split validated on the twin against the plan's, its error against the tolerance, step
times at TP=2 and TP=1, the share of time in collectives and the scaling efficiency, each
labelled measured on the twin; a failed run with its reason and rank; a split that could not
be validated here with why."""

from __future__ import annotations

import pytest

from adaptation.models import StageStatus
from adaptation.services.release_notes import release_notes_regenerate
from engine.notes import MEASURED_TWIN
from tests.adaptation.services.test_release_notes_store import STAGES
from tests.engine.stages.release_notes.test_engine import not_validated_lines, notes_for, section
from tests.factories import make_job, make_release
from tests.performance_rows import h200_pool
from tests.release_notes_results import REPO_ID, full_results, recorded_distributed

NO_EP_PLAN = (
    "expert parallelism could not be validated: transformers' Qwen3MoeForCausalLM has no "
    "expert-parallel plan (ep_plan)"
)


def with_distributed(name: str) -> dict:
    results = full_results()
    results["distributed"] = recorded_distributed(name)[1]
    return results


def failed_states(results: dict, error: str) -> dict:
    """Every stage's state when the distributed stage failed with `error` and kept what is
    in `results["distributed"]`: the stages after it skipped."""
    states = {name: {"status": "succeeded", "error": "", "result": None} for name in results}
    states["distributed"] = {
        "status": "failed",
        "error": error,
        "result": results.pop("distributed"),
    }
    for name in ("performance", "stability"):
        states[name] = {"status": "skipped", "error": "", "result": None}
        results.pop(name)
    return states


def test_a_passing_split_is_shown_against_the_plans_with_its_measured_figures():
    notes = notes_for(with_distributed("pass"))
    dist = notes["sections"]["distributed"]
    assert (dist["validated"], dist["passed"], dist["label"]) == (True, True, MEASURED_TWIN)
    assert dist["split"] == {
        "tp": 2,
        "ep": 2,
        "processes": 2,
        "backend": "gloo",
        "device_type": "cpu",
    }
    assert dist["plan_split"] == {"tp": 8, "pp": 1, "ep": 8, "dp": 1}

    text = section(notes["markdown"], "Multi-device validation")
    assert (
        "**Passed**: the twin split TP=2 EP=2 across 2 processes (`gloo` on `cpu`) matches "
        "the single-process float32 reference on every rank; measured (twin)." in text
    )
    assert (
        "Against the plan's split TP8 PP1 EP8 DP1: the plan's TP=8 needs more than "
        "the worker's 2 devices; TP=2, the largest divisor of 8 the worker holds, is the split "
        "to validate."
    ) in text
    for row in (
        "| Validated split | TP=2 EP=2 across 2 processes (`gloo` on `cpu`) |",
        "| Plan's split | TP8 PP1 EP8 DP1 |",
        "| Max \\|logit error\\| (worst rank) | 7.45e-07 (tolerance 1.28e-04) |",
        "| Top-1 agreement (worst rank) | 100.0 % |",
        "| Decode step, TP=2 | 16.4 ms (122 tokens/s), measured (twin) |",
        "| Decode step, TP=1 | 5.49 ms (364 tokens/s), measured (twin) |",
        "| Time in collectives | 11.1 %, measured (twin) |",
        "| Scaling efficiency | 0.167 (TP=1 step / (2 x TP=2 step); 1 = linear), measured (twin) |",
    ):
        assert row in text
    # on a CPU host the twin's TP=2 is slower than TP=1, and the notes say why
    assert "per-step framework and gloo overhead" in text
    assert "multi-device TP=2 EP=2 passed" in notes["summary"]
    # the section comes between the configuration and the performance recommendations
    markdown = notes["markdown"]
    assert (
        markdown.index("## Configuration")
        < markdown.index("## Multi-device validation")
        < markdown.index("## Performance recommendations")
    )


def test_on_an_accelerator_the_cpu_reading_is_not_given():
    text = section(notes_for()["markdown"], "Multi-device validation")
    assert "| Validated split | TP=2 across 2 processes (`nccl` on `cuda`) |" in text
    assert "gloo overhead" not in text


def test_a_split_off_the_reference_fails_with_its_reason_and_figures():
    results = with_distributed("mismatch")
    error = recorded_distributed("mismatch")[0]
    notes = notes_for(results, states=failed_states(results, error))

    text = section(notes["markdown"], "Multi-device validation")
    assert (
        "**Failed**: TP=2 on 2 gloo processes does not match the float32 reference on rank 0; "
        "max \\|logit error\\| 0.903 over the tolerance 9.89e-05" in text
    )
    assert "| Max \\|logit error\\| (worst rank) | 9.03e-01 (tolerance 9.89e-05) |" in text
    assert "| Top-1 agreement (worst rank) | 5.0 % |" in text
    assert notes["sections"]["distributed"]["first_divergent"] == {
        "module": "model.layers.1.self_attn",
        "layer": 1,
        "kind": "attention",
    }
    items = not_validated_lines(notes["markdown"])
    assert f"`distributed`: failed: {error.split(';')[0]}" in items[0]
    assert "Serving on more than one device did not pass on the twin (TP=2)." in items
    assert "multi-device TP=2 failed" in notes["summary"]


def test_a_crashed_rank_is_named_with_its_exit_status():
    results = with_distributed("crash")
    error = recorded_distributed("crash")[0]
    notes = notes_for(results, states=failed_states(results, error))

    text = section(notes["markdown"], "Multi-device validation")
    assert (
        "**Failed**: the distributed run failed (torchrun exited with code 1): rank 1 was killed "
        "by SIGKILL." in text
    )
    assert "| Failed rank | rank 1 was killed by SIGKILL |" in text
    assert notes["sections"]["distributed"]["failed_rank_exit_code"] == -9  # the template words it
    assert "Decode step" not in text  # nothing was measured
    assert not_validated_lines(notes["markdown"])[0] == (
        "`distributed`: failed: the distributed run failed (torchrun exited with code 1): "
        "rank 1 was killed by SIGKILL."
    )


def test_a_split_that_could_not_be_validated_here_says_why():
    notes = notes_for(with_distributed("not_validated"))

    assert notes["sections"]["distributed"]["validated"] is False
    text = section(notes["markdown"], "Multi-device validation")
    assert (
        "**Not validated** here: transformers' FooForCausalLM has no tensor-parallel plan "
        "(base_model_tp_plan): the split cannot be validated for this architecture. The "
        "plan's split (TP1 PP1 EP1 DP1) was not run across processes." in text
    )
    assert (
        "Serving on more than one device was not validated: transformers' FooForCausalLM has "
        "no tensor-parallel plan (base_model_tp_plan): the split cannot be validated for this "
        "architecture." in not_validated_lines(notes["markdown"])
    )
    assert "multi-device not validated" in notes["summary"]
    # it ran no twin
    assert "`distributed`" not in not_validated_lines(notes["markdown"])[0]


def test_expert_parallelism_left_out_is_listed_as_not_validated():
    results = with_distributed("pass")
    results["distributed"] |= {"ep": 1, "ep_note": NO_EP_PLAN}
    notes = notes_for(results)

    expected = (
        "Expert parallelism was not validated on the twin: transformers' Qwen3MoeForCausalLM "
        "has no expert-parallel plan (ep_plan)."
    )
    assert expected in not_validated_lines(notes["markdown"])
    assert (
        "Expert parallelism was not validated: transformers' Qwen3MoeForCausalLM has no "
        "expert-parallel plan (ep_plan)." in notes["markdown"]
    )


def test_a_job_without_the_stage_says_the_split_was_not_run():
    results = full_results()
    del results["distributed"]
    notes = notes_for(results)
    text = section(notes["markdown"], "Multi-device validation")
    assert (
        "Not run: this job has no distributed stage. The plan's split (TP1 PP1 EP1 "
        "DP1) was not run across processes." in text
    )
    assert "multi-device" not in notes["summary"]


@pytest.mark.django_db
def test_notes_regenerated_after_a_failed_distributed_stage_keep_its_findings():
    error, kept = recorded_distributed("crash")
    results = full_results()
    job = make_job(
        release=make_release(repo_id=REPO_ID),
        pool=h200_pool(),
        stages=STAGES,
        statuses=dict.fromkeys(STAGES[:5], StageStatus.SUCCEEDED)
        | {"distributed": StageStatus.FAILED}
        | dict.fromkeys(STAGES[6:], StageStatus.SKIPPED),
        results={name: results[name] for name in STAGES[:5]} | {"distributed": kept},
        errors={"distributed": error},
    )

    notes = release_notes_regenerate(job=job)

    dist = notes.sections["distributed"]
    assert (dist["status"], dist["verdict"], dist["failed_rank"]) == ("failed", "failed", 1)
    assert "| Failed rank | rank 1 was killed by SIGKILL |" in notes.markdown
    stages = {s["name"]: s["status"] for s in notes.sections["stages"]}
    assert stages["distributed"] == "failed" and stages["performance"] == "skipped"
