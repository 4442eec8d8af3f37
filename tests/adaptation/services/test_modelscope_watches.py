"""The ModelScope hub kind in the app: a watch polls an organization through the fake
ModelScope and the fetch stage of the job it starts reads the release through it (headers by
range requests, never the weights); a watch's endpoint must be a configured ModelScope;
`MODELSCOPE_API_TOKEN` goes only there; the release page links to the repo."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from adaptation.models import (
    AdaptationJob,
    AllowedHubEndpoint,
    HubKind,
    ModelRelease,
    StageRun,
    StageStatus,
)
from adaptation.services.hub_polling import hub_watch_poll
from engine.hubs import HubAuthError, HubSpec, hub_source
from tests.checkpoints import safetensors_file
from tests.factories import make_release, make_watch
from tests.fakemodelscope import FakeModelScope
from workers.runner import execute_stage_run

pytestmark = pytest.mark.django_db

REALCONFIGS = Path(__file__).resolve().parents[2] / "data" / "realconfigs"
TOKENIZER = Path(__file__).resolve().parents[2] / "data" / "tokenizers" / "qwen3"
TOKEN = "ms-fake-valid-token"
SHARD_BYTES = 300_000  # each shard's data: three times the first range read


@pytest.fixture
def fake_modelscope(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[FakeModelScope]:
    for name in ("MODELSCOPE_ENDPOINT", "MODELSCOPE_API_TOKEN", "MODELSCOPE_DOMAIN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path / "var"))
    with FakeModelScope() as fake:
        yield fake


@pytest.fixture
def configured(fake_modelscope, monkeypatch) -> FakeModelScope:
    """The operator points MODELSCOPE_ENDPOINT at the fake."""
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", fake_modelscope.url)
    return fake_modelscope


def release_files(repo_id: str) -> dict[str, bytes]:
    """The real published config, a Qwen3 tokenizer, and two indexed shards."""
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = {"weight_map": {f"w{i}": name for i, name in enumerate(names)}}
    return {
        "config.json": (REALCONFIGS / f"{repo_id.replace('/', '__')}.json").read_bytes(),
        "model.safetensors.index.json": json.dumps(index).encode(),
        "README.md": b"# release\n",
        **{p.name: p.read_bytes() for p in sorted(TOKENIZER.iterdir())},
        **{
            name: safetensors_file({f"w{i}": ("BF16", (SHARD_BYTES // 2,))})
            for i, name in enumerate(names)
        },
    }


def test_a_modelscope_watch_polls_newest_first_and_its_job_fetches_through_the_fake(configured):
    ms = configured
    older = ms.add_repo(
        "Qwen/Qwen2.5-72B-Instruct",
        release_files("Qwen/Qwen2.5-72B-Instruct"),
        created_at=datetime(2024, 9, 19, tzinfo=UTC),
    )
    newer = ms.add_repo(
        "Qwen/Qwen3-235B-A22B-Instruct-2507",
        release_files("Qwen/Qwen3-235B-A22B-Instruct-2507"),
        created_at=datetime(2025, 7, 21, tzinfo=UTC),
    )
    ms.add_repo("Qwen/Qwen3-Embedding", {"README.md": b"# not an Instruct"})
    watch = make_watch(
        kind=HubKind.MODELSCOPE, endpoint="", author="Qwen", repo_pattern="Qwen/*-Instruct*"
    )
    watch.full_clean()

    outcome = hub_watch_poll(watch=watch)

    assert outcome.error == ""
    assert outcome.new_releases == [
        f"Qwen/Qwen3-235B-A22B-Instruct-2507@{newer[:12]}",
        f"Qwen/Qwen2.5-72B-Instruct@{older[:12]}",
    ]
    release = ModelRelease.objects.get(repo_id="Qwen/Qwen3-235B-A22B-Instruct-2507")
    assert (release.hub_kind, release.hub_endpoint, release.revision) == (
        HubKind.MODELSCOPE,
        ms.url,
        newer,
    )
    assert release.published_at == datetime(2025, 7, 21, tzinfo=UTC)

    ms.clear_log()
    job = AdaptationJob.objects.get(release=release)
    fetch = StageRun.objects.get(job=job, stage="fetch")
    execute_stage_run(fetch.pk, final_try=True)
    fetch.refresh_from_db()
    assert fetch.status == StageStatus.SUCCEEDED, fetch.error
    assert fetch.result["weights"]["shard_count"] == 2
    assert fetch.result["tokenizer"]["kind"] == "fast"
    release.refresh_from_db()
    assert release.config["model_type"] == "qwen3_moe"
    shard_reads = [
        r for r in ms.requests if r.query.get("FilePath", [""])[0].endswith(".safetensors")
    ]
    assert len(shard_reads) == 2
    assert all(r.range and r.status == 206 and r.bytes_sent < SHARD_BYTES for r in shard_reads)


def test_a_modelscope_watch_must_use_a_configured_modelscope(fake_modelscope, settings):
    watch = make_watch(kind=HubKind.MODELSCOPE, endpoint=fake_modelscope.url, author="Qwen")
    with pytest.raises(ValidationError, match="MODELSCOPE_ENDPOINT"):
        watch.full_clean()
    # A Hugging Face allow-list entry is not a ModelScope one.
    AllowedHubEndpoint.objects.create(
        url=fake_modelscope.url, hub_kind="huggingface", allow_private_network=True
    )
    assert "not a configured hub" in watch.endpoint_refusal()
    # A ModelScope entry on a loopback address needs "allow private network".
    AllowedHubEndpoint.objects.all().delete()
    entry = AllowedHubEndpoint(url=fake_modelscope.url, hub_kind="modelscope")
    with pytest.raises(ValidationError):
        entry.full_clean()
    entry.save()  # put in the database anyway: the poll refuses it before any request
    outcome = hub_watch_poll(watch=watch)
    assert outcome.error.startswith("endpoint refused:")
    assert fake_modelscope.requests == []
    entry.allow_private_network = True
    entry.save()
    assert watch.endpoint_refusal() == ""


def test_an_offline_modelscope_watch_reads_in_words_on_the_board_and_in_the_admin(
    monkeypatch, tmp_path, logged_in_client, admin_client
):
    """No network (a `.invalid` name never resolves, RFC 2606): the board's hub-trouble
    banner and the admin say why and whose fault it is, without the client's internals."""
    offline = "https://day0-hub.invalid"
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", offline)
    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path / "var"))
    watch = make_watch(name="ms-qwen", kind=HubKind.MODELSCOPE, endpoint=offline, author="Qwen")
    assert hub_watch_poll(watch=watch).error
    watch.refresh_from_db()
    said = (
        f"listing models of Qwen on {offline}: cannot reach {offline}: the name does not"
        " resolve. The hub or the network is at fault, not the release: check the network,"
        " proxy and MODELSCOPE_ENDPOINT; retry later."
    )
    assert said in watch.last_error

    board = logged_in_client.get(reverse("adaptation:board")).content.decode()
    admin = admin_client.get(
        reverse("admin:adaptation_hubwatch_change", args=[watch.pk])
    ).content.decode()
    for page in (board, admin):
        assert said in page
        for internal in ("NetworkError", "Errno", "HTTPSConnection", "E1020", "?owner="):
            assert internal not in page
    assert "The trouble is in reaching the hub" in board


def test_the_token_goes_only_to_a_configured_modelscope(fake_modelscope, monkeypatch):
    ms = fake_modelscope
    ms.add_repo("openai/gpt-oss-20b", release_files("openai/gpt-oss-20b"), private=True)
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", TOKEN)
    spec = HubSpec(kind="modelscope", endpoint=ms.url)
    # Allow-listed, but for Hugging Face: no ModelScope token there.
    entry = AllowedHubEndpoint.objects.create(
        url=ms.url, hub_kind="huggingface", allow_private_network=True
    )
    with pytest.raises(HubAuthError, match="HTTP 401"):
        hub_source(spec).latest_release("openai/gpt-oss-20b")
    assert ms.requests and not [r for r in ms.requests if "authorization" in r.headers]
    entry.hub_kind = "modelscope"
    entry.save()
    assert hub_source(spec).latest_release("openai/gpt-oss-20b").complete
    assert ms.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"


def test_the_release_page_links_to_the_repo_on_modelscope(logged_in_client):
    release = make_release(
        hub_kind=HubKind.MODELSCOPE, hub_endpoint="https://modelscope.cn", repo_id="Qwen/Qwen3-8B"
    )
    page = logged_in_client.get(reverse("adaptation:release_detail", args=[release.pk]))
    assert b'href="https://modelscope.cn/models/Qwen/Qwen3-8B"' in page.content
