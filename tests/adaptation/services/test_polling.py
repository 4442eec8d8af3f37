"""Hub polling: releases and jobs from real configs through the real hub code paths, once per
revision; hub errors recorded on the watch with backoff; uploads in progress wait."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from adaptation.models import AdaptationJob, HubKind, JobStatus, ModelRelease, StageStatus
from adaptation.services.hub_polling import hub_watch_poll, hub_watches_poll
from tests.conftest import REALCONFIGS_DIR
from tests.factories import make_watch
from tests.helpers import run_queued_stages
from workers.runner import execute_stage_run

pytestmark = pytest.mark.django_db


def real(name: str) -> bytes:
    return (REALCONFIGS_DIR / f"{name}.json").read_bytes()


@pytest.fixture
def hf_watch(fake_hub, monkeypatch):
    # A watch may poll only a configured hub: the operator points HF_ENDPOINT at the fake Hub.
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    fake_hub.add_repo(
        "meta-llama/Llama-3.1-8B",
        {"config.json": real("meta-llama__Llama-3.1-8B"), "README.md": b"# Llama"},
        created_at=datetime(2024, 7, 23, 15, 0, tzinfo=UTC),
    )
    fake_hub.add_repo(
        "meta-llama/Llama-Guard-4",
        {"README.md": b"# uploading"},  # no config.json yet: not a release
    )
    return make_watch(
        name="meta", kind=HubKind.HUGGINGFACE, endpoint=fake_hub.url, author="meta-llama"
    )


def test_hub_poll_creates_one_release_and_job_per_revision(hf_watch, fake_hub, quick_measurements):
    [outcome] = hub_watches_poll(due_only=False)
    assert outcome.error == ""
    assert len(outcome.new_releases) == 1
    assert outcome.incomplete == [
        "meta-llama/Llama-Guard-4: no config.json yet (upload in progress?)"
    ]
    release = ModelRelease.objects.get()
    assert release.repo_id == "meta-llama/Llama-3.1-8B"
    assert len(release.revision) == 40
    assert release.published_at == datetime(2024, 7, 23, 15, 0, tzinfo=UTC)
    assert release.hub_endpoint == fake_hub.url.rstrip("/")

    job = run_queued_stages(AdaptationJob.objects.get(release=release))
    runs = {run.stage: run for run in job.stage_runs.all()}
    for stage in ("fetch", "analyze", "operators", "precision"):
        assert runs[stage].status == StageStatus.SUCCEEDED, runs[stage].error
    # The plan sizes the full 8B model against the cpu pool's one device, this machine: it
    # fits a machine of ~37 GiB or more, and elsewhere fails saying what would fit.
    plan = runs["plan"]
    if plan.status == StageStatus.FAILED:
        assert job.status == JobStatus.FAILED
        assert "does not fit 1 x cpu" in plan.error and plan.result["fits"] is False
        assert {runs[s].status for s in ("performance", "stability")} == {StageStatus.SKIPPED}
    else:
        assert plan.status == StageStatus.SUCCEEDED and job.status == JobStatus.SUCCEEDED
        assert runs["performance"].result["options"]["max_batch_size"] == 4
    analysis = runs["analyze"].result
    assert analysis["total_params"] == 8_030_261_248
    assert analysis["kv_cache_bytes_per_token"] == 131_072
    release.refresh_from_db()
    assert release.family and release.config["rope_scaling"]["rope_type"] == "llama3"

    hub_watches_poll(due_only=False)
    assert ModelRelease.objects.count() == 1  # seen again: nothing new

    new_config = json.loads(real("meta-llama__Llama-3.1-8B"))
    new_config["max_position_embeddings"] = 262144
    fake_hub.add_repo("meta-llama/Llama-3.1-8B", {"config.json": json.dumps(new_config).encode()})
    hub_watches_poll(due_only=False)
    assert ModelRelease.objects.filter(repo_id="meta-llama/Llama-3.1-8B").count() == 2
    assert AdaptationJob.objects.count() == 2


def test_rate_limit_is_recorded_and_backed_off(hf_watch, fake_hub):
    fake_hub.fail_next("/api/models", 429, {"Retry-After": "900"})
    before = timezone.now()
    [outcome] = hub_watches_poll(due_only=False)
    hf_watch.refresh_from_db()
    assert "429" in outcome.error or "rate" in outcome.error.lower()
    assert hf_watch.consecutive_failures == 1
    assert hf_watch.last_error.endswith("(next try in 900 s)")
    wait = (hf_watch.next_poll_at - before).total_seconds()
    assert 899 <= wait <= 905  # Retry-After beats the 600 s exponential backoff
    assert ModelRelease.objects.count() == 0

    [skipped] = hub_watches_poll(due_only=False)
    assert skipped.skipped_until == hf_watch.next_poll_at  # a manual round waits too

    [forced] = hub_watches_poll(due_only=False, force=True)
    hf_watch.refresh_from_db()
    assert forced.error == "" and len(forced.new_releases) == 1
    assert hf_watch.consecutive_failures == 0 and hf_watch.last_error == ""


def test_repeated_errors_back_off_exponentially_up_to_the_ceiling(settings, hf_watch, fake_hub):
    settings.DAY0_MAX_BACKOFF_S = 1000
    now = timezone.now()
    waits = []
    for step in range(3):
        fake_hub.fail_next("/api/models", 500)
        at = now + timedelta(hours=step)
        hub_watch_poll(watch=hf_watch, now=at)
        waits.append((hf_watch.next_poll_at - at).total_seconds())
    assert waits == [600, 1000, 1000]  # 300 s interval times 2, then 4 (capped at 1000)
    assert hf_watch.consecutive_failures == 3


def test_gated_repo_is_reported_on_the_watch(fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    fake_hub.add_repo("acme/secret", {"config.json": b"{}"}, gated=True)
    watch = make_watch(kind=HubKind.HUGGINGFACE, endpoint=fake_hub.url, repo_pattern="acme/*")
    fake_hub.fail_next("/api/models", 401, {"X-Error-Code": "GatedRepo"})
    [outcome] = hub_watches_poll(due_only=False)
    watch.refresh_from_db()
    assert "HF_TOKEN" in watch.last_error
    assert outcome.error


def test_upload_in_progress_is_picked_up_once_complete(tmp_path):
    folder = tmp_path / "hub" / "acme" / "big-moe"
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(real("Qwen__Qwen3-235B-A22B-Instruct-2507"))
    index = {
        "metadata": {"total_size": 16},
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        },
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 8)
    make_watch(endpoint=str(tmp_path / "hub"))

    [outcome] = hub_watches_poll(due_only=False)
    assert outcome.new_releases == []
    assert "model-00002-of-00002.safetensors" in outcome.incomplete[0]

    (folder / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 8)
    [outcome] = hub_watches_poll(due_only=False)
    assert len(outcome.new_releases) == 1
    assert ModelRelease.objects.get().repo_id == "acme/big-moe"


def test_transient_hub_error_in_a_stage_is_retried_then_succeeds(hf_watch, fake_hub):
    hub_watches_poll(due_only=False)
    job = AdaptationJob.objects.get()
    fetch = job.stage_runs.get(stage="fetch")
    fake_hub.fail_next("/api/models/meta-llama", 503)
    outcome = execute_stage_run(fetch.pk)
    assert outcome.status == "retry"
    fetch.refresh_from_db()
    assert (fetch.status, fetch.retries) == (StageStatus.QUEUED, 1)
    assert "retrying" in fetch.log

    assert execute_stage_run(fetch.pk).status == "succeeded"
    fetch.refresh_from_db()
    assert fetch.status == StageStatus.SUCCEEDED and fetch.attempt == 1


def test_a_broken_watch_does_not_stop_the_round(tmp_path, fake_hub):
    from adaptation.models import AcceleratorPool

    off = AcceleratorPool.objects.create(name="off", backend="cpu", queue="pool.off", enabled=False)
    make_watch(name="a-disabled-pool", endpoint=str(tmp_path), pool=off)
    make_watch(name="b-missing-root", endpoint=str(tmp_path / "nope"))
    folder = tmp_path / "good" / "acme" / "llama"
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(real("meta-llama__Llama-3.1-8B"))
    make_watch(name="c-good", endpoint=str(tmp_path / "good"))

    outcomes = {o.watch: o for o in hub_watches_poll(due_only=False)}
    assert "pool 'off' is disabled" in outcomes["a-disabled-pool"].error
    assert outcomes["b-missing-root"].error
    assert outcomes["c-good"].new_releases and not outcomes["c-good"].error


def test_watch_job_options_reach_the_jobs_it_starts(tmp_path):
    """A watch's stage options (checked by the stages) become the options of its jobs."""
    root = tmp_path / "hub"
    (root / "acme" / "m").mkdir(parents=True)
    (root / "acme" / "m" / "config.json").write_bytes(real("openai__gpt-oss-20b"))
    watch = make_watch(endpoint=str(root), job_options={"plan": {"context_tokens": 8192}})
    watch.full_clean()

    hub_watch_poll(watch=watch)

    job = AdaptationJob.objects.get()
    assert job.options["plan"]["context_tokens"] == 8192


def test_watch_refuses_job_options_a_stage_does_not_take(tmp_path):
    from django.core.exceptions import ValidationError

    watch = make_watch(endpoint=str(tmp_path), job_options={"plan": {"context_tokns": 8192}})
    with pytest.raises(ValidationError) as caught:
        watch.full_clean()
    assert "context_tokns" in str(caught.value.message_dict["job_options"])
