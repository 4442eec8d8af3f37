"""Real weights: a small checkpoint in a mirror folder runs at full size in operators and
precision; too large, on a Hub, or broken, the seeded twin runs and says why (no Django)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from engine.contract import PoolSpec, ReleaseRef, StageContext, StageFailed
from engine.stages.fetch import run as fetch
from engine.stages.operators import run as operators
from engine.stages.precision import run as precision
from engine.twin import DEFAULT_REAL_WEIGHTS_MAX_BYTES, twin_for_release
from engine.twin.real import HUB_NOT_DOWNLOADED

# Builds and runs scaled twins with torch: left out of `make test-fast`.
pytestmark = pytest.mark.slow

CPU = PoolSpec(name="cpu", backend="cpu", queue="cpu")
REPO = "acme/tiny-llama"
TENSOR = "model.layers.1.mlp.up_proj.weight"


@dataclass(frozen=True)
class RoomyPool(PoolSpec):
    """A pool that sets its own limit (PoolSpec itself has no such field yet)."""

    real_weights_max_bytes: object = DEFAULT_REAL_WEIGHTS_MAX_BYTES


def write_release(root: Path, repo_id: str = REPO) -> Path:
    """A tiny Llama saved by transformers itself into `<root>/<org>/<name>/`."""
    torch.manual_seed(7)
    model = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            vocab_size=256,
        )
    )
    folder = root / repo_id
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def context(root: Path, *, pool=CPU, revision: str = "main", **release) -> StageContext:
    """A context whose `previous["fetch"]` is the real fetch stage's result for the folder."""
    ref = ReleaseRef("mirror", str(root), REPO, revision)
    fetched = fetch.run(StageContext(release=ref, pool=pool))
    if release:
        ref = replace(ref, **release)
    return StageContext(release=ref, pool=pool, previous={"fetch": fetched})


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mirror")
    write_release(root)
    return root


@pytest.fixture
def own_mirror(tmp_path) -> Path:
    write_release(tmp_path)
    return tmp_path


def test_the_fetch_result_sizes_the_checkpoint(mirror):
    weights = context(mirror).previous["fetch"]["weights"]
    assert weights["source"] == "safetensors_headers"
    assert weights["tensor_count"] == 21
    saved = load_file(mirror / REPO / "model.safetensors")
    assert weights["total_size"] == sum(t.numel() * t.element_size() for t in saved.values())


def test_the_real_model_holds_the_saved_tensors_at_full_size(mirror):
    ctx = context(mirror)
    ctx = context(mirror, revision=ctx.previous["fetch"]["revision"])  # the revision checks out
    twin = twin_for_release(ctx, ctx.previous["fetch"]["config"])
    saved = load_file(mirror / REPO / "model.safetensors")
    total = ctx.previous["fetch"]["weights"]["total_size"]
    assert twin.description["weights"] == (
        f"real (21 tensors, {total} bytes from model.safetensors)"
    )
    assert twin.description["weights_source"] == "real"
    assert twin.description["sizes"] == []
    assert twin.description["notes"][0].startswith("nothing was shrunk")
    assert twin.description["code_source"] == "transformers"
    assert twin.config.hidden_size == 64 and twin.config.vocab_size == 256  # not shrunk
    params = dict(twin.model.named_parameters())
    assert torch.equal(params[TENSOR], saved[TENSOR])
    assert all(torch.equal(params[name], tensor) for name, tensor in saved.items())
    assert twin.description["parameters"] == sum(t.numel() for t in saved.values())
    assert not twin.model.training and params[TENSOR].dtype == torch.float32
    json.dumps(twin.description, allow_nan=False)


def test_operators_measure_the_real_release(mirror):
    result = operators.run(context(mirror))
    twin = result["twin"]
    assert twin["weights_source"] == "real" and twin["weights"].startswith("real (21 tensors")
    assert twin["class"] == "LlamaForCausalLM"
    assert result["missing"] == [] and result["counts"]["covered"] == len(result["operators"])
    recorded = {op["name"]: op for op in result["operators"]}
    assert "bfloat16" in recorded["aten::embedding.default"]["dtypes"]


def test_precision_compares_the_real_release_in_float32_and_each_dtype(mirror):
    result = precision.run(context(mirror))
    assert result["twin"]["weights_source"] == "real"
    assert result["reference"] == {"device": "cpu", "dtype": "float32"}
    assert result["passed"] is True
    bf16 = result["dtypes"]["bfloat16"]
    assert bf16["mean_abs_error"] > 0 and 0.99 < bf16["cosine_similarity"] < 1.0
    # the real model has 2 layers (a seeded twin of this config would have 4)
    assert {row["layer"] for row in bf16["layers"]} == {0, 1, 2}


def test_a_checkpoint_over_the_limit_keeps_the_seeded_twin(mirror):
    ctx = context(mirror)
    fetched = dict(ctx.previous["fetch"])
    fetched["weights"] = dict(fetched["weights"], total_size=3 * 1024**3)
    ctx = StageContext(release=ctx.release, pool=CPU, previous={"fetch": fetched})
    twin = twin_for_release(ctx, fetched["config"])
    reason = (
        f"real weights not loaded: the checkpoint is {3 * 1024**3} bytes, over pool cpu's "
        f"limit of {DEFAULT_REAL_WEIGHTS_MAX_BYTES} bytes (real_weights_max_bytes)"
    )
    assert twin.description["weights_source"] == "seeded"
    assert twin.description["notes"][-1] == reason
    assert twin.description["weights"].endswith(f"({reason})")


def test_the_pool_sets_its_own_limit(mirror):
    small = RoomyPool(name="tight", backend="cpu", queue="cpu", real_weights_max_bytes=1000)
    result = operators.run(context(mirror, pool=small))
    assert result["twin"]["weights_source"] == "seeded"
    assert "over pool tight's limit of 1000 bytes" in result["twin"]["notes"][-1]
    roomy = RoomyPool(name="roomy", backend="cpu", queue="cpu", real_weights_max_bytes=10**9)
    ctx = context(mirror, pool=roomy)
    twin = twin_for_release(ctx, ctx.previous["fetch"]["config"])
    assert twin.description["weights_source"] == "real"
    bad = RoomyPool(name="bad", backend="cpu", queue="cpu", real_weights_max_bytes="2GB")
    with pytest.raises(StageFailed, match=r"pool bad: real_weights_max_bytes must be a whole"):
        operators.run(StageContext(release=ctx.release, pool=bad, previous=ctx.previous))


def test_a_hub_release_keeps_the_seeded_twin_and_says_why(mirror):
    ctx = context(mirror, hub_kind="huggingface", hub_endpoint="")
    result = precision.run(ctx)
    assert result["twin"]["weights_source"] == "seeded"
    assert result["twin"]["notes"][-1] == HUB_NOT_DOWNLOADED
    assert HUB_NOT_DOWNLOADED == "real weights not downloaded: the fetch stage reads metadata only"
    assert result["twin"]["sizes"]  # the seeded twin was shrunk and says so


def test_a_corrupt_shard_falls_back_naming_the_file(own_mirror):
    ctx = context(own_mirror)
    shard = own_mirror / REPO / "model.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # cut short after the fetch read its header
    twin = twin_for_release(ctx, ctx.previous["fetch"]["config"])
    note = twin.description["notes"][-1]
    assert twin.description["weights_source"] == "seeded"
    assert note.startswith("real weights not loaded: model.safetensors is unreadable: ")
    assert note.endswith("incomplete metadata, file not fully covered")


def _rewrite(own_mirror: Path, edit) -> StageContext:
    shard = own_mirror / REPO / "model.safetensors"
    tensors = load_file(shard)
    edit(tensors)
    save_file(tensors, shard, metadata={"format": "pt"})
    return context(own_mirror)


def test_a_missing_tensor_falls_back_naming_it(own_mirror):
    ctx = _rewrite(own_mirror, lambda t: t.pop(TENSOR))
    twin = twin_for_release(ctx, ctx.previous["fetch"]["config"])
    assert twin.description["weights_source"] == "seeded"
    assert twin.description["notes"][-1] == (
        f"real weights not loaded: the checkpoint lacks 1 tensor the model needs: {TENSOR}"
    )


def test_a_shape_mismatch_falls_back_naming_both_shapes(own_mirror):
    ctx = _rewrite(own_mirror, lambda t: t.update({TENSOR: torch.zeros(64, 64)}))
    result = operators.run(ctx)
    assert result["twin"]["weights_source"] == "seeded"
    assert result["twin"]["notes"][-1] == (
        "real weights not loaded: tensor shapes differ from the config's: "
        f"{TENSOR} [64, 64] in the checkpoint, [128, 64] in the model"
    )


def test_a_folder_changed_since_the_fetch_is_not_loaded(own_mirror):
    ctx = context(own_mirror)
    ctx = context(own_mirror, revision=ctx.previous["fetch"]["revision"])
    shutil.copy(own_mirror / REPO / "model.safetensors", own_mirror / REPO / "extra.safetensors")
    twin = twin_for_release(ctx, ctx.previous["fetch"]["config"])
    assert twin.description["weights_source"] == "seeded"
    assert "the mirror folder changed since revision" in twin.description["notes"][-1]
