"""/api/v1/releases/: filters, search, ordering, pagination and the detail's analysis."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from adaptation.models import StageRun
from tests.adaptation.api.conftest import results

pytestmark = pytest.mark.django_db

URL = "/api/v1/releases/"


def repo_ids(response) -> list[str]:
    return [row["repo_id"] for row in results(response)]


def test_list_is_newest_first_with_the_newest_jobs_status(cast, seeded):
    rows = results(cast.api("mona").get(URL))
    assert [(r["repo_id"], r["status"], r["latest_job"]) for r in rows] == [
        ("deepseek-ai/DeepSeek-V3", "running", seeded.deepseek_queued.pk),
        ("Qwen/Qwen2.5-72B-Instruct", "failed", seeded.qwen_failed.pk),
        ("meta-llama/Llama-3.1-8B", "running", seeded.llama_running.pk),
    ]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("org=Qwen", ["Qwen/Qwen2.5-72B-Instruct"]),
        ("org=meta-llama", ["meta-llama/Llama-3.1-8B"]),
        ("org=meta", []),  # the whole org, not a prefix of it
        ("org=qwen", ["Qwen/Qwen2.5-72B-Instruct"]),  # ignoring case, as watches match
        ("org=META-LLAMA/", ["meta-llama/Llama-3.1-8B"]),
        ("status=failed", ["Qwen/Qwen2.5-72B-Instruct"]),
        ("status=running", ["deepseek-ai/DeepSeek-V3", "meta-llama/Llama-3.1-8B"]),
        ("status=succeeded", []),  # llama's newest job runs again
        ("family=qwen2", ["Qwen/Qwen2.5-72B-Instruct"]),
        ("hub=mirror", []),
        ("search=deepseek", ["deepseek-ai/DeepSeek-V3"]),
        (
            "ordering=discovered_at",
            ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-72B-Instruct", "deepseek-ai/DeepSeek-V3"],
        ),
        ("org=meta-llama&status=running", ["meta-llama/Llama-3.1-8B"]),
    ],
)
def test_filters_search_and_ordering(cast, seeded, query, expected):
    assert repo_ids(cast.api("mona").get(f"{URL}?{query}")) == expected


def test_since_takes_an_iso_time(cast, seeded):
    since = (timezone.now() - timedelta(hours=15)).isoformat()
    response = cast.api("eli").get(URL, {"since": since})
    assert repo_ids(response) == ["deepseek-ai/DeepSeek-V3"]
    since = (timezone.now() - timedelta(hours=25)).isoformat()
    assert len(results(cast.api("eli").get(URL, {"since": since}))) == 2


@pytest.mark.parametrize(
    ("since", "expected"),
    [
        # An offset PostgreSQL refuses is read as the same instant in UTC (found by the
        # schema test on PostgreSQL).
        ("2000-01-01T00:00:00+23:56", 3),
        ("2242-09-04T05:36:13+23:56", 0),
    ],
)
def test_since_takes_any_offset_python_reads(cast, seeded, since, expected):
    assert len(results(cast.api("mona").get(URL, {"since": since}))) == expected


def test_since_out_of_range_is_a_400(cast, seeded):
    response = cast.api("mona").get(URL, {"since": "0001-01-01T00:00:00+05:00"})
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"since": ["Out of range."]}


def test_a_malformed_filter_is_a_400_in_the_error_shape(cast, seeded):
    response = cast.api("mona").get(URL, {"since": "yesterday", "status": "bogus"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert set(error["fields"]) == {"since", "status"}
    assert "Select a valid choice" in error["fields"]["status"][0]


def test_pagination_pages_and_caps_page_size(cast, seeded):
    api = cast.api("mona")
    first = api.get(URL, {"page_size": 2}).json()
    assert first["count"] == 3
    assert [r["repo_id"] for r in first["results"]] == [
        "deepseek-ai/DeepSeek-V3",
        "Qwen/Qwen2.5-72B-Instruct",
    ]
    assert first["previous"] is None and "page=2" in first["next"]
    second = api.get(first["next"]).json()
    assert [r["repo_id"] for r in second["results"]] == ["meta-llama/Llama-3.1-8B"]
    assert second["next"] is None
    assert api.get(URL, {"page": 3, "page_size": 2}).status_code == 404


def test_detail_has_the_latest_successful_analysis_config_summary_and_jobs(cast, seeded):
    response = cast.api("mona").get(f"{URL}{seeded.deepseek.pk}/")
    assert response.status_code == 200
    body = response.json()
    analyze = StageRun.objects.get(
        job__release=seeded.deepseek, stage="analyze", status="succeeded"
    )
    assert body["analysis"]["stage_run"] == analyze.pk
    assert body["analysis"]["job"] == analyze.job_id
    assert body["analysis"]["family"] == "deepseek_v3"
    assert body["analysis"]["architecture"] == "DeepseekV3ForCausalLM"
    assert body["analysis"]["result"]["num_layers"] == 61
    assert body["analysis"]["result"]["kv_cache_bytes_per_token"] == 70272
    summary = body["config_summary"]
    assert summary["hidden_size"] == 7168
    assert summary["num_hidden_layers"] == 61
    assert summary["quantization_method"] == "fp8"
    assert summary["architectures"] == ["DeepseekV3ForCausalLM"]
    assert [j["id"] for j in body["jobs"]] == [seeded.deepseek_queued.pk, analyze.job_id]
    assert body["jobs"][0]["stages"] == [
        {"stage": "fetch", "status": "queued", "attempt": 1},
        {"stage": "analyze", "status": "pending", "attempt": 1},
    ]
    assert body["jobs"][0]["pool"] == "h200"
    assert body["status"] == "running"


def test_detail_of_a_release_never_analysed(cast, seeded):
    body = cast.api("eli").get(f"{URL}{seeded.qwen.pk}/").json()
    assert body["analysis"] is None
    assert body["config_summary"] is None
    assert [j["status"] for j in body["jobs"]] == ["failed"]


def test_missing_release_is_a_404_in_the_error_shape(cast, seeded):
    response = cast.api("mona").get(f"{URL}999999/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    # in the API's words, not Django's "No ModelRelease matches the given query."
    assert response.json()["error"]["message"] == "No model release with id 999999."


@pytest.mark.parametrize(
    ("url", "ordering"),
    [
        (URL, "unknownfield"),
        (URL, "repo_id,-nope"),
        (URL, "config"),  # a real field, but not one to order by
        ("/api/v1/jobs/", "-release__repo_id"),
        ("/api/v1/stages/", "log"),
        ("/api/v1/pools/", "queue"),
        ("/api/v1/webhook-endpoints/", "secret_digest"),
    ],
)
def test_an_unknown_ordering_is_a_400_naming_the_allowed_fields(cast, seeded, url, ordering):
    response = cast.api("ada").get(url, {"ordering": ordering})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid" and list(error["fields"]) == ["ordering"]
    assert error["fields"]["ordering"][0].startswith("Cannot order by ")
    assert "(a leading - for descending)" in error["fields"]["ordering"][0]


def test_an_allowed_ordering_still_orders_and_blank_terms_are_ignored(cast, seeded):
    response = cast.api("mona").get(URL, {"ordering": "-repo_id,"})
    assert repo_ids(response) == [
        "meta-llama/Llama-3.1-8B",
        "deepseek-ai/DeepSeek-V3",
        "Qwen/Qwen2.5-72B-Instruct",
    ]


def test_detail_lists_open_limitations_most_severe_first_and_each_jobs_readiness(cast, seeded):
    from adaptation.models import KnownLimitation

    deepseek, h200 = seeded.deepseek, seeded.deepseek_queued.pool
    KnownLimitation.objects.create(
        release=deepseek, title="MTP modules not validated", severity="minor", stage="analyze",
        key="analyze:mtp",
    )  # fmt: skip
    KnownLimitation.objects.create(
        release=deepseek, pool=h200, title="FP8 kernels missing", severity="blocker",
        author=cast.eli, body="Use **bf16**.",
    )  # fmt: skip
    KnownLimitation.objects.create(
        release=deepseek, title="Old note", severity="blocker", status="resolved"
    )

    body = cast.api("mona").get(f"{URL}{deepseek.pk}/").json()

    assert [(n["title"], n["severity"], n["pool"]) for n in body["limitations"]] == [
        ("FP8 kernels missing", "blocker", "h200"),
        ("MTP modules not validated", "minor", None),
    ]  # the resolved one is left out
    assert body["limitations"][0]["author"] == "eli" and body["limitations"][0]["stage"] == ""
    assert body["limitations"][1]["key"] == "analyze:mtp"
    assert body["limitations"][0]["body"] == "Use **bf16**."
    job = body["jobs"][0]
    assert (job["readiness"], job["blocking_stage"], job["ready_at"]) == (
        seeded.deepseek_queued.readiness,
        seeded.deepseek_queued.blocking_stage,
        None,
    )
