"""The `distributed` stage: the plan's split run for real on torch.distributed.

A release day validates one card first, then scales to several cards and validates the
parallel strategies. This stage takes the plan's TP degree (see
`degree.validated_tp`), builds the scaled twin with the release's head and expert
divisibility by that degree, saves it, and runs it across that many processes with
`torchrun` (`launch.py`): gloo on a cpu pool, NCCL on CUDA. Each rank loads the twin through
transformers' own tensor-parallel plan (`tp_plan`, DTensor shards) and, for MoE releases
whose plan uses it, its expert-parallel plan (`ep_plan`), then records the same prefill and
teacher-forced decode as the single-process float32 reference (`capture.py`). Every rank's
logits and hidden states are compared with the reference (`compare.py`), step times and the
share of time in collectives are measured, and the unsplit twin is timed on one rank's share
of the host for the measured scaling efficiency (TP=1 vs TP=N).

A plan that splits no decoder layer is not validated (`sharding.py`: the weights each rank
holds only a shard of), a crashed or hung rank is named as the culprit, not the peers that
wait for it in a collective (`failures.py`), and the job's options are checked in
`options.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from engine import formatting as fmt
from engine.contract import StageContext, StageFailed, never_cancelled
from engine.formatting import exit_status
from engine.paths import var_dir
from engine.stages.plan.result import PlanResult, Split

from .degree import BACKENDS, EP_NOT_VALIDATED, divisibility, validated_tp
from .failures import failure_reason
from .options import DistributedOptionsError, distributed_options
from .sharding import decoder_prefix, outside_decoder, plan_touches_decoder, split_blocks

# Decode steps compared with the reference, and decode steps timed (after 2 warm-up steps).
DECODE_STEPS = 4
TIMING_STEPS = 8
# A collective a rank waits on longer than this fails that rank (gloo/NCCL timeout): a rank
# that hangs is then reported by its peers before the stage's own limit kills everything.
COLLECTIVE_TIMEOUT_S = 60.0

NULL_FIGURES = (
    "max_abs_error",
    "top1_agreement",
    "step_time_s",
    "step_time_tp1_s",
    "tokens_per_s",
    "tokens_per_s_tp1",
    "comm_fraction",
    "scaling_efficiency",
)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# A run's work folder older than this is left over from a worker killed mid-run (a stage's
# ranks run at most MAX_TIMEOUT_S, an hour): swept by the next run.
STALE_WORK_S = 6 * 3600


def work_root() -> Path:
    """Where runs keep their work folders (the saved twin, inputs, rank outputs and logs):
    `distributed/` under DAY0_VAR_DIR when the worker has one, else under the system's
    temporary folder. Folders older than `STALE_WORK_S` there are removed first."""
    root = var_dir("distributed")
    root.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for entry in root.glob("day0-distributed-*"):
        try:
            stale = now - entry.stat().st_mtime > STALE_WORK_S
        except OSError:
            continue
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
    return root


def not_validated(reason: str, **known: Any) -> dict[str, Any]:
    """The result of a split that could not be validated here, and why (the stage succeeds
    and raises a known-limitation note instead of faking a run)."""
    result: dict[str, Any] = {
        "validated": False,
        "passed": None,
        "reason": reason,
        "backend": None,
        "world_size": 1,
        "tp": 1,
        "ep": 1,
        **dict.fromkeys(NULL_FIGURES),
        "ranks": [],
    }
    result.update(known)
    return result


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def validate_split(
    twin: Any,
    *,
    tp: int,
    ep: int = 1,
    device_type: str = "cpu",
    backend: str | None = None,
    timeout_s: float = 180,
    inject: Mapping[str, Any] | None = None,
    threads_per_rank: int | None = None,
    log: Callable[[str], None] = lambda _m: None,
    cancelled: Callable[[], bool] = never_cancelled,
) -> dict[str, Any]:
    """Run `twin` (a `engine.twin.Twin`) split TP=`tp` (EP=`ep`, 1 or `tp`) across
    `tp` processes and compare every rank with the single-process float32 reference.

    Returns {"validated": True, "passed", "backend", "device_type", "world_size", "tp", "ep",
    "max_abs_error" (worst rank, logits), "top1_agreement" (worst rank), "tolerance",
    "ranks": [compare.compare_rank rows + "step_time_s", "comm_fraction"], "first_divergent"
    (the first failing rank's, or None), "step_time_s" (median decode step at TP=tp, the
    slowest rank's, seconds, measured), "step_time_tp1_s" (the unsplit twin on one rank's
    share, seconds, measured), "prefill_time_s", "tokens_per_s" / "tokens_per_s_tp1" (decode
    tokens/s = batch / step time), "comm_fraction" (mean over ranks of the profiled share of
    time in collectives), "comm_ops" (rank 0's collective events), "scaling_efficiency"
    (step_time_tp1_s / (tp x step_time_s): 1 = linear), "threads_per_rank", "decode_steps",
    "timing_steps", "prompt", "launcher", "elapsed_s", "notes", "sharding" ({"blocks": {block
    kind: split?}, "outside_decoder", "sharded_parameters"}), "reason"}; or `not_validated(...)`
    when the ranks ran but no decoder-layer weight was split (nothing of the decoder to
    validate).

    Raises `StageFailed` (with `.result`) when a rank's outputs are off the reference (naming
    the rank, the logit error and the first divergent module), when a rank crashes (its exit
    status and log excerpt) or when the ranks run past `timeout_s` (every process is killed
    first); `StageCancelled` when `cancelled()` turns true.
    """
    import torch

    from engine.stages.precision.drift import hook_points

    from .capture import record_run
    from .compare import compare_rank
    from .launch import launch_ranks

    backend = backend or BACKENDS.get(device_type, "gloo")
    threads = threads_per_rank or max(1, _usable_cpus() // tp)
    points = [[name, layer, kind] for name, layer, kind in hook_points(twin.model)]
    work = Path(tempfile.mkdtemp(prefix="day0-distributed-", dir=work_root()))
    try:
        twin.model.save_pretrained(str(work / "model"))
        reference = record_run(
            twin.model, twin.input_ids, [p[0] for p in points], steps=DECODE_STEPS
        )
        torch.save(
            {"input_ids": twin.input_ids, "forced_tokens": reference["tokens"]},
            work / "inputs.pt",
        )
        spec = {
            "model_dir": str(work / "model"),
            "tp": tp,
            "ep": ep,
            "backend": backend,
            "device_type": device_type,
            "threads": threads,
            "points": points,
            "decode_steps": DECODE_STEPS,
            "timing_steps": TIMING_STEPS,
            # Half the stage's budget: a peer of a hung rank times out, and reports, while
            # there is still time to collect every rank's log before the launcher is killed.
            "collective_timeout_s": min(COLLECTIVE_TIMEOUT_S, max(5.0, timeout_s / 2)),
            "baseline": True,
            "inject": dict(inject or {}),
        }
        (work / "spec.json").write_text(json.dumps(spec))
        env = {"CUDA_VISIBLE_DEVICES": ""} if device_type == "cpu" else {}
        log(
            f"launching {tp} {backend} ranks (TP={tp}, EP={ep}, "
            f"{fmt.counted(threads, 'thread')} each)"
        )
        outcome = launch_ranks(
            work,
            world_size=tp,
            threads_per_rank=threads,
            timeout_s=timeout_s,
            cancelled=cancelled,
            env=env,
        )
        base: dict[str, Any] = {
            "validated": True,
            "backend": backend,
            "device_type": device_type,
            "world_size": tp,
            "tp": tp,
            "ep": ep,
            "threads_per_rank": threads,
            "decode_steps": DECODE_STEPS,
            "timing_steps": TIMING_STEPS,
            "prompt": {
                "batch": int(twin.input_ids.shape[0]),
                "tokens": int(twin.input_ids.shape[1]),
            },
            "launcher": "torchrun --standalone (c10d rendezvous on localhost, OS-chosen port)",
            "elapsed_s": outcome.elapsed_s,
            "inject": dict(inject or {}),
            "rank_logs": outcome.rank_logs,
            "pids": outcome.pids,
        }
        if outcome.status != "ok":
            if outcome.status == "timeout":
                headline = f"the {tp} ranks did not finish within {timeout_s:g} s and were killed"
            else:
                headline = f"the distributed run failed (torchrun {exit_status(outcome.exit_code)})"
            reason, failed_rank = failure_reason(
                headline, outcome.rank_logs, outcome.launcher_excerpt
            )
            result = {**base, **dict.fromkeys(NULL_FIGURES), "passed": False, "ranks": []}
            result["failed_rank"] = failed_rank
            result["reason"] = reason
            raise StageFailed(reason, result=result)

        outputs = [torch.load(work / f"rank{r}.pt", weights_only=True) for r in range(tp)]
    finally:
        shutil.rmtree(work, ignore_errors=True)

    sharded = list(outputs[0]["sharded"])
    prefix = decoder_prefix(points)
    blocks = split_blocks(sharded, points)
    sharding = {
        "sharded_parameters": len(sharded),
        "outside_decoder": outside_decoder(sharded, prefix),
        "blocks": blocks,
    }
    if not any(blocks.values()):
        return not_validated(
            f"transformers' plan for {type(twin.model).__name__} splits only "
            f"{', '.join(sharding['outside_decoder']) or 'nothing'} at TP={tp}: every rank runs "
            "every decoder layer whole, so there is no split of the decoder to validate",
            **{k: base[k] for k in ("backend", "device_type", "world_size", "tp", "ep")},
            sharding=sharding,
        )
    rows = []
    for out in outputs:
        row = compare_rank(out["rank"], reference, out["run"], points)
        row["step_time_s"] = _median(out["timing"]["decode_step_s"])
        row["comm_fraction"] = out["comm"]["fraction"]
        rows.append(row)
    step = max(row["step_time_s"] for row in rows)
    baseline = outputs[0]["baseline"]
    step_tp1 = _median(baseline["decode_step_s"]) if baseline else None
    batch = int(twin.input_ids.shape[0])
    errors = [row["max_abs_error"] for row in rows if row["max_abs_error"] is not None]
    agreements = [row["top1_agreement"] for row in rows if row["top1_agreement"] is not None]
    fractions = [row["comm_fraction"] for row in rows if row["comm_fraction"] is not None]
    failing = [row for row in rows if not row["passed"]]
    result = {
        **base,
        "passed": not failing,
        "max_abs_error": max(errors) if len(errors) == len(rows) else None,
        "top1_agreement": min(agreements) if len(agreements) == len(rows) else None,
        "tolerance": {
            "max_abs_error": rows[0]["tolerance"],
            "rule": "|logit - reference| <= 1e-4 x max|reference logit| + 1e-5 "
            "(float32 round-off of reordered sums), top-1 equal outside ties",
            "reference": "one process, float32, the same seeded twin",
        },
        "ranks": rows,
        "first_divergent": failing[0]["first_divergent"] if failing else None,
        "step_time_s": step,
        "step_time_tp1_s": step_tp1,
        "prefill_time_s": max(out["timing"]["prefill_s"] for out in outputs),
        "tokens_per_s": batch / step,
        "tokens_per_s_tp1": batch / step_tp1 if step_tp1 else None,
        "comm_fraction": sum(fractions) / len(fractions) if fractions else None,
        "comm_ops": outputs[0]["comm"]["ops"],
        "scaling_efficiency": step_tp1 / (tp * step) if step_tp1 else None,
        "timing_kind": "measured",
        "notes": [note for out in outputs for note in out["notes"]][:1],
        "sharding": sharding,
    }
    whole = sorted(kind for kind, split in blocks.items() if not split)
    if whole:
        result["notes"].append(
            f"transformers' plan for {type(twin.model).__name__} leaves the {', '.join(whole)} "
            "blocks whole on every rank: this run validates the split of "
            f"{', '.join(sorted(k for k, v in blocks.items() if v))} only"
        )
    if device_type == "cpu" and tp * threads > _usable_cpus():
        result["notes"].append(
            f"{tp} ranks x {fmt.counted(threads, 'thread')} exceed the host's {_usable_cpus()} "
            "usable CPUs: the ranks share cores, so the TP step time and the scaling efficiency "
            f"understate {tp} devices of their own"
        )
    result["reason"] = _verdict(result, failing)
    if failing:
        raise StageFailed(result["reason"], result=result)
    return result


def _verdict(result: Mapping[str, Any], failing: list[dict[str, Any]]) -> str:
    split = f"TP={result['tp']}" + (f" EP={result['ep']}" if result["ep"] > 1 else "")
    where = f"{result['world_size']} {result['backend']} processes"
    if not failing:
        return (
            f"{split} on {where} matches the float32 reference: max |logit error| "
            f"{result['max_abs_error']:.2e} (tolerance {result['tolerance']['max_abs_error']:.2e}),"
            f" top-1 agreement {result['top1_agreement']:.3f} on every rank"
        )
    row = failing[0]
    parts = [f"{split} on {where} does not match the float32 reference on rank {row['rank']}"]
    if row.get("error"):
        parts.append(row["error"])
    if row.get("max_abs_error") is not None:
        parts.append(
            f"max |logit error| {row['max_abs_error']:.3g} over the tolerance "
            f"{row['tolerance']:.2e}, top-1 agreement {row['top1_agreement']:.3f}"
        )
    div = row.get("first_divergent")
    if div:
        size = (
            f"max abs error {div['max_abs_error']:.3g} > {div['tolerance']:.2e}"
            if div.get("max_abs_error") is not None
            else f"shape {div.get('shape')}"
        )
        parts.append(f"first divergent module {div['module']} (layer {div['layer']}, {size})")
    return "; ".join(parts)


def _device_count(device_type: str) -> int:
    import torch

    module = getattr(torch, device_type, None)
    count = getattr(module, "device_count", None)
    return int(count()) if callable(count) else 0


def _expert_parallel(want: Any, plan: Split, twin: Any, tp: int) -> tuple[int, str | None]:
    """(EP degree, why EP is not validated or None); `plan` is the plan's split."""
    moe = (twin.analysis or {}).get("moe")
    if want == "auto":
        want = bool(moe) and (plan.ep or 1) > 1
    if not want:
        return 1, None
    if not moe:
        return 1, "expert parallelism asked for, but the release has no routed experts"
    if not getattr(twin.model, "ep_plan", None):
        return 1, (
            f"{EP_NOT_VALIDATED}transformers' {type(twin.model).__name__} has no "
            "expert-parallel plan (ep_plan)"
        )
    if moe["num_experts"] % tp:
        return 1, f"{moe['num_experts']} routed experts do not split evenly over EP={tp}"
    return tp, None


def run(ctx: StageContext) -> dict[str, Any]:
    """Validate the plan's split of `ctx`'s release on the pool's devices (module docstring).

    Options (`ctx.options`, checked by `options.distributed_options`): processes, tp,
    expert_parallel, backend, timeout_s, inject. Returns `validate_split`'s result plus "plan" (the
    plan's TP/PP/EP/DP), "degree_reason", "pool_devices", "divisibility" and "twin"; or
    `not_validated(...)` when this pool or architecture cannot run the split (no devices, a
    backend without torch.distributed support, no transformers tp_plan, the release's own
    modeling code). Raises `StageFailed` for unusable options, a missing plan, or what
    `validate_split` raises.
    """
    from engine.remote_code import sandbox as remote_code
    from engine.stages.precision.drift import hook_points
    from engine.twin import twin_for_release

    try:
        options = distributed_options(ctx.options)
    except DistributedOptionsError as err:
        raise StageFailed(f"the job's distributed options are unusable: {err}") from err
    plan = PlanResult.from_stored(ctx.previous.get("plan")).split
    if not plan.tp:
        raise StageFailed("the plan stage produced no split to validate")
    device_type = ctx.pool.backend
    backend = options["backend"] or BACKENDS.get(device_type)
    known: dict[str, Any] = {"plan": plan.to_dict(), "device_type": device_type}
    if backend is None:
        return not_validated(
            f"pool {ctx.pool.name}'s backend {device_type!r} has no torch.distributed "
            "backend on this worker (gloo, NCCL, XCCL, HCCL are known; a job's "
            '"backend" option names another)',
            **known,
        )
    if not _backend_available(backend):
        return not_validated(
            f"this worker's torch has no {backend!r} torch.distributed backend "
            "(torch.distributed.is_backend_available is false)",
            **known,
        )
    devices = options["processes"] if device_type == "cpu" else _device_count(device_type)
    if options["tp"] is not None and options["tp"] > devices:
        raise StageFailed(
            f"the job asks for tp={options['tp']}, more than the worker's {devices} "
            + ("processes (the processes option)" if device_type == "cpu" else "devices")
        )
    tp, why = validated_tp(plan.tp, devices, options["tp"])
    known.update({"backend": backend, "pool_devices": devices, "degree_reason": why})
    if tp < 2:
        return not_validated(why, **known)
    for key in ("kill_rank", "hang_rank"):
        if key in options["inject"] and not 0 <= options["inject"][key] < tp:
            raise StageFailed(f"inject.{key} is {options['inject'][key]}: ranks are 0 to {tp - 1}")
    config = remote_code.fetched_config(ctx)
    if remote_code.needs_remote_code(config):
        return not_validated(
            "the release runs on its own modeling code (trust_remote_code); transformers' "
            "tensor-parallel plans cover only its own classes",
            **known,
        )
    twin = twin_for_release(ctx, config, parallel_degree=tp)
    if not getattr(twin.model, "tp_plan", None):
        return not_validated(
            f"transformers' {type(twin.model).__name__} has no tensor-parallel plan "
            "(base_model_tp_plan): the split cannot be validated for this architecture",
            **known,
        )
    ep, ep_note = _expert_parallel(options["expert_parallel"], plan, twin, tp)
    rules = [*twin.model.tp_plan, *((getattr(twin.model, "ep_plan", None) or {}) if ep > 1 else {})]
    prefix = decoder_prefix(hook_points(twin.model))
    if not plan_touches_decoder(rules, prefix):
        return not_validated(
            f"transformers' tensor-parallel plan for {type(twin.model).__name__} splits only "
            f"{', '.join(sorted(twin.model.tp_plan))}: every rank would run every decoder layer "
            "whole, so there is no split of the decoder to validate",
            **known,
        )
    indivisible = _indivisible(twin.analysis or {}, tp)
    if indivisible:
        release_counts = _indivisible(ctx.previous.get("analyze") or {}, tp)
        if options["tp"] is not None and release_counts:  # the job asked for a split that
            raise StageFailed(  # cannot exist, on the release as on its twin
                f"tp={tp} does not divide the release's {release_counts} (nor the twin's "
                f"{indivisible}): choose a divisor"
            )
        return not_validated(f"TP={tp} does not divide the twin's {indivisible}", **known)
    wrong = options["inject"].get("wrong_shard")
    if wrong is not None:
        _check_weight(twin.model, wrong)
    analysis = ctx.previous.get("analyze") or {}
    known["divisibility"] = divisibility(analysis, twin.analysis or {}, tp, ep)
    known["twin"] = {
        "class": twin.description.get("class"),
        "parameters": twin.description.get("parameters"),
        "weights_source": twin.description.get("weights_source"),
    }
    known["ep_note"] = ep_note
    ctx.log(f"validating TP={tp} EP={ep}: {why}")
    if ep_note:
        ctx.log(ep_note)
    try:
        result = validate_split(
            twin,
            tp=tp,
            ep=ep,
            device_type=device_type,
            backend=backend,
            timeout_s=options["timeout_s"],
            inject=options["inject"],
            log=ctx.log,
            cancelled=ctx.cancelled,
        )
    except StageFailed as exc:
        if isinstance(exc.result, dict):
            exc.result.update(known)
        raise
    result.update(known)
    blocks = (result.get("sharding") or {}).get("blocks") or {}
    if result.get("validated") and blocks:
        # Divisibility matters only for what the plan split: heads when attention is split,
        # experts when the MoE block is.
        kept = {"query heads / TP": "attention", "K/V heads / TP": "attention"}
        result["divisibility"] = [
            row for row in result["divisibility"] if blocks.get(kept.get(row["name"], "moe"), False)
        ]
    ctx.log(result["reason"])
    return result


def _check_weight(model: Any, name: str) -> None:
    """Raise `StageFailed` unless `name` is a 2-D weight of the twin (inject.wrong_shard)."""
    weights = {n: p for n, p in model.named_parameters() if p.dim() == 2}
    if name not in weights:
        examples = ", ".join(n for n in weights if ".layers.0." in n)
        raise StageFailed(
            f"inject.wrong_shard names no 2-D weight of the twin: {name!r} (layer 0 has {examples})"
        )


def _backend_available(backend: str) -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_backend_available(backend))


def _indivisible(analysis: Mapping[str, Any], tp: int) -> str:
    """ "" when TP=`tp` divides the twin's query heads and K/V heads (fewer K/V heads than
    `tp` are replicated, not split); else which count it does not divide."""
    heads, kv = analysis.get("num_attention_heads"), analysis.get("num_kv_heads")
    if isinstance(heads, int) and heads % tp:
        return f"{heads} query heads"
    if isinstance(kv, int) and kv >= tp and kv % tp:
        return f"{kv} K/V heads"
    return ""
