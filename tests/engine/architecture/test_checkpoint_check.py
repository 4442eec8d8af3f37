"""The checkpoint's tensors against what the config implies (transformers' meta-device build
of it): a missing layer, a wrong shape, an extra layer, a wrapper's other prefixes, and an
architecture transformers does not know (layer counts only). Each problem is a finding that
names the tensors."""

from __future__ import annotations

import pytest

from engine.stages.analyze.findings import findings
from tests.checkpoint_cases import Case
from tests.limitation_words import worded

from .test_checkpoint_count import analyse, case


def by_key(result: dict) -> dict:
    return {f.key: f for f in worded(findings(result, pool="cpu"))}


def corrupted(name: str, table: dict) -> Case:
    c = case(name)
    return Case(c.name, c.config, table, c.params, c.mtp_params)


def test_a_missing_layer_names_the_layer_and_its_tensors():
    c = case("deepseek_v3")
    table = {n: e for n, e in c.table.items() if not n.startswith("model.layers.2.")}

    result = analyse(corrupted("deepseek_v3", table))

    check = result["checkpoint_check"]
    assert check["layers"] == {"config": 4, "checkpoint": 3, "missing": "2"}
    lost = sorted(n for n in c.table if n.startswith("model.layers.2.") and "scale" not in n)
    assert check["missing"]["count"] == len(lost)  # the router's bias buffer too
    assert "model.layers.2.mlp.gate.e_score_correction_bias" in lost
    assert check["missing"]["names"][0] == "model.layers.2.input_layernorm.weight"
    assert all(n.startswith("model.layers.2.") for n in check["missing"]["names"])
    found = by_key(result)
    assert found["analyze:checkpoint-layers"].severity == "major"
    assert found["analyze:checkpoint-layers"].title == (
        "The checkpoint holds 3 decoder layers, the config says 4"
    )
    assert "layers 2 are missing" in found["analyze:checkpoint-layers"].body
    missing = found["analyze:checkpoint-missing"]
    assert "`model.layers.2.input_layernorm.weight`" in missing.body
    assert f"and {len(lost) - 10} more" in missing.body
    # The checkpoint is the truth: its count, one layer short, is the analysis's.
    assert result["total_params"] < c.params
    assert "analyze:checkpoint-count" in found


def test_a_wrong_shape_names_the_tensor_with_both_shapes():
    c = case("qwen3_moe")
    table = dict(c.table)
    table["model.layers.1.self_attn.k_proj.weight"] = ("BF16", (48, 64))

    result = analyse(corrupted("qwen3_moe", table))

    wrong = result["checkpoint_check"]["wrong_shape"]
    assert wrong["count"] == 1
    assert wrong["tensors"] == [
        {
            "name": "model.layers.1.self_attn.k_proj.weight",
            "expected": [32, 64],
            "found": [48, 64],
            "dtype": "BF16",
            "packed": 1,
        }
    ]
    shape = by_key(result)["analyze:checkpoint-shape"]
    assert shape.severity == "major"
    assert "| `model.layers.1.self_attn.k_proj.weight` | `[32, 64]` | `[48, 64]` |" in shape.body


def test_a_packed_tensor_of_the_wrong_size_is_a_wrong_shape():
    c = case("gpt_oss")
    table = dict(c.table)
    name = "model.layers.0.mlp.experts.down_proj_blocks"
    dtype, (experts, rows, blocks, size) = table[name]
    table[name] = (dtype, (experts, rows, blocks - 1, size))

    result = analyse(corrupted("gpt_oss", table))

    [wrong] = result["checkpoint_check"]["wrong_shape"]["tensors"]
    assert wrong["name"] == name
    assert wrong["packed"] == 2


def test_an_extra_layer_past_the_config_names_the_layer_and_its_tensors():
    c = case("llama")
    table = dict(c.table)
    table.update(
        {
            n.replace("model.layers.2.", "model.layers.3."): e
            for n, e in c.table.items()
            if n.startswith("model.layers.2.")
        }
    )

    result = analyse(corrupted("llama", table))

    check = result["checkpoint_check"]
    assert check["layers"] == {"config": 3, "checkpoint": 4, "extra": "3"}
    assert check["extra"]["count"] == 9
    assert check["extra"]["names"][0] == "model.layers.3.input_layernorm.weight"
    found = by_key(result)
    assert "layers 3 are past the config's last layer" in found["analyze:checkpoint-layers"].body
    assert "`model.layers.3.self_attn.q_proj.weight`" in found["analyze:checkpoint-extra"].body
    assert result["total_params"] > c.params


def test_mtp_layers_the_config_does_not_declare_are_reported():
    c = case("glm4_moe")
    config = dict(c.config, num_nextn_predict_layers=0)

    result = analyse(Case(c.name, config, c.table, c.params, c.mtp_params))

    # Its enorm/hnorm/eh_proj mark layer 3 as an MTP module all the same.
    assert result["extra_params"] == c.mtp_params
    assert result["checkpoint_check"]["mtp"] == {"config": 0, "checkpoint": 1}
    assert by_key(result)["analyze:checkpoint-mtp"].title == (
        "The checkpoint holds 1 MTP module, the config says 0"
    )


def test_other_wrapper_prefixes_match_the_same_tensors():
    c = case("deepseek_v4")
    # The V4 case already names tensors its own way (`embed`, `head`, `layers.N.attn`);
    # wrapped under `language_model.model.` they are still the same tensors.
    table = {f"language_model.model.{n}": e for n, e in c.table.items()}

    result = analyse(corrupted("deepseek_v4", table))

    check = result["checkpoint_check"]
    assert check["expected_from"] == "DeepseekV4ForCausalLM"
    assert check["matched_tensors"] == check["expected_tensors"]
    assert not {"missing", "extra", "wrong_shape"} & set(check)
    assert result["total_params"] == c.params


def test_an_unknown_architecture_is_checked_for_layer_counts_only():
    c = case("llama")
    config = dict(c.config, model_type="acme_nova", architectures=["NovaForCausalLM"])
    table = {n: e for n, e in c.table.items() if not n.startswith("model.layers.1.")}

    result = analyse(Case("nova", config, table, c.params))

    check = result["checkpoint_check"]
    assert check["expected_from"] is None
    assert check["layers"] == {"config": 3, "checkpoint": 2, "missing": "1"}
    assert "missing" not in check
    assert "analyze:checkpoint-layers" in by_key(result)


def test_index_and_headers_that_disagree_are_a_finding():
    from engine.architecture import analyze_config
    from engine.architecture.checkpoint_analysis import with_checkpoint
    from engine.stages.fetch.run import summarize_weights

    from .test_checkpoint_count import headers

    c = case("llama")
    metadata = headers(c.table)
    index = {"weight_map": dict.fromkeys([*metadata["tensors"], "model.layers.9.x.weight"], "a")}
    del index["weight_map"]["lm_head.weight"]
    weights = summarize_weights(index, metadata)

    assert weights["index_mismatch"] == {
        "index_only": {"count": 1, "names": ["model.layers.9.x.weight"]},
        "headers_only": {"count": 1, "names": ["lm_head.weight"]},
    }
    result = with_checkpoint(analyze_config(c.config, weights=weights).to_dict(), c.config, weights)
    body = by_key(result)["analyze:checkpoint-index"].body
    assert body == (
        "The index names `model.layers.9.x.weight`, which no header holds; the headers hold "
        "`lm_head.weight`, which the index omits."
    )


@pytest.mark.parametrize("name", ["llama", "deepseek_v3"])
def test_a_clean_checkpoint_raises_no_checkpoint_finding(name):
    result = analyse(case(name))
    assert not [k for k in by_key(result) if k.startswith("analyze:checkpoint")]
