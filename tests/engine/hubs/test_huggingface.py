"""HuggingFaceSource against the fake Hub, through the real huggingface_hub code path."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest
import torch
from safetensors.torch import save, save_file

from engine.hubs import hub_source
from engine.hubs.base import (
    HubAuthError,
    HubNotFound,
    HubRateLimited,
    HubSpec,
    HubUnavailable,
)
from engine.hubs.http import retry_after_seconds
from engine.hubs.huggingface import HuggingFaceSource
from tests.checkpoints import safetensors_file
from tests.fakehub import FakeHub

REALCONFIGS = Path(__file__).resolve().parents[2] / "data" / "realconfigs"
VALID_TOKEN = "hf_fake_valid_token"


def realconfig(repo_id: str) -> bytes:
    """The published config.json of `repo_id`, as bytes."""
    return (REALCONFIGS / f"{repo_id.replace('/', '__')}.json").read_bytes()


def release(repo_id: str, *, shards: int = 2, extra: dict[str, bytes] | None = None) -> dict:
    """A repo's files: real config, generation config, README, an index naming `shards`
    shards (all present, each a safetensors file holding the one F16 tensor of 4 values the
    index puts there), a tokenizer that must never be fetched."""
    shard_names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    index = {
        "metadata": {"total_size": 123456},
        "weight_map": {f"model.layers.{i}.weight": name for i, name in enumerate(shard_names)},
    }
    files = {
        "config.json": realconfig(repo_id),
        "generation_config.json": b'{"do_sample": true, "temperature": 0.7}',
        "model.safetensors.index.json": json.dumps(index).encode(),
        "README.md": f"# {repo_id}\n\nReleased today.\n".encode(),
        "tokenizer.json": b'{"version": "1.0"}',
        **{
            name: safetensors_file({f"model.layers.{i}.weight": ("F16", (4,))})
            for i, name in enumerate(shard_names)
        },
    }
    files.update(extra or {})
    return files


def source(hub: FakeHub, **spec: str) -> HuggingFaceSource:
    return HuggingFaceSource(HubSpec(kind="huggingface", endpoint=hub.url, **spec))


def at(day: str) -> datetime:
    return datetime.fromisoformat(day).replace(tzinfo=UTC)


@pytest.fixture
def qwen_hub(fake_hub: FakeHub) -> dict[str, str]:
    """Two real Qwen releases, another author's, and a Qwen repo mid-upload (no config)."""
    return {
        "Qwen/Qwen2.5-72B-Instruct": fake_hub.add_repo(
            "Qwen/Qwen2.5-72B-Instruct",
            release("Qwen/Qwen2.5-72B-Instruct", shards=37),
            created_at=at("2024-09-16T11:55:00"),
        ),
        "deepseek-ai/DeepSeek-V3": fake_hub.add_repo(
            "deepseek-ai/DeepSeek-V3",
            release("deepseek-ai/DeepSeek-V3", shards=3),
            created_at=at("2024-12-25T12:00:00"),
        ),
        "Qwen/Qwen3-235B-A22B-Instruct-2507": fake_hub.add_repo(
            "Qwen/Qwen3-235B-A22B-Instruct-2507",
            release("Qwen/Qwen3-235B-A22B-Instruct-2507", shards=4),
            created_at=at("2025-07-21T09:00:00"),
        ),
        "Qwen/Qwen3-Next-80B": fake_hub.add_repo(
            "Qwen/Qwen3-Next-80B",
            {"README.md": b"# coming soon", "model-00001-of-00002.safetensors": b"\0" * 8},
            created_at=at("2025-09-10T08:00:00"),
        ),
    }


# -- listing ---------------------------------------------------------------------------------


def test_list_releases_newest_first_with_sha_created_at_and_completeness(fake_hub, qwen_hub):
    candidates = source(fake_hub, author="Qwen").list_releases()

    assert [c.repo_id for c in candidates] == [
        "Qwen/Qwen3-Next-80B",
        "Qwen/Qwen3-235B-A22B-Instruct-2507",
        "Qwen/Qwen2.5-72B-Instruct",
    ]
    assert [c.revision for c in candidates] == [qwen_hub[c.repo_id] for c in candidates]
    assert candidates[1].published_at == at("2025-07-21T09:00:00")
    assert candidates[2].published_at == at("2024-09-16T11:55:00")
    assert [c.complete for c in candidates] == [False, True, True]
    assert "config.json" in candidates[0].reason
    # One listing request carries sha, dates and files; only the indexes are downloaded.
    listing = fake_hub.requests_to("/api/models")
    assert len(listing) == 1
    assert listing[0].query["author"] == ["Qwen"]
    assert listing[0].query["sort"] == ["createdAt"]
    assert all(r.headers["user-agent"].startswith("day0/") for r in fake_hub.requests)
    assert not [r for r in fake_hub.requests if r.path.endswith(".safetensors")]


def test_list_releases_filters_by_repo_pattern(fake_hub, qwen_hub):
    candidates = source(fake_hub, author="Qwen", repo_pattern="qwen/Qwen3-*-Instruct-*")
    assert [c.repo_id for c in candidates.list_releases()] == ["Qwen/Qwen3-235B-A22B-Instruct-2507"]


def test_list_releases_without_author_lists_all_and_honours_limit(fake_hub, qwen_hub):
    candidates = source(fake_hub).list_releases(limit=2)

    assert [c.repo_id for c in candidates] == [
        "Qwen/Qwen3-Next-80B",
        "Qwen/Qwen3-235B-A22B-Instruct-2507",
    ]
    assert fake_hub.requests_to("/api/models")[0].query["limit"] == ["2"]
    # The older repos were never looked at.
    assert not fake_hub.requests_to("DeepSeek-V3")
    assert not fake_hub.requests_to("Qwen2.5-72B")


def test_list_releases_follows_the_hubs_pages(qwen_hub):
    with FakeHub(page_size=1) as paged:
        for repo_id in ("Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen3-235B-A22B-Instruct-2507"):
            paged.add_repo(repo_id, release(repo_id))
        candidates = source(paged, author="Qwen").list_releases()
        assert len(paged.requests_to("/api/models")) == 2
    assert [c.repo_id for c in candidates] == [
        "Qwen/Qwen3-235B-A22B-Instruct-2507",
        "Qwen/Qwen2.5-72B-Instruct",
    ]


def test_hf_endpoint_environment_variable_is_used_when_spec_has_no_endpoint(
    fake_hub, qwen_hub, monkeypatch
):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    hub = hub_source(HubSpec(kind="huggingface", author="deepseek-ai"))

    assert hub.endpoint == fake_hub.url
    assert [c.revision for c in hub.list_releases()] == [qwen_hub["deepseek-ai/DeepSeek-V3"]]


def test_latest_release_reports_sha_date_and_completeness(fake_hub, qwen_hub):
    latest = source(fake_hub).latest_release("deepseek-ai/DeepSeek-V3")

    assert latest.revision == qwen_hub["deepseek-ai/DeepSeek-V3"]
    assert latest.published_at == at("2024-12-25T12:00:00")
    assert latest.complete and latest.reason == ""


# -- incomplete uploads ----------------------------------------------------------------------


def test_index_naming_missing_shards_is_incomplete(fake_hub):
    files = release("moonshotai/Kimi-K2-Instruct", shards=3)
    del files["model-00002-of-00003.safetensors"], files["model-00003-of-00003.safetensors"]
    fake_hub.add_repo("moonshotai/Kimi-K2-Instruct", files)
    hub = source(fake_hub, author="moonshotai")

    for candidate in (hub.list_releases()[0], hub.latest_release("moonshotai/Kimi-K2-Instruct")):
        assert candidate.complete is False
        assert "2 shards" in candidate.reason
        assert "model-00002-of-00003.safetensors" in candidate.reason


def test_missing_config_is_incomplete(fake_hub):
    files = release("openai/gpt-oss-20b")
    del files["config.json"]
    fake_hub.add_repo("openai/gpt-oss-20b", files)

    candidate = source(fake_hub).latest_release("openai/gpt-oss-20b")
    assert candidate.complete is False
    assert candidate.reason.startswith("no config.json")


def test_numbered_shards_missing_without_index_is_incomplete(fake_hub):
    fake_hub.add_repo(
        "openai/gpt-oss-20b",
        {"config.json": realconfig("openai/gpt-oss-20b"), "model-00001-of-00003.safetensors": b""},
    )
    candidate = source(fake_hub).latest_release("openai/gpt-oss-20b")
    assert candidate.complete is False
    assert candidate.reason == "only 1 of 3 model-*-of-* shards present yet"


# -- fetching --------------------------------------------------------------------------------


def test_fetch_release_downloads_only_the_describing_files(fake_hub):
    files = release("moonshotai/Kimi-K2-Instruct", shards=3)
    sha = fake_hub.add_repo("moonshotai/Kimi-K2-Instruct", files)

    fetched = source(fake_hub).fetch_release("moonshotai/Kimi-K2-Instruct", sha)

    assert fetched.revision == sha
    assert set(fetched.files) == {
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "README.md",
    }
    assert fetched.files["config.json"] == realconfig("moonshotai/Kimi-K2-Instruct")
    assert json.loads(fetched.files["config.json"])["model_type"] == "kimi_k2"
    assert fetched.files["README.md"] == files["README.md"]
    assert fetched.file_sizes == {name: len(content) for name, content in files.items()}
    # Every shard's header is read, index or not: one range request each, never the weights.
    assert fetched.safetensors_metadata["tensors"] == {
        f"model.layers.{i}.weight": {"dtype": "F16", "shape": [4]} for i in range(3)
    }
    assert fetched.safetensors_metadata["shard_count"] == 3
    shard_reads = [r for r in fake_hub.requests if r.path.endswith(".safetensors")]
    assert len(shard_reads) == 3
    assert all(r.method == "GET" and r.range == "bytes=0-100000" for r in shard_reads)
    fetched_paths = [r.path for r in fake_hub.requests if r.method == "GET"]
    assert not [p for p in fetched_paths if p.endswith("tokenizer.json")]
    assert all(f"/resolve/{sha}/" in p for p in fetched_paths if "/resolve/" in p)


def test_fetch_release_without_optional_files(fake_hub):
    sha = fake_hub.add_repo(
        "meta-llama/Llama-3.1-8B", {"config.json": realconfig("meta-llama/Llama-3.1-8B")}
    )
    fetched = source(fake_hub).fetch_release("meta-llama/Llama-3.1-8B", "main")

    assert fetched.revision == sha  # "main" resolved to its commit
    assert fetched.files == {"config.json": realconfig("meta-llama/Llama-3.1-8B")}
    assert fetched.safetensors_metadata is None


def test_an_older_revision_stays_fetchable_after_a_new_commit(fake_hub):
    repo_id = "Qwen/Qwen2.5-72B-Instruct"
    old_sha = fake_hub.add_repo(repo_id, release(repo_id))
    fixed = json.loads(realconfig(repo_id))
    fixed["max_window_layers"] = 70
    new_sha = fake_hub.add_repo(
        repo_id, release(repo_id, extra={"config.json": json.dumps(fixed).encode()})
    )
    hub = source(fake_hub)

    assert new_sha != old_sha
    assert hub.latest_release(repo_id).revision == new_sha
    assert hub.fetch_release(repo_id, old_sha).files["config.json"] == realconfig(repo_id)
    assert (
        json.loads(hub.fetch_release(repo_id, new_sha).files["config.json"])["max_window_layers"]
        == 70
    )


def _tensors() -> dict[str, torch.Tensor]:
    """A few tensors of different dtypes; lm_head makes the file larger than the 100 kB
    first range read, so reading the whole file would show in the request log."""
    return {
        "model.embed_tokens.weight": torch.zeros(256, 64, dtype=torch.bfloat16),
        "lm_head.weight": torch.zeros(400, 100, dtype=torch.float32),
        "model.layers.0.mlp.experts.gate_up_proj_blocks": torch.zeros(8, 16, dtype=torch.uint8),
        "model.layers.0.self_attn.q_proj.weight": torch.zeros(16, 16, dtype=torch.float8_e4m3fn),
        "model.norm.weight": torch.zeros(3, 5, 7, dtype=torch.float16),
        "position_ids": torch.zeros(1, 32, dtype=torch.int64),
    }


def test_fetch_without_index_reads_safetensors_headers_by_range_only(fake_hub, tmp_path):
    tensors = _tensors()
    save_file(tensors, tmp_path / "model.safetensors")
    weights = (tmp_path / "model.safetensors").read_bytes()
    sha = fake_hub.add_repo(
        "openai/gpt-oss-20b",
        {"config.json": realconfig("openai/gpt-oss-20b"), "model.safetensors": weights},
    )

    fetched = source(fake_hub).fetch_release("openai/gpt-oss-20b", sha)

    metadata = fetched.safetensors_metadata
    assert metadata is not None
    assert metadata["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert metadata["total_size"] == 32768 + 160000 + 128 + 256 + 210 + 256
    assert metadata["shard_count"] == 1
    assert metadata["tensors"]["model.embed_tokens.weight"] == {"dtype": "BF16", "shape": [256, 64]}
    assert {name: t["dtype"] for name, t in metadata["tensors"].items()} == {
        "model.embed_tokens.weight": "BF16",
        "lm_head.weight": "F32",
        "model.layers.0.mlp.experts.gate_up_proj_blocks": "U8",
        "model.layers.0.self_attn.q_proj.weight": "F8_E4M3",
        "model.norm.weight": "F16",
        "position_ids": "I64",
    }
    assert metadata["tensors"]["model.norm.weight"]["shape"] == [3, 5, 7]
    assert fetched.file_sizes["model.safetensors"] == len(weights)
    weight_requests = fake_hub.requests_to("model.safetensors")
    assert weight_requests, "the header must have been read from the hub"
    assert all(
        r.method == "GET" and r.range and r.range.startswith("bytes=") for r in weight_requests
    )
    assert sum(r.bytes_sent for r in weight_requests) <= 100_001 < len(weights)


def test_large_headers_and_several_unindexed_files_are_read_by_ranges(fake_hub, tmp_path):
    # ~1500 tensors make a header larger than the first 100 kB read: a second range follows.
    long_name = "self_attn.a_rather_long_projection_name_for_a_big_header.weight"
    many = {
        f"model.layers.{i}.{long_name}": torch.zeros(2, dtype=torch.float16) for i in range(1500)
    }
    small = {"lm_head.weight": torch.zeros(10, 10, dtype=torch.bfloat16)}
    first, second = save(many), save(small)
    fake_hub.add_repo(
        "deepseek-ai/DeepSeek-V3",
        {
            "config.json": realconfig("deepseek-ai/DeepSeek-V3"),
            "model-00001-of-00002.safetensors": first,
            "model-00002-of-00002.safetensors": second,
        },
    )

    fetched = source(fake_hub).fetch_release("deepseek-ai/DeepSeek-V3", "main")

    metadata = fetched.safetensors_metadata
    assert metadata["shard_count"] == 2
    assert len(metadata["tensors"]) == 1501
    assert metadata["total_size"] == 1500 * 2 * 2 + 10 * 10 * 2
    first_reads = fake_hub.requests_to("model-00001-of-00002.safetensors")
    assert [r.range.split("-")[0] for r in first_reads] == ["bytes=0", "bytes=8"]
    assert all(r.bytes_sent < len(first) for r in first_reads)


# -- errors ----------------------------------------------------------------------------------


def test_gated_repo_without_token_is_an_auth_error_naming_the_repo(fake_hub):
    fake_hub.add_repo("meta-llama/Llama-3.1-8B", release("meta-llama/Llama-3.1-8B"), gated=True)

    with pytest.raises(HubAuthError) as raised:
        source(fake_hub).fetch_release("meta-llama/Llama-3.1-8B", "main")
    assert "meta-llama/Llama-3.1-8B" in raised.value.message
    assert "HF_TOKEN" in raised.value.message
    assert raised.value.transient is False
    assert fake_hub.requests_to("/resolve/")[0].status == 401


def test_gated_repo_with_a_token_lacking_access_is_an_auth_error(fake_hub):
    fake_hub.add_repo("meta-llama/Llama-3.1-8B", release("meta-llama/Llama-3.1-8B"), gated=True)

    with pytest.raises(HubAuthError, match="gated or private"):
        source(fake_hub, token="hf_not_granted").fetch_release("meta-llama/Llama-3.1-8B", "main")
    assert fake_hub.requests_to("/resolve/")[0].status == 403


def test_gated_repo_with_token_from_spec(fake_hub):
    fake_hub.add_repo("meta-llama/Llama-3.1-8B", release("meta-llama/Llama-3.1-8B"), gated=True)

    fetched = source(fake_hub, token=VALID_TOKEN).fetch_release("meta-llama/Llama-3.1-8B", "main")
    assert fetched.files["config.json"] == realconfig("meta-llama/Llama-3.1-8B")
    assert {r.headers["authorization"] for r in fake_hub.requests_to("/resolve/")} == {
        f"Bearer {VALID_TOKEN}"
    }


def test_gated_repo_with_hf_token_on_the_configured_hub(fake_hub, monkeypatch):
    # HF_TOKEN goes to the hub the operator configured (HF_ENDPOINT); see test_trust.py.
    fake_hub.add_repo("meta-llama/Llama-3.1-8B", release("meta-llama/Llama-3.1-8B"), gated=True)
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    monkeypatch.setenv("HF_TOKEN", VALID_TOKEN)

    fetched = source(fake_hub).fetch_release("meta-llama/Llama-3.1-8B", "main")
    assert fetched.files["config.json"] == realconfig("meta-llama/Llama-3.1-8B")
    assert {r.headers["authorization"] for r in fake_hub.requests_to("/resolve/")} == {
        f"Bearer {VALID_TOKEN}"
    }


def test_forbidden_listing_is_an_auth_error(fake_hub):
    fake_hub.fail_next("/api/models", 403, {"X-Error-Message": "Forbidden"})
    with pytest.raises(HubAuthError, match="HTTP 403"):
        source(fake_hub, author="Qwen").list_releases()


def test_unknown_repo_and_revision_are_not_found(fake_hub, qwen_hub):
    hub = source(fake_hub)
    with pytest.raises(HubNotFound, match="Qwen/Qwen9-1T: no such repo"):
        hub.latest_release("Qwen/Qwen9-1T")
    with pytest.raises(HubNotFound, match="no such revision"):
        hub.fetch_release("deepseek-ai/DeepSeek-V3", "0" * 40)


@pytest.mark.parametrize(
    ("path_prefix", "call"),
    [
        ("/api/models", lambda hub: hub.list_releases()),
        ("/api/models/deepseek-ai", lambda hub: hub.latest_release("deepseek-ai/DeepSeek-V3")),
        (
            "/deepseek-ai/DeepSeek-V3/resolve/",
            lambda hub: hub.fetch_release("deepseek-ai/DeepSeek-V3", "main"),
        ),
    ],
    ids=["listing", "model-info", "download"],
)
def test_rate_limit_gives_retry_after_without_waiting(fake_hub, qwen_hub, path_prefix, call):
    # times=5: the library would retry; the source must not (the caller schedules retries).
    fake_hub.fail_next(path_prefix, 429, {"Retry-After": "7"}, times=5)
    started = time.monotonic()

    with pytest.raises(HubRateLimited) as raised:
        call(source(fake_hub))

    assert raised.value.retry_after_s == 7
    assert raised.value.transient is True
    assert "retry in 7 s" in raised.value.message
    assert time.monotonic() - started < 2
    assert sum(1 for r in fake_hub.requests if r.status == 429) <= 2


def test_rate_limit_while_reading_safetensors_headers(fake_hub, tmp_path):
    save_file(_tensors(), tmp_path / "model.safetensors")
    sha = fake_hub.add_repo(
        "openai/gpt-oss-20b",
        {"config.json": b"{}", "model.safetensors": (tmp_path / "model.safetensors").read_bytes()},
    )
    # Longer than a header read waits (safetensors_headers.MAX_RATE_LIMIT_WAIT_S): the task
    # retries later.
    fake_hub.fail_next(
        f"/openai/gpt-oss-20b/resolve/{sha}/model.safetensors", 429, {"Retry-After": "3600"}
    )
    with pytest.raises(HubRateLimited) as raised:
        source(fake_hub).fetch_release("openai/gpt-oss-20b", "main")
    assert raised.value.retry_after_s == 3600
    assert len(fake_hub.requests_to("model.safetensors")) == 1


def test_a_short_rate_limit_while_reading_headers_is_waited_out(fake_hub, tmp_path):
    save_file(_tensors(), tmp_path / "model.safetensors")
    sha = fake_hub.add_repo(
        "openai/gpt-oss-20b",
        {"config.json": b"{}", "model.safetensors": (tmp_path / "model.safetensors").read_bytes()},
    )
    fake_hub.fail_next(
        f"/openai/gpt-oss-20b/resolve/{sha}/model.safetensors", 429, {"Retry-After": "1"}
    )

    fetched = source(fake_hub).fetch_release("openai/gpt-oss-20b", "main")

    assert len(fetched.safetensors_metadata["tensors"]) == 6
    assert [r.status for r in fake_hub.requests_to("model.safetensors")] == [429, 206]


@pytest.mark.parametrize(
    ("headers", "expected_s"),
    [
        (
            {"RateLimit": '"api";r=0;t=55', "RateLimit-Policy": '"fixed window";"api";q=500;w=300'},
            55,
        ),
        ({"RateLimit-Reset": "42"}, 42),
        ({}, 60),
    ],
    ids=["ietf-ratelimit", "ratelimit-reset", "no-header-default"],
)
def test_rate_limit_headers_other_than_retry_after(fake_hub, qwen_hub, headers, expected_s):
    fake_hub.fail_next("/api/models", 429, headers, times=5)
    with pytest.raises(HubRateLimited) as raised:
        source(fake_hub).list_releases()
    assert raised.value.retry_after_s == expected_s


def test_retry_after_as_http_date():
    now = datetime(2025, 7, 21, 9, 0, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=90), usegmt=True)
    assert retry_after_seconds({"retry-after": later}, now=now) == 90
    assert (
        retry_after_seconds(
            {"Retry-After": format_datetime(now, usegmt=True)}, now=now + timedelta(hours=1)
        )
        == 0
    )
    assert retry_after_seconds({"Retry-After": "soon"}) is None


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_errors_are_unavailable_and_fail_fast(fake_hub, qwen_hub, status):
    fake_hub.fail_next("/", status, times=10)
    started = time.monotonic()
    with pytest.raises(HubUnavailable, match=f"HTTP {status}") as raised:
        source(fake_hub, author="Qwen").list_releases()
    assert raised.value.transient is True
    assert time.monotonic() - started < 2


def test_server_error_while_downloading_is_unavailable(fake_hub, qwen_hub):
    fake_hub.fail_next("/deepseek-ai/DeepSeek-V3/resolve/", 500, times=10)
    with pytest.raises(HubUnavailable, match="deepseek-ai/DeepSeek-V3@main"):
        source(fake_hub).fetch_release("deepseek-ai/DeepSeek-V3", "main")


def test_a_stalled_listing_times_out_as_unavailable(fake_hub, qwen_hub):
    # The library sends listings without a timeout; the source's timeout must apply.
    fake_hub.fail_next("/api/models", 503, delay_s=1.5)
    hub = HuggingFaceSource(HubSpec(kind="huggingface", endpoint=fake_hub.url), timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(HubUnavailable, match=r"no answer in time\. The hub or the network"):
        hub.list_releases()
    assert time.monotonic() - started < 1.0


def test_unreachable_hub_is_unavailable_and_fails_fast():
    hub = FakeHub().start()
    url = hub.url
    hub.stop()
    started = time.monotonic()
    with pytest.raises(HubUnavailable) as raised:
        HuggingFaceSource(HubSpec(kind="huggingface", endpoint=url)).list_releases()
    assert time.monotonic() - started < 2
    assert raised.value.message == (
        f"listing models of all authors on the hub: cannot reach {url}: the connection was"
        " refused. The hub or the network is at fault, not the release: check the network,"
        " proxy and HF_ENDPOINT; retry later."
    )
