"""MirrorSource on a temporary folder laid out as `<root>/<org>/<name>/`, and hub dispatch."""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.hubs import hub_source
from engine.hubs.base import HubError, HubNotFound, HubSpec
from engine.hubs.huggingface import HuggingFaceSource
from engine.hubs.mirror import MirrorSource
from engine.hubs.modelscope import ModelScopeSource
from tests.checkpoints import safetensors_file

REALCONFIGS = Path(__file__).resolve().parents[2] / "data" / "realconfigs"


def realconfig(repo_id: str) -> bytes:
    return (REALCONFIGS / f"{repo_id.replace('/', '__')}.json").read_bytes()


def put_release(
    root: Path, repo_id: str, *, mtime: datetime | None = None, shards: int = 2, index: bool = True
) -> Path:
    """Write a release folder: real config, README, index and its shards (each a safetensors
    file holding the one F16 tensor of 4 values the index puts there); every file's mtime
    set to `mtime`."""
    folder = root / repo_id
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(realconfig(repo_id))
    (folder / "README.md").write_text(f"# {repo_id}\n")
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    if index:
        weight_map = {f"model.layers.{i}.weight": name for i, name in enumerate(names)}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for i, name in enumerate(names):
        (folder / name).write_bytes(safetensors_file({f"model.layers.{i}.weight": ("F16", (4,))}))
    if mtime is not None:
        set_mtime(folder, mtime)
    return folder


def set_mtime(folder: Path, when: datetime) -> None:
    for path in folder.iterdir():
        os.utime(path, (when.timestamp(), when.timestamp()))


def mirror(root: Path, **spec: str) -> MirrorSource:
    return MirrorSource(HubSpec(kind="mirror", endpoint=str(root), **spec))


JUL = datetime(2025, 7, 21, 9, 0, tzinfo=UTC)
DEC = datetime(2024, 12, 25, 12, 0, tzinfo=UTC)
SEP = datetime(2024, 9, 16, 11, 55, tzinfo=UTC)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "mirror"
    put_release(root, "Qwen/Qwen2.5-72B-Instruct", mtime=SEP)
    put_release(root, "deepseek-ai/DeepSeek-V3", mtime=DEC)
    put_release(root, "Qwen/Qwen3-235B-A22B-Instruct-2507", mtime=JUL)
    return root


def test_lists_newest_first_by_file_mtimes_without_a_publication_time(root):
    candidates = mirror(root).list_releases()

    assert [c.repo_id for c in candidates] == [
        "Qwen/Qwen3-235B-A22B-Instruct-2507",
        "deepseek-ai/DeepSeek-V3",
        "Qwen/Qwen2.5-72B-Instruct",
    ]
    # An mtime is when the files were copied, not published: the app records first sight.
    assert [c.published_at for c in candidates] == [None, None, None]
    assert all(c.complete and c.reason == "" for c in candidates)
    assert mirror(root).list_releases(limit=1)[0].repo_id == "Qwen/Qwen3-235B-A22B-Instruct-2507"


def test_author_and_pattern_filter(root):
    assert [c.repo_id for c in mirror(root, author="qwen").list_releases()] == [
        "Qwen/Qwen3-235B-A22B-Instruct-2507",
        "Qwen/Qwen2.5-72B-Instruct",
    ]
    assert [c.repo_id for c in mirror(root, repo_pattern="*/DeepSeek-*").list_releases()] == [
        "deepseek-ai/DeepSeek-V3"
    ]
    assert mirror(root, author="meta-llama").list_releases() == []


def test_revision_is_the_content_hash_and_stable_across_scans(root):
    repo_id = "deepseek-ai/DeepSeek-V3"
    first = mirror(root).latest_release(repo_id)
    set_mtime(root / repo_id, JUL)  # touched, not changed: same revision
    again = mirror(root).latest_release(repo_id)

    assert again.revision == first.revision
    assert len(first.revision) == 64
    folder = root / repo_id
    expected = hashlib.sha256()
    for name in ("config.json", "model.safetensors.index.json", "README.md"):
        content = (folder / name).read_bytes()
        expected.update(f"{name}\0{len(content)}\0".encode() + content)
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        expected.update(f"{name}\0{(folder / name).stat().st_size}\0".encode())
    assert first.revision == expected.hexdigest()


def test_a_changed_config_is_a_new_revision_and_the_old_one_is_gone(root):
    repo_id = "Qwen/Qwen2.5-72B-Instruct"
    hub = mirror(root)
    old = hub.latest_release(repo_id).revision
    config = json.loads(realconfig(repo_id))
    config["rope_theta"] = 2_000_000.0
    (root / repo_id / "config.json").write_text(json.dumps(config))

    new = hub.latest_release(repo_id).revision
    assert new != old
    assert json.loads(hub.fetch_release(repo_id, new).files["config.json"])["rope_theta"] == 2e6
    with pytest.raises(HubNotFound, match="mirror changed"):
        hub.fetch_release(repo_id, old)


def test_fetch_release_reads_the_files_and_sizes(root):
    repo_id = "Qwen/Qwen3-235B-A22B-Instruct-2507"
    folder = root / repo_id
    (folder / "generation_config.json").write_text('{"temperature": 0.7}')
    (folder / "tokenizer.json").write_text("{}")
    hub = mirror(root)
    revision = hub.latest_release(repo_id).revision
    # generation_config.json is a release file: adding it made a new revision
    fetched = hub.fetch_release(repo_id, revision)

    assert fetched.revision == revision
    assert set(fetched.files) == {
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "README.md",
    }
    assert fetched.files["config.json"] == realconfig(repo_id)
    assert json.loads(fetched.files["config.json"])["num_experts"] == 128
    assert fetched.file_sizes == {p.name: p.stat().st_size for p in folder.iterdir()}
    # The index's shards' headers are read too.
    assert fetched.safetensors_metadata["tensors"] == {
        "model.layers.0.weight": {"dtype": "F16", "shape": [4]},
        "model.layers.1.weight": {"dtype": "F16", "shape": [4]},
    }


def test_incomplete_without_config(root):
    (root / "deepseek-ai/DeepSeek-V3/config.json").unlink()
    candidate = mirror(root).latest_release("deepseek-ai/DeepSeek-V3")
    assert candidate.complete is False
    assert candidate.reason.startswith("no config.json")


def test_incomplete_when_the_index_names_missing_shards(root):
    (root / "deepseek-ai/DeepSeek-V3/model-00002-of-00002.safetensors").unlink()
    candidate = mirror(root).latest_release("deepseek-ai/DeepSeek-V3")
    assert candidate.complete is False
    assert candidate.reason == (
        "model.safetensors.index.json names 1 shard not uploaded yet: "
        "model-00002-of-00002.safetensors"
    )


@pytest.mark.parametrize(
    "leftover",
    [
        "model-00002-of-00002.safetensors.part",
        "model-00002-of-00002.safetensors.incomplete",
        ".cache/huggingface/download/model-00002-of-00002.safetensors.incomplete",
        "config.json.tmp",
    ],
)
def test_incomplete_while_a_file_is_still_being_written(root, leftover):
    path = root / "Qwen/Qwen2.5-72B-Instruct" / leftover
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0")
    candidate = mirror(root).latest_release("Qwen/Qwen2.5-72B-Instruct")
    assert candidate.complete is False
    assert candidate.reason == f"files still being written: {leftover}"


def test_reads_safetensors_headers_when_there_is_no_index(tmp_path):
    root = tmp_path / "mirror"
    folder = put_release(root, "openai/gpt-oss-20b", shards=0, index=False)
    tensors = {
        "model.embed_tokens.weight": torch.zeros(64, 32, dtype=torch.bfloat16),
        "model.layers.0.mlp.experts.gate_up_proj_blocks": torch.zeros(4, 8, 16, dtype=torch.uint8),
        "model.layers.0.mlp.experts.gate_up_proj_scales": torch.zeros(4, 8, dtype=torch.uint8),
        "model.layers.0.self_attn.sinks": torch.zeros(8, dtype=torch.float32),
        "model.layers.0.self_attn.q_proj.weight": torch.zeros(8, 8, dtype=torch.float8_e4m3fn),
    }
    save_file(tensors, folder / "model.safetensors")
    hub = mirror(root)

    fetched = hub.fetch_release(
        "openai/gpt-oss-20b", hub.latest_release("openai/gpt-oss-20b").revision
    )

    metadata = fetched.safetensors_metadata
    assert metadata["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert metadata["total_size"] == 4096 + 512 + 32 + 32 + 64
    assert metadata["shard_count"] == 1
    assert metadata["tensors"]["model.layers.0.mlp.experts.gate_up_proj_blocks"] == {
        "dtype": "U8",
        "shape": [4, 8, 16],
    }
    assert metadata["tensors"]["model.layers.0.self_attn.q_proj.weight"]["dtype"] == "F8_E4M3"
    assert metadata["tensors"]["model.embed_tokens.weight"]["dtype"] == "BF16"


def test_an_unreadable_safetensors_header_is_a_hub_error(tmp_path):
    root = tmp_path / "mirror"
    folder = put_release(root, "openai/gpt-oss-20b", shards=0, index=False)
    (folder / "model.safetensors").write_bytes(b"\xff" * 32)
    with pytest.raises(HubError, match=r"safetensors header of model\.safetensors"):
        mirror(root).fetch_release("openai/gpt-oss-20b", "main")


def test_missing_root_and_missing_release(tmp_path, root):
    with pytest.raises(HubNotFound, match="does not exist"):
        mirror(tmp_path / "not-mounted").list_releases()
    with pytest.raises(HubNotFound, match=r"has no folder meta-llama/Llama-3\.1-8B"):
        mirror(root).fetch_release("meta-llama/Llama-3.1-8B", "0" * 64)
    with pytest.raises(HubError, match="root folder"):
        hub_source(HubSpec(kind="mirror"))


def test_hub_source_dispatches_on_kind(tmp_path):
    assert isinstance(hub_source(HubSpec(kind="mirror", endpoint=str(tmp_path))), MirrorSource)
    assert isinstance(hub_source(HubSpec(kind="huggingface")), HuggingFaceSource)
    assert isinstance(hub_source(HubSpec(kind="modelscope")), ModelScopeSource)
    with pytest.raises(ValueError, match="known kinds are huggingface, modelscope, mirror"):
        hub_source(HubSpec(kind="gitlab"))


@pytest.mark.parametrize("name", ["README.md", "modeling_evil.py", "model.safetensors"])
def test_a_file_linking_out_of_the_mirror_is_refused_unread(tmp_path, name):
    """A release file that is a link to a worker's secret (its environment, a key) is refused
    naming the file; nothing of the target reaches the release's files."""
    root = tmp_path / "mirror"
    folder = put_release(root, "openai/gpt-oss-20b", shards=0, index=False)
    secret = tmp_path / "worker.env"
    secret.write_text("SECRET_KEY=do-not-leak\n")
    (folder / name).unlink(missing_ok=True)
    (folder / name).symlink_to(secret)
    put_release(root, "Qwen/Qwen2.5-72B-Instruct")
    source = mirror(root)
    # The watch still lists both: one release's link does not stop the others' polling.
    assert {c.repo_id for c in source.list_releases()} == {
        "openai/gpt-oss-20b",
        "Qwen/Qwen2.5-72B-Instruct",
    }
    with pytest.raises(HubError, match=rf"{re.escape(name)} links outside the mirror") as err:
        source.fetch_release("openai/gpt-oss-20b", "main")
    assert not err.value.transient and "do-not-leak" not in str(err.value)
    with pytest.raises(HubError, match="links outside the mirror"):
        source.fetch_files("openai/gpt-oss-20b", "main", [name])


def test_a_link_inside_the_mirror_is_followed(tmp_path):
    """A snapshot's files may link to blobs kept elsewhere under the same mirror root."""
    root = tmp_path / "mirror"
    folder = put_release(root, "openai/gpt-oss-20b", shards=0, index=False)
    blobs = root / ".blobs"
    blobs.mkdir()
    (folder / "config.json").rename(blobs / "abc123")
    (folder / "config.json").symlink_to(blobs / "abc123")
    fetched = mirror(root).fetch_release("openai/gpt-oss-20b", "main")
    assert fetched.files["config.json"] == realconfig("openai/gpt-oss-20b")
