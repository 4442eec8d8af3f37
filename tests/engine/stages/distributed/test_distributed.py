"""The distributed stage on the cpu pool: gloo, 2 torchrun processes, transformers' TP plans.

Each validation starts real processes (about 5-10 s on 2 cores), so the twins are built once
per module and the stage-level test doubles as the Llama TP=2 proof.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import pytest

from engine.architecture import analyze_config
from engine.contract import PoolSpec, ReleaseRef, StageContext, StageFailed
from engine.stages.distributed import launch
from engine.stages.distributed import run as distributed
from engine.stages.distributed.degree import validated_tp
from engine.stages.distributed.failures import culprit, error_line, failure_reason
from engine.stages.distributed.options import (
    DistributedOptionsError,
    distributed_options,
    distributed_time_limits,
)
from engine.stages.distributed.run import validate_split
from engine.stages.distributed.sharding import (
    decoder_prefix,
    outside_decoder,
    plan_touches_decoder,
    split_blocks,
)
from engine.twin import build_twin
from engine.twin.shrink import keep_divisibility
from tests.engine.stages.realconfigs import load

# Builds and runs scaled twins with torch: left out of `make test-fast`.
pytestmark = pytest.mark.slow

LLAMA = "meta-llama__Llama-3.1-8B"
QWEN3_MOE = "Qwen__Qwen3-235B-A22B-Instruct-2507"
CPU = PoolSpec(name="cpu", backend="cpu", queue="cpu")
PLAN_TP2 = {"tp": 2, "pp": 1, "ep": 1, "dp": 1}


@pytest.fixture(scope="module")
def llama_twin():
    return build_twin(load(LLAMA), parallel_degree=2)


@pytest.fixture(scope="module")
def moe_twin():
    return build_twin(load(QWEN3_MOE), parallel_degree=2)


def _context(name: str, plan: dict, options: dict | None = None, pool: PoolSpec = CPU):
    config = load(name)
    return StageContext(
        release=ReleaseRef("mirror", "/nowhere", name.replace("__", "/"), "main"),
        pool=pool,
        previous={
            "fetch": {"config": config},
            "analyze": analyze_config(config).to_dict(),
            "plan": plan,
        },
        options=options or {},
    )


def _live_cmdline(pid: int) -> str | None:
    """The command line of process `pid` when it is alive (not a zombie), else None."""
    proc = Path(f"/proc/{pid}")
    try:
        cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
    return None if state == "Z" else cmdline


def _alive(pids: dict) -> list[int]:
    """The launcher and rank pids of a result (`pids`) still running as torchrun or a rank."""
    candidates = [pids["launcher"], *pids["ranks"].values()]
    return [
        pid
        for pid in candidates
        if (cmd := _live_cmdline(pid)) and ("torch.distributed.run" in cmd or ".rank " in cmd)
    ]


def _running_with(text: str) -> list[int]:
    """Pids of live processes whose command line contains `text`."""
    pids = [int(proc.name) for proc in Path("/proc").iterdir() if proc.name.isdigit()]
    return [pid for pid in pids if text in (_live_cmdline(pid) or "")]


def test_llama_tp2_stage_matches_the_reference_within_float32_round_off():
    result = distributed.run(_context(LLAMA, {"tp": 8, "pp": 1, "ep": 1, "dp": 1}))

    assert result["validated"] is True and result["passed"] is True
    assert (result["backend"], result["world_size"], result["tp"], result["ep"]) == (
        "gloo",
        2,
        2,
        1,
    )
    assert "largest divisor of 8" in result["degree_reason"]
    # Reordered float32 sums only: the logits (max |x| ~ 1) agree to ~1e-6.
    assert 0 <= result["max_abs_error"] < 1e-5
    assert result["top1_agreement"] == 1.0
    assert [row["rank"] for row in result["ranks"]] == [0, 1]
    assert all(row["passed"] and row["first_divergent"] is None for row in result["ranks"])
    assert result["step_time_s"] > 0 and result["step_time_tp1_s"] > 0
    assert result["tokens_per_s"] == pytest.approx(2 / result["step_time_s"])
    assert result["scaling_efficiency"] == pytest.approx(
        result["step_time_tp1_s"] / (2 * result["step_time_s"])
    )
    assert 0 < result["comm_fraction"] <= 1
    assert "c10d::allreduce_" in result["comm_ops"]  # row-parallel o_proj/down_proj sums
    assert {row["name"]: row["kept"] for row in result["divisibility"]} == {
        "query heads / TP": True,
        "K/V heads / TP": True,
    }


def test_qwen3_moe_tp2_with_expert_parallel_matches(moe_twin):
    result = validate_split(moe_twin, tp=2, ep=2)

    assert result["passed"] is True and (result["tp"], result["ep"]) == (2, 2)
    assert result["max_abs_error"] < 1e-5
    assert result["top1_agreement"] == 1.0
    assert moe_twin.analysis["moe"]["num_experts"] % 2 == 0


def test_a_weight_split_on_the_wrong_dimension_fails_and_says_where(llama_twin):
    weight = "model.layers.1.self_attn.o_proj.weight"
    with pytest.raises(StageFailed) as caught:
        validate_split(llama_twin, tp=2, inject={"wrong_shard": weight})

    result = caught.value.result
    assert result["passed"] is False
    # Layer 0 is untouched; the first output off the reference is layer 1's attention block.
    assert result["first_divergent"]["module"] == "model.layers.1.self_attn"
    assert result["first_divergent"]["layer"] == 1
    assert result["first_divergent"]["max_abs_error"] > 100 * result["first_divergent"]["tolerance"]
    assert result["max_abs_error"] > result["tolerance"]["max_abs_error"]
    assert "first divergent module model.layers.1.self_attn" in caught.value.reason
    assert result["notes"] == [f"{weight}: shard split on dim 0 instead of dim 1"]


def test_a_killed_rank_fails_the_stage_and_leaves_no_process(llama_twin):
    with pytest.raises(StageFailed) as caught:
        validate_split(llama_twin, tp=2, inject={"kill_rank": 1})

    result = caught.value.result
    assert result["failed_rank"] == 1
    assert ": rank 1 was killed by SIGKILL\nits log:\n" in caught.value.reason
    assert "injected: killing this rank" in caught.value.reason  # the rank's own log lines
    assert result["max_abs_error"] is None and result["passed"] is False
    assert sorted(result["pids"]["ranks"]) == [0, 1]
    assert _alive(result["pids"]) == []


def test_a_hanging_rank_ends_within_the_time_limit(llama_twin):
    with pytest.raises(StageFailed) as caught:
        validate_split(llama_twin, tp=2, inject={"hang_rank": 1}, timeout_s=30)

    result = caught.value.result
    # Ended by the time limit, not left hanging: the run returned, its ranks named and gone.
    # Its peer times out in the collective the hung rank never joins: the peer is the victim,
    # the rank that fell behind is named, with where it stopped.
    assert result["failed_rank"] == 1
    first = caught.value.reason.splitlines()[0]
    assert "rank 1 stopped after 'loaded'" in first
    assert "[rank 1] injected: hanging instead of running" in first
    assert "the other ranks were waiting for it in a collective" in first
    assert sorted(result["pids"]["ranks"]) == [0, 1]
    assert _alive(result["pids"]) == []


def test_ranks_past_the_time_limit_are_all_killed(llama_twin, tmp_path, monkeypatch):
    work = tmp_path / "ranks-work"
    work.mkdir()
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **_kwargs: str(work))
    with pytest.raises(StageFailed, match="did not finish within 1 s and were killed") as caught:
        validate_split(llama_twin, tp=2, timeout_s=1)
    assert _alive(caught.value.result["pids"]) == []
    # Ranks killed before writing their pid files die with the launcher (PR_SET_PDEATHSIG).
    deadline = time.monotonic() + 10
    while _running_with(str(work)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _running_with(str(work)) == []


def test_two_validations_at_once_do_not_collide_on_ports(llama_twin, moe_twin):
    results: dict[str, dict] = {}

    def validate(name, twin, ep):
        results[name] = validate_split(twin, tp=2, ep=ep, timeout_s=150)

    threads = [
        threading.Thread(target=validate, args=("dense", llama_twin, 1)),
        threading.Thread(target=validate, args=("moe", moe_twin, 2)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {name: r["passed"] for name, r in results.items()} == {"dense": True, "moe": True}


def test_exit_codes_are_read_from_torchruns_summary():
    summary = """
    Failures:
      <NO_OTHER_FAILURES>
    Root Cause (first observed failure):
    [0]:
      time      : 2026-11-30_05:11:16
      rank      : 1 (local_rank: 1)
      exitcode  : -9 (pid: 5172)
    """
    assert launch.exit_codes(summary) == {1: -9}


def test_a_pool_without_a_distributed_backend_is_not_validated():
    manifest = PoolSpec(name="npu", backend="manifest", queue="npu")
    result = distributed.run(_context(LLAMA, PLAN_TP2, pool=manifest))
    assert result["validated"] is False and result["passed"] is None
    assert "no torch.distributed backend" in result["reason"]
    assert result["max_abs_error"] is None


def test_the_stage_needs_a_plan():
    ctx = _context(LLAMA, {})
    with pytest.raises(StageFailed, match="no split to validate"):
        distributed.run(ctx)


def test_options_are_checked():
    assert distributed_options(None) == {
        "processes": 2,
        "tp": None,
        "timeout_s": 180,
        "expert_parallel": "auto",
        "backend": None,
        "inject": {},
    }
    assert distributed_options({"backend": "hccl"})["backend"] == "hccl"
    for bad, message in (
        ({"processes": 1}, "processes must be an integer from 2"),
        ({"timeout_s": "soon"}, "timeout_s must be an integer"),
        ({"expert_parallel": "yes"}, "expert_parallel must be"),
        ({"inject": {"kill_rank": True}}, "inject.kill_rank must be a rank"),
        ({"inject": {"hang_rank": -1}}, "inject.hang_rank must be a rank"),
        ({"inject": {"explode": 1}}, "inject must be an object with one of"),
        ({"inject": []}, "inject must be an object"),
        ({"inject": {"wrong_shard": " "}}, "inject.wrong_shard must be a weight's name"),
        ({"tp": 1}, "tp must be an integer from 2"),
        ({"speed": 2}, "unknown distributed option: speed"),
        ({"speed": 2, "size": 1}, "unknown distributed options: size, speed"),
        ({"backend": "nc cl"}, "backend must be a torch.distributed backend"),
        ([1], "must be an object"),
    ):
        with pytest.raises(DistributedOptionsError, match=message):
            distributed_options(bad)
    assert distributed_time_limits({}) == (240, 300)
    assert distributed_time_limits({"timeout_s": 600}) == (660, 720)


def test_bad_options_fail_the_stage_by_name():
    with pytest.raises(StageFailed, match="distributed options are unusable: unknown"):
        distributed.run(_context(LLAMA, PLAN_TP2, {"speed": 2}))


@pytest.mark.parametrize(
    ("plan_tp", "devices", "forced", "expected"),
    [
        (2, 2, None, 2),
        (8, 2, None, 2),  # the largest divisor of 8 the worker holds
        (8, 6, None, 4),
        (1, 2, None, 2),  # a TP=1 plan: the next point of its scaling curve
        (3, 2, None, 1),  # no divisor of 3 fits on 2 devices
        (8, 1, None, 1),
        (8, 4, 2, 2),
        (8, 2, 4, 1),  # asked for more than the worker holds
    ],
)
def test_validated_degree(plan_tp, devices, forced, expected):
    tp, why = validated_tp(plan_tp, devices, forced)
    assert tp == expected and why


@pytest.mark.parametrize(
    ("real", "twin", "degree", "expected"),
    [
        (8, 2, 4, 4),  # 8 K/V heads split by TP=4: the twin's 2 become 4
        (8, 2, 2, 2),
        (1, 1, 2, 1),  # MQA stays one (replicated) K/V head
        (8, 2, 16, 2),  # TP=16 does not divide 8 on the release: nor on the twin
        (128, 16, 32, 32),  # Qwen3's 128 experts over EP=32
    ],
)
def test_twin_counts_keep_the_releases_divisibility(real, twin, degree, expected):
    assert keep_divisibility(real, twin, degree) == expected


def test_a_tp4_twin_has_divisible_heads_and_experts():
    llama = build_twin(load(LLAMA), parallel_degree=4).analysis
    assert (llama["num_attention_heads"] % 4, llama["num_kv_heads"] % 4) == (0, 0)
    assert llama["num_attention_heads"] // llama["num_kv_heads"] == 4  # GQA ratio 32/8 kept
    qwen = build_twin(load(QWEN3_MOE), parallel_degree=4).analysis
    assert qwen["moe"]["num_experts"] % 4 == 0 and qwen["num_kv_heads"] % 4 == 0


def test_a_plan_that_splits_no_decoder_layer_is_not_validated():
    # transformers 5.24's gpt-oss plan splits only the embedding and the LM head.
    ctx = _context("openai__gpt-oss-20b", PLAN_TP2)
    result = distributed.run(ctx)
    assert result["validated"] is False and result["passed"] is None
    assert result["reason"] == (
        "transformers' tensor-parallel plan for GptOssForCausalLM splits only lm_head, "
        "model.embed_tokens: every rank would run every decoder layer whole, so there is no "
        "split of the decoder to validate"
    )
    assert result["max_abs_error"] is None and result["tp"] == 1


def test_options_the_worker_cannot_honour_fail_the_stage():
    with pytest.raises(StageFailed, match="tp=4, more than the worker's 2 processes"):
        distributed.run(_context(LLAMA, PLAN_TP2, {"tp": 4}))
    with pytest.raises(StageFailed, match=r"inject\.kill_rank is 2: ranks are 0 to 1"):
        distributed.run(_context(LLAMA, PLAN_TP2, {"inject": {"kill_rank": 2}}))


def test_a_tp_that_does_not_divide_the_heads_fails_or_is_not_validated():
    # Asked for by the job: a split that cannot exist on the release either.
    with pytest.raises(StageFailed, match="tp=3 does not divide the release's 32 query heads"):
        distributed.run(_context(LLAMA, PLAN_TP2, {"processes": 3, "tp": 3}))
    # A plan's TP=3 the twin cannot split (the planner never makes one for 32 heads, but an
    # edited plan might): not validated, and why.
    result = distributed.run(
        _context(LLAMA, {"tp": 3, "pp": 1, "ep": 1, "dp": 1}, {"processes": 3})
    )
    assert result["validated"] is False
    assert result["reason"] == "TP=3 does not divide the twin's 8 query heads"


def test_a_wrong_shard_naming_no_weight_fails_before_any_process_starts():
    with pytest.raises(StageFailed, match=r"inject\.wrong_shard names no 2-D weight of the twin"):
        distributed.run(_context(LLAMA, PLAN_TP2, {"inject": {"wrong_shard": "model.norm"}}))


def test_which_blocks_a_plan_splits():
    points = [
        ["model.layers.0.self_attn", 0, "attention"],
        ["model.layers.0.mlp", 0, "moe"],
        ["model.layers.0", 0, "output"],
        ["model.norm", 1, "norm"],
    ]
    # DeepSeek-V3's plan: experts split, MLA attention whole.
    sharded = ["model.embed_tokens.weight", "model.layers.0.mlp.experts.gate_up_proj"]
    assert split_blocks(sharded, points) == {"attention": False, "moe": True}
    assert outside_decoder(sharded, decoder_prefix(points)) == ["model.embed_tokens.weight"]
    assert plan_touches_decoder(["model.layers.*.mlp.experts"], "model.layers")
    assert not plan_touches_decoder(["lm_head", "model.embed_tokens"], "model.layers")


def test_the_rank_that_fell_behind_is_blamed_not_the_peer_that_timed_out():
    timed_out = (
        "[rank 0] loaded LlamaForCausalLM with tp=2 ep=1\n"
        "[rank0]: RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
        "15000ms for recv operation to complete"
    )
    logs = [
        {"rank": 0, "exit_code": 1, "phase": "loaded", "excerpt": timed_out},
        {"rank": 1, "exit_code": -15, "phase": "loaded", "excerpt": "[rank 1] injected: hang"},
    ]
    assert culprit(logs) == (logs[1], False)
    crashed = [
        {"rank": 0, "exit_code": -15, "phase": "recorded", "excerpt": "[rank 0] timed"},
        {
            "rank": 1,
            "exit_code": 1,
            "phase": "loaded",
            "excerpt": "[rank1]: ValueError: shape '[2, 16, -1, 16]' is invalid",
        },
    ]
    reason, rank = failure_reason("the distributed run failed", crashed)
    assert rank == 1
    assert reason.splitlines()[0] == (
        "the distributed run failed: rank 1 exited with code 1 "
        "(ValueError: shape '[2, 16, -1, 16]' is invalid)"
    )
    assert error_line("Traceback\n  File x\n[rank0]: RuntimeError: boom") == "RuntimeError: boom"


def test_at_the_time_limit_the_rank_outside_the_collective_is_the_one_that_hung():
    dump = (
        "Current thread 0x00007f (most recent call first):\n"
        '  File "/venv/torch/distributed/tensor/_redistribute.py", line 9 in redistribute\n'
        '  File "/app/engine/stages/distributed/rank.py", line 170 in main\n'
    )
    assert launch.last_stack(dump) == [
        'File "/app/engine/stages/distributed/rank.py", line 170 in main',
        'File "/venv/torch/distributed/tensor/_redistribute.py", line 9 in redistribute',
    ]
    waiting = {"rank": 0, "exit_code": None, "phase": "loaded", "excerpt": "[rank 0] loaded"}
    hung = {"rank": 1, "exit_code": None, "phase": "loaded", "excerpt": "[rank 1] injected"}
    assert culprit([waiting | {"in_collective": True}, hung | {"in_collective": False}]) == (
        hung | {"in_collective": False},
        False,
    )
    # Nothing tells two ranks at the same step apart: no rank is blamed.
    reason, rank = failure_reason("the 2 ranks did not finish within 10 s", [waiting, hung])
    assert rank is None
    assert reason.splitlines()[0] == (
        "the 2 ranks did not finish within 10 s: could not tell which rank hung (every rank "
        "stopped after 'loaded')"
    )


def test_work_folders_live_under_the_var_dir_and_stale_ones_are_swept(tmp_path, monkeypatch):
    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path))
    stale = tmp_path / "distributed" / "day0-distributed-old"
    stale.mkdir(parents=True)
    fresh = tmp_path / "distributed" / "day0-distributed-running"
    fresh.mkdir()
    old = time.time() - distributed.STALE_WORK_S - 60
    os.utime(stale, (old, old))
    assert distributed.work_root() == tmp_path / "distributed"
    assert not stale.exists() and fresh.exists()  # a run still going keeps its folder


def test_a_stack_dump_is_not_the_excerpt_of_a_ranks_log(tmp_path):
    """A rank's excerpt leaves out faulthandler's dump, whichever header it writes ("Stack"
    for one thread, as rank.py registers it), so a hung rank's last line is what it logged
    itself, not the dump's header."""
    stderr = tmp_path / "stderr.log"
    stderr.write_text(
        "[rank 1] injected: hanging instead of running\n"
        "Stack (most recent call first):\n"
        '  File "/app/engine/stages/distributed/rank.py", line 170 in main\n'
        "Current thread 0x00007f (most recent call first):\n"
        '  File "/app/engine/stages/distributed/rank.py", line 171 in main\n'
    )
    assert launch._tail(stderr) == "[rank 1] injected: hanging instead of running"
