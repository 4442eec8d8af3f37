"""Layer kinds day0 does not know: counted from the name and the standard keys, labelled as an
estimate, refused only when the keys are missing (engine/architecture/layer_kinds.py).

MiniMax-M3's published config.json (tests/data/unknown_layer_kinds, with its source) is the
real case: transformers resolves its `layer_types` to "minimax_m3_sparse" on layers 3-59."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.architecture import AnalysisError, analyze_config
from engine.architecture.attention import attention_layout
from engine.architecture.config_reader import read_config
from engine.architecture.moe import moe_layout
from engine.architecture.params import build_inventory
from tests.limitation_words import findings_for_stage

DATA = Path(__file__).resolve().parents[2] / "data" / "unknown_layer_kinds"

H, VOCAB = 6144, 200_064
# One layer of MiniMax-M3 by the published tensor listing (tests/data/unknown_layer_kinds):
# q/k/v/o projections (64 heads, 4 K/V heads, head_dim 128) and per-head q/k norms ...
M3_ATTENTION = 8192 * H + 512 * H + 512 * H + H * 8192 + 128 + 128
# ... the sparse layers' lightning indexer (index_q_proj, index_k_proj and their norms) ...
M3_INDEXER = 512 * H + 128 * H + 128 + 128
# ... 128 routed experts, the router and one shared expert, all 3072 wide ...
M3_MOE = 128 * 3 * 3072 * H + 128 * H + 3 * 3072 * H
# ... the dense layers' 12288-wide MLP, and two RMSNorms per layer.
M3_DENSE_MLP = 3 * 12288 * H
M3_SPARSE_LAYER = M3_ATTENTION + M3_INDEXER + M3_MOE + 2 * H
M3_DENSE_LAYER = M3_ATTENTION + M3_DENSE_MLP + 2 * H
M3_TOTAL = 2 * VOCAB * H + H + 3 * M3_DENSE_LAYER + 57 * M3_SPARSE_LAYER
# 60 layers of K and V (4 heads x 128 at bf16), and the indexer's 128-wide key on 57 of them.
M3_KV_BYTES_PER_TOKEN = 60 * 2 * 4 * 128 * 2 + 57 * 128 * 2


def m3_config() -> dict:
    return json.loads((DATA / "MiniMaxAI__MiniMax-M3.json").read_text())


def m3_text_config_transformers_does_not_know() -> dict:
    """Constructed from the real config: its text model alone, flat, with the keys
    transformers' MiniMaxM3VLTextConfig derives (`layer_types`, `mlp_layer_types`, the
    indexer's `index_*`), under a model type neither day0 nor transformers knows: the day-0
    case, where day0 counts every parameter itself."""
    text = dict(m3_config()["text_config"])
    text.update(
        model_type="minimax_m3",
        layer_types=["full_attention"] * 3 + ["minimax_m3_sparse"] * 57,
        mlp_layer_types=["dense"] * 3 + ["sparse"] * 57,
        index_n_heads=4,
        index_head_dim=128,
        torch_dtype="bfloat16",
    )
    return text


def test_the_published_checkpoint_listing_adds_up_to_the_hand_count():
    # The report's own total: language model, vision side and the routers' bias buffers.
    assert M3_TOTAL + 865_567_232 + 57 * 128 == 427_040_140_160


def test_minimax_m3_is_analysed_with_its_sparse_layers_labelled_an_estimate():
    analysis = analyze_config(m3_config())
    assert analysis.params_source == "transformers meta-device build"
    # The parameters are transformers' build: exactly the published checkpoint's.
    assert analysis.total_params == M3_TOTAL == 426_174_565_632
    assert analysis.multimodal_tower_params == 865_567_232
    assert analysis.attention["full_layers"] == 60
    assert analysis.attention["kv_cache_layers"] == 60
    assert analysis.kv_cache_bytes_per_token == M3_KV_BYTES_PER_TOKEN == 137_472
    (guess,) = analysis.estimated_layer_kinds
    assert guess == {
        "name": "minimax_m3_sparse",
        "counted_as": "full_attention",
        "layers": list(range(3, 60)),
        "hint": "sparse",
        "index_n_heads": 4,
        "index_head_dim": 128,
    }
    (assumed,) = [a for a in analysis.assumptions if "minimax_m3_sparse" in a]
    assert assumed.startswith(
        "estimated: layer kind 'minimax_m3_sparse' is not known to day0; counted as full "
        "attention on 57 layers (3-59)"
    )
    assert "64 heads, 4 K/V heads, head_dim 128" in assumed
    assert "lightning indexer of 4 heads x 128" in assumed
    assert "the guess sets only the KV-cache figures" in assumed
    # The dense layers are 12288 wide (dense_intermediate_size), the experts 3072.
    assert analysis.moe["dense_intermediate_size"] == 12288
    assert analysis.moe["expert_intermediate_size"] == 3072


def test_where_day0_counts_the_parameters_the_unknown_layers_follow_the_guess():
    config = m3_text_config_transformers_does_not_know()
    analysis = analyze_config(config)
    assert analysis.estimated and analysis.params_source == "estimated"

    cfg = read_config(config)
    layout, _ = attention_layout(cfg)
    moe, _ = moe_layout(cfg)
    inventory = build_inventory(cfg, layout, moe)
    # Every sparse layer: the real layer less its per-head q/k norms (256), which the
    # Llama-style modules of an unknown family do not have.
    for layer in (3, 30, 59):
        counted = sum(g.numel_each * g.experts for g in inventory if layer in g.layers)
        assert counted == M3_SPARSE_LAYER - 256 == 7_416_066_304
    assert analysis.total_params == M3_TOTAL - 60 * 256
    assert analysis.kv_cache_bytes_per_token == M3_KV_BYTES_PER_TOKEN
    (assumed,) = [a for a in analysis.assumptions if "minimax_m3_sparse" in a]
    assert "the MoE block on each" in assumed and "transformers" not in assumed


BASE = {
    "model_type": "zephyrine",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize(
    ("kind", "extra", "counted_as", "kv_bytes_per_token", "why"),
    [
        # Nothing in the name: full attention, K/V on both layers (2 x 2 heads x 16 x 2 bytes).
        ("hyena_mixer", {}, "full_attention", 2 * 128, "nothing in the name says otherwise"),
        ("block_swa", {"sliding_window": 8}, "sliding_attention", 2 * 128, "says swa"),
        # A window word without a sliding_window is counted as full attention.
        ("block_swa", {}, "full_attention", 2 * 128, "but the config sets no sliding_window"),
        # A recurrent mixer with the Gated DeltaNet keys keeps no K/V.
        (
            "gated_deltanet",
            {
                "linear_num_key_heads": 2,
                "linear_num_value_heads": 2,
                "linear_key_head_dim": 16,
                "linear_value_head_dim": 16,
                "linear_conv_kernel_dim": 4,
            },
            "linear_attention",
            128,
            "says delta",
        ),
    ],
)
def test_an_unknown_kind_is_counted_from_its_name_and_the_keys(
    kind, extra, counted_as, kv_bytes_per_token, why
):
    config = {**BASE, **extra, "layer_types": ["full_attention", kind]}
    analysis = analyze_config(config)
    assert [g["counted_as"] for g in analysis.estimated_layer_kinds] == [counted_as]
    assert analysis.attention["layer_types"] == ["full_attention", counted_as]
    assert analysis.kv_cache_bytes_per_token == kv_bytes_per_token
    (assumed,) = [a for a in analysis.assumptions if kind in a]
    assert "on 1 layer (1)" in assumed and why in assumed


def test_a_moe_name_without_experts_says_the_mlp_is_dense():
    analysis = analyze_config({**BASE, "layer_types": ["moe_block", "moe_block"]})
    (assumed,) = [a for a in analysis.assumptions if "moe_block" in a]
    assert "a dense MLP (the name says experts, but the config has none)" in assumed
    per_layer = 64 * 64 * 2 + 2 * 32 * 64 + 3 * 64 * 128 + 2 * 64  # GQA, gated MLP, norms
    assert analysis.total_params == 2 * per_layer + 2 * 100 * 64 + 64


def test_an_unknown_kind_without_the_standard_keys_is_refused_naming_them():
    config = {
        k: v for k, v in BASE.items() if k not in ("num_key_value_heads", "intermediate_size")
    }
    config["layer_types"] = ["full_attention", "hyena_mixer"]
    with pytest.raises(AnalysisError) as err:
        analyze_config(config)
    message = str(err.value)
    assert message.startswith("layer_types[1] = 'hyena_mixer' is not a known layer kind")
    assert "num_key_value_heads" in message and "intermediate_size" in message


def test_the_guess_is_a_finding_on_every_pool():
    result = analyze_config(m3_text_config_transformers_does_not_know()).to_dict()
    (note,) = [
        f for f in findings_for_stage("analyze", result, pool="cpu") if "layer-kind" in f.key
    ]
    assert note.key == "analyze:layer-kind:minimax_m3_sparse"
    assert note.severity == "minor" and note.all_pools
    assert note.title == (
        "Layer kind minimax_m3_sparse is not known to day0: counted as full attention"
    )
    assert "on 57 layers" in note.body and "and so are the parameter counts" in note.body
