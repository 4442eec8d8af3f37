"""Every safetensors header of a release, never its weights: the Hub by range requests (in
parallel, with 429 backoff, cached per commit) and mirror folders by their header bytes;
checkpoints built from transformers' meta-device build of a real (shrunk) config."""

from __future__ import annotations

import json
import struct

import httpx2
import pytest
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import SafetensorsFileMetadata, TensorInfo

from engine.hubs import HubSpec, safetensors_headers, trust
from engine.hubs.base import HubError, HubNotFound, HubRateLimited
from engine.hubs.huggingface import HuggingFaceSource
from engine.hubs.mirror import MirrorSource
from engine.hubs.safetensors_headers import (
    MAX_SHARDS,
    HeaderCache,
    read_hub_headers,
    weight_files,
)
from tests.checkpoints import meta_checkpoint, safetensors_file, shard
from tests.engine.stages.realconfigs import load
from tests.fakehub import FakeHub

REPO = "Qwen/Qwen3-235B-A22B-Instruct-2507"
SHARDS = 64


def qwen3_moe_small() -> dict:
    """Qwen3-235B-A22B's real config, shrunk: 4 layers of 8 experts at width 64."""
    config = load("Qwen__Qwen3-235B-A22B-Instruct-2507")
    config.update(
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        vocab_size=512,
        bos_token_id=0,
        eos_token_id=1,
    )
    return config


@pytest.fixture(scope="module")
def table() -> dict:
    return meta_checkpoint(qwen3_moe_small())


def hub_release(fake_hub: FakeHub, table: dict, *, shards: int = SHARDS) -> tuple[str, dict]:
    files = {"config.json": json.dumps(qwen3_moe_small()).encode(), **shard(table, shards)}
    return fake_hub.add_repo(REPO, files), files


def source(hub: FakeHub) -> HuggingFaceSource:
    return HuggingFaceSource(HubSpec(kind="huggingface", endpoint=hub.url))


def as_metadata(table: dict) -> dict:
    return {name: {"dtype": d, "shape": list(s)} for name, (d, s) in table.items()}


def test_a_64_shard_release_costs_one_range_request_per_shard(fake_hub, table):
    sha, files = hub_release(fake_hub, table)

    fetched = source(fake_hub).fetch_release(REPO, sha)

    metadata = fetched.safetensors_metadata
    assert metadata["tensors"] == as_metadata(table)
    assert metadata["shard_count"] == SHARDS
    assert (
        metadata["total_size"]
        == json.loads(files["model.safetensors.index.json"])["metadata"]["total_size"]
    )
    shard_reads = [r for r in fake_hub.requests if r.path.endswith(".safetensors")]
    assert len(shard_reads) == SHARDS
    assert {r.path.rsplit("/", 1)[1] for r in shard_reads} == {
        name for name in files if name.endswith(".safetensors")
    }
    assert all(r.method == "GET" and r.range == "bytes=0-100000" for r in shard_reads)
    # model info, then HEAD + GET for config.json and the index, then one range per shard
    assert len(fake_hub.requests) == 1 + 2 * 2 + SHARDS
    assert len(fake_hub.requests) <= 130


def test_headers_are_read_once_per_commit(fake_hub, table):
    sha, _ = hub_release(fake_hub, table, shards=4)
    first = source(fake_hub).fetch_release(REPO, sha)
    fake_hub.clear_log()

    again = source(fake_hub).fetch_release(REPO, sha)

    assert again.safetensors_metadata == first.safetensors_metadata
    assert not [r for r in fake_hub.requests if r.path.endswith(".safetensors")]
    # A branch name is resolved to its commit first, so it is cached too.
    fake_hub.clear_log()
    assert source(fake_hub).fetch_release(REPO, "main").safetensors_metadata["shard_count"] == 4
    assert not [r for r in fake_hub.requests if r.path.endswith(".safetensors")]


def test_a_failed_shard_leaves_the_others_cached_for_the_retry(fake_hub, table):
    sha, _ = hub_release(fake_hub, table, shards=4)
    failing = f"/{REPO}/resolve/{sha}/model-00003-of-00004.safetensors"
    fake_hub.fail_next(failing, 503)

    with pytest.raises(HubError, match="HTTP 503"):
        source(fake_hub).fetch_release(REPO, sha)
    fake_hub.clear_log()
    fetched = source(fake_hub).fetch_release(REPO, sha)

    assert fetched.safetensors_metadata["tensors"] == as_metadata(table)
    asked = [r.path for r in fake_hub.requests if r.path.endswith(".safetensors")]
    assert asked == [failing]


def test_range_requests_follow_the_hf_token_rule(fake_hub, table, monkeypatch):
    monkeypatch.setattr(trust, "_token_check", None)
    monkeypatch.setenv("HF_TOKEN", "hf_fake_valid_token")
    sha, _ = hub_release(fake_hub, table, shards=2)

    source(fake_hub).fetch_release(REPO, sha)  # not the configured hub: no token
    shard_reads = [r for r in fake_hub.requests if r.path.endswith(".safetensors")]
    assert len(shard_reads) == 2
    assert [r.headers.get("authorization") for r in shard_reads] == [None, None]

    other = FakeHub().start()
    try:
        other_sha, _ = hub_release(other, table, shards=2)
        monkeypatch.setenv("HF_ENDPOINT", other.url)  # the configured hub: the token
        source(other).fetch_release(REPO, other_sha)
        reads = [r for r in other.requests if r.path.endswith(".safetensors")]
        assert [r.headers.get("authorization") for r in reads] == ["Bearer hf_fake_valid_token"] * 2
    finally:
        other.stop()


class _RateLimitedApi:
    """An `HfApi` stand-in whose header reads answer 429 `times` times, then a header."""

    def __init__(self, times: int, headers: dict[str, str]) -> None:
        self.left = times
        self.headers = headers
        self.calls = 0

    def parse_safetensors_file_metadata(self, repo_id, filename, *, revision, timeout):
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            response = httpx2.Response(
                429, headers=self.headers, request=httpx2.Request("GET", "http://hub")
            )
            raise HfHubHTTPError("429 Too Many Requests", response=response)
        return SafetensorsFileMetadata(
            metadata={}, tensors={"w": TensorInfo(dtype="BF16", shape=[2, 2], data_offsets=(0, 8))}
        )


def _read(api, tmp_path, monkeypatch, waits):
    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path))
    return read_hub_headers(
        api,
        "org/model",
        "a" * 40,
        ["model.safetensors"],
        cache=HeaderCache("http://hub", "org/model", "a" * 40),
        timeout_s=1.0,
        sleep=waits.append,
    )


def test_429_without_retry_after_backs_off_1_2_4_8_s_then_gives_up(tmp_path, monkeypatch):
    waits: list[float] = []
    api = _RateLimitedApi(4, {})
    assert _read(api, tmp_path, monkeypatch, waits)["tensors"] == {
        "w": {"dtype": "BF16", "shape": [2, 2]}
    }
    assert waits == [1.0, 2.0, 4.0, 8.0]

    waits.clear()
    with pytest.raises(HfHubHTTPError):
        _read(_RateLimitedApi(5, {}), tmp_path / "other", monkeypatch, waits)
    assert waits == [1.0, 2.0, 4.0, 8.0]


def test_429_retry_after_is_honoured_within_the_budget(tmp_path, monkeypatch):
    waits: list[float] = []
    api = _RateLimitedApi(2, {"Retry-After": "12"})
    assert _read(api, tmp_path, monkeypatch, waits)["shard_count"] == 1
    assert waits == [12.0, 12.0]
    assert api.calls == 3

    waits.clear()
    with pytest.raises(HfHubHTTPError):  # 12 + 12 + 12 s is past the 30 s budget
        _read(_RateLimitedApi(3, {"Retry-After": "12"}), tmp_path / "x", monkeypatch, waits)
    assert waits == [12.0, 12.0]


def test_the_wait_budget_is_shared_by_all_the_files(tmp_path, monkeypatch):
    class PerFile(_RateLimitedApi):
        def __init__(self) -> None:
            super().__init__(0, {"Retry-After": "12"})
            self.limited: set[str] = set()

        def parse_safetensors_file_metadata(self, repo_id, filename, *, revision, timeout):
            if filename not in self.limited:  # every file's first read is a 429
                self.limited.add(filename)
                self.left = 1
            return super().parse_safetensors_file_metadata(
                repo_id, filename, revision=revision, timeout=timeout
            )

    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path))
    waits: list[float] = []
    with pytest.raises(HfHubHTTPError):
        read_hub_headers(
            PerFile(),
            "org/model",
            "a" * 40,
            ["a.safetensors", "b.safetensors", "c.safetensors"],
            cache=HeaderCache("http://hub", "org/model", "a" * 40),
            timeout_s=1.0,
            workers=1,
            sleep=waits.append,
        )
    assert waits == [12.0, 12.0]  # a third 12 s would pass the 30 s of the whole read


def test_rate_limited_past_the_budget_is_a_transient_hub_error(fake_hub, table):
    sha, _ = hub_release(fake_hub, table, shards=2)
    fake_hub.fail_next(
        f"/{REPO}/resolve/{sha}/model-00002-of-00002.safetensors", 429, {"Retry-After": "120"}
    )
    with pytest.raises(HubRateLimited) as raised:
        source(fake_hub).fetch_release(REPO, sha)
    assert raised.value.retry_after_s == 120


# -- mirror folders ---------------------------------------------------------------------------


def mirror_release(root, table, *, shards: int, data: bool) -> MirrorSource:
    folder = root / REPO
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(qwen3_moe_small()))
    for name, content in shard(table, shards, data=data).items():
        (folder / name).write_bytes(content)
    return MirrorSource(HubSpec(kind="mirror", endpoint=str(root)))


def test_a_mirror_reads_only_header_bytes(tmp_path, table):
    # The shards end after their headers: a reader that touched the weights would fail.
    hub = mirror_release(tmp_path, table, shards=8, data=False)

    fetched = hub.fetch_release(REPO, "main")

    assert fetched.safetensors_metadata["tensors"] == as_metadata(table)
    assert fetched.safetensors_metadata["shard_count"] == 8


def test_a_mirror_refuses_an_absurd_header_length(tmp_path, table):
    hub = mirror_release(tmp_path, table, shards=2, data=False)
    path = tmp_path / REPO / "model-00002-of-00002.safetensors"
    path.write_bytes(struct.pack("<Q", 2**40) + b"{}")

    with pytest.raises(HubError) as raised:
        hub.fetch_release(REPO, "main")
    assert "safetensors header of model-00002-of-00002.safetensors" in raised.value.message
    assert "too big" in raised.value.message


def test_a_header_whose_offsets_do_not_fit_its_shape_names_the_tensor(tmp_path, table):
    hub = mirror_release(tmp_path, table, shards=1, data=False)
    header = {"model.norm.weight": {"dtype": "BF16", "shape": [64], "data_offsets": [0, 64]}}
    raw = json.dumps(header).encode()
    (tmp_path / REPO / "model-00001-of-00001.safetensors").write_bytes(
        struct.pack("<Q", len(raw)) + raw
    )

    with pytest.raises(HubError, match=r"tensor 'model.norm.weight': data_offsets span 64 bytes"):
        hub.fetch_release(REPO, "main")


def test_weight_files_follow_transformers_loading_rule():
    index = json.dumps({"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}}).encode()
    names = ["m-1.safetensors", "m-2.safetensors", "consolidated.safetensors", "config.json"]
    assert weight_files(names, index) == ["m-1.safetensors", "m-2.safetensors"]
    assert weight_files(["consolidated.safetensors", "model.safetensors"], None) == [
        "model.safetensors"
    ]
    assert weight_files(["b.safetensors", "a.safetensors", "original/x.safetensors"], None) == [
        "a.safetensors",
        "b.safetensors",
    ]
    with pytest.raises(HubError, match=r"model\.safetensors\.index\.json is not valid JSON"):
        weight_files(names, b"not json")
    with pytest.raises(HubNotFound, match="names 1 shard the repo does not hold: m-2"):
        weight_files(["m-1.safetensors"], index)


def test_a_duplicated_tensor_name_is_reported(tmp_path):
    folder = tmp_path / "org/dup"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "a.safetensors").write_bytes(safetensors_file({"x.weight": ("F16", (2,))}))
    (folder / "b.safetensors").write_bytes(safetensors_file({"x.weight": ("F16", (2,))}))

    fetched = MirrorSource(HubSpec(kind="mirror", endpoint=str(tmp_path))).fetch_release(
        "org/dup", "main"
    )

    assert fetched.safetensors_metadata["duplicates"] == {"count": 1, "names": ["x.weight"]}


# -- what a hostile uploader may write ---------------------------------------------------------


def test_an_index_nested_too_deeply_is_the_release_s_fault_naming_the_file():
    deep = b'{"weight_map": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"

    with pytest.raises(HubError) as raised:
        weight_files(["model-1.safetensors"], deep)
    assert raised.value.message == (
        "model.safetensors.index.json is nested too deeply to be read as JSON."
    )
    assert not raised.value.transient


def test_an_index_mapping_a_tensor_to_a_non_name_is_refused():
    index = json.dumps({"weight_map": {"a": "m-1.safetensors", "b": ["m-2"]}}).encode()

    with pytest.raises(HubError, match=r"maps tensor 'b' to \['m-2'\], not a file name"):
        weight_files(["m-1.safetensors"], index)


def test_an_index_naming_too_many_shards_is_refused_before_any_request(fake_hub):
    names = [f"m-{i}.safetensors" for i in range(MAX_SHARDS + 1)]
    index = json.dumps({"weight_map": {f"t{i}": name for i, name in enumerate(names)}})
    files = {"config.json": b"{}", "model.safetensors.index.json": index.encode()}
    fake_hub.add_repo(REPO, {**files, **dict.fromkeys(names, b"")})

    with pytest.raises(HubError, match=r"names 2,001 safetensors files; day0 reads the headers"):
        source(fake_hub).fetch_release(REPO, "main")
    assert not [r for r in fake_hub.requests if r.path.endswith("0.safetensors")]


def test_too_many_top_level_files_without_an_index_are_refused():
    names = [f"m-{i}.safetensors" for i in range(MAX_SHARDS + 1)]

    with pytest.raises(HubError, match="without an index, 2,001 safetensors files"):
        weight_files(names, None)


def one_tensor_mirror(root, entry, name: str = "model.norm.weight") -> MirrorSource:
    folder = root / REPO
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    raw = json.dumps({name: entry}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return MirrorSource(HubSpec(kind="mirror", endpoint=str(root)))


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        # True and False are ints to Python: [False, 2] would pass as [0, 2].
        ({"dtype": "BF16", "shape": [1], "data_offsets": [False, 2]}, "not two byte offsets"),
        ({"dtype": "BF16", "shape": [2**41], "data_offsets": [0, 2**42]}, "shape"),
        ({"dtype": "BF16", "shape": [1] * 9, "data_offsets": [0, 2]}, "9 dims"),
        ({"dtype": "BF16", "shape": [1], "data_offsets": [0, 2**64 + 1]}, "not two byte offsets"),
    ],
)
def test_a_malformed_header_entry_names_the_file_and_the_tensor(tmp_path, entry, reason):
    hub = one_tensor_mirror(tmp_path, entry)

    with pytest.raises(HubError) as raised:
        hub.fetch_release(REPO, "main")
    assert "safetensors header of model.safetensors, tensor 'model.norm.weight'" in (
        raised.value.message
    )
    assert reason in raised.value.message


def test_an_over_long_tensor_name_is_refused_cut_to_80_characters(tmp_path):
    name = "model.layers." + "9" * 5000 + ".weight"
    hub = one_tensor_mirror(tmp_path, {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}, name)

    with pytest.raises(HubError) as raised:
        hub.fetch_release(REPO, "main")
    message = raised.value.message
    assert "its name is 5,020 characters long (day0 reads names of at most 1,024)" in message
    assert len(message) < 300


@pytest.mark.parametrize("header", [b"[1, 2]", b'{"t": "not a tensor"}', b"[" * 100_000])
def test_a_header_that_is_not_an_object_of_tensors_is_the_release_s_fault(tmp_path, header):
    folder = tmp_path / REPO
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)

    with pytest.raises(HubError, match=r"safetensors header of model\.safetensors"):
        MirrorSource(HubSpec(kind="mirror", endpoint=str(tmp_path))).fetch_release(REPO, "main")


def test_too_many_tensors_are_refused_with_the_count(tmp_path, table, monkeypatch):
    monkeypatch.setattr(safetensors_headers, "MAX_TENSORS", len(table) - 1)
    hub = mirror_release(tmp_path, table, shards=4, data=False)
    index = tmp_path / REPO / "model.safetensors.index.json"
    with pytest.raises(HubError, match=f"index.json names {len(table):,} tensors; day0 reads"):
        hub.fetch_release(REPO, "main")
    index.unlink()  # the headers alone: every top-level file is read

    with pytest.raises(HubError, match=f"hold {len(table):,} tensors; day0 reads at most"):
        hub.fetch_release(REPO, "main")


def test_too_many_tensors_over_the_hub_stop_the_reads(fake_hub, table, monkeypatch):
    monkeypatch.setattr(safetensors_headers, "MAX_TENSORS", len(table) // 2)
    files = shard(table, SHARDS)
    del files["model.safetensors.index.json"]
    fake_hub.add_repo(REPO, {"config.json": json.dumps(qwen3_moe_small()).encode(), **files})

    with pytest.raises(HubError, match=r"tensors; day0 reads at most \d+"):
        source(fake_hub).fetch_release(REPO, "main")
    # the reads stop once the count is past the bound (those in flight finish)
    shard_reads = [r for r in fake_hub.requests if r.path.endswith(".safetensors")]
    assert len(shard_reads) < SHARDS
