"""End to end: releases dropped into a mirror folder, `poll_hubs`, a real Celery worker
process runs the stages, the board shows them; `adapt --wait` follows a job to its end.

The jobs run on the `cpu` pool, whose one device is the worker's machine: whether a release's
`plan` fits depends on that machine's memory (on a 24 GiB machine only gpt-oss-20b does), so
the expected plan outcome is worked out for the machine the test runs on; the worker runs
here too."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command

from adaptation.models import (
    ACTIVE_STAGE_STATUSES,
    AdaptationJob,
    JobStatus,
    ModelRelease,
    OperatorCheck,
    PerformancePoint,
    PrecisionResult,
    ReleaseNotes,
    StageRun,
    StageStatus,
)
from engine.architecture import analyze_config
from engine.notes import MEASURED_TWIN
from engine.stages.plan.errors import NoFittingPlan
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from tests import dom
from tests.conftest import REALCONFIGS_DIR
from tests.e2e.conftest import wait_for
from tests.factories import cpu_pool, make_watch

pytestmark = [pytest.mark.e2e]

BROKEN_CONFIG = b'{\n  "model_type": "llama",\n  "hidden_size": 4096,,\n}\n'


def drop_release(root: Path, repo_id: str, config: bytes) -> Path:
    folder = root / repo_id
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(config)
    return folder


def real_config(name: str) -> bytes:
    return (REALCONFIGS_DIR / f"{name}.json").read_bytes()


def fits_this_machine(name: str, **options) -> bool:
    """Whether the release `name` fits the cpu pool, one device with this machine's memory
    (the worker of these tests runs here)."""
    analysis = analyze_config(json.loads(real_config(name))).to_dict()
    try:
        plan_release(analysis, PoolLayout("cpu", devices_per_node=1), **options)
    except NoFittingPlan:
        return False
    return True


def all_jobs_done() -> bool:
    """Every job ended, and its release notes (which run after a failure too) were written."""
    jobs = AdaptationJob.objects.all()
    return (
        jobs.exists()
        and all(job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED) for job in jobs)
        and not StageRun.objects.filter(status__in=ACTIVE_STAGE_STATUSES).exists()
    )


def plan_fit(plan: dict) -> int:
    """The sequences a fitting plan holds at its context (the notes cap the knee there)."""
    return plan["predicted"].get("largest_batch_sequences") or plan["max_sequences_at_context"]


def check_measured_stages(runs: dict, quick: dict) -> None:
    """A job whose plan fits went on through the distributed validation, performance and
    stability on the twin."""
    distributed = runs["distributed"]
    assert distributed.status == StageStatus.SUCCEEDED, distributed.error
    # The plan serves on one device: the next point of its curve, TP=2, ran on 2 processes.
    assert (distributed.result["tp"], distributed.result["world_size"]) == (2, 2)
    assert distributed.result["passed"] is True and distributed.result["max_abs_error"] < 1e-5
    performance, stability = runs["performance"], runs["stability"]
    assert performance.status == StageStatus.SUCCEEDED, performance.error
    assert stability.status == StageStatus.SUCCEEDED, stability.error
    points = [p for p in performance.result["points"] if p["kind"] == "measured"]
    assert {p["batch_size"] for p in points} == {1, 2, 4}
    assert {p["prompt_len"] for p in points} == set(quick["performance"]["prompt_lens"])
    assert performance.result["knee_batch_size"] in (1, 2, 4)
    assert performance.result["calibration"]["device"]["kind"] == "measured"
    rows = PerformancePoint.objects.filter(stage_run=performance)
    assert rows.filter(kind="measured", metric="decode_tokens_per_s").count() == len(points)
    assert rows.filter(metric="decode_efficiency").exists()
    assert stability.result["passed"] is True and stability.result["steps"] >= 20
    notes = runs["release_notes"]
    assert notes.status == StageStatus.SUCCEEDED, notes.error
    stored = ReleaseNotes.objects.get(stage_run=notes)
    assert stored.version == 1 and stored.markdown == notes.result["markdown"]
    assert runs["plan"].result["artifacts"]["vllm"] in stored.markdown
    # The twin's knee, capped at the sequences the plan fits at its context.
    recommended = min(performance.result["knee_batch_size"], plan_fit(runs["plan"].result))
    assert f"Recommended batch size: **{recommended}** sequences" in stored.markdown


def test_polled_releases_run_on_a_real_worker(
    celery_worker_process, tmp_path, client, staff_user, quick_measurements
):
    root = tmp_path / "hub"
    drop_release(root, "acme/llama-8b", real_config("meta-llama__Llama-3.1-8B"))
    drop_release(root, "acme/broken", BROKEN_CONFIG)
    drop_release(root, "acme/qwen3-moe", real_config("Qwen__Qwen3-235B-A22B-Instruct-2507"))
    make_watch(name="acme-mirror", endpoint=str(root))

    call_command("poll_hubs", stdout=io.StringIO())
    assert ModelRelease.objects.count() == 3
    wait_for(all_jobs_done, timeout_s=240, worker=celery_worker_process, what="the three jobs")

    by_repo = {job.release.repo_id: job for job in AdaptationJob.objects.select_related("release")}
    broken = by_repo["acme/broken"]
    assert broken.status == JobStatus.FAILED
    fetch, *later = broken.stage_runs.order_by("position")
    assert fetch.status == StageStatus.FAILED
    assert "config.json is not valid JSON" in fetch.error
    assert "line 3 column 23" in fetch.error
    assert [run.status for run in later[:-1]] == [StageStatus.SKIPPED] * 8
    # The release notes still ran, and say what blocked.
    assert later[-1].stage == "release_notes" and later[-1].status == StageStatus.SUCCEEDED
    blocked = ReleaseNotes.objects.get(stage_run=later[-1]).markdown
    assert blocked.startswith("## What blocked this release\n\nThe `fetch` stage failed: ")

    fits = {
        "acme/llama-8b": fits_this_machine("meta-llama__Llama-3.1-8B"),
        "acme/qwen3-moe": fits_this_machine("Qwen__Qwen3-235B-A22B-Instruct-2507"),
    }
    for repo_id, total in (("acme/llama-8b", 8_030_261_248), ("acme/qwen3-moe", 235_093_634_560)):
        job = by_repo[repo_id]
        runs = {r.stage: r for r in job.stage_runs.all()}
        measured = [runs[stage] for stage in ("fetch", "analyze", "operators", "precision")]
        assert {r.status for r in measured} == {StageStatus.SUCCEEDED}, [
            (r.stage, r.error) for r in measured
        ]
        assert all(r.worker_host for r in runs.values() if r.status != StageStatus.SKIPPED)
        plan = runs["plan"]
        if fits[repo_id]:
            assert plan.status == StageStatus.SUCCEEDED and job.status == JobStatus.SUCCEEDED
            assert plan.result["accelerator"] == "cpu" and plan.result["devices"] == 1
            check_measured_stages(runs, quick_measurements)
        else:  # the model is larger than this machine: the plan says what would fit
            assert plan.status == StageStatus.FAILED and job.status == JobStatus.FAILED
            assert "does not fit 1 x cpu" in plan.error and "would fit" in plan.error
            assert plan.result["fits"] is False and plan.result["suggestions"]["devices"] > 1
            later = ("distributed", "serve", "performance", "stability")
            assert {runs[s].status for s in later} == {"skipped"}
            assert runs["release_notes"].status == StageStatus.SUCCEEDED
            assert "The `plan` stage failed: " in runs["release_notes"].result["markdown"]
        assert runs["analyze"].result["total_params"] == total
        assert runs["operators"].result["missing"] == []  # the cpu pool runs every operator
        assert OperatorCheck.objects.filter(stage_run=runs["operators"]).count() > 20
        precision = {
            p.dtype: p for p in PrecisionResult.objects.filter(stage_run=runs["precision"])
        }
        assert set(precision) == {"bfloat16", "float16"}
        assert all(p.passed and p.cosine_similarity > 0.99 for p in precision.values())
        assert job.release.config["model_type"] in ("llama", "qwen3_moe")

    # Seen again, nothing is created twice.
    call_command("poll_hubs", stdout=io.StringIO())
    assert ModelRelease.objects.count() == 3
    assert AdaptationJob.objects.count() == 3

    client.force_login(staff_user)
    board = client.get("/").content.decode()

    def plan_state(repo_id: str) -> str:
        return "Succeeded" if fits[repo_id] else "Failed"

    expected = {
        "acme/llama-8b": ["Succeeded"] * 4 + [plan_state("acme/llama-8b")],
        "acme/broken": ["Failed", "Skipped", "Skipped", "Skipped", "Skipped"],
        "acme/qwen3-moe": ["Succeeded"] * 4 + [plan_state("acme/qwen3-moe")],
    }
    for repo_id, states in expected.items():
        row = board_row(board, by_repo[repo_id].release_id)
        assert repo_id in row
        for stage, state in zip(
            ("fetch", "analyze", "operators", "precision", "plan"), states, strict=True
        ):
            assert stage_cell(row, stage).startswith(state), (repo_id, stage)


def board_row(board: str, release_id: int) -> str:
    """The markup of the board's row for the release."""
    return dom.find(board, f"tr#release-row-{release_id}").html


def stage_cell(row: str, stage: str) -> str:
    """The text of the row's `stage` cell, its parts (status, duration, ...) apart."""
    return " ".join(dom.find(row, f'td[data-stage="{stage}"]').strings)


def test_adapt_waits_and_prints_the_finished_job(celery_worker_process, tmp_path):
    cpu_pool()
    good = drop_release(tmp_path / "hub", "openai/gpt-oss-20b", real_config("openai__gpt-oss-20b"))
    # One 8k sequence: gpt-oss-20b's 12.8 GiB of MXFP4 weights fit a machine of ~17 GiB.
    plan_options = {"context_tokens": 8192, "concurrency": 1}
    fits = fits_this_machine("openai__gpt-oss-20b", **plan_options)
    out = io.StringIO()
    quick = {
        "performance": {"max_batch_size": 4, "prompt_lens": [16], "repeats": 3},
        "stability": {"duration_s": 3},
    }
    args = ["--context", "8192", "--concurrency", "1", "--options", json.dumps(quick)]
    try:
        call_command("adapt", str(good), *args, "--wait", "--format", "json", "--timeout", "240",
                     stdout=out)  # fmt: skip
    except SystemExit as exit_info:  # the plan failed: this machine is too small
        # The job summary says which stage failed and why (a slow host, a real fault).
        assert not fits and exit_info.code == 1, out.getvalue()[-3000:]
    finished = json.loads(out.getvalue())
    assert finished["status"] == ("succeeded" if fits else "failed")
    stages = {s["name"]: s for s in finished["stages"]}
    assert list(stages) == [
        "fetch", "analyze", "operators", "precision", "plan", "distributed", "serve",
        "performance", "stability", "release_notes",
    ]  # fmt: skip
    if fits:
        performance = stages["performance"]["result"]
        for point in performance["points"]:
            assert {"dtype", "batch_size", "prompt_len", "ttft_s", "tpot_s",
                    "prefill_tokens_per_s", "decode_tokens_per_s", "peak_memory_bytes",
                    "kind"} <= point.keys()  # fmt: skip
        measured = [p for p in performance["points"] if p["kind"] == "measured"]
        assert {(p["batch_size"], p["prompt_len"]) for p in measured} == {(1, 16), (2, 16), (4, 16)}
        assert performance["knee_batch_size"] in (1, 2, 4)
        # the plan on the cpu pool had no calibration before this job's performance run
        assert stages["plan"]["result"]["predicted"]["calibrated"]["available"] is False
        # transformers' gpt-oss plan splits only the embedding and the LM head: nothing of
        # the decoder to validate, said so (the stage succeeds; a note is raised).
        distributed = stages["distributed"]
        assert distributed["status"] == "succeeded", distributed["error"]
        distributed = distributed["result"]
        assert {"backend", "world_size", "tp", "ep", "max_abs_error", "top1_agreement",
                "passed", "step_time_s", "comm_fraction",
                "scaling_efficiency"} <= distributed.keys()  # fmt: skip
        assert distributed["validated"] is False and distributed["passed"] is None
        assert distributed["backend"] == "gloo" and distributed["max_abs_error"] is None
        assert "splits only lm_head, model.embed_tokens" in distributed["reason"]
        stability = stages["stability"]["result"]
        assert {"duration_s", "steps", "memory_slope_bytes_per_step", "nonfinite_outputs",
                "errors", "step_time_drift", "passed"} <= stability.keys()  # fmt: skip
        assert stability["passed"] is True and 3 <= stability["duration_s"] < 60
        # The notes of a real config: the plan's launch command and the measured knee.
        notes = stages["release_notes"]
        assert notes["status"] == "succeeded", notes["error"]
        markdown = notes["result"]["markdown"]
        assert stages["plan"]["result"]["artifacts"]["vllm"] in markdown
        knee = performance["knee"]
        recommended = min(knee["batch_size"], plan_fit(stages["plan"]["result"]))
        assert f"Recommended batch size: **{recommended}** sequences" in markdown
        assert f"| **measured (twin)** | {knee['batch_size']} | " in markdown
        measured = notes["result"]["sections"]["performance"]["measured"]
        assert measured["tpot_s"] == knee["tpot_s"] and measured["label"] == MEASURED_TWIN
    else:
        later = ("distributed", "serve", "performance", "stability")
        assert [stages[s]["status"] for s in later] == ["skipped"] * 4
        # The notes say what blocked (adapt --wait follows the job until they are written).
        assert stages["release_notes"]["status"] == "succeeded"
        assert "The `plan` stage failed: " in stages["release_notes"]["result"]["markdown"]
    measured = [stages[name] for name in ("fetch", "analyze", "operators", "precision")]
    assert all(s["status"] == "succeeded" and s["attempt"] == 1 for s in measured)
    plan = stages["plan"]["result"]
    assert plan["inputs"]["context_tokens"] == 8192 and plan["inputs"]["concurrency"] == 1
    assert plan["accelerator"] == "cpu" and plan["fits"] is fits
    assert stages["analyze"]["result"]["kv_cache_bytes_per_token"] == 49_152
    operators = stages["operators"]["result"]
    assert operators["missing"] == []
    assert {"name", "dtypes", "feature", "status"} <= operators["operators"][0].keys()
    precision = stages["precision"]["result"]
    assert precision["reference"] == {"device": "cpu", "dtype": "float32"}
    for metrics in precision["dtypes"].values():
        assert {"max_abs_error", "mean_abs_error", "cosine_similarity", "top1_agreement",
                "kl_divergence", "passed", "first_divergent_layer"} <= metrics.keys()  # fmt: skip
    assert precision["twin"]["sizes"]

    broken = drop_release(tmp_path / "hub", "acme/broken", BROKEN_CONFIG)
    out = io.StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command("adapt", str(broken), "--wait", "--timeout", "120", stdout=out)
    assert exit_info.value.code == 1
    assert "fetch" in out.getvalue() and "not valid JSON" in out.getvalue()
