"""Parameters counted from the checkpoint's own safetensors headers, for every family: the
total is exactly the parameters transformers builds, packed 4-bit values count as their
logical elements, quantization scales as bytes only, MTP modules apart; the config-derived
figures stay beside them (tests/checkpoint_cases.py builds the checkpoints)."""

from __future__ import annotations

import math

import pytest

from engine.architecture import analyze_config
from engine.architecture.checkpoint_analysis import with_checkpoint
from engine.architecture.checkpoint_names import fold_tensors, unfold_tensors
from engine.stages.analyze.findings import findings
from engine.stages.fetch.run import summarize_weights
from tests.checkpoint_cases import CASES, Case
from tests.limitation_words import worded

_built: dict[str, Case] = {}


def case(name: str) -> Case:
    if name not in _built:
        _built[name] = CASES[name]()
    return _built[name]


def headers(table: dict) -> dict:
    """What the hub sources return for a checkpoint holding `table`."""
    return {
        "total_size": 0,
        "shard_count": 1,
        "tensors": {name: {"dtype": d, "shape": list(s)} for name, (d, s) in table.items()},
    }


def analyse(c: Case) -> dict:
    weights = summarize_weights(None, headers(c.table))
    return with_checkpoint(analyze_config(c.config, weights=weights).to_dict(), c.config, weights)


@pytest.mark.parametrize("name", list(CASES))
def test_total_params_are_exactly_the_checkpoints(name):
    c = case(name)
    result = analyse(c)

    assert result["params_counted_from"] == "checkpoint"
    assert result["total_params"] == c.params
    assert result["checkpoint"]["total_params"] == c.params
    assert result["extra_params"] == c.mtp_params
    # The config-derived count agrees (within rounding) and is kept beside it: no finding.
    comparison = result["checkpoint"]["comparison"]
    assert comparison["agree"] is True
    assert (
        result["config_figures"]["total_params"] == comparison["figures"]["total_params"]["config"]
    )
    assert not [f for f in findings(result, pool="cpu") if f.key == "analyze:checkpoint-count"]
    # Two independent derivations of the active parameters: the config's layout and the
    # checkpoint's groups with the router's top-k.
    assert result["active_params"] == result["config_figures"]["active_params"]
    check = result["checkpoint_check"]
    assert check["layers"] == {
        "config": c.config.get("num_hidden_layers"),
        "checkpoint": c.config.get("num_hidden_layers"),
    }
    assert not {"missing", "extra", "wrong_shape"} & set(check)


def test_fp8_counts_values_per_dtype_and_scales_as_bytes_only():
    c = case("deepseek_v3")
    result = analyse(c)
    ckpt = result["checkpoint"]

    f8 = sum(math.prod(s) for d, s in c.table.values() if d == "F8_E4M3")
    scales = [s for n, (d, s) in c.table.items() if n.endswith("weight_scale_inv")]
    assert ckpt["params_by_dtype"]["F8_E4M3"] == f8
    assert ckpt["bytes_by_dtype"]["F8_E4M3"] == f8
    assert ckpt["scale_bytes"] == 4 * sum(math.prod(s) for s in scales) > 0
    assert ckpt["bytes_by_group"]["quantization_scales"] == ckpt["scale_bytes"]
    assert "quantization_scales" not in ckpt["params_by_group"]
    # DeepSeek's router bias is a buffer in transformers: stored, not in the total.
    n_moe = c.config["num_hidden_layers"] - c.config["first_k_dense_replace"]
    assert ckpt["buffer_params"] == n_moe * c.config["n_routed_experts"]
    assert ckpt["mtp_modules"] == 1
    assert ckpt["weight_bytes"] == result["weight_bytes"]
    assert ckpt["weight_bytes"] == sum(
        math.ceil(math.prod(s) * {"F8_E4M3": 1, "BF16": 2, "F32": 4}[d])
        for d, s in c.table.values()
    )


def test_mxfp4_blocks_count_their_logical_values():
    c = case("gpt_oss")
    ckpt = analyse(c)["checkpoint"]

    blocks = {n: s for n, (_, s) in c.table.items() if n.endswith("_blocks")}
    assert len(blocks) == 4
    # Two FP4 values a byte: the blocks hold exactly the bf16 experts' elements.
    assert ckpt["params_by_group"]["routed_expert"] == sum(
        math.prod(s) for n, (_, s) in c.table.items() if ".experts." in n and "_scales" not in n
    ) + sum(math.prod(s) for s in blocks.values())
    assert ckpt["params_by_dtype"]["U8"] == 2 * sum(math.prod(s) for s in blocks.values())
    assert ckpt["packed_tensors"] == 4
    assert ckpt["bytes_by_group"]["quantization_scales"] == sum(
        math.prod(s) for n, (_, s) in c.table.items() if n.endswith("_scales")
    )
    assert ckpt["total_params"] == c.params


def test_awq_qweight_counts_eight_values_per_int32():
    c = case("llama_awq")
    ckpt = analyse(c)["checkpoint"]

    qweights = [s for n, (_, s) in c.table.items() if n.endswith(".qweight")]
    assert ckpt["params_by_dtype"]["I32"] == 8 * sum(math.prod(s) for s in qweights)
    assert ckpt["packed_tensors"] == len(qweights) == 7 * 3
    assert ckpt["scale_bytes"] == sum(
        math.prod(s) * (4 if d == "I32" else 2)
        for n, (d, s) in c.table.items()
        if n.endswith((".qzeros", ".scales"))
    )


def test_routed_experts_are_active_by_the_routers_top_k_per_layer():
    c = case("qwen3_moe")
    result = analyse(c)
    ckpt = result["checkpoint"]

    routed = ckpt["params_by_group"]["routed_expert"]
    k, experts = c.config["num_experts_per_tok"], c.config["num_experts"]
    embedding = ckpt["params_by_group"]["embedding"]
    assert ckpt["active_params"] == c.params - embedding - routed + routed * k // experts
    assert ckpt["experts_by_layer"] == {str(experts): c.config["num_hidden_layers"]}


def test_an_unknown_architecture_is_counted_and_the_checkpoint_wins():
    llama = case("llama")
    config = dict(llama.config, model_type="acme_nova", architectures=["NovaForCausalLM"])
    config["tie_word_embeddings"] = True  # the config says tied, the checkpoint has a head
    table = {n.replace(".self_attn.", ".attn."): e for n, e in llama.table.items()}
    result = analyse(Case("nova", config, table, llama.params))

    assert result["total_params"] == llama.params
    assert result["checkpoint_check"]["expected_from"] is None
    assert "transformers knows neither" in result["checkpoint_check"]["why_no_expected"]
    [count] = [
        f for f in worded(findings(result, pool="cpu")) if f.key == "analyze:checkpoint-count"
    ]
    lm_head = llama.config["vocab_size"] * llama.config["hidden_size"]
    assert result["config_figures"]["total_params"] == llama.params - lm_head
    assert "| lm head | 0 | 16,384 | +16,384 |" in count.body
    assert count.title.startswith("Parameters from the config are off by +")


def test_folded_tensors_give_back_every_name():
    c = case("deepseek_v3")
    tensors = headers(c.table)["tensors"]
    del tensors["model.layers.2.mlp.experts.5.up_proj.weight"]  # one layer lacks one expert

    folded = fold_tensors(tensors)

    assert unfold_tensors(folded) == tensors
    assert len(folded) < len(tensors) / 5
    assert {
        "name": "model.layers.*.mlp.experts.*.up_proj.weight",
        "dtype": "F8_E4M3",
        "shape": [32, 64],
        "index": ["2", "0-4,6-7"],
    } in folded
