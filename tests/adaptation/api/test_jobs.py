"""/api/v1/jobs/: lists, detail with stages, create, cancel and re-run, with the error shape
of the domain's refusals."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from adaptation.models import AdaptationJob, StageRun, Trigger
from tests.adaptation.api.conftest import results
from tests.factories import cpu_pool, make_job, make_release

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs/"


def ids(response) -> list[int]:
    return [row["id"] for row in results(response)]


def test_list_newest_first_with_filters(cast, seeded):
    api = cast.api("mona")
    all_ids = ids(api.get(URL))
    assert all_ids[:4] == [
        seeded.deepseek_queued.pk,
        seeded.qwen_failed.pk,
        seeded.llama_running.pk,
        seeded.llama_done.pk,
    ]
    assert len(all_ids) == 5
    assert ids(api.get(URL, {"status": "failed"})) == [seeded.qwen_failed.pk]
    assert set(ids(api.get(URL, {"pool": "h200"}))) == {
        seeded.qwen_failed.pk,
        seeded.deepseek_queued.pk,
        all_ids[4],
    }
    assert ids(api.get(URL, {"release": seeded.llama.pk})) == [
        seeded.llama_running.pk,
        seeded.llama_done.pk,
    ]
    assert ids(api.get(URL, {"release": seeded.llama.pk, "ordering": "created_at"})) == [
        seeded.llama_done.pk,
        seeded.llama_running.pk,
    ]
    assert ids(api.get(URL, {"trigger": "api"})) == []


def test_list_rows_carry_the_latest_attempt_of_each_stage(cast, seeded):
    row = next(r for r in results(cast.api("eli").get(URL)) if r["id"] == seeded.llama_running.pk)
    assert row["repo_id"] == "meta-llama/Llama-3.1-8B"
    assert row["pool"] == "cpu"
    assert row["status"] == "running"
    assert row["stage_names"] == ["fetch", "analyze"]
    assert row["stages"] == [
        {"stage": "fetch", "status": "succeeded", "attempt": 1},
        {"stage": "analyze", "status": "running", "attempt": 1},
    ]


def test_detail_has_each_stages_latest_attempt(cast, seeded):
    job = seeded.qwen_failed
    body = cast.api("mona").get(f"{URL}{job.pk}/").json()
    fetch, analyze = body["stages"]
    assert fetch["stage"] == "fetch" and fetch["status"] == "failed"
    assert fetch["error"] == "config.json: line 3 column 5: Expecting value"
    assert fetch["worker_host"] == "worker-1"
    assert fetch["finished_at"] is not None
    assert analyze["status"] == "skipped" and analyze["attempt"] == 1
    done = cast.api("mona").get(f"{URL}{seeded.llama_done.pk}/").json()
    # Scalars of the result only; the stage run's own detail has the whole result.
    assert done["stages"][0]["result_summary"] == {"files": 4}
    assert done["stages"][1]["result_summary"] == {
        "family": "llama",
        "architecture": "LlamaForCausalLM",
        "num_layers": 32,
    }


def test_engineer_creates_a_job_for_a_release(cast, seeded, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as sent:
        response = cast.api("eli").post(
            URL,
            {
                "release": seeded.qwen.pk,
                "pool": "cpu",
                "stages": ["fetch", "analyze"],
                "options": {},
            },
            format="json",
        )
    assert response.status_code == 201, response.content
    body = response.json()
    job = AdaptationJob.objects.get(pk=body["id"])
    assert job.trigger == Trigger.API and body["trigger"] == "api"
    assert job.requested_by == cast.eli and body["requested_by"] == "eli"
    assert job.release == seeded.qwen and job.pool.name == "cpu"
    assert [(s["stage"], s["status"]) for s in body["stages"]] == [
        ("fetch", "queued"),
        ("analyze", "pending"),
    ]
    assert len(sent) == 1  # the first stage goes to the pool's queue after commit


def test_create_defaults_to_every_stage_on_the_default_pool(cast, seeded, settings):
    settings.DAY0_DEFAULT_POOL = "h200"
    response = cast.api("ada").post(URL, {"release": seeded.llama.pk}, format="json")
    assert response.status_code == 201
    job = AdaptationJob.objects.get(pk=response.json()["id"])
    assert job.pool == seeded.h200
    from engine.registry import stage_names

    assert job.stages == stage_names()


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"pool": "cpu"}, "release", "This field is required."),
        ({"release": 999999}, "release", 'Invalid pk "999999" - object does not exist.'),
        ({"release": "RELEASE", "stages": []}, "stages", "This list may not be empty."),
    ],
)
def test_create_refuses_bad_input_field_by_field(cast, seeded, body, field, message):
    body = {k: (seeded.qwen.pk if v == "RELEASE" else v) for k, v in body.items()}
    response = cast.api("eli").post(URL, body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"][field] == [message]
    assert AdaptationJob.objects.count() == 5


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"pool": "nope"}, "pool", "No enabled pool 'nope'; enabled pools: cpu, h200."),
        ({"stages": ["fetch", "dance"]}, "stages", "Unknown stage 'dance'; known stages: fetch,"),
        (
            {"stages": ["analyze"]},
            "stages",
            "analyze needs fetch: add what it needs to the stage list, or leave the list out "
            "for every stage.",
        ),
        (
            {"stages": ["fetch"], "options": {"plan": {"context_tokens": 10}}},
            "options",
            "Options for stage 'plan', which this job does not run",
        ),
    ],
)
def test_create_refusals_of_the_domain_name_their_field(cast, seeded, extra, field, message):
    response = cast.api("eli").post(URL, {"release": seeded.qwen.pk, **extra}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert list(error["fields"]) == [field]
    assert error["fields"][field][0].startswith(message)
    assert AdaptationJob.objects.count() == 5


def test_an_unknown_default_pool_is_a_pool_error(cast, seeded, settings):
    settings.DAY0_DEFAULT_POOL = "gone"
    response = cast.api("eli").post(URL, {"release": seeded.qwen.pk}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {
        "pool": ["No enabled pool 'gone'; enabled pools: cpu, h200."]
    }


@pytest.mark.parametrize("release", [3.7, 1.0, True, "1.5", "", [1], {"id": 1}, 2**63])
def test_a_release_id_must_be_a_whole_number(cast, seeded, release):
    """`3.7` is not release 3 (nor `true` release 1): the database would read them so."""
    response = cast.api("eli").post(URL, {"release": release, "pool": "cpu"}, format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["release"]
    assert AdaptationJob.objects.count() == 5


def test_a_release_id_may_be_sent_as_its_digits(cast, seeded):
    response = cast.api("eli").post(URL, {"release": str(seeded.qwen.pk)}, format="json")
    assert response.status_code == 201
    assert AdaptationJob.objects.get(pk=response.json()["id"]).release == seeded.qwen


def test_json_nested_too_deeply_is_a_400_parse_error(cast, seeded):
    body = "[" * 100_000 + "]" * 100_000
    response = cast.api("eli").post(URL, body, content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {
        "error": {"code": "parse_error", "message": "JSON parse error - nested too deeply."}
    }
    assert AdaptationJob.objects.count() == 5


def test_a_job_for_a_release_on_a_pool_where_one_runs_is_a_409_naming_it(cast, seeded, settings):
    settings.DAY0_PUBLIC_URL = "https://day0.example.org/"  # where the page links point
    running = seeded.llama_running  # on cpu; llama_done, also on cpu, has ended
    response = cast.api("eli").post(
        URL, {"release": seeded.llama.pk, "pool": "cpu", "stages": ["fetch"]}, format="json"
    )
    assert response.status_code == 409, response.content
    assert response.json() == {
        "error": {
            "code": "duplicate_job",
            "message": f"Job {running.pk} for meta-llama/Llama-3.1-8B@"
            f"{seeded.llama.revision[:12]} on pool cpu is still running. "
            'Send "allow_duplicate": true to start another anyway.',
            "job": {
                "id": running.pk,
                "status": "running",
                "url": f"http://testserver/api/v1/jobs/{running.pk}/",
                "page_url": f"https://day0.example.org/releases/{seeded.llama.pk}/#job-{running.pk}",
            },
        }
    }
    assert AdaptationJob.objects.count() == 5


def test_a_pending_job_refuses_a_second_one_too(cast, seeded):
    pending = make_job(release=seeded.qwen, pool=seeded.cpu)
    assert pending.status == "pending"
    response = cast.api("eli").post(URL, {"release": seeded.qwen.pk}, format="json")
    assert response.status_code == 409
    assert response.json()["error"]["job"]["id"] == pending.pk
    assert response.json()["error"]["job"]["status"] == "pending"


def test_allow_duplicate_starts_a_second_job_while_one_runs(cast, seeded):
    body = {"release": seeded.llama.pk, "pool": "cpu", "allow_duplicate": True}
    response = cast.api("eli").post(URL, body, format="json")
    assert response.status_code == 201, response.content
    second = AdaptationJob.objects.get(pk=response.json()["id"])
    assert second.release == seeded.llama and second.pool == seeded.cpu
    assert (
        AdaptationJob.objects.filter(release=seeded.llama, pool=seeded.cpu)
        .exclude(status__in=["succeeded", "failed", "cancelled"])
        .count()
        == 2
    )


def test_allow_duplicate_false_is_the_default(cast, seeded):
    body = {"release": seeded.llama.pk, "pool": "cpu", "allow_duplicate": False}
    assert cast.api("eli").post(URL, body, format="json").status_code == 409


def test_a_job_that_has_ended_is_no_duplicate(cast, seeded):
    api = cast.api("eli")
    # qwen's only job on h200 failed.
    response = api.post(URL, {"release": seeded.qwen.pk, "pool": "h200"}, format="json")
    assert response.status_code == 201, response.content
    # Once the running llama job on cpu is cancelled, a new one starts.
    assert api.post(f"{URL}{seeded.llama_running.pk}/cancel/").status_code == 200
    response = api.post(URL, {"release": seeded.llama.pk, "pool": "cpu"}, format="json")
    assert response.status_code == 201, response.content


def test_a_job_running_on_another_pool_is_no_duplicate(cast, seeded):
    response = cast.api("eli").post(
        URL, {"release": seeded.llama.pk, "pool": "h200"}, format="json"
    )  # llama_running is on cpu
    assert response.status_code == 201, response.content
    assert AdaptationJob.objects.get(pk=response.json()["id"]).pool == seeded.h200


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite has no row locks (it serialises writes)"
)
def test_the_duplicate_check_locks_the_release_row(cast, seeded):
    """Two concurrent submissions: the second waits on the release row until the first
    commits, then sees its job."""
    with CaptureQueriesContext(connection) as queries:
        response = cast.api("eli").post(URL, {"release": seeded.qwen.pk}, format="json")
    assert response.status_code == 201
    locks = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].endswith("FOR UPDATE") and '"adaptation_modelrelease"' in q["sql"]
    ]
    assert len(locks) == 1, locks


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite has no row locks (it serialises writes)"
)
@pytest.mark.django_db(transaction=True)
def test_of_two_concurrent_submissions_the_second_waits_and_is_refused(monkeypatch):
    """The first submission holds its transaction open after creating its job; the second,
    in another connection, must wait on the release row's lock, then see that job."""
    from adaptation.services import queueing
    from adaptation.services.jobs import DuplicateJobError, job_create

    monkeypatch.setattr(queueing, "stage_message_send", lambda **kw: None)
    release, pool = make_release(), cpu_pool()
    created, go_on = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def submit(name: str, *, hold: bool) -> None:
        try:
            with transaction.atomic():
                outcome[name] = job_create(
                    release=release,
                    pool=pool,
                    trigger="api",
                    stages=["fetch"],
                    allow_duplicate=False,
                )
                if hold:
                    created.set()
                    go_on.wait(10)
        except DuplicateJobError as exc:
            outcome[name] = exc
        finally:
            connection.close()

    first = threading.Thread(target=submit, args=("first",), kwargs={"hold": True})
    first.start()
    assert created.wait(10)
    second = threading.Thread(target=submit, args=("second",), kwargs={"hold": False})
    second.start()
    second.join(0.5)
    assert second.is_alive()  # waiting on the lock the first holds
    go_on.set()
    first.join(10)
    second.join(10)
    assert isinstance(outcome["first"], AdaptationJob)
    assert isinstance(outcome["second"], DuplicateJobError)
    assert outcome["second"].job.pk == outcome["first"].pk
    assert AdaptationJob.objects.count() == 1


def test_cancel_a_running_job(cast, seeded, monkeypatch):
    job = seeded.llama_running
    response = cast.api("eli").post(f"{URL}{job.pk}/cancel/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "cancelled"
    assert [(s["stage"], s["status"], s["error"]) for s in body["stages"]] == [
        ("fetch", "succeeded", ""),
        ("analyze", "cancelled", "Cancelled by eli."),
    ]
    job.refresh_from_db()
    assert job.status == "cancelled" and job.finished_at is not None


def test_cancel_a_finished_job_is_a_409(cast, seeded):
    response = cast.api("eli").post(f"{URL}{seeded.llama_done.pk}/cancel/")
    assert response.status_code == 409
    assert response.json() == {
        "error": {
            "code": "conflict",
            "message": f"Job {seeded.llama_done.pk} has already succeeded; "
            "there is nothing to cancel.",
        }
    }


def test_rerun_a_stage(cast, seeded):
    job = seeded.qwen_failed
    response = cast.api("eli").post(f"{URL}{job.pk}/stages/fetch/rerun/")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "running"
    assert [(s["stage"], s["attempt"], s["status"]) for s in body["stages"]] == [
        ("fetch", 2, "queued"),
        ("analyze", 2, "pending"),
    ]
    assert StageRun.objects.filter(job=job).count() == 4


def test_rerun_refusals(cast, seeded):
    api = cast.api("eli")
    running = seeded.llama_running
    response = api.post(f"{URL}{running.pk}/stages/fetch/rerun/")
    assert response.status_code == 409
    assert response.json()["error"] == {
        "code": "conflict",
        "message": f"Job {running.pk} is still running (analyze); wait for it.",
    }
    response = api.post(f"{URL}{seeded.qwen_failed.pk}/stages/analyze/rerun/")
    assert response.status_code == 409
    assert "analyze needs fetch to succeed first" in response.json()["error"]["message"]
    response = api.post(f"{URL}{seeded.qwen_failed.pk}/stages/dance/rerun/")
    assert response.status_code == 404
    assert response.json()["error"]["message"] == (
        f"Job {seeded.qwen_failed.pk} has no stage 'dance'; it has fetch, analyze."
    )
    assert api.post(f"{URL}999999/cancel/").status_code == 404


def test_ordering_by_a_shared_value_keeps_one_order_newest_id_first(cast, seeded):
    rows = results(cast.api("mona").get(URL, {"ordering": "status"}))
    pairs = [(r["status"], r["id"]) for r in rows]
    assert pairs == sorted(pairs, key=lambda p: (p[0], -p[1]))
    assert [p[0] for p in pairs] == ["failed", "running", "running", "succeeded", "succeeded"]
