"""The analyze stage's typed result (`engine/stages/analyze/result.py`): what the stage writes
(from a config, and corrected by a checkpoint's headers) reads back unchanged, a stored row of
any shape reads without raising, and the judgements made of an analysis (family, attention,
experts, dense layers, what is new, the checkpoint's problems) are made once."""

from __future__ import annotations

import json

import pytest

from engine.architecture import analyze_config
from engine.contract import PoolSpec, ReleaseRef, StageContext
from engine.stages.analyze.result import (
    AnalysisResult,
    CheckpointCheck,
    ConfigCount,
    CountGroup,
    LayerCount,
    LayerKindEstimate,
    NewAspect,
)
from engine.stages.analyze.run import run as analyze_run
from engine.stages.fetch.result import NameList
from engine.stages.fetch.run import run as fetch_run
from tests.checkpoints import shard
from tests.conftest import load_realconfig
from tests.engine.architecture.test_checkpoint_count import case

POOL = PoolSpec(name="cpu", backend="cpu", queue="cpu")


def _analysis(name: str, **extra) -> dict:
    """The analyze stage's result for a published config, as stored (JSON)."""
    written = analyze_config(load_realconfig(name)).to_dict() | extra
    return json.loads(json.dumps(written))


@pytest.fixture(autouse=True)
def own_var_dir(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path / "var"))


def _from_headers(fake_hub, table: dict, config: dict) -> dict:
    """fetch then analyze a 4-shard release served by the fake Hub: the analysis counted
    from the checkpoint's headers."""
    files = {"config.json": json.dumps(config).encode(), **shard(table, 4, data=False)}
    repo = "deepseek-ai/DeepSeek-V3"
    release = ReleaseRef("huggingface", fake_hub.url, repo, fake_hub.add_repo(repo, files))
    fetched = fetch_run(StageContext(release=release, pool=POOL, log=lambda _: None))
    analysed = analyze_run(
        StageContext(release=release, pool=POOL, previous={"fetch": fetched}, log=lambda _: None)
    )
    return json.loads(json.dumps(analysed))


@pytest.mark.parametrize(
    "name", ["deepseek-ai__DeepSeek-V3", "openai__gpt-oss-20b", "meta-llama__Llama-3.1-8B"]
)
def test_what_the_stage_writes_from_a_config_reads_back_unchanged(name):
    written = _analysis(
        name, new_against_known=[{"aspect": "family", "detail": "family x has not been seen"}]
    )

    assert AnalysisResult.from_stored(written).to_dict() == written


def test_what_the_stage_writes_from_a_checkpoint_reads_back_unchanged(fake_hub):
    c = case("deepseek_v3")
    table = {n: e for n, e in c.table.items() if not n.startswith("model.layers.1.")}
    table["model.layers.3.self_attn.o_proj.weight"] = ("F8_E4M3", (64, 32))
    written = _from_headers(fake_hub, table, c.config)

    result = AnalysisResult.from_stored(written)

    assert result.to_dict() == written
    assert result.counted_from_checkpoint and result.exact_params
    total = result.config_count("total_params")
    assert total is not None and total.config is not None and total.difference is not None
    assert total.checkpoint == result.total_params
    check = result.check
    assert check is not None and check.layers_differ and check.layers is not None
    assert check.layers.missing == "1"
    assert check.missing is not None and check.missing.count > 0
    assert check.wrong_shape_count == 1
    assert check.wrong_shape[0].name == "model.layers.3.self_attn.o_proj.weight"
    # each missing tensor, the wrong shape and the missing layer are problems
    assert check.problems == check.missing.count + 1 + 1


def test_what_a_release_is():
    deepseek = AnalysisResult.from_stored(_analysis("deepseek-ai__DeepSeek-V3"))
    gpt_oss = AnalysisResult.from_stored(_analysis("openai__gpt-oss-20b"))
    llama = AnalysisResult.from_stored(_analysis("meta-llama__Llama-3.1-8B"))

    assert deepseek.family_name == "deepseek_v3" and deepseek.attention_kind == "MLA"
    assert deepseek.is_moe and deepseek.experts_routed == 256 and deepseek.experts_per_token == 8
    assert deepseek.quantization_method == "fp8" and deepseek.rope_type == "yarn"
    assert deepseek.has_dense_ffn_layers  # its first three layers are dense
    assert deepseek.has_mtp and deepseek.is_analysis
    # every gpt-oss layer is MoE: its intermediate size is no dense FFN's
    assert gpt_oss.is_moe and not gpt_oss.has_dense_ffn_layers
    assert gpt_oss.kv_kept_differs  # sliding layers: freed and kept KV differ
    assert llama.is_moe is False and llama.has_dense_ffn_layers and llama.experts_routed is None
    assert llama.quantization_method is None and not llama.has_mtp
    assert not llama.counted_from_checkpoint and llama.config_count("total_params") is None


def test_experts_and_quantization_said_not_said_or_none():
    assert AnalysisResult.from_stored({"moe": None}).is_moe is False
    assert AnalysisResult.from_stored({}).is_moe is None
    # a value that is no summary says nothing
    assert AnalysisResult.from_stored({"moe": 3}).is_moe is None
    assert not AnalysisResult.from_stored({"quantization": "fp8"}).says_quantization
    assert "moe" not in AnalysisResult.from_stored({}).to_dict()
    assert AnalysisResult.from_stored({"moe": None}).to_dict()["moe"] is None


def test_the_family_is_named_by_its_model_type_when_day0_does_not_know_it():
    assert AnalysisResult(family=None, model_type="novel_moe").family_name == "novel_moe"
    assert AnalysisResult(family="llama", model_type="llama4").family_name == "llama"
    assert AnalysisResult().family_name is None


def test_what_findings_judge_of_an_analysis():
    unknown = AnalysisResult(
        config_keys=("auto_map", "hidden_size"), family_known=False, rope={"type": "longrope2"}
    )
    assert unknown.ships_code_for_unknown_family and unknown.rope_type_unknown
    assert not AnalysisResult(
        config_keys=("auto_map",), family_known=True
    ).ships_code_for_unknown_family
    assert not AnalysisResult(rope={"type": "yarn"}).rope_type_unknown
    assert AnalysisResult(params_source="transformers meta-device build").exact_params
    assert not AnalysisResult(params_source="estimated").exact_params
    assert not AnalysisResult(params_source="estimated").params_from_family_table
    assert AnalysisResult().params_from_family_table
    assert AnalysisResult(config_figures={"estimated": True}).config_count_estimated
    # neither an MTP count nor a RoPE summary: not an analysis
    assert not AnalysisResult.from_stored({"family": "llama"}).is_analysis


def test_a_layer_kind_day0_does_not_know_reads_with_the_kind_it_was_counted_as():
    result = AnalysisResult.from_stored(
        {
            "estimated_layer_kinds": [
                {"name": "sparse_attn", "counted_as": "sliding_attention", "layers": [1, 3, 5]},
                {"name": "odd"},
                "not a guess",
            ]
        }
    )

    assert result.layer_kind_estimates == [
        LayerKindEstimate("sparse_attn", "sliding_attention", 3),
        LayerKindEstimate("odd", "None", 0),  # as the notes always wrote an unnamed kind
    ]


def test_kv_bytes_of_one_sequence_keep_a_sliding_layers_window_and_a_chunked_layers_chunk():
    attention = {
        "kv_cache_layers": 4,
        "full_layers": 2,
        "sliding_layers": 1,
        "chunked_layers": 1,
        "sliding_window": 128,
        "attention_chunk_size": 512,
    }
    result = AnalysisResult(kv_cache_bytes_per_token=400, attention=attention)

    # 100 bytes per token per layer: 2 full layers x 1,000 + 128 + 512
    assert result.kv_bytes_at_context(1000) == 100 * (2 * 1000 + 128 + 512)
    # below the window and the chunk every layer keeps every token
    assert result.kv_bytes_at_context(100) == 100 * 4 * 100
    assert AnalysisResult(kv_cache_bytes_per_token=400).kv_bytes_at_context(1000) is None
    assert AnalysisResult(attention=attention).kv_bytes_at_context(1000) is None


@pytest.mark.parametrize(
    ("aspect", "detail", "shown"),
    [
        ("RoPE type", "RoPE type not seen before: yarn", "not seen before: yarn"),
        ("MoE layout", "MoE layout: 256 experts, top 8", "256 experts, top 8"),
        ("family", "familyX is new", "familyX is new"),
        (
            "config keys",
            "keys no known family uses: q_lora_rank",
            "keys no known family uses: q_lora_rank",
        ),
        (None, "something new", "something new"),
    ],
)
def test_new_against_known_without_a_repeat_of_its_aspect(aspect, detail, shown):
    assert NewAspect(aspect, detail).detail_without_aspect == shown
    assert NewAspect(aspect, detail).line == detail


def test_new_against_known_reads_mappings_and_older_plain_entries():
    result = AnalysisResult.from_stored(
        {"new_against_known": [{"aspect": "family", "detail": ""}, "a new key", None, {}]}
    )

    assert result.new_aspects == (
        NewAspect("family", ""),
        NewAspect(None, "a new key"),
        NewAspect(None, ""),
    )
    assert [a.line for a in result.new_aspects] == ["family", "a new key", ""]
    assert AnalysisResult.from_stored({"new_against_known": "x"}).new_against_known is None


def test_the_checkpoint_check_counts_its_problems():
    check = CheckpointCheck.from_stored(
        {
            "expected_from": "DeepseekV3ForCausalLM",
            "expected_tensors": 10,
            "matched_tensors": 7,
            "missing": {"count": 2, "names": ["a", "b"]},
            "extra": {"count": 1, "names": ["c"]},
            "wrong_shape": {"count": 3, "tensors": [{"name": "d", "expected": [1], "found": [2]}]},
            "layers": {"config": 4, "checkpoint": 3, "missing": "1"},
            "mtp": {"config": 1, "checkpoint": 0},
            "index_mismatch": {"index_only": {"count": 1, "names": ["e"]}},
        }
    )

    assert check is not None
    assert check.problems == 2 + 1 + 3 + 1 + 1
    assert check.layers == LayerCount(4, 3, missing="1")
    assert check.index_only == NameList(1, ("e",)) and check.headers_only is None
    assert CheckpointCheck.from_stored({"layers": {"config": 4, "checkpoint": 4}}).problems == 0
    assert CheckpointCheck.from_stored([]) is None


def test_the_config_count_beside_the_checkpoint_s():
    result = AnalysisResult.from_stored(
        {
            "params_counted_from": "checkpoint",
            "checkpoint": {
                "comparison": {
                    "figures": {
                        "total_params": {
                            "config": 100,
                            "checkpoint": 96,
                            "difference": -4,
                            "relative": -0.04,
                        }
                    },
                    "groups": {"experts": {"config": 80, "checkpoint": 76, "difference": -4}},
                    "agree": False,
                }
            },
        }
    )

    assert result.config_count("total_params") == ConfigCount(100.0, -4.0, -0.04, 96.0)
    assert result.config_count("active_params") is None
    assert result.counts_disagree
    assert result.count_groups == [CountGroup("experts", 80, 76, -4)]
    # counted from the config: nothing beside it, nothing to disagree with
    assert not AnalysisResult.from_stored({"params_counted_from": "config"}).counts_disagree


def test_a_bounded_name_list_counts_the_names_past_those_kept():
    assert NameList(12, ("a", "b")).more == 10
    assert NameList(1, ("a",)).more == 0
    assert NameList().more == 0


@pytest.mark.parametrize(
    "row",
    [
        None,
        [],
        "analysis",
        {},
        {"attention": "MLA", "rope": [1], "moe": 3, "quantization": "fp8", "total_params": "7B"},
        {"config_keys": "hidden_size", "assumptions": None, "conventions": [1], "notes": 3},
        {"checkpoint": [], "checkpoint_check": {"missing": 3, "wrong_shape": {"tensors": 2}}},
        {"weight_bytes_by_dtype": {"BF16": "x"}, "estimated_layer_kinds": [None, 1, {}]},
        {"family_known": "no", "tie_word_embeddings": 1, "mtp_layers": True},
    ],
)
def test_a_stored_row_of_any_shape_reads_without_raising(row):
    result = AnalysisResult.from_stored(row)

    assert result.family_known in (None, True, False)
    assert result.total_params is None and result.mtp_layers is None
    assert isinstance(result.config_keys, tuple) and isinstance(result.notes, tuple)
    assert result.attention_kind is None and result.quantization_method is None
    assert isinstance(result.has_dense_ffn_layers, bool)
    assert result.check is None or result.check.problems >= 0
    assert AnalysisResult.from_stored(result.to_dict()) == result
