"""`manage.py plan`: worked examples on real configs, `--pool` with pool rows and live
workers, the admin's catalog rows, exit codes and one-line reasons for bad input; `adapt`'s
plan options."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from adaptation.models import AcceleratorKind, AcceleratorPool, AdaptationJob, Worker
from engine.catalog import load_catalog
from tests.adaptation.management.plan_calls import plan_json, plan_refused
from tests.conftest import REALCONFIGS_DIR, load_realconfig
from tests.factories import cpu_pool

pytestmark = pytest.mark.django_db

GIB = 2**30
DEEPSEEK_V3 = str(REALCONFIGS_DIR / "deepseek-ai__DeepSeek-V3.json")
LLAMA_8B = str(REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json")
GPT_OSS_20B = str(REALCONFIGS_DIR / "openai__gpt-oss-20b.json")


def test_deepseek_v3_fp8_fits_8_h200():
    plan = plan_json(DEEPSEEK_V3, "--accelerator", "h200", "--devices", "8")
    assert plan["fits"] is True and plan["devices"] == 8 and plan["nodes"] == 1
    assert plan["tp"] * plan["pp"] * plan["dp"] == 8 and plan["ep"] >= 1
    memory = plan["memory_per_device_bytes"]
    assert {"weights", "kv_cache", "activations_workspace", "runtime_overhead"} <= memory.keys()
    assert memory["total_used"] <= memory["budget"]
    for batch in ("batch_1", "largest_batch"):
        point = plan["predicted"][batch]
        assert point["kind"] == "predicted"
        assert point["decode_tokens_per_s"] > 0 and point["tpot_s"] > 0
    assert plan["predicted"]["largest_batch_sequences"] > 1
    assert plan["catalog_version"] == load_catalog().version


def test_deepseek_v3_on_8_h100_exits_2_saying_more_devices_would_fit():
    out = io.StringIO()
    with pytest.raises(CommandError) as err:
        call_command(
            "plan", DEEPSEEK_V3, "--accelerator", "h100", "--devices", "8", "--format", "json",
            stdout=out,
        )  # fmt: skip
    assert err.value.returncode == 2
    assert "more devices would fit: 16 x h100" in str(err.value)
    printed = json.loads(out.getvalue())
    assert printed["fits"] is False and printed["suggestions"] == {"devices": 16}
    assert printed["reason"] == str(err.value)


def test_llama_8b_fits_one_24gb_l4_at_bf16_with_a_4k_context():
    plan = plan_json(LLAMA_8B, "--accelerator", "l4", "--devices", "1", "--context", "4096")
    assert plan["fits"] and plan["devices"] == 1 and plan["accelerator"] == "l4"
    assert plan["dtype_label"] == "checkpoint (bfloat16)"
    assert plan["inputs"]["context_tokens"] == 4096


def test_a_smaller_context_suggestion_and_dtype_option():
    err, _ = plan_refused(LLAMA_8B, "--accelerator", "l4", "--devices", "1")
    assert err.returncode == 2 and "a smaller context would fit this pool" in str(err)
    args = ("--accelerator", "l4", "--devices", "1", "--context", "16384", "--dtype", "fp8")
    plan = plan_json(LLAMA_8B, *args)
    assert plan["dtype"] == "fp8" and plan["fits"]
    assert plan["memory_per_device_bytes"]["weights"] < 9 * GIB  # 8B parameters at 1 byte


def test_text_output_labels_predictions_and_gives_memory_in_gib():
    out = io.StringIO()
    call_command("plan", DEEPSEEK_V3, "--accelerator", "h200", "--devices", "8", stdout=out)
    text = out.getvalue()
    assert "on 8 x h200: NVIDIA H200" in text
    assert "GiB" in text and "budget" in text
    assert "predicted     decode at batch 1:" in text and "tokens/s" in text
    assert "runner-up" in text and "vllm serve" in text
    assert text.rstrip().endswith(
        f"not measurements of this model (catalog {load_catalog().version})."
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--accelerator", "tpu-v9", "--devices", "8"), "unknown accelerator kind 'tpu-v9'"),
        (("--accelerator", "h100", "--devices", "0"), "--devices must be at least 1, got 0"),
        (("--accelerator", "h100", "--devices", "eight"), "--devices must be a whole number"),
        (("--accelerator", "h100", "--devices", "12"), "use 8 or 16, or give --devices-per-node"),
        (
            ("--accelerator", "h100", "--devices", "8", "--devices-per-node", "3"),
            "--devices 8 is not a multiple of --devices-per-node 3",
        ),
        (("--accelerator", "h100"), "--accelerator h100 needs --devices N"),
        ((), "say where to plan: --pool NAME, or --accelerator KIND --devices N"),
        (("--pool", "cpu", "--accelerator", "h100"), "not both"),
        (("--pool", "tpu"), "no pool 'tpu'; pools: cpu"),
        (("--accelerator", "h100", "--devices", "8", "--context", "0"), "--context must be"),
        (("--accelerator", "h100", "--devices", "8", "--dtype", "fp3"), "unknown serving dtype"),
    ],
)
def test_bad_input_exits_1_with_one_line(args, words):
    cpu_pool()
    err, _ = plan_refused(LLAMA_8B, *args)
    assert err.returncode == 1
    assert words in str(err)


def test_unknown_kind_names_the_known_ones():
    err, _ = plan_refused(LLAMA_8B, "--accelerator", "tpu-v9", "--devices", "1")
    for kind in ("h200", "h100", "a100-80gb", "mi300x", "gaudi3", "ascend-910b", "l4", "cpu"):
        assert kind in str(err)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"num_hidden_layers": 5_000_000}, "implausibly large"),
        (
            {"num_attention_heads": 31, "num_key_value_heads": 31},
            "not divisible by num_attention_heads",
        ),
        ({"hidden_size": 0}, "hidden_size"),
        ({"hidden_size": -4096}, "hidden_size"),
    ],
)
def test_absurd_configs_are_refused_with_one_line(tmp_path, overrides, words):
    config = {**load_realconfig("meta-llama__Llama-3.1-8B"), **overrides}
    path = tmp_path / "absurd.json"
    path.write_text(json.dumps(config))
    err, _ = plan_refused(str(path), "--accelerator", "h100", "--devices", "8")
    assert err.returncode == 1 and words in str(err)


def test_a_malformed_config_is_refused_with_one_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_bytes(b'{"model_type": "llama",')
    err, _ = plan_refused(str(path), "--accelerator", "h100", "--devices", "8")
    assert err.returncode == 1 and "is not valid JSON" in str(err)


def test_ten_trillion_parameters_answer_with_the_devices_that_would_fit(tmp_path):
    config = load_realconfig("deepseek-ai__DeepSeek-V3")
    config["n_routed_experts"] = 4096  # ~10.5T parameters; benchmarks/planner.py times it
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(config))
    err, _ = plan_refused(str(path), "--accelerator", "h100", "--devices", "8")
    assert err.returncode == 2 and "more devices would fit: 256 x h100" in str(err)
    plan = plan_json(str(path), "--accelerator", "h100", "--devices", "256")
    assert plan["fits"] and plan["devices"] == 256


def test_a_folder_and_a_repo_id_resolve_like_analyze(tmp_path, fake_hub, monkeypatch):
    folder = tmp_path / "meta-llama" / "Llama-3.1-8B"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(load_realconfig("meta-llama__Llama-3.1-8B")))
    plan = plan_json(str(folder), "--accelerator", "h100", "--devices", "8")
    assert plan["release"] == "meta-llama/Llama-3.1-8B" and plan["devices"] == 1

    fake_hub.add_repo(
        "meta-llama/Llama-3.1-8B", {"config.json": (folder / "config.json").read_bytes()}
    )
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    plan = plan_json("meta-llama/Llama-3.1-8B", "--accelerator", "h100", "--devices", "8")
    assert "vllm serve meta-llama/Llama-3.1-8B" in plan["artifacts"]["vllm"]


def test_pool_option_plans_on_the_pools_layout():
    AcceleratorPool.objects.create(name="h100x16", backend="manifest", accelerator="h100", nodes=2)
    plan = plan_json(DEEPSEEK_V3, "--pool", "h100x16")
    assert plan["devices"] == 16 and plan["pool"] == {
        "devices_per_node": 8,
        "nodes": 2,
        "devices": 16,
    }
    assert "h100 (NVIDIA H100 SXM5 80GB) figures from catalog" in plan["note"]


def test_an_admin_row_overrides_the_file_for_the_command():
    h100 = load_catalog().accelerator("h100")
    AcceleratorKind.objects.create(
        kind="h100",
        name="H100 with 141 GiB (mechanism test)",
        memory_gib=141,
        memory_bandwidth_tb_per_s=h100.memory_bandwidth_bytes_per_s / 1e12,
        dense_bf16_tflop_per_s=h100.dense_bf16_flops / 1e12,
        low_precision_kind="fp8",
        dtypes=["bfloat16", "float16", "float8_e4m3fn"],
        sources={
            "memory_bytes": "test",
            "memory_bandwidth_bytes_per_s": "test",
            "dense_bf16_flops": "test",
        },
    )
    plan = plan_json(DEEPSEEK_V3, "--accelerator", "h100", "--devices", "8")
    assert plan["fits"] and plan["devices"] == 8
    assert plan["accelerator_name"] == "H100 with 141 GiB (mechanism test)"
    assert "the admin's catalog row" in plan["note"]
    assert "1 admin row" in plan["catalog_version"]


def make_worker(name: str, memory_gib: float, *, age_s: float = 1, stopped: bool = False):
    beat = timezone.now() - timedelta(seconds=age_s)
    return Worker.objects.create(
        name=name,
        hostname=name.partition("@")[2],
        queues=["pool.cpu"],
        backend="cpu",
        cpu_cores=96,
        memory_bytes=round(memory_gib * GIB),
        last_heartbeat_at=beat,
        stopped_at=beat if stopped else None,
    )


def test_the_cpu_pool_is_its_live_workers_machine():
    cpu_pool()
    make_worker("cpu@big", 512)
    make_worker("cpu@small", 24)
    make_worker("cpu@gone", 4, stopped=True)
    make_worker("cpu@stale", 4, age_s=3600)
    plan = plan_json(GPT_OSS_20B, "--pool", "cpu")
    assert plan["fits"] and plan["accelerator"] == "cpu"
    # The smallest live worker: a job may land on any of them.
    assert plan["memory_per_device_bytes"]["capacity"] == 24 * GIB
    assert "worker cpu@small as it registered at start (96 cores, 24.0 GiB" in plan["note"]
    assert "the smallest of 2 live workers" in plan["note"]
    err, out = plan_refused(DEEPSEEK_V3, "--pool", "cpu", "--format", "json")
    assert err.returncode == 2 and "does not fit 1 x cpu" in str(err)
    assert json.loads(out)["accelerator_memory_bytes"] == 24 * GIB


def test_the_cpu_pool_predicts_on_the_figures_its_performance_runs_measured():
    from tests.adaptation.test_catalog_rows import probed_run

    pool = cpu_pool()
    make_worker("cpu@small", 24)
    runs = [probed_run(pool, bw * 1e9, 4e11) for bw in (10, 40, 20)]
    plan = plan_json(GPT_OSS_20B, "--pool", "cpu")
    assert plan["predicted"]["available"], plan["predicted"].get("reason")
    assert "memory bandwidth 20.0 GB/s and BF16 0.40 TFLOP/s measured" in plan["note"]
    assert f"median of 3 performance runs (stage runs {runs[-1].pk}, " in plan["note"]


def test_without_a_live_worker_the_cpu_pool_is_this_machine_and_says_so():
    cpu_pool()
    make_worker("cpu@stale", 4, age_s=3600)
    try:
        note = plan_json(GPT_OSS_20B, "--pool", "cpu")["note"]
    except CommandError:  # this machine has too little memory for gpt-oss-20b
        note = plan_json(GPT_OSS_20B, "--pool", "cpu", "--context", "512")["note"]
    assert note.startswith("no live worker on pool.cpu: cpu is this machine as measured here")


def test_a_gpu_pool_without_an_accelerator_is_refused_with_what_to_set():
    AcceleratorPool.objects.create(name="gpus", backend="cuda")
    err, _ = plan_refused(LLAMA_8B, "--pool", "gpus")
    assert err.returncode == 1 and "names no accelerator kind" in str(err)


def test_adapt_stores_the_plan_options(tmp_path):
    cpu_pool()
    folder = tmp_path / "meta-llama" / "Llama-3.1-8B"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(load_realconfig("meta-llama__Llama-3.1-8B")))
    out = io.StringIO()
    call_command(
        "adapt", str(folder), "--context", "4096", "--concurrency", "2", "--dtype", "bf16",
        "--format", "json", stdout=out,
    )  # fmt: skip
    job = AdaptationJob.objects.get(pk=json.loads(out.getvalue())["job"])
    assert job.options == {"plan": {"context_tokens": 4096, "concurrency": 2, "dtype": "bfloat16"}}


@pytest.mark.parametrize(
    ("args", "words"),
    [(("--context", "0"), "--context must be at least 1"), (("--dtype", "fp3"), "fp3")],
)
def test_adapt_refuses_bad_plan_options_before_creating_anything(tmp_path, args, words):
    cpu_pool()
    folder = tmp_path / "org" / "model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    with pytest.raises(CommandError, match=words):
        call_command("adapt", str(folder), *args)
    assert not AdaptationJob.objects.exists()


def test_text_names_the_model_as_given_and_shows_warnings_and_redundant_experts():
    """A bare config file is named by --model-id in the launch commands; uneven EP (EP 12
    over 256 experts, a split given with --split) is a warning, and both engines get the
    redundant experts it needs (vLLM EPLB, SGLang --ep-num-redundant-experts)."""
    out = io.StringIO()
    call_command(
        "plan",
        DEEPSEEK_V3,
        "--accelerator",
        "h100",
        "--devices",
        "32",
        "--context",
        "131072",
        "--concurrency",
        "64",
        "--split",
        "TP1 PP2 EP12 DP12",
        "--model-id",
        "deepseek-ai/DeepSeek-V3",
        stdout=out,
    )
    text = out.getvalue()
    plan = plan_json(
        DEEPSEEK_V3, "--accelerator", "h100", "--devices", "32", "--context", "131072",
        "--concurrency", "64", "--split", "TP1 PP2 EP12 DP12",
    )  # fmt: skip
    split = f"TP{plan['tp']} PP{plan['pp']} EP{plan['ep']} DP{plan['dp']}"
    assert f"split         {split} on {plan['devices']} devices" in text
    assert "vllm serve deepseek-ai/DeepSeek-V3 " in text
    assert "deepseek-ai__DeepSeek-V3" not in text
    assert plan["ep"] == 12 and 256 % plan["ep"]
    redundant = -(-256 // plan["ep"]) * plan["ep"] - 256
    assert f"warning       uneven EP: 256 routed experts over EP {plan['ep']}" in text
    assert f'"num_redundant_experts": {redundant}' in plan["artifacts"]["vllm"]
    assert f"--ep-num-redundant-experts {redundant}" in plan["artifacts"]["sglang"]
    err, _ = plan_refused(DEEPSEEK_V3, "--accelerator", "h100", "--devices", "8", "--model-id", "x")
    assert "--model-id must be a repo id" in str(err)
