"""Coalescing Hub uploads (`adaptation.webhooks.uploads`): many deliveries, one job at the
last revision once the repo is quiet and the upload complete, checked on the local fake Hub."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import override_settings

from adaptation.models import (
    AdaptationJob,
    DeliveryVerdict,
    ModelRelease,
    PendingUpload,
    Trigger,
    WebhookDelivery,
)
from adaptation.webhooks import uploads
from adaptation.webhooks.uploads import pending_upload_settle, pending_uploads_sweep
from engine.hubs import HubSpec
from engine.hubs.huggingface import HuggingFaceSource
from tests.adaptation.webhooks.conftest import REPO, hub_body, post_hub
from tests.factories import make_job, make_release

pytestmark = pytest.mark.django_db

CONFIG = json.dumps({"model_type": "llama", "hidden_size": 64}).encode()
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEX = json.dumps(
    {"metadata": {"total_size": 8}, "weight_map": {"a.weight": SHARDS[0], "b.weight": SHARDS[1]}}
).encode()


def commit(fake_hub, *names: str) -> str:
    """Push a commit of `REPO` holding `names` (config, index, shards); returns its sha."""
    available = {
        ".gitattributes": b"*.safetensors filter=lfs\n",
        "config.json": CONFIG,
        "model.safetensors.index.json": INDEX,
        SHARDS[0]: b"\0" * 4,
        SHARDS[1]: b"\1" * 4,
    }
    return fake_hub.add_repo(REPO, {name: available[name] for name in (".gitattributes", *names)})


@pytest.fixture
def hub_env(monkeypatch, fake_hub):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    return fake_hub


def deliver(client, endpoint, sha: str):
    response = post_hub(client, endpoint, hub_body("repo_content_update_no_refs", headSha=sha))
    assert response.status_code == 202, response.json()
    return response


def after_quiet(upload: PendingUpload, extra_s: float = 1):
    return upload.last_event_at + timedelta(seconds=upload.endpoint.quiet_period_s + extra_s)


def test_three_deliveries_make_one_upload_and_one_job_at_the_last_sha(
    client, hub_env, hub_endpoint, hub_watch, sent
):
    shas = [
        commit(hub_env, "config.json"),
        commit(hub_env, "config.json", "model.safetensors.index.json", SHARDS[0]),
        commit(hub_env, "config.json", "model.safetensors.index.json", *SHARDS),
    ]
    for sha in shas:
        deliver(client, hub_endpoint, sha)

    upload = PendingUpload.objects.get()
    assert (upload.deliveries, upload.revision, upload.hub_endpoint) == (3, shas[2], hub_env.url)
    outcome = pending_upload_settle(pending_upload_id=upload.pk, now=after_quiet(upload))

    assert outcome.status == "started"
    job = AdaptationJob.objects.get()
    assert outcome.job_id == job.pk
    assert job.release.revision == shas[2]  # pinned to the LAST sha, not the first
    assert (job.release.repo_id, job.release.hub_endpoint) == (REPO, hub_env.url)
    assert job.trigger == Trigger.WEBHOOK and job.release.found_by == Trigger.WEBHOOK
    assert job.release.watch == hub_watch and job.pool == hub_watch.pool
    assert job.release.published_at is not None  # the repo's createdAt, from the hub
    upload.refresh_from_db()
    assert (upload.status, upload.release, upload.job) == ("started", job.release, job)
    # Every delivery of the upload now points at its one job.
    assert set(WebhookDelivery.objects.values_list("job", flat=True)) == {job.pk}
    assert len(sent.stages) == 0  # the first stage is queued on commit (test transaction)

    again = pending_upload_settle(pending_upload_id=upload.pk, now=after_quiet(upload, 300))
    assert again.status == "started" and again.retry_in_s is None
    assert AdaptationJob.objects.count() == 1


def test_the_first_stage_is_queued_when_the_settle_commits(
    hub_env, hub_endpoint, hub_watch, sent, client, django_capture_on_commit_callbacks
):
    sha = commit(hub_env, "config.json", "model.safetensors.index.json", *SHARDS)
    deliver(client, hub_endpoint, sha)
    upload = PendingUpload.objects.get()
    with django_capture_on_commit_callbacks(execute=True):
        pending_upload_settle(pending_upload_id=upload.pk, now=after_quiet(upload))
    job = AdaptationJob.objects.get()
    assert [m["stage"] for m in sent.stages] == ["fetch"]
    assert sent.stages[0]["queue"] == job.pool.queue


def test_settle_before_the_quiet_period_reschedules_for_the_remainder(
    client, hub_env, hub_endpoint, hub_watch, sent
):
    deliver(client, hub_endpoint, commit(hub_env, "config.json"))
    upload = PendingUpload.objects.get()
    hub_env.clear_log()

    outcome = pending_upload_settle(
        pending_upload_id=upload.pk, now=upload.last_event_at + timedelta(seconds=45)
    )

    assert outcome.status == "waiting"
    assert outcome.retry_in_s == pytest.approx(15)
    assert hub_env.requests == []  # no hub call while deliveries may still come
    upload.refresh_from_db()
    assert (upload.checks, upload.last_check_at) == (0, None)
    assert AdaptationJob.objects.count() == 0


@override_settings(DAY0_WEBHOOK_SETTLE_RECHECK_S=120)
def test_an_incomplete_upload_waits_then_its_completing_commit_starts_the_job(
    client, hub_env, hub_endpoint, hub_watch, sent
):
    partial = commit(hub_env, "config.json", "model.safetensors.index.json", SHARDS[0])
    deliver(client, hub_endpoint, partial)
    upload = PendingUpload.objects.get()
    now = after_quiet(upload)

    outcome = pending_upload_settle(pending_upload_id=upload.pk, now=now)

    assert outcome.status == "waiting" and outcome.retry_in_s == 120
    assert SHARDS[1] in outcome.reason and "not uploaded yet" in outcome.reason
    upload.refresh_from_db()
    assert upload.status == "waiting" and upload.checks == 1
    assert SHARDS[1] in upload.last_check_error
    assert AdaptationJob.objects.count() == 0

    # The missing shard arrives as the next commit, announced by its own delivery.
    complete = commit(hub_env, "config.json", "model.safetensors.index.json", *SHARDS)
    deliver(client, hub_endpoint, complete)
    upload.refresh_from_db()
    assert (upload.revision, upload.deliveries) == (complete, 2)
    outcome = pending_upload_settle(pending_upload_id=upload.pk, now=after_quiet(upload, 130))

    assert outcome.status == "started"
    assert AdaptationJob.objects.get().release.revision == complete
    upload.refresh_from_db()
    assert (upload.checks, upload.last_check_error) == (2, "")


def test_a_hub_error_is_recorded_and_retried(client, hub_env, hub_endpoint, hub_watch, sent):
    deliver(client, hub_endpoint, commit(hub_env, "config.json"))
    upload = PendingUpload.objects.get()
    hub_env.fail_next("/api/models", 429, {"Retry-After": "300"})

    outcome = pending_upload_settle(pending_upload_id=upload.pk, now=after_quiet(upload))

    assert outcome.status == "waiting"
    assert outcome.retry_in_s == 300  # the hub's Retry-After, over the 60 s recheck
    upload.refresh_from_db()
    assert "rate limited" in upload.last_check_error
    assert AdaptationJob.objects.count() == 0


@override_settings(DAY0_WEBHOOK_SETTLE_GIVE_UP_S=3600)
def test_an_upload_still_incomplete_after_the_give_up_time_is_abandoned(
    client, hub_env, hub_endpoint, hub_watch, sent
):
    deliver(client, hub_endpoint, commit(hub_env, ".gitattributes"))
    upload = PendingUpload.objects.get()

    outcome = pending_upload_settle(
        pending_upload_id=upload.pk, now=upload.last_event_at + timedelta(seconds=3601)
    )

    assert outcome.status == "abandoned" and outcome.retry_in_s is None
    upload.refresh_from_db()
    assert upload.status == "abandoned"
    assert "no config.json yet" in upload.last_check_error
    assert AdaptationJob.objects.count() == 0
    # A later delivery for the repo opens a new upload (the old one no longer waits).
    deliver(client, hub_endpoint, commit(hub_env, "config.json"))
    assert PendingUpload.objects.filter(status="waiting").count() == 1


def test_a_revision_the_poller_recorded_meanwhile_is_a_duplicate(
    client, hub_env, hub_endpoint, hub_watch, sent
):
    sha = commit(hub_env, "config.json")
    deliver(client, hub_endpoint, sha)
    upload = PendingUpload.objects.get()
    polled = make_job(release=make_release(repo_id=REPO, revision=sha, hub_endpoint=hub_env.url))

    outcome = pending_upload_settle(pending_upload_id=upload.pk, now=after_quiet(upload))

    assert (outcome.status, outcome.job_id) == ("duplicate", polled.pk)
    assert AdaptationJob.objects.count() == 1
    upload.refresh_from_db()
    assert (upload.status, upload.job) == ("duplicate", polled)


def test_the_same_revision_announced_again_after_the_job_makes_no_second_job(
    client, hub_env, hub_endpoint, hub_watch, sent
):
    sha = commit(hub_env, "config.json")
    deliver(client, hub_endpoint, sha)
    upload = PendingUpload.objects.get()
    pending_upload_settle(pending_upload_id=upload.pk, now=after_quiet(upload))
    job = AdaptationJob.objects.get()

    response = post_hub(client, hub_endpoint, hub_body("repo_content_update_no_refs", headSha=sha))

    assert response.status_code == 200
    assert (response.json()["verdict"], response.json()["job"]) == ("duplicate", job.pk)
    assert PendingUpload.objects.count() == 1 and AdaptationJob.objects.count() == 1


def test_a_delivery_during_the_check_stops_the_start(
    client, hub_env, hub_endpoint, hub_watch, sent, monkeypatch
):
    first = commit(hub_env, "config.json")
    deliver(client, hub_endpoint, first)
    upload = PendingUpload.objects.get()
    later = commit(hub_env, "config.json", "model.safetensors.index.json", *SHARDS)
    checked = HuggingFaceSource.release_at

    def release_at_while_a_delivery_lands(self, repo_id, revision):
        candidate = checked(self, repo_id, revision)
        deliver(client, hub_endpoint, later)  # lands between the check and the start
        return candidate

    monkeypatch.setattr(HuggingFaceSource, "release_at", release_at_while_a_delivery_lands)
    outcome = pending_upload_settle(pending_upload_id=upload.pk, now=after_quiet(upload))

    assert outcome.status == "waiting" and outcome.retry_in_s == 60
    assert AdaptationJob.objects.count() == 0 and ModelRelease.objects.count() == 0
    upload.refresh_from_db()
    assert (upload.status, upload.revision) == ("waiting", later)


def test_a_second_settle_right_after_a_check_stops(client, hub_env, hub_endpoint, hub_watch, sent):
    deliver(client, hub_endpoint, commit(hub_env, ".gitattributes"))
    upload = PendingUpload.objects.get()
    now = after_quiet(upload)
    assert pending_upload_settle(pending_upload_id=upload.pk, now=now).status == "waiting"
    hub_env.clear_log()

    duplicate = pending_upload_settle(pending_upload_id=upload.pk, now=now + timedelta(seconds=5))

    assert duplicate.status == "skipped" and duplicate.retry_in_s is None
    assert hub_env.requests == []  # one check chain per upload


def test_the_task_reschedules_itself_when_told(
    client, hub_env, hub_endpoint, hub_watch, sent, django_capture_on_commit_callbacks
):
    from workers.tasks import settle_upload

    deliver(client, hub_endpoint, commit(hub_env, "config.json"))
    upload = PendingUpload.objects.get()
    with django_capture_on_commit_callbacks(execute=True):
        status = settle_upload.run(upload.pk)  # the quiet period has not passed yet
    assert status == "waiting"
    assert sent.settles[-1]["args"] == [upload.pk]
    assert 55 < sent.settles[-1]["countdown"] <= 60


def test_the_sweep_requeues_only_uploads_whose_chain_was_lost(
    client, hub_env, hub_endpoint, hub_watch, sent, django_capture_on_commit_callbacks
):
    deliver(client, hub_endpoint, commit(hub_env, "config.json"))
    fresh = PendingUpload.objects.get()
    lost = PendingUpload.objects.create(
        endpoint=hub_endpoint.row,
        pool=hub_watch.pool,
        hub_endpoint=hub_env.url,
        repo_id="acme-ai/Other",
        revision="f" * 40,
        first_event_at=fresh.last_event_at - timedelta(hours=1),
        last_event_at=fresh.last_event_at - timedelta(hours=1),
    )
    checked_recently = PendingUpload.objects.create(
        endpoint=hub_endpoint.row,
        pool=hub_watch.pool,
        hub_endpoint=hub_env.url,
        repo_id="acme-ai/Third",
        revision="e" * 40,
        first_event_at=fresh.last_event_at - timedelta(hours=1),
        last_event_at=fresh.last_event_at - timedelta(hours=1),
        last_check_at=fresh.last_event_at - timedelta(seconds=30),
    )
    sent.settles.clear()
    with django_capture_on_commit_callbacks(execute=True):
        queued = pending_uploads_sweep(now=fresh.last_event_at + timedelta(seconds=10))

    assert queued == [lost.pk]
    assert sent.settles == [{"args": [lost.pk], "countdown": 0.0}]
    assert checked_recently.pk not in queued and fresh.pk not in queued


def test_coalescing_deliveries_are_linked_only_to_their_own_upload(
    client, hub_env, hub_endpoint, hub_watch, sent
):
    old = commit(hub_env, ".gitattributes")
    deliver(client, hub_endpoint, old)
    first_upload = PendingUpload.objects.get()
    PendingUpload.objects.filter(pk=first_upload.pk).update(status="abandoned")
    sha = commit(hub_env, "config.json")
    deliver(client, hub_endpoint, sha)
    upload = PendingUpload.objects.get(status="waiting")

    pending_upload_settle(pending_upload_id=upload.pk, now=after_quiet(upload))

    job = AdaptationJob.objects.get()
    linked = dict(WebhookDelivery.objects.values_list("revision", "job"))
    assert linked == {old: None, sha: job.pk}
    assert set(WebhookDelivery.objects.values_list("verdict", flat=True)) == {
        DeliveryVerdict.COALESCING
    }


def test_release_at_reads_a_repo_at_one_revision(hub_env):
    partial = commit(hub_env, "config.json", "model.safetensors.index.json", SHARDS[0])
    complete = commit(hub_env, "config.json", "model.safetensors.index.json", *SHARDS)
    source = HuggingFaceSource(HubSpec(kind="huggingface", endpoint=hub_env.url))

    at_partial = source.release_at(REPO, partial)
    assert (at_partial.revision, at_partial.complete) == (partial, False)
    assert SHARDS[1] in at_partial.reason
    at_complete = source.release_at(REPO, complete)
    assert (at_complete.revision, at_complete.complete, at_complete.reason) == (complete, True, "")


def test_record_updates_the_waiting_upload_after_losing_an_insert_race(hub_endpoint, hub_watch):
    """The insert race's loser (IntegrityError on the partial unique constraint) moves the
    winner's row on instead of failing."""
    from django.utils import timezone

    now = timezone.now()
    kwargs = dict(
        endpoint=hub_endpoint.row,
        watch=hub_watch,
        pool=hub_watch.pool,
        hub_endpoint="https://huggingface.co",
        repo_id=REPO,
    )
    winner = PendingUpload.objects.create(**kwargs, revision="a" * 40)
    real_update = uploads.QuerySet.update
    calls = {"n": 0}

    def update_misses_once(self, **fields):
        calls["n"] += 1
        if calls["n"] == 1 and self.model is PendingUpload:
            return 0  # as if the winner had not committed yet when we looked
        return real_update(self, **fields)

    import unittest.mock

    with unittest.mock.patch.object(uploads.QuerySet, "update", update_misses_once):
        upload, created = uploads.pending_upload_record(**kwargs, revision="b" * 40, at=now)

    assert created is False and upload.pk == winner.pk
    assert (upload.revision, upload.deliveries) == ("b" * 40, 2)


def test_the_job_gets_the_watch_job_options(client, hub_env, hub_endpoint, hub_watch, sent):
    hub_watch.job_options = {"plan": {"context_tokens": 8192}}
    hub_watch.save()
    deliver(client, hub_endpoint, commit(hub_env, "config.json"))
    upload = PendingUpload.objects.get()

    assert pending_upload_settle(pending_upload_id=upload.pk, now=after_quiet(upload)).job_id
    assert AdaptationJob.objects.get().options["plan"]["context_tokens"] == 8192


def test_refused_watch_options_wait_until_the_watch_is_fixed(
    client, hub_env, hub_endpoint, hub_watch, sent
):
    # Saved without the admin's check (`HubWatch.clean`): the stages refuse it.
    hub_watch.job_options = {"fetch": {"x": 1}}
    hub_watch.save()
    deliver(client, hub_endpoint, commit(hub_env, "config.json"))
    upload = PendingUpload.objects.get()
    now = after_quiet(upload)

    waiting = pending_upload_settle(pending_upload_id=upload.pk, now=now)

    assert (waiting.status, waiting.retry_in_s) == ("waiting", 60)
    assert "watch 'acme' has job options the stages refuse" in waiting.reason
    assert AdaptationJob.objects.count() == 0
    hub_watch.job_options = {}
    hub_watch.save()
    started = pending_upload_settle(pending_upload_id=upload.pk, now=now + timedelta(seconds=60))
    assert started.status == "started" and AdaptationJob.objects.count() == 1
