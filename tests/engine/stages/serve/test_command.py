"""The launched command: the plan's own, changed only where the pool must, each change a row."""

import shlex

import pytest

from engine.stages.plan.artifacts import sglang_command, vllm_command
from engine.stages.plan.validity import Split
from engine.stages.serve.command import (
    CommandError,
    flag_value,
    launch_command,
    planned_command,
    tensor_parallel,
)

PLANNED = (
    "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 4 --pipeline-parallel-size 1 "
    "--dtype bfloat16 --max-model-len 131072 --max-num-seqs 4 --max-num-batched-tokens 8192 "
    "--gpu-memory-utilization 0.9"
)


def _launch(planned=PLANNED, **kw):
    args = dict(
        kind="vllm",
        python="/env/bin/python",
        checkpoint_dir="/ckpt",
        port=40123,
        devices=2,
        memory_fraction=0.1,
    )
    args.update(kw)
    return launch_command(planned, **args)


def test_vllm_command_changed_only_where_the_pool_must():
    launch = _launch(max_context=8192, extra_flags=["--enforce-eager"])
    assert launch.argv == [
        "/env/bin/python", "-m", "vllm.entrypoints.openai.api_server",
        "--model", "/ckpt", "--served-model-name", "meta-llama/Llama-3.1-8B",
        "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
        "--dtype", "bfloat16", "--max-model-len", "8192", "--max-num-seqs", "4",
        "--max-num-batched-tokens", "8192", "--gpu-memory-utilization", "0.1",
        "--distributed-executor-backend", "mp",
        "--host", "127.0.0.1", "--port", "40123", "--enforce-eager",
    ]  # fmt: skip
    assert launch.tp == 2
    rows = {row["flag"]: (row["planned"], row["launched"]) for row in launch.diff}
    assert rows == {
        "(program)": ("vllm serve", "/env/bin/python -m vllm.entrypoints.openai.api_server"),
        "--model": ("meta-llama/Llama-3.1-8B", "/ckpt"),
        "--tensor-parallel-size": ("4", "2"),
        "--max-model-len": ("131072", "8192"),
        "--gpu-memory-utilization": ("0.9", "0.1"),
        "--distributed-executor-backend": ("", "mp"),
        "--host/--port": ("", "127.0.0.1:40123"),
        "--enforce-eager": ("", "--enforce-eager"),
    }
    assert all(row["why"] for row in launch.diff)
    assert shlex.split(launch.launched) == launch.argv


def test_nothing_changes_that_fits():
    launch = _launch(devices=8, max_context=131072)
    flags = {row["flag"] for row in launch.diff}
    assert "--tensor-parallel-size" not in flags and "--max-model-len" not in flags
    assert flag_value(launch.argv, "--tensor-parallel-size") == "4"
    assert launch.tp == 4


def test_forced_tp1_for_the_comparison():
    launch = _launch(tp=1)
    assert flag_value(launch.argv, "--tensor-parallel-size") == "1"
    assert launch.tp == 1
    row = next(r for r in launch.diff if r["flag"] == "--tensor-parallel-size")
    assert row["launched"] == "1" and "compare" in row["why"]


def test_the_full_size_launch_loads_dummy_weights_in_place_of_the_plans_format():
    launch = _launch(PLANNED + " --load-format safetensors", load_format="dummy")
    assert flag_value(launch.argv, "--load-format") == "dummy"
    assert launch.argv.count("--load-format") == 1
    rows = {row["flag"]: row for row in launch.diff}
    assert (rows["--load-format"]["planned"], rows["--load-format"]["launched"]) == (
        "safetensors",
        "dummy",
    )
    assert "random weights" in rows["--load-format"]["why"]
    assert "config and tokenizer alone" in rows["--model"]["why"]
    assert "--load-format" not in _launch().argv  # the twin loads its checkpoint as saved
    smaller = _launch(load_format="dummy", tp=1)
    row = next(r for r in smaller.diff if r["flag"] == "--tensor-parallel-size")
    assert (row["launched"], row["why"]) == ("1", "TP=1 launch for the scaling curve at full size")


def test_the_plans_own_writers_round_trip():
    split = Split(tp=2, pp=1, ep=2, dp=1)
    planned = vllm_command("Qwen/Qwen3-30B-A3B", split, "bfloat16", context_tokens=4096,
                           max_num_seqs=8)  # fmt: skip
    launch = _launch(planned)
    assert "--enable-expert-parallel" in launch.argv
    assert launch.served_model_name == "Qwen/Qwen3-30B-A3B"
    assert tensor_parallel(planned, "vllm") == 2
    sglang = sglang_command("Qwen/Qwen3-30B-A3B", split, "bfloat16", context_tokens=4096,
                            max_num_seqs=8, nodes=1)  # fmt: skip
    launched = _launch(sglang, kind="sglang")
    assert launched.argv[:5] == ["/env/bin/python", "-m", "sglang.launch_server",
                                 "--model-path", "/ckpt"]  # fmt: skip
    assert flag_value(launched.argv, "--mem-fraction-static") == "0.1"


def test_other_programs_are_refused():
    with pytest.raises(CommandError, match="not a vLLM command"):
        _launch("rm -rf / --no-preserve-root")
    with pytest.raises(CommandError, match="no command"):
        _launch("")
    with pytest.raises(CommandError, match="does not parse"):
        _launch("vllm serve 'unclosed")


def test_planned_command_reads_the_plans_artifacts():
    assert planned_command({"artifacts": {"vllm": PLANNED}}, "vllm") == PLANNED
    assert planned_command({"artifacts": {}}, "sglang") == ""
    assert planned_command({}, "vllm") == ""


def test_what_a_single_cpu_worker_cannot_honour_is_dropped_with_its_reason():
    fp8 = PLANNED.replace("--dtype bfloat16", "--dtype bfloat16 --quantization fp8")
    on_cpu = _launch(fp8)
    assert "--quantization" not in on_cpu.argv
    row = next(r for r in on_cpu.diff if r["flag"] == "--quantization")
    assert (row["planned"], row["launched"]) == ("fp8", "")
    on_gpu = _launch(fp8, device="cuda", devices=8)
    assert flag_value(on_gpu.argv, "--quantization") == "fp8"
    assert "--distributed-executor-backend" not in on_gpu.argv
    split = Split(tp=2, pp=1, ep=1, dp=1)
    sglang = sglang_command("org/m", split, "bfloat16", context_tokens=4096, max_num_seqs=8,
                            nodes=2)  # fmt: skip
    launched = _launch(sglang, kind="sglang")
    assert not {"--nnodes", "--node-rank", "--dist-init-addr"} & set(launched.argv)
    assert {"--nnodes", "--node-rank", "--dist-init-addr"} <= {r["flag"] for r in launched.diff}


def test_a_planned_executor_backend_becomes_mp_on_a_cpu_pool():
    launch = _launch(PLANNED + " --distributed-executor-backend ray")
    assert launch.argv.count("--distributed-executor-backend") == 1
    assert flag_value(launch.argv, "--distributed-executor-backend") == "mp"
    assert launch.argv[-2:] == ["--port", "40123"]  # no stray "mp" word after the flags
