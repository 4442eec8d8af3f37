"""ModelScopeSource against the fake ModelScope, through the real `modelscope_hub` client."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from engine.hubs import hub_source
from engine.hubs.base import (
    HubAuthError,
    HubError,
    HubNotFound,
    HubRateLimited,
    HubSpec,
    HubUnavailable,
)
from engine.hubs.modelscope import FIRST_READ_BYTES, ModelScopeSource
from tests.checkpoints import safetensors_file
from tests.fakemodelscope import FakeModelScope

REALCONFIGS = Path(__file__).resolve().parents[2] / "data" / "realconfigs"
TOKEN = "ms-fake-valid-token"


@pytest.fixture
def fake_modelscope() -> Iterator[FakeModelScope]:
    with FakeModelScope() as fake:
        yield fake


@pytest.fixture(autouse=True)
def no_modelscope_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MODELSCOPE_ENDPOINT", "MODELSCOPE_API_TOKEN", "MODELSCOPE_DOMAIN"):
        monkeypatch.delenv(name, raising=False)


def release(repo_id: str, *, shards: int = 2, tensor_elements: int = 4) -> dict[str, bytes]:
    """A repo's files: its real published config, generation config, README, tokenizer, an
    index naming `shards` shards (each holding one F16 tensor of `tensor_elements` values)."""
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    index = {"weight_map": {f"model.layers.{i}.weight": n for i, n in enumerate(names)}}
    return {
        "config.json": (REALCONFIGS / f"{repo_id.replace('/', '__')}.json").read_bytes(),
        "generation_config.json": b'{"do_sample": true}',
        "model.safetensors.index.json": json.dumps(index).encode(),
        "README.md": f"# {repo_id}\n".encode(),
        "tokenizer.json": b'{"version": "1.0"}',
        **{
            name: safetensors_file({f"model.layers.{i}.weight": ("F16", (tensor_elements,))})
            for i, name in enumerate(names)
        },
    }


def source(fake: FakeModelScope, **spec: str) -> ModelScopeSource:
    return ModelScopeSource(HubSpec(kind="modelscope", endpoint=fake.url, **spec))


def test_hub_source_builds_the_modelscope_kind(fake_modelscope):
    built = hub_source(HubSpec(kind="modelscope", endpoint=fake_modelscope.url))
    assert isinstance(built, ModelScopeSource)
    assert built.endpoint == fake_modelscope.url


def test_a_blank_endpoint_is_modelscope_endpoint_else_modelscope_cn(monkeypatch):
    assert ModelScopeSource(HubSpec(kind="modelscope")).endpoint == "https://modelscope.cn"
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", "https://ms.example.com/")
    assert ModelScopeSource(HubSpec(kind="modelscope")).endpoint == "https://ms.example.com"


def test_list_releases_of_an_organization_newest_first_with_the_pattern(fake_modelscope):
    ms = fake_modelscope
    old = ms.add_repo(
        "Qwen/Qwen2.5-72B-Instruct",
        release("Qwen/Qwen2.5-72B-Instruct"),
        created_at=datetime(2024, 9, 1, tzinfo=UTC),
    )
    new = ms.add_repo(
        "Qwen/Qwen3-235B-A22B-Instruct-2507",
        release("Qwen/Qwen3-235B-A22B-Instruct-2507"),
        created_at=datetime(2025, 7, 21, tzinfo=UTC),
    )
    ms.add_repo("Qwen/Qwen2.5-Coder-notes", {"README.md": b"# notes"})
    ms.add_repo("deepseek-ai/DeepSeek-V3", release("deepseek-ai/DeepSeek-V3"))
    # The older repo changed last: the listing's order is not the creation order.
    old = ms.add_repo(
        "Qwen/Qwen2.5-72B-Instruct",
        {**release("Qwen/Qwen2.5-72B-Instruct"), "README.md": b"# v2"},
    )

    listed = source(ms, author="Qwen", repo_pattern="Qwen/Qwen*-Instruct*").list_releases()

    assert [(c.repo_id, c.revision, c.complete) for c in listed] == [
        ("Qwen/Qwen3-235B-A22B-Instruct-2507", new, True),
        ("Qwen/Qwen2.5-72B-Instruct", old, True),
    ]
    assert listed[0].published_at == datetime(2025, 7, 21, tzinfo=UTC)
    (listing,) = ms.requests_to("/openapi/v1/models")
    assert listing.query["owner"] == ["Qwen"] and listing.query["sort"] == ["last_modified"]


def test_an_upload_in_progress_is_incomplete(fake_modelscope):
    files = release("deepseek-ai/DeepSeek-V3", shards=3)
    del files["model-00003-of-00003.safetensors"]
    fake_modelscope.add_repo("deepseek-ai/DeepSeek-V3", files)
    (candidate,) = source(fake_modelscope, author="deepseek-ai").list_releases()
    assert not candidate.complete
    assert "model-00003-of-00003.safetensors" in candidate.reason


def test_fetch_reads_the_describing_files_and_every_header_by_range(fake_modelscope):
    ms = fake_modelscope
    # Shards larger than the first read, so a full download would show in the byte counts.
    files = release("meta-llama/Llama-3.1-8B", shards=3, tensor_elements=FIRST_READ_BYTES)
    sha = ms.add_repo("meta-llama/Llama-3.1-8B", files)

    fetched = source(ms).fetch_release("meta-llama/Llama-3.1-8B", "master")

    assert fetched.revision == sha
    assert set(fetched.files) == {
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "README.md",
    }
    assert fetched.files["config.json"] == files["config.json"]
    assert fetched.file_sizes["tokenizer.json"] == len(files["tokenizer.json"])
    meta = fetched.safetensors_metadata
    assert meta["shard_count"] == 3
    assert meta["tensors"]["model.layers.2.weight"] == {"dtype": "F16", "shape": [FIRST_READ_BYTES]}
    assert meta["total_size"] == 3 * 2 * FIRST_READ_BYTES
    shard_reads = [
        r
        for r in ms.requests_to("/repo")
        if r.query.get("FilePath", [""])[0].endswith(".safetensors")
    ]
    assert len(shard_reads) == 3
    for read in shard_reads:
        assert read.range == f"bytes=0-{FIRST_READ_BYTES - 1}" and read.status == 206
        assert read.bytes_sent == FIRST_READ_BYTES
    assert not [r for r in ms.requests if r.query.get("FilePath") == ["tokenizer.json"]]


def test_fetch_at_an_older_commit_and_files_at_a_commit(fake_modelscope):
    ms = fake_modelscope
    first = ms.add_repo("openai/gpt-oss-20b", {**release("openai/gpt-oss-20b"), "m.py": b"A=1"})
    ms.add_repo("openai/gpt-oss-20b", {**release("openai/gpt-oss-20b"), "m.py": b"A=2"})
    s = source(ms)
    assert s.fetch_release("openai/gpt-oss-20b", first).revision == first
    assert s.fetch_files("openai/gpt-oss-20b", first, ["m.py"]) == {"m.py": b"A=1"}
    assert s.release_at("openai/gpt-oss-20b", first).revision == first
    with pytest.raises(HubNotFound):
        s.fetch_files("openai/gpt-oss-20b", first, ["absent.py"])


@pytest.mark.parametrize(
    ("status", "headers", "error"),
    [
        (404, {}, HubNotFound),
        (401, {}, HubAuthError),
        (403, {}, HubAuthError),
        (500, {}, HubUnavailable),
        (503, {}, HubUnavailable),
    ],
)
def test_errors_map_to_hub_errors(fake_modelscope, status, headers, error):
    fake_modelscope.add_repo("moonshotai/Kimi-K2-Instruct", release("moonshotai/Kimi-K2-Instruct"))
    fake_modelscope.fail_next("/openapi/v1/models", status, headers, times=2)
    with pytest.raises(error):
        source(fake_modelscope, author="moonshotai").list_releases()
    assert len(fake_modelscope.requests_to("/openapi/v1/models")) == 1  # no retries


@pytest.mark.parametrize(
    ("endpoint", "reason"),
    [
        # `.invalid` never resolves (RFC 2606): the offline case a new user met.
        ("https://day0-hub.invalid", "the name does not resolve"),
        ("stopped", "the connection was refused"),
    ],
)
def test_an_unreachable_hub_says_why_in_words_and_logs_the_exception(caplog, endpoint, reason):
    if endpoint == "stopped":
        with FakeModelScope() as stopped:
            endpoint = stopped.url
    hub = ModelScopeSource(HubSpec(kind="modelscope", endpoint=endpoint, author="Qwen"))
    with (
        caplog.at_level(logging.INFO, logger="engine.hubs.modelscope"),
        pytest.raises(HubUnavailable) as raised,
    ):
        hub.list_releases()
    assert raised.value.message == (
        f"listing models of Qwen on {endpoint}: cannot reach {endpoint}: {reason}. The hub or"
        " the network is at fault, not the release: check the network, proxy and"
        " MODELSCOPE_ENDPOINT; retry later."
    )
    # The exception, class and all, is in the log for whoever debugs it.
    assert "NetworkError(" in caplog.text


def test_a_429_says_when_to_come_back_and_is_not_retried(fake_modelscope):
    fake_modelscope.add_repo("moonshotai/Kimi-K2-Instruct", release("moonshotai/Kimi-K2-Instruct"))
    fake_modelscope.fail_next("/api/v1/models/moonshotai", 429, {"Retry-After": "42"}, times=5)
    with pytest.raises(HubRateLimited) as caught:
        source(fake_modelscope, author="moonshotai").list_releases()
    assert caught.value.retry_after_s == 42
    assert len(fake_modelscope.requests_to("/repo/files")) == 1


def test_a_429_on_a_header_read_is_waited_out(fake_modelscope):
    ms = fake_modelscope
    ms.add_repo("meta-llama/Llama-3.1-8B", release("meta-llama/Llama-3.1-8B", shards=2))
    shard = "model-00002-of-00002.safetensors"
    ms.fail_next("/api/v1/models/", 429, {"Retry-After": "0"}, times=2, file_path=shard)
    fetched = source(ms).fetch_release("meta-llama/Llama-3.1-8B", "master")
    assert fetched.safetensors_metadata["shard_count"] == 2
    reads = [r.status for r in ms.requests if r.query.get("FilePath") == [shard]]
    assert reads == [429, 429, 206]


def test_a_429_on_a_header_read_past_the_wait_budget_goes_up(fake_modelscope):
    ms = fake_modelscope
    ms.add_repo("meta-llama/Llama-3.1-8B", release("meta-llama/Llama-3.1-8B", shards=1))
    shard = "model-00001-of-00001.safetensors"
    ms.fail_next("/api/v1/models/", 429, {"Retry-After": "3600"}, file_path=shard)
    with pytest.raises(HubRateLimited) as caught:
        source(ms).fetch_release("meta-llama/Llama-3.1-8B", "master")
    assert caught.value.retry_after_s == 3600


def test_unknown_repo_and_revision_are_not_found(fake_modelscope):
    fake_modelscope.add_repo("openai/gpt-oss-20b", release("openai/gpt-oss-20b"))
    with pytest.raises(HubNotFound):
        source(fake_modelscope).latest_release("openai/absent")
    with pytest.raises(HubNotFound):
        source(fake_modelscope).release_at("openai/gpt-oss-20b", "0" * 40)


def test_private_repo_needs_the_token_which_goes_only_to_a_configured_endpoint(
    fake_modelscope, monkeypatch
):
    ms = fake_modelscope
    ms.add_repo("openai/gpt-oss-20b", release("openai/gpt-oss-20b"), private=True)
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", TOKEN)
    # Not the configured ModelScope (MODELSCOPE_ENDPOINT unset: https://modelscope.cn).
    with pytest.raises(HubAuthError):
        source(ms).latest_release("openai/gpt-oss-20b")
    assert ms.requests and not [r for r in ms.requests if "authorization" in r.headers]
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", ms.url)
    candidate = source(ms).latest_release("openai/gpt-oss-20b")
    assert candidate.complete
    assert ms.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"


def test_a_hostile_header_is_the_release_s_fault(fake_modelscope):
    files = release("openai/gpt-oss-20b", shards=1)
    files["model-00001-of-00001.safetensors"] = (10).to_bytes(8, "little") + b"[[[[[[[[[["
    fake_modelscope.add_repo("openai/gpt-oss-20b", files)
    with pytest.raises(HubError) as caught:
        source(fake_modelscope).fetch_release("openai/gpt-oss-20b", "master")
    assert type(caught.value) is HubError
    assert "model-00001-of-00001.safetensors" in caught.value.message


def test_the_client_parts_the_source_replaces_are_still_there(fake_modelscope, tmp_path):
    # The source turns off the client's own retries through parts that are not its public API
    # (pinned to modelscope-hub 0.5.x in pyproject.toml): a release that renames them must
    # fail here, not quietly bring back retry loops of up to 4 x 8 s under the poller's own.
    import inspect

    from modelscope_hub import HubApi, HubConfig
    from modelscope_hub._legacy_api import LegacyClient
    from modelscope_hub._openapi import OpenAPIClient

    plain = HubApi(config=HubConfig(endpoint=fake_modelscope.url, token="", config_dir=tmp_path))
    # The client makes both lazily (`legacy`, `openapi`) unless these attributes are set.
    assert isinstance(plain.legacy, LegacyClient) and isinstance(plain.openapi, OpenAPIClient)
    assert plain._legacy is plain.legacy and plain._openapi is plain.openapi
    assert "max_attempts" in inspect.signature(LegacyClient._request_repo_tree).parameters
    source = ModelScopeSource(HubSpec(kind="modelscope", endpoint=fake_modelscope.url))
    assert type(source.api.legacy).__name__ == "_OneTryLegacyClient"
    assert source.api.openapi is source.api._openapi
