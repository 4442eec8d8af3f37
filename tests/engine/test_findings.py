"""What each stage's real result raises (`engine.registry.findings_for_stage`), without the
database: the results come from the stages' own engines (the operators and precision stages
run scaled twins on the CPU; the plan and analysis run on real published configs)."""

from __future__ import annotations

import pytest

from adaptation.safe_markdown import render_markdown
from engine import markdown as md
from engine.architecture import analyze_config
from engine.catalog import load_catalog
from engine.stages.plan.errors import NoFittingPlan
from engine.stages.plan.findings import kv_bytes_per_sequence
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from engine.stages.plan.run import no_fit_result
from tests.conftest import load_realconfig
from tests.limitation_twins import DEEPSEEK, LLAMA, analysis_of
from tests.limitation_words import findings_for_stage


def by_key(findings) -> dict:
    return {f.key: f for f in findings}


@pytest.mark.slow  # runs scaled twins
def test_a_missing_operator_is_a_blocker_naming_the_feature(operators_on_npu):
    assert operators_on_npu["missing"] == ["aten::_grouped_mm.default"]  # the real manifest's gap

    findings = by_key(findings_for_stage("operators", operators_on_npu, pool="npu-x1"))

    assert list(findings) == ["operators:missing:aten::_grouped_mm"]
    note = findings["operators:missing:aten::_grouped_mm"]
    assert note.severity == "blocker" and note.all_pools is False
    assert note.title == (
        "aten::_grouped_mm is missing on pool npu-x1 (MoE experts (grouped GEMM))"
    )
    calls = next(o for o in operators_on_npu["operators"] if o["status"] == "missing")["calls"]
    assert f"- calls: {calls:,}" in note.body
    assert "**MoE experts (grouped GEMM)**" in note.body


@pytest.mark.slow  # runs scaled twins
def test_a_fully_covered_run_raises_nothing(operators_with_grouped_mm):
    assert operators_with_grouped_mm["missing"] == []
    assert findings_for_stage("operators", operators_with_grouped_mm, pool="npu-x1") == []


def test_an_operator_lacking_only_some_dtypes_says_which():
    result = {
        "device": "cpu",
        "dtype": "bfloat16",
        "checked_against": "manifest",
        "operators": [
            {
                "name": "aten::topk.default",
                "dtypes": ["bfloat16", "float32"],
                "feature": "MoE routing (softmax scores, top-4)",
                "status": "missing",
                "via": "manifest",
                "devices": ["cpu"],
                "calls": 48,
                "missing_dtypes": ["bfloat16"],
            },
            {"name": "aten::mm.default", "status": "fallback", "feature": "MLP"},
            {"name": "aten::add.Tensor", "status": "covered"},
        ],
    }
    findings = by_key(findings_for_stage("operators", result, pool="npu-x1"))
    assert findings["operators:missing:aten::topk"].title == (
        "aten::topk lacks bfloat16 on pool npu-x1 (MoE routing (softmax scores, top-4))"
    )
    assert findings["operators:missing:aten::topk"].severity == "blocker"
    fallback = findings["operators:fallback"]
    assert fallback.severity == "minor" and "`aten::mm`: MLP" in fallback.body
    assert fallback.title == "1 operator runs through the fallback on npu-x1"
    assert fallback.body.startswith(
        "1 operator has no kernel of its own on pool `npu-x1` and runs through the backend's "
        "fallback (usually a copy to the CPU and back): correct, but slow on the paths that use "
        "it.\n"
    )


@pytest.mark.slow  # runs scaled twins
def test_a_failed_precision_check_raises_one_major_note_per_dtype(precision_results):
    failed = precision_results["failed"]
    entry = failed["dtypes"]["float16"]
    assert entry["passed"] is False

    findings = findings_for_stage("precision", failed, pool="cpu")

    assert [f.key for f in findings] == ["precision:float16"]
    note = findings[0]
    assert note.severity == "major"
    assert note.title.startswith("float16 fails precision on pool cpu: relative logit error")
    assert note.title.endswith("; first divergent layer 1 (norm)")
    # the measured figure against its limit, and the layer and module it diverged at
    assert (
        f"| relative logit error | {entry['relative_logit_error']:.5g} | "
        f"≤ {entry['thresholds']['max_relative_logit_error']:.5g} | **failed** |"
    ) in note.body
    assert "layer 1, `norm` (`model.layers.1.post_attention_layernorm`)" in note.body
    u = entry["unit_roundoff"]
    assert f"({entry['first_divergent_local_error'] / u:.3g}u)" in note.body


@pytest.mark.slow  # runs scaled twins
def test_a_passing_precision_run_raises_nothing(precision_results):
    assert findings_for_stage("precision", precision_results["passed"], pool="cpu") == []


def test_a_dtype_the_device_cannot_run_is_a_major_note():
    result = {"dtypes": {}, "skipped_dtypes": {"int8": "aten::_weight_int8pack_mm does not run"}}
    (note,) = findings_for_stage("precision", result, pool="cpu")
    assert note.key == "precision:unsupported:int8" and note.severity == "major"
    # the operator's name renders literally (its underscores open no emphasis)
    assert "aten::_weight_int8pack_mm does not run</p>" in render_markdown(note.body)


def _no_fit(name: str, layout: PoolLayout) -> dict:
    analysis = analysis_of(name)
    catalog = load_catalog()
    with pytest.raises(NoFittingPlan) as err:
        plan_release(analysis, layout, release=name, catalog=catalog)
    return no_fit_result(err.value, analysis, layout, catalog, {}, release=name)


def test_a_plan_that_does_not_fit_is_a_blocker_with_what_would_fit():
    result = _no_fit(DEEPSEEK, PoolLayout(accelerator="h200", devices_per_node=4, nodes=1))
    assert result["suggestions"] == {"devices": 8}

    (note,) = findings_for_stage("plan", result, pool="h200-half")

    assert note.key == "plan:no-fit" and note.severity == "blocker"
    assert note.title == (
        "Needs more devices than pool h200-half has: 8 x h200 would fit, the pool has 4"
    )
    assert "What would fit:\n\n- 8 x `h200` (the pool has 4)" in note.body
    assert "needs 168.3 GiB per device" in note.body  # the planner's reason, quoted


def test_a_plan_capped_below_the_full_context_by_memory_is_major():
    analysis = analysis_of(LLAMA)
    layout = PoolLayout(accelerator="l4", devices_per_node=1, nodes=1)
    plan = plan_release(
        analysis, layout, context_tokens=8192, concurrency=1, catalog=load_catalog()
    ).to_dict()
    memory = plan["memory_per_device_bytes"]
    room = (
        memory["budget"]
        - memory["weights"]
        - memory["activations_workspace"]
        - memory["runtime_overhead"]
    )
    # Llama-3.1-8B keeps 128 KiB of KV per token: its 131,072-token context is 16 GiB
    assert analysis["kv_cache_bytes_per_token"] == 131_072
    longest = int(room // 131_072)

    (note,) = findings_for_stage("plan", plan, pool="l4", analysis=analysis)

    assert note.key == "plan:context-capped" and note.severity == "major"
    assert note.title == (
        f"Context capped by memory on pool l4: at most {longest:,} of 131,072 tokens per sequence"
    )
    assert "16.0 GiB at 131,072 tokens" in note.body
    assert "- sequences at the full context (131,072 tokens): 0" in note.body


def test_a_context_capped_by_default_on_a_pool_that_holds_it_is_minor_or_info():
    analysis = analysis_of("openai__gpt-oss-20b")
    layout = PoolLayout(accelerator="l4", devices_per_node=1, nodes=1)
    default = plan_release(analysis, layout, catalog=load_catalog()).to_dict()
    (minor,) = findings_for_stage("plan", default, pool="l4", analysis=analysis)
    assert minor.severity == "minor"
    assert minor.title == (
        "Context capped at 32,768 of 131,072 tokens on pool l4: 2 sequences fit at 131,072"
    )
    single = plan_release(analysis, layout, concurrency=1, catalog=load_catalog()).to_dict()
    (info,) = findings_for_stage("plan", single, pool="l4", analysis=analysis)
    assert info.severity == "info"
    # a plan at the full context raises nothing
    full = plan_release(
        analysis, layout, context_tokens=131_072, concurrency=1, catalog=load_catalog()
    ).to_dict()
    assert findings_for_stage("plan", full, pool="l4", analysis=analysis) == []


def test_sliding_window_layers_keep_only_their_window_of_kv():
    analysis = analysis_of("openai__gpt-oss-20b")  # 12 full + 12 sliding layers of 128 tokens
    per_layer = analysis["kv_cache_bytes_per_token"] / 24
    assert kv_bytes_per_sequence(analysis, 1000) == per_layer * (12 * 1000 + 12 * 128)
    assert kv_bytes_per_sequence(analysis, 131_072) == analysis["kv_cache_bytes_at_max_context"]


def test_deepseek_v3s_mtp_module_is_an_analysis_note_for_every_pool():
    config = load_realconfig(DEEPSEEK)
    assert config["num_nextn_predict_layers"] == 1

    findings = by_key(findings_for_stage("analyze", analysis_of(DEEPSEEK), pool="cpu"))

    assert list(findings) == ["analyze:mtp"]
    note = findings["analyze:mtp"]
    assert note.all_pools is True and note.severity == "minor"
    assert note.title == "1 MTP module for speculative decoding is not validated or planned"
    assert "13,463,426,304 params in `extra_params`" in note.body


def test_a_model_without_mtp_or_unusual_features_raises_nothing():
    assert findings_for_stage("analyze", analysis_of(LLAMA), pool="cpu") == []


def test_an_unknown_rope_type_and_shipped_modeling_code_are_analysis_notes():
    config = load_realconfig(LLAMA)
    config["rope_scaling"] = {"rope_type": "[x](javascript:alert(1))", "factor": 8.0}
    findings = by_key(findings_for_stage("analyze", analyze_config(config).to_dict(), pool="cpu"))
    rope = findings["analyze:rope-type"]
    assert rope.severity == "major" and rope.all_pools
    html = render_markdown(rope.body)
    assert "href" not in html and "<code>[x](javascript:alert(1))</code>" in html

    remote = {
        "architecture": "NovelForCausalLM",
        "family_known": False,
        "config_keys": ["auto_map", "hidden_size"],
        "mtp_layers": 0,
        "rope": {"type": "default"},
    }
    (note,) = findings_for_stage("analyze", remote, pool="cpu")
    assert note.key == "analyze:remote-code" and note.severity == "major"


@pytest.mark.slow  # runs scaled twins
def test_out_of_memory_before_the_end_of_the_sweep_is_minor(twins):
    import torch

    from engine.contract import PoolSpec
    from engine.stages.performance.run import measure_performance

    def out_of_memory_from_batch_4(model):
        def hook(_module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None and ids.shape[0] >= 4:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        return model.register_forward_pre_hook(hook, with_kwargs=True)

    result = measure_performance(
        twins(LLAMA),
        PoolSpec(name="cpu", backend="cpu", queue="pool.cpu"),
        options={
            "max_batch_size": 8,
            "prompt_lens": [16],
            "warmup": 1,
            "repeats": 2,
            "prefill_warmup": 1,
            "prefill_repeats": 1,
            "dtypes": ["float32"],
        },
        hooks=[out_of_memory_from_batch_4],
        device_figures={
            "kind": "measured",
            "device": "cpu",
            "threads": 1,
            "memory_bandwidth_bytes_per_s": 1.5e10,
            "flops": {"bfloat16": 1e12, "float16": 1.6e11},
        },
    )
    assert [s["batch_size"] for s in result["stopped"]] == [4]

    (note,) = findings_for_stage("performance", result, pool="cpu")

    assert note.key == "performance:oom:float32" and note.severity == "minor"
    assert note.title == "Out of memory at batch 4 in float32 on pool cpu (performance sweep)"
    assert "Largest batch measured in `float32`: 2." in note.body


@pytest.mark.slow  # runs scaled twins
def test_nan_outputs_under_sustained_load_are_a_stability_note(twins):
    import torch

    from engine.contract import PoolSpec, StageFailed
    from engine.stages.stability.run import measure_stability

    calls = {"n": 0}

    def poison_the_tenth_forward(model):
        def hook(_module, _args, output):
            calls["n"] += 1
            return torch.full_like(output, float("nan")) if calls["n"] == 10 else None

        return model.lm_head.register_forward_hook(hook)

    with pytest.raises(StageFailed) as failed:
        measure_stability(
            twins(LLAMA),
            PoolSpec(name="cpu", backend="cpu", queue="pool.cpu"),
            options={
                "duration_s": 0.5,
                "min_steps": 10,
                "batch_size": 2,
                "prompt_len": 32,
                "decode_steps": 4,
            },
            hooks=[poison_the_tenth_forward],
        )

    findings = by_key(findings_for_stage("stability", failed.value.result, pool="cpu"))

    assert "stability:nonfinite" in findings
    note = findings["stability:nonfinite"]
    assert note.severity == "major"
    assert "2 next-token logit rows held NaN or Inf (threshold 0)" in note.body


def test_stages_without_findings_or_a_result_say_so_with_none():
    assert findings_for_stage("fetch", {"config": {}}, pool="cpu") is None
    assert findings_for_stage("operators", None, pool="cpu") is None
    assert findings_for_stage("operators", {"error": "crashed"}, pool="cpu") is None
    assert findings_for_stage("plan", {"reason": "no accelerator"}, pool="cpu") is None


def test_markdown_helpers_keep_strings_literal():
    assert render_markdown(md.text("*a* [b](c) <i>")) == "<p>*a* [b](c) &lt;i&gt;</p>\n"
    assert render_markdown(md.code("a ` b")) == "<p><code>a ` b</code></p>\n"
