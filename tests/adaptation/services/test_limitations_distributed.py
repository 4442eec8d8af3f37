"""The multi-device validation's notes (`engine.stages.distributed.findings`) from the
`distributed` stage's stored results (`tests/data/distributed/`, recorded from the stage's
engine on 2 gloo processes: a passing TP=2 EP=2 MoE run, a wrong shard injected, a rank
killed, an architecture without a tensor-parallel plan; `recorded_distributed`), and how the
stage flow raises and resolves them: a passing run resolves them, a run that validates
nothing leaves them open."""

from __future__ import annotations

import copy

import pytest

from adaptation.models import KnownLimitation, StageRun
from adaptation.safe_markdown import render_markdown
from adaptation.services.jobs import job_rerun_stage
from adaptation.services.stage_runs import stage_run_claim, stage_run_fail, stage_run_succeed
from engine.stages.distributed.degree import validated_tp
from engine.stages.distributed.run import not_validated
from tests.factories import make_job
from tests.limitation_words import findings_for_stage
from tests.release_notes_results import recorded_distributed as stored

MISMATCH = "distributed:mismatch"
RANK_FAILED = "distributed:rank-failed"
NOT_VALIDATED = "distributed:not-validated"
EP_NOT_VALIDATED = "distributed:ep-not-validated"
# The note the stage keeps when transformers' class has no expert-parallel plan.
NO_EP_PLAN = (
    "expert parallelism could not be validated: transformers' Qwen3MoeForCausalLM has no "
    "expert-parallel plan (ep_plan)"
)


def result_of(name: str) -> dict:
    """A recorded run as if its fault were the release's own (the recordings broke the run on
    purpose through the job's `inject` option, which raises no note)."""
    result = copy.deepcopy(stored(name)[1])
    result.pop("inject", None)
    return result


def without_ep(result: dict) -> dict:
    """The passing MoE run had transformers' class no ep_plan: TP=2 with the experts whole."""
    return result | {"ep": 1, "ep_note": NO_EP_PLAN}


def by_key(findings) -> dict:
    return {f.key: f for f in findings}


# --- findings ----------------------------------------------------------------------------------


def test_a_split_off_the_reference_is_a_blocker_naming_the_rank_error_and_module():
    (note,) = findings_for_stage("distributed", result_of("mismatch"), pool="cpu")

    assert (note.key, note.severity) == (MISMATCH, "blocker")
    assert note.title == (
        "TP=2 on pool cpu does not match the single-device reference: rank 0, max |logit "
        "error| 0.903 > 9.89e-05, first divergent module model.layers.1.self_attn"
    )
    assert "across 2 `gloo` processes on pool `cpu` (device `cpu`)" in note.body
    assert "2 of 2 ranks are off" in note.body
    row = "| 0 | 0.903 | 9.89e-05 | 5.0 % | `model.layers.1.self_attn` (layer 1) | **failed** |"
    assert row in note.body
    assert (
        "First divergent module: `model.layers.1.self_attn` (layer 1, attention): max abs "
        "error 0.232 over its tolerance 2.97e-05." in note.body
    )
    assert "- the plan's split: TP2 PP1 EP1 DP1; validated: TP=2 (the plan's TP=2)" in note.body
    html = render_markdown(note.body)
    assert "<table>" in html and "<td><strong>failed</strong></td>" in html


def test_a_killed_rank_is_a_blocker_with_its_exit_status_and_the_reasons_first_lines():
    error, result = stored("crash")
    result = result_of("crash")

    (note,) = findings_for_stage("distributed", result, pool="cpu")

    assert (note.key, note.severity) == (RANK_FAILED, "blocker")
    assert note.title == "TP=2 run failed on pool cpu: rank 1 was killed by SIGKILL"
    assert "rank 1 was killed by SIGKILL after 5.23 s" in note.body
    first_lines = "\n".join(error.splitlines()[:4])
    assert f"```text\n{first_lines}\n" in note.body  # quoted as the stage wrote it
    assert "- rank 0 was killed by SIGTERM\n- rank 1 was killed by SIGKILL\n" in note.body
    assert "<pre><code" in render_markdown(note.body)


def test_ranks_past_the_time_limit_are_a_blocker_saying_they_hung():
    result = result_of("crash")
    result["reason"] = (
        "the 2 ranks did not finish within 180 s and were killed: rank 1 stopped after "
        "'loaded'\nits log:\n[rank 1] injected: hanging instead of running"
    )
    result["rank_logs"] = [dict(entry, exit_code=None) for entry in result["rank_logs"]]
    result["inject"] = {}

    (note,) = findings_for_stage("distributed", result, pool="cpu")

    assert note.key == RANK_FAILED and note.severity == "blocker"
    assert note.title == "TP=2 run hung on pool cpu: rank 1 stopped after 'loaded'"
    assert "[rank 1] injected: hanging instead of running" in note.body
    assert "- rank 0 ended with no exit status recorded" in note.body


def test_a_long_reason_is_quoted_by_its_first_lines():
    result = result_of("crash")
    result["reason"] = "\n".join(f"line {n}" for n in range(1, 31))

    (note,) = findings_for_stage("distributed", result, pool="cpu")

    assert "The stage says (first 8 lines):" in note.body
    assert "line 8\n```" in note.body and "line 9" not in note.body


@pytest.mark.parametrize(
    ("reason", "why"),
    [
        (
            "transformers' FooForCausalLM has no tensor-parallel plan (base_model_tp_plan): the "
            "split cannot be validated for this architecture",
            "transformers' FooForCausalLM has no tensor-parallel plan (base_model_tp_plan)",
        ),
        (
            "the release runs on its own modeling code (trust_remote_code); transformers' "
            "tensor-parallel plans cover only its own classes",
            "the release runs on its own modeling code (trust_remote_code)",
        ),
        (validated_tp(8, 1)[1], "the pool's worker holds 1 device"),
        (
            "pool npu-x1's backend 'manifest' has no torch.distributed backend on this worker "
            "(gloo, NCCL, XCCL, HCCL are known)",
            "pool npu-x1's backend 'manifest' has no torch.distributed backend on this worker "
            "(gloo, NCCL, XCCL, HCCL are known)",
        ),
    ],
)
def test_a_split_that_cannot_run_here_is_a_minor_note_saying_what_and_why(reason, why):
    result = not_validated(reason, plan={"tp": 8, "pp": 1, "ep": 8, "dp": 1}, device_type="cpu")

    (note,) = findings_for_stage("distributed", result, pool="cpu")

    assert (note.key, note.severity) == (NOT_VALIDATED, "minor")
    assert note.title == f"Multi-device split not validated on pool cpu: {why}"
    assert "validated no part of the plan's split (TP8 PP1 EP8 DP1) across processes" in note.body
    assert "its outputs against the single-device float32 reference" in note.body


def test_the_recorded_run_without_a_tensor_parallel_plan_names_the_class():
    (note,) = findings_for_stage("distributed", result_of("not_validated"), pool="cpu")
    assert note.title == (
        "Multi-device split not validated on pool cpu: transformers' FooForCausalLM has no "
        "tensor-parallel plan (base_model_tp_plan)"
    )
    assert "(device `cpu`, backend `gloo`, 2 devices on the worker)" in note.body


def test_a_passing_split_raises_nothing():
    assert findings_for_stage("distributed", result_of("pass"), pool="cpu") == []


def test_expert_parallelism_left_out_of_a_passing_split_is_a_minor_note():
    (note,) = findings_for_stage("distributed", without_ep(result_of("pass")), pool="cpu")

    assert (note.key, note.severity) == (EP_NOT_VALIDATED, "minor")
    assert note.title == (
        "Expert parallelism not validated on pool cpu: transformers' Qwen3MoeForCausalLM has "
        "no expert-parallel plan (ep_plan)"
    )
    assert render_markdown(note.body).startswith(
        "<p>The plan serves the routed experts with EP8 (TP8 PP1 EP8 DP1); the "
        "<code>distributed</code> stage ran TP=2 across 2 <code>gloo</code> processes on pool "
        "<code>cpu</code> (device <code>cpu</code>), and it matched the single-device "
        "reference, without expert parallelism (EP=1): transformers' Qwen3MoeForCausalLM has "
        "no expert-parallel plan (ep_plan)."
    )


def test_results_that_are_not_a_distributed_run_raise_nothing_to_judge():
    assert findings_for_stage("distributed", {"error": "crashed"}, pool="cpu") is None
    assert findings_for_stage("distributed", {"validated": True}, pool="cpu") is None


# --- the stage flow ----------------------------------------------------------------------------


def distributed_job():
    """A job at its distributed stage (fetch, analyze and plan done) on the cpu pool."""
    return make_job(
        stages=("fetch", "analyze", "plan", "distributed"),
        statuses={
            "fetch": "succeeded",
            "analyze": "succeeded",
            "plan": "succeeded",
            "distributed": "queued",
        },
    )


def running(job) -> StageRun:
    run = StageRun.objects.filter(job=job, stage="distributed").order_by("-attempt").first()
    claimed = stage_run_claim(stage_run_id=run.pk, worker_host="worker-1")
    assert claimed is not None
    return claimed


def rerun(job) -> StageRun:
    job_rerun_stage(job=job, stage="distributed")
    return running(job)


def ends(job, name: str, *, first: bool = False) -> None:
    """The job's distributed attempt ends as the recorded run `name` did."""
    run = running(job) if first else rerun(job)
    error, _recorded = stored(name)
    result = result_of(name)
    if error:
        assert stage_run_fail(stage_run=run, error=error, result=result)
    else:
        stage_run_succeed(stage_run=run, result=result)


def notes(job) -> dict[str, tuple[str, str]]:
    return {
        n.key: (n.severity, n.status) for n in KnownLimitation.objects.filter(release=job.release)
    }


@pytest.mark.django_db
def test_a_mismatch_is_a_blocker_that_a_passing_rerun_resolves():
    job = distributed_job()

    ends(job, "mismatch", first=True)

    note = KnownLimitation.objects.get(release=job.release)
    assert (note.key, note.severity, note.status, note.stage) == (
        MISMATCH,
        "blocker",
        "open",
        "distributed",
    )
    assert note.pool.name == "cpu"

    ends(job, "pass")
    note.refresh_from_db()
    assert note.status == "resolved" and note.resolved_at is not None


@pytest.mark.django_db
def test_runs_that_cannot_judge_a_mismatch_leave_it_open():
    job = distributed_job()
    ends(job, "mismatch", first=True)

    # validated nothing (no tensor-parallel plan): says nothing about the mismatch
    ends(job, "not_validated")
    assert notes(job) == {MISMATCH: ("blocker", "open"), NOT_VALIDATED: ("minor", "open")}

    # a rank crashed: the split was tried (no longer "not validated"), no outputs compared
    ends(job, "crash")
    assert notes(job) == {
        MISMATCH: ("blocker", "open"),
        NOT_VALIDATED: ("minor", "resolved"),
        RANK_FAILED: ("blocker", "open"),
    }

    ends(job, "pass")
    assert set(notes(job).values()) == {("blocker", "resolved"), ("minor", "resolved")}


@pytest.mark.django_db
def test_expert_parallelism_not_validated_is_resolved_by_a_run_that_validates_it():
    job = distributed_job()
    stage_run_succeed(stage_run=running(job), result=without_ep(result_of("pass")))
    assert notes(job) == {EP_NOT_VALIDATED: ("minor", "open")}

    ends(job, "pass")  # TP=2 EP=2
    assert notes(job) == {EP_NOT_VALIDATED: ("minor", "resolved")}


def test_a_rank_its_peers_timed_out_on_is_said_to_hang():
    result = result_of("crash")
    result["reason"] = (
        "the distributed run failed (torchrun exited with code 1): rank 1 stopped after "
        "'loaded'; the other ranks were waiting for it in a collective\nits log:\n..."
    )
    (note,) = findings_for_stage("distributed", result, pool="cpu")
    assert note.title == (
        "TP=2 run hung on pool cpu: rank 1 stopped after 'loaded'; the other ranks were "
        "waiting for it in a collective"
    )


def test_a_run_broken_on_purpose_raises_and_resolves_nothing():
    for name in ("crash", "mismatch"):
        _error, result = stored(name)
        assert result["inject"]  # the recordings were broken through the inject option
        assert findings_for_stage("distributed", result, pool="cpu") == []


@pytest.mark.django_db
def test_a_run_broken_on_purpose_leaves_the_notes_as_they_were():
    job = distributed_job()
    ends(job, "mismatch", first=True)
    error, injected = stored("crash")  # kill_rank 1, as the job asked
    assert stage_run_fail(stage_run=rerun(job), error=error, result=injected)
    assert notes(job) == {MISMATCH: ("blocker", "open")}


def test_a_split_not_validated_says_which_split_it_would_have_run():
    result = not_validated(
        "transformers' tensor-parallel plan for GptOssForCausalLM splits only lm_head",
        plan={"tp": 1, "pp": 1, "ep": 1, "dp": 1},
        degree_reason="the plan serves on one device (TP=1); TP=2, the next point of its "
        "scaling curve, is the split to validate",
    )
    (note,) = findings_for_stage("distributed", result, pool="cpu")
    assert (
        "The split it would have run: the plan serves on one device (TP=1); TP=2, the next "
        "point of its scaling curve, is the split to validate." in note.body
    )
