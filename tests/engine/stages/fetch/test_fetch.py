"""The fetch stage's parsing, without Django or a hub."""

from __future__ import annotations

import pytest

from engine.contract import StageFailed
from engine.hubs.base import ReleaseFiles
from engine.stages.fetch.run import parse_json_file, parse_release_files, summarize_weights


def test_malformed_json_names_the_file_and_the_position():
    with pytest.raises(StageFailed) as info:
        parse_json_file("generation_config.json", b'{"a": 1,\n "b": }')
    assert info.value.reason == (
        "generation_config.json is not valid JSON: Expecting value at line 2 column 7 (char 15)."
    )


def test_non_utf8_is_refused_with_the_offset():
    with pytest.raises(StageFailed, match=r"config.json is not UTF-8 text \(byte 1\)"):
        parse_json_file("config.json", b"{\xff}")


def test_missing_config_and_non_object_config_fail():
    with pytest.raises(StageFailed, match=r"has no config\.json"):
        parse_release_files(ReleaseFiles(repo_id="a/b", revision="r", files={}))
    with pytest.raises(StageFailed, match="not an object"):
        parse_release_files(
            ReleaseFiles(repo_id="a/b", revision="r", files={"config.json": b"[1]"})
        )


def test_index_is_summarized_without_keeping_the_weight_map():
    index = {
        "metadata": {"total_size": 16_060_522_496},
        "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00004.safetensors",
            "model.layers.0.mlp.up_proj.weight": "model-00002-of-00004.safetensors",
            "lm_head.weight": "model-00004-of-00004.safetensors",
        },
    }
    summary = summarize_weights(index, None)
    assert summary == {
        "source": "index",
        "total_size": 16_060_522_496,
        "shard_count": 3,
        "tensor_count": 3,
        "dtypes": {},
    }
    with pytest.raises(StageFailed, match="no 'weight_map'"):
        summarize_weights({"metadata": {}}, None)


def test_safetensors_headers_are_summarized_per_dtype():
    metadata = {
        "total_size": 0,
        "tensors": {
            "w": {"dtype": "BF16", "shape": [4, 8]},
            "s": {"dtype": "F32", "shape": [4]},
            "q": {"dtype": "F8_E4M3", "shape": [16, 16]},
        },
    }
    summary = summarize_weights(None, metadata)
    assert summary["dtypes"] == {"BF16": 64, "F32": 16, "F8_E4M3": 256}
    assert summary["total_size"] == 336
    assert summary["source"] == "safetensors_headers"


def test_headers_are_kept_with_an_index_and_folded_by_layer_and_expert():
    tensors = {
        f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight": {
            "dtype": "F8_E4M3",
            "shape": [32, 64],
        }
        for layer in range(3, 61)
        for expert in range(256)
        for proj in ("gate_proj", "up_proj")
    }
    tensors["lm_head.weight"] = {"dtype": "BF16", "shape": [256, 64]}
    index = {
        "metadata": {"total_size": 123},
        "weight_map": dict.fromkeys(tensors, "model-00001-of-00001.safetensors"),
    }

    summary = summarize_weights(index, {"total_size": 7, "shard_count": 1, "tensors": tensors})

    assert summary["source"] == "safetensors_headers"
    assert summary["total_size"] == 7
    assert summary["index_total_size"] == 123
    assert summary["tensor_count"] == 58 * 256 * 2 + 1
    assert "index_mismatch" not in summary
    assert summary["tensors"] == [
        {"name": "lm_head.weight", "dtype": "BF16", "shape": [256, 64]},
        {
            "name": "model.layers.*.mlp.experts.*.gate_proj.weight",
            "dtype": "F8_E4M3",
            "shape": [32, 64],
            "index": ["3-60", "0-255"],
        },
        {
            "name": "model.layers.*.mlp.experts.*.up_proj.weight",
            "dtype": "F8_E4M3",
            "shape": [32, 64],
            "index": ["3-60", "0-255"],
        },
    ]


def test_nan_and_infinity_are_refused_with_their_position():
    with pytest.raises(StageFailed) as info:
        parse_json_file("config.json", b'{\n  "rope_theta": NaN\n}')
    assert info.value.reason == (
        "config.json is not valid JSON: NaN at line 2 column 17 (char 18); "
        "JSON has no NaN or Infinity."
    )
    with pytest.raises(StageFailed, match="-Infinity at line 1 column 7"):
        parse_json_file("config.json", b'{"a": -Infinity}')


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        # 1e400 is parsed as infinity: int() of it raised OverflowError.
        (b'{"total_size": 1e400}', r"metadata\.total_size inf is not a byte count"),
        (b'{"total_size": -1}', r"metadata\.total_size -1 is not a byte count"),
        (b'{"total_size": true}', r"metadata\.total_size True is not a byte count"),
        (b"[1]", r"'metadata' is \[1\], not an object"),
    ],
)
def test_a_malformed_index_total_size_is_the_release_s_fault(metadata, reason):
    index = b'{"metadata": ' + metadata + b', "weight_map": {"w": "model.safetensors"}}'
    fetched = ReleaseFiles(
        repo_id="a/b",
        revision="r",
        files={"config.json": b"{}", "model.safetensors.index.json": index},
    )

    with pytest.raises(StageFailed, match=r"^model\.safetensors\.index\.json: " + reason):
        parse_release_files(fetched)


def test_an_index_nested_too_deeply_names_the_file():
    with pytest.raises(StageFailed, match=r"index\.json is nested too deeply to be read as JSON"):
        parse_json_file("model.safetensors.index.json", b"[" * 200_000 + b"]" * 200_000)


def test_a_tensor_name_past_the_int_string_limit_is_refused_naming_it():
    # int() of a 5,000-digit string raises ValueError (Python's int-string limit).
    name = "model.layers." + "7" * 5000 + ".weight"
    metadata = {"tensors": {name: {"dtype": "BF16", "shape": [4]}}}

    with pytest.raises(StageFailed) as info:
        summarize_weights(None, metadata)
    assert info.value.reason.startswith("safetensors header of tensor 'model.layers.7777")
    assert "its name is 5,020 characters long" in info.value.reason
    assert len(info.value.reason) < 300


def test_a_tensor_shape_past_the_bounds_is_refused_naming_it():
    metadata = {"tensors": {"w": {"dtype": "BF16", "shape": [2**41]}}}

    with pytest.raises(StageFailed, match=r"tensor 'w': shape \[2199023255552\] is not a list"):
        summarize_weights(None, metadata)
