"""`manage.py plan` with a workload and a given split: --split reported instead of chosen,
--input-len/--output-len/--concurrency N|max/--phase/--kv-dtype giving the `workload` object
beside the plan (the engine's `predict_workload` on the plan's split), the text lines, and
a one-line refusal with exit 1 for each bad value (exit 2 for a split that does not fit)."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from engine import formatting as fmt
from engine.architecture import analyze_config
from engine.catalog import load_catalog
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import evaluate_split, plan_release
from engine.stages.plan.validity import Split
from engine.stages.plan.workload import Workload, predict_workload
from tests.adaptation.management.plan_calls import plan_json, plan_refused
from tests.conftest import REALCONFIGS_DIR, load_realconfig

pytestmark = pytest.mark.django_db

DEEPSEEK_V3 = str(REALCONFIGS_DIR / "deepseek-ai__DeepSeek-V3.json")
LLAMA_8B = str(REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json")
ON_8_H200 = ("--accelerator", "h200", "--devices", "8")
ON_8_H100 = ("--accelerator", "h100", "--devices", "8")
WORKLOAD = ("--input-len", "1000", "--output-len", "1000")


def analysis_of(name: str) -> dict:
    return analyze_config(load_realconfig(name)).to_dict()


# --- bad values: exit 1, one line naming the flag ----------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--split", "garbage"), "--split: cannot read 'garbage' in the split"),
        (("--split", "TP8 TP4"), "--split: TP is given twice"),
        (("--split", "TP0"), "--split: TP must be at least 1, got 0"),
        (("--split", "TP8 EP4"), "--split: EP 4 is neither 1 nor TP x DP = 8"),
        (("--split", "TP16"), "--split: the split TP16 PP1 EP1 DP1 uses 16 devices"),
        (("--split", "TP8 EP8"), "has EP 8, but the model is dense"),
        (("--input-len", "1000"), "a workload needs --output-len too, beside --input-len"),
        (("--output-len", "1000"), "a workload needs --input-len too, beside --output-len"),
        (("--input-len", "0", "--output-len", "10"), "--input-len must be at least 1, got 0"),
        (("--input-len", "ten", "--output-len", "10"), "--input-len must be a whole number"),
        (("--concurrency", "max"), "--concurrency max is a workload's: give --input-len"),
        ((*WORKLOAD, "--concurrency", "lots"), '--concurrency must be a whole number or "max"'),
        ((*WORKLOAD, "--concurrency", "0"), "--concurrency must be at least 1, got 0"),
        (("--phase", "decode"), "--phase is a workload's: give --input-len and --output-len"),
        ((*WORKLOAD, "--phase", "train"), "--phase must be one of both, prefill, decode"),
        ((*WORKLOAD, "--kv-dtype", "int4"), "--kv-dtype: unknown KV-cache dtype 'int4'"),
        (
            (*WORKLOAD, "--context", "1500"),
            "--context 1,500 is shorter than the workload's sequences (--input-len + "
            "--output-len = 2,000 tokens)",
        ),
    ],
)
def test_bad_values_exit_1_with_one_line(args, words):
    err, out = plan_refused(LLAMA_8B, *ON_8_H100, *args)
    assert err.returncode == 1
    assert words in str(err)
    assert out == ""


def test_the_plans_own_concurrency_still_means_sequences_held_at_once():
    """Without a workload --concurrency sizes the plan as before: Llama-3.1-8B keeps 128 KiB
    of bf16 KV a token (32 layers x 8 KV heads x 128 x K and V x 2 bytes), so 32 sequences of
    8,192 tokens hold 32 GiB on one H100, 8 times the default 4 sequences' 4 GiB."""
    one = ("--accelerator", "h100", "--devices", "1", "--context", "8192")
    four = plan_json(LLAMA_8B, *one)
    many = plan_json(LLAMA_8B, *one, "--concurrency", "32")
    assert "workload" not in four and "workload" not in many
    assert four["inputs"]["concurrency"] == 4 and many["inputs"]["concurrency"] == 32
    assert many["devices"] == four["devices"] == 1
    assert four["memory_per_device_bytes"]["kv_cache"] == pytest.approx(4 * 2**30, rel=1e-6)
    assert many["memory_per_device_bytes"]["kv_cache"] == pytest.approx(32 * 2**30, rel=1e-6)


# --- a given split -----------------------------------------------------------------------------


def test_a_given_split_is_reported_instead_of_the_planners_choice():
    """The planner puts DeepSeek-V3 on 8 x H200 at TP1 EP8 DP8; --split "TP8 EP8" reports
    that split, sized and predicted as `evaluate_split` sizes it."""
    chosen = plan_json(DEEPSEEK_V3, *ON_8_H200)
    assert (chosen["tp"], chosen["dp"]) != (8, 1)
    given = plan_json(DEEPSEEK_V3, *ON_8_H200, "--split", "tp8 ep8")
    assert (given["tp"], given["pp"], given["ep"], given["dp"]) == (8, 1, 8, 1)
    assert given["fits"] is True and given["runners_up"] == []
    assert "the split TP8 PP1 EP8 DP1 was given" in " ".join(given["notes"])
    candidate = evaluate_split(
        analysis_of("deepseek-ai__DeepSeek-V3"),
        PoolLayout("h200", 8),
        Split(tp=8, pp=1, dp=1, ep=8),
        catalog=load_catalog(),
    )
    assert given["memory_per_device_bytes"] == candidate.memory.to_dict()
    predicted = candidate.predictor.predictions(given["inputs"]["context_tokens"])
    assert given["predicted"] == json.loads(json.dumps(predicted))
    assert "--tensor-parallel-size 8" in given["artifacts"]["vllm"]


def test_a_given_split_that_does_not_fit_exits_2_with_its_needs():
    """DeepSeek-V3's 671B FP8 weights (about 640 GiB) on 4 of 8 H100s: about 160 GiB a
    device against a budget of 72 GiB."""
    out = io.StringIO()
    with pytest.raises(CommandError) as err:
        call_command(
            "plan", DEEPSEEK_V3, *ON_8_H100, "--split", "TP4 EP4", "--format", "json", stdout=out
        )
    assert err.value.returncode == 2
    assert "at TP4 PP1 EP4 DP1 does not fit 4 x h100" in str(err.value)
    assert "against a budget of" in str(err.value)
    printed = json.loads(out.getvalue())
    assert printed["fits"] is False and printed["split"] == "TP4 PP1 EP4 DP1"
    assert printed["reason"] == str(err.value)


def test_a_split_the_engines_refuse_for_the_model_exits_2_with_the_rule():
    err, _ = plan_refused(LLAMA_8B, *ON_8_H100, "--split", "TP3")
    assert err.returncode == 2
    assert "the split TP3 PP1 EP1 DP1 does not load" in str(err)
    assert "TP 3 does not divide the 32 attention heads" in str(err)


# --- the workload ------------------------------------------------------------------------------


def test_the_workload_is_predict_workloads_dict_for_the_same_inputs():
    args = (*WORKLOAD, "--concurrency", "64", "--dtype", "fp8", "--kv-dtype", "fp8")
    plan = plan_json(DEEPSEEK_V3, *ON_8_H200, *args)
    analysis = analysis_of("deepseek-ai__DeepSeek-V3")
    expected = predict_workload(
        analysis,
        PoolLayout("h200", 8),
        Workload(input_tokens=1000, output_tokens=1000, concurrency=64),
        dtype="fp8",
        kv_dtype="fp8",
        catalog=load_catalog(),
    ).to_dict()
    assert plan["workload"] == json.loads(json.dumps(expected))
    # One split for both: the plan's, chosen for one of the workload's 2,000-token sequences.
    assert (
        plan["workload"]["split"] == f"TP{plan['tp']} PP{plan['pp']} EP{plan['ep']} DP{plan['dp']}"
    )
    assert plan["inputs"]["context_tokens"] == 2000 and plan["inputs"]["concurrency"] == 1
    assert plan["workload"]["concurrency"] == 64 and plan["workload"]["kv_dtype"] == "fp8"
    for key in ("output_tokens_per_s", "input_tokens_per_s", "ttft_s", "tpot_s", "e2e_s"):
        assert plan["workload"][key] > 0, key
    assert plan["workload"]["output_tokens_per_s_per_device"] == pytest.approx(
        plan["workload"]["output_tokens_per_s"] / plan["workload"]["devices"]
    )
    assert {"accelerator", "engine", "points", "residual", "source"} <= plan["workload"][
        "fit"
    ].keys()


def test_concurrency_max_gives_the_largest_batch():
    base = (LLAMA_8B, *ON_8_H100, *WORKLOAD)
    most = plan_json(*base, "--concurrency", "max")["workload"]
    assert most["concurrency_requested"] == "max"
    assert plan_json(*base)["workload"] == most  # max is the default with a workload
    for load in (1, 16, 64):
        fewer = plan_json(*base, "--concurrency", str(load))["workload"]
        assert fewer["batch"] <= load < most["batch"]
        assert fewer["output_tokens_per_s"] < most["output_tokens_per_s"]
    beyond = plan_json(*base, "--concurrency", str(4 * most["concurrency"]))["workload"]
    assert beyond["batch"] == most["batch"]  # the rest wait their turn
    assert beyond["ttft_s"] > most["ttft_s"]


def test_a_given_split_is_the_workloads_split_too():
    plan = plan_json(DEEPSEEK_V3, *ON_8_H200, "--split", "TP8 EP8", *WORKLOAD)
    expected = predict_workload(
        analysis_of("deepseek-ai__DeepSeek-V3"),
        PoolLayout("h200", 8),
        Workload(1000, 1000, None),
        split=Split(tp=8, pp=1, dp=1, ep=8),
        catalog=load_catalog(),
    ).to_dict()
    assert plan["workload"] == json.loads(json.dumps(expected))
    assert plan["workload"]["split"] == "TP8 PP1 EP8 DP1"


def test_phases_of_disaggregated_serving():
    base = (LLAMA_8B, *ON_8_H100, *WORKLOAD, "--concurrency", "32")
    prefill = plan_json(*base, "--phase", "prefill")["workload"]
    decode = plan_json(*base, "--phase", "decode")["workload"]
    assert prefill["phase"] == "prefill" and prefill["input_tokens_per_s"] > 0
    assert prefill["output_tokens_per_s"] is None and prefill["tpot_s"] is None
    assert decode["phase"] == "decode" and decode["output_tokens_per_s"] > 0
    assert decode["ttft_s"] is None and decode["input_tokens_per_s"] is None


def test_the_text_format_prints_the_workloads_lines():
    out = io.StringIO()
    call_command("plan", LLAMA_8B, *ON_8_H100, *WORKLOAD, "--concurrency", "64", stdout=out)
    text = out.getvalue()
    workload = plan_json(LLAMA_8B, *ON_8_H100, *WORKLOAD, "--concurrency", "64")["workload"]
    assert (
        "  workload      1,000 input + 1,000 output tokens per request, 64 requests in flight, "
        f"prefill and decode, on {workload['split']}, KV cache bfloat16\n"
    ) in text
    assert f"  predicted     output {fmt.tokens_per_s(workload['output_tokens_per_s'])} (" in text
    assert "median TTFT " in text and ", TPOT " in text and ", end to end " in text
    assert f"  fit           h100 x vllm ({workload['fit']['scope']}, " in text
    assert text.rstrip().endswith(f"(catalog {load_catalog().version}).")


def test_without_a_workload_the_output_is_todays_plan():
    plan = plan_json(LLAMA_8B, *ON_8_H100)
    assert "workload" not in plan
    expected = plan_release(
        analysis_of("meta-llama__Llama-3.1-8B"),
        PoolLayout("h100", 8),
        release=plan["release"],
        catalog=load_catalog(),
    ).to_dict()
    expected |= {"catalog_version": load_catalog().version, "note": plan["note"]}
    assert plan == json.loads(json.dumps(expected))


def test_the_engine_picks_the_fit_and_a_pool_its_own_engine():
    trt = plan_json(LLAMA_8B, *ON_8_H100, *WORKLOAD, "--engine", "tensorrt-llm")
    assert trt["workload"]["fit"]["engine"] == "tensorrt-llm"
    assert trt["workload"]["fit"]["accelerator"] == "h100"
    assert trt["predicted"]["fit"] == trt["workload"]["fit"]
    default = plan_json(LLAMA_8B, *ON_8_H100, *WORKLOAD)
    assert default["workload"]["fit"]["engine"] == "vllm"
    assert default["workload"]["output_tokens_per_s"] != trt["workload"]["output_tokens_per_s"]
    error, _ = plan_refused(LLAMA_8B, *ON_8_H100, *WORKLOAD, "--engine", "ollama")
    assert "--engine must be one of vllm, sglang, tensorrt-llm" in str(error)
