"""The `release_notes` stage: what users of a release need to deploy it on a pool, written
from the earlier stages' results.

The notes are one Markdown document (`markdown`) and the same content as data (`sections`):

- **configuration**: the recommended pool (the job's), the plan's TP/PP/EP/DP split, serving
  dtype, context, concurrency (sized for, and the largest batch that fits), memory per
  device, and the plan's vLLM and SGLang launch commands copied as the plan wrote them; a
  plan that fits nothing says why and what would fit.
- **distributed** ("Multi-device validation"): the split the `distributed` stage ran on the
  twin (TP/EP, processes, backend) against the plan's, the worst max |logit error| against
  its tolerance and the top-1 agreement, decode step time at TP=N and TP=1, the share of
  time in collectives and the scaling efficiency, all `MEASURED_TWIN`; or why the split was
  not validated.
- **performance**: the knee batch size with its TPOT and decode tokens/s, measured on the
  scaled twin (labelled `MEASURED_TWIN`), beside the plan's full-size roofline at that batch
  (`PREDICTED_FULL`, and `CALIBRATED_FULL` where the pool had a calibration); the knee of
  every measured dtype.
- **precision**: per dtype passed/failed, top-1 agreement, max abs error, cosine, KL.
- **operators** and **stability**: coverage and the stability verdict.
- **limitations**: the release's open known limitations for the pool (or every pool),
  most severe first (`StageContext.limitations`, filled by the runner for a definition
  with `reads_limitations`).
- **not_validated**: stages that failed, were skipped or did not run, and what a twin,
  the split run only on the twin (or not at all), short prompts and a short stability run
  leave unproven.

Plain Python: nothing here imports Django or torch. `build_release_notes` is the engine;
`run` is the stage (its predecessors all succeeded, or the stage would have been skipped);
`adaptation.release_notes.release_notes_regenerate` calls the engine for any job, with the
stages' states, so a job that failed early still gets notes from what it found.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine import formatting as fmt
from engine.contract import StageContext
from engine.stages.distributed.degree import EP_NOT_VALIDATED

NOTES_FORMAT = 1
# The stages whose results the notes read, in job order.
READS = (
    "fetch",
    "analyze",
    "operators",
    "precision",
    "plan",
    "distributed",
    "performance",
    "stability",
)
# The stages whose figures come from a scaled twin (unless run on the release's real weights).
TWIN_STAGES = ("operators", "precision", "distributed", "performance", "stability")
SEVERITY_ORDER = ("blocker", "major", "minor", "info")
SEVERITY_TITLES = {"blocker": "Blocker", "major": "Major", "minor": "Minor", "info": "Info"}

# How each figure is labelled, in the document and in `sections`.
MEASURED_TWIN = "measured (twin)"
MEASURED_FULL = "measured (full-size, real weights)"
PREDICTED_FULL = "predicted (full-size)"
CALIBRATED_FULL = "calibrated prediction (full-size)"

_NOT_RUN = "not run"
# How the distributed stage's `ep_note` starts when transformers' class has no EP plan.


# --- Markdown (figures: `engine.formatting`) -----------------------------------------

_SPECIAL = re.compile(r"([\\`*\[\]<>|])")
# An underscore opens or closes emphasis only next to a non-word character.
_LOOSE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def text(value: Any) -> str:
    """`value` as one line of Markdown text: whitespace collapsed, the characters that would
    start markup (emphasis, links, code, HTML, table cells) escaped."""
    line = " ".join(str(value).split())
    line = _SPECIAL.sub(r"\\\1", line)
    line = _LOOSE_UNDERSCORE.sub(r"\\_", line)
    if line.startswith(("#", "+", "-", "=")) or re.match(r"\d+[.)]", line):
        line = "\\" + line
    return line


def code(value: Any) -> str:
    """`value` as an inline code span, fenced with more backticks than it holds."""
    line = " ".join(str(value).split())
    longest = max((len(run) for run in re.findall(r"`+", line)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if line.startswith("`") or line.endswith("`") else ""
    return f"{fence}{pad}{line}{pad}{fence}"


def code_block(value: str, info: str = "") -> str:
    """`value` as a fenced code block, the fence longer than any backtick run inside."""
    longest = max((len(run) for run in re.findall(r"`{3,}", value)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{value.rstrip()}\n{fence}"


def first_line(value: Any, limit: int = 300) -> str:
    """The first non-empty line of an error or reason, cut at `limit` characters."""
    for line in str(value or "").splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _indent(markdown: str, by: str = "  ") -> str:
    return "\n".join(by + line if line.strip() else "" for line in markdown.splitlines())


# --- the stages' states ---------------------------------------------------------------------


@dataclass(frozen=True)
class StageState:
    """What one earlier stage left: its status ("succeeded", "failed", "skipped",
    "cancelled", "pending", …, or "not run" when the job does not have it), the result to
    read (a success's, or what a failed run kept), and the reason it did not succeed."""

    name: str
    status: str
    result: Mapping[str, Any] | None
    reason: str = ""

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"


def stage_states(
    results: Mapping[str, Mapping[str, Any]],
    states: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, StageState]:
    """The state of every stage in `READS`. `results` are the succeeded stages' results
    (`StageContext.previous`); `states` ({stage: {"status", "error", "result"}}), where
    given, says how each of the job's stages ended (a failed run's `result` is what it kept).
    Without `states`, a stage with a result succeeded and any other did not run."""
    out: dict[str, StageState] = {}
    for name in READS:
        state = (states or {}).get(name)
        if state is not None:
            status = str(state.get("status") or _NOT_RUN)
            result = results.get(name) if status == "succeeded" else state.get("result")
            reason = first_line(state.get("error"))
        elif name in results:
            status, result, reason = "succeeded", results[name], ""
        else:
            status, result, reason = _NOT_RUN, None, ""
        out[name] = StageState(
            name=name,
            status=status,
            result=result if isinstance(result, Mapping) else None,
            reason=reason,
        )
    return out


def _ran_twin(state: StageState) -> bool:
    """Whether the stage ran a twin: it kept a result, and for `distributed`, one of a split
    it tried (a split that could not be validated here ran nothing)."""
    if state.result is None:
        return False
    return state.name != "distributed" or state.result.get("validated") is True


def _twin_description(states: Mapping[str, StageState]) -> tuple[Mapping[str, Any] | None, bool]:
    """(the twin description of the first twin stage that kept one, whether every twin stage
    that ran did so on the release's real weights at full size)."""
    described = [
        s.result["twin"]
        for name in TWIN_STAGES
        if _ran_twin(s := states[name]) and isinstance(s.result.get("twin"), Mapping)
    ]
    if not described:
        return None, False
    real = all(d.get("weights_source") == "real" for d in described)
    return described[0], real


# --- sections ---------------------------------------------------------------------------------


def _release_section(release: Any, pool: Any, analysis: Mapping[str, Any] | None) -> dict:
    section: dict[str, Any] = {
        "repo_id": getattr(release, "repo_id", ""),
        "revision": getattr(release, "revision", ""),
        "pool": getattr(pool, "name", ""),
    }
    if analysis:
        moe = analysis.get("moe") or None
        quant = analysis.get("quantization") or None
        section.update(
            {
                "architecture": analysis.get("architecture"),
                "family": analysis.get("family") or analysis.get("model_type"),
                "total_params": analysis.get("total_params"),
                "active_params": analysis.get("active_params"),
                "attention": (analysis.get("attention") or {}).get("kind"),
                "max_context_tokens": analysis.get("max_position_embeddings"),
                "weight_bytes": analysis.get("weight_bytes"),
                "kv_cache_bytes_per_token": analysis.get("kv_cache_bytes_per_token"),
                "quantization": (quant or {}).get("method") if quant else None,
                "experts": (
                    {"routed": moe.get("num_experts"), "per_token": moe.get("experts_per_token")}
                    if moe
                    else None
                ),
                "mtp_layers": analysis.get("mtp_layers") or 0,
                # Each detail names its aspect already ("attention not seen before: ...").
                "new_against_known": [
                    str(item.get("detail") or item.get("aspect"))
                    for item in analysis.get("new_against_known") or []
                    if isinstance(item, Mapping)
                ],
            }
        )
    return section


def _configuration(pool: Any, plan: StageState) -> dict[str, Any]:
    result = plan.result or {}
    base = {
        "pool": getattr(pool, "name", ""),
        "accelerator": result.get("accelerator") or getattr(pool, "accelerator", "") or None,
        "accelerator_name": result.get("accelerator_name"),
    }
    if not plan.succeeded or result.get("fits") is not True:
        inputs = result.get("inputs") or {}
        return base | {
            "available": False,
            "fits": result.get("fits"),
            "status": plan.status,
            "reason": result.get("reason") or plan.reason or f"the plan stage {plan.status}",
            "suggestions": dict(result.get("suggestions") or {}),
            "context_tokens": inputs.get("context_tokens"),
            "concurrency": inputs.get("concurrency"),
            "dtype": inputs.get("dtype"),
        }
    inputs = result.get("inputs") or {}
    predicted = result.get("predicted") or {}
    artifacts = result.get("artifacts") or {}
    return base | {
        "available": True,
        "fits": True,
        "devices": result.get("devices"),
        "nodes": result.get("nodes"),
        "pool_layout": result.get("pool"),
        "split": {key: result.get(key) for key in ("tp", "pp", "ep", "dp")},
        "dtype": result.get("dtype"),
        "dtype_label": result.get("dtype_label") or result.get("dtype"),
        "context_tokens": inputs.get("context_tokens"),
        "concurrency": inputs.get("concurrency"),
        "max_concurrency": predicted.get("largest_batch_sequences")
        or result.get("max_sequences_at_context"),
        "memory_per_device_bytes": dict(result.get("memory_per_device_bytes") or {}),
        "launch": {
            engine: artifacts[engine]
            for engine in ("vllm", "sglang")
            if isinstance(artifacts.get(engine), str)
        },
        "launch_notes": [str(n) for n in artifacts.get("notes") or []],
        "validity_flags": [str(f) for f in result.get("validity_flags") or []],
        "notes": [str(n) for n in result.get("notes") or []],
    }


def _predicted_at(
    performance: Mapping[str, Any] | None, plan: Mapping[str, Any] | None, batch: int
) -> dict[str, Any] | None:
    """The plan's full-size decode prediction at `batch` sequences (the largest predicted
    batch at or below it), from the performance result's predicted points, else from the
    plan's decode curve; None when there is none."""
    candidates: list[dict[str, Any]] = []
    for point in (performance or {}).get("points") or []:
        if (
            isinstance(point, Mapping)
            and point.get("kind") == "predicted"
            and point.get("prompt_len") is None
            and fmt.finite(point.get("tpot_s")) is not None
        ):
            candidates.append(
                {
                    "batch_size": point.get("batch_size"),
                    "tpot_s": point.get("tpot_s"),
                    "decode_tokens_per_s": point.get("decode_tokens_per_s"),
                    "calibrated_tpot_s": point.get("calibrated_tpot_s"),
                    "calibrated_decode_tokens_per_s": point.get("calibrated_decode_tokens_per_s"),
                    "context_tokens": point.get("context_tokens"),
                    "dtype": point.get("dtype"),
                }
            )
    if not candidates and plan and plan.get("fits") is True:
        predicted = plan.get("predicted") or {}
        context = (plan.get("inputs") or {}).get("context_tokens")
        for entry in predicted.get("decode_curve") or [] if predicted.get("available") else []:
            if isinstance(entry, Mapping):
                candidates.append(
                    {
                        "batch_size": entry.get("concurrent_sequences"),
                        "tpot_s": entry.get("tpot_s"),
                        "decode_tokens_per_s": entry.get("decode_tokens_per_s"),
                        "context_tokens": context,
                        "dtype": plan.get("dtype"),
                    }
                )
    below = [
        c
        for c in candidates
        if isinstance(c.get("batch_size"), int) and not isinstance(c["batch_size"], bool)
        if c["batch_size"] <= batch
    ]
    if not below:
        return None
    return max(below, key=lambda c: c["batch_size"])


def _performance(
    perf: StageState, plan: StageState, twin: Mapping[str, Any] | None
) -> dict[str, Any]:
    result = perf.result or {}
    knee = result.get("knee") if isinstance(result.get("knee"), Mapping) else None
    if not perf.succeeded or knee is None:
        return {
            "available": False,
            "status": perf.status,
            "reason": perf.reason
            or ("no knee was found on the measured points" if perf.succeeded else ""),
        }
    measured_model = next(
        (
            p.get("model")
            for p in result.get("points") or []
            if isinstance(p, Mapping) and p.get("kind") == "measured"
        ),
        "twin",
    )
    label = MEASURED_FULL if measured_model == "release" else MEASURED_TWIN
    batch = knee.get("batch_size")
    measured = {
        "label": label,
        "model": measured_model,
        "dtype": knee.get("dtype"),
        "prompt_len": knee.get("prompt_len"),
        "batch_size": batch,
        "tpot_s": knee.get("tpot_s"),
        "tpot_p95_s": knee.get("tpot_p95_s"),
        "decode_tokens_per_s": knee.get("decode_tokens_per_s"),
        "found": bool(knee.get("found")),
        "reason": knee.get("reason") or "",
        "device": result.get("device"),
        "twin_parameters": (twin or {}).get("parameters"),
    }
    predicted = None
    plan_result = plan.result if plan.succeeded else None
    if isinstance(batch, int):
        at = _predicted_at(result, plan_result, batch)
        if at is not None:
            predicted = {
                "label": PREDICTED_FULL,
                "accelerator": (plan_result or {}).get("accelerator"),
                **{k: at.get(k) for k in ("batch_size", "tpot_s", "decode_tokens_per_s")},
                "context_tokens": at.get("context_tokens"),
                "dtype": at.get("dtype"),
            }
            if fmt.finite(at.get("calibrated_tpot_s")) is not None:
                predicted["calibrated"] = {
                    "label": CALIBRATED_FULL,
                    "tpot_s": at.get("calibrated_tpot_s"),
                    "decode_tokens_per_s": at.get("calibrated_decode_tokens_per_s"),
                }
    by_dtype = [
        {
            "dtype": entry.get("dtype"),
            "prompt_len": entry.get("prompt_len"),
            "batch_size": entry.get("batch_size"),
            "tpot_s": entry.get("tpot_s"),
            "decode_tokens_per_s": entry.get("decode_tokens_per_s"),
            "found": bool(entry.get("found")),
        }
        for entry in (result.get("knee_by_dtype") or {}).values()
        if isinstance(entry, Mapping)
    ]
    largest = None
    if plan_result and plan_result.get("fits") is True:
        big = ((plan_result.get("predicted") or {}).get("largest_batch")) or None
        if isinstance(big, Mapping):
            largest = {
                "label": PREDICTED_FULL,
                "concurrent_sequences": big.get("concurrent_sequences"),
                "tpot_s": big.get("tpot_s"),
                "decode_tokens_per_s": big.get("decode_tokens_per_s"),
            }
    info = result.get("predicted")
    prediction_info = info if isinstance(info, Mapping) else {}
    # The twin's knee is measured on the twin's memory: never recommend more sequences than
    # the plan fits at its full context on the pool.
    cap = None
    if plan_result and plan_result.get("fits") is True:
        fits = (plan_result.get("predicted") or {}).get("largest_batch_sequences") or (
            plan_result.get("max_sequences_at_context")
        )
        if isinstance(batch, int) and isinstance(fits, int) and 1 <= fits < batch:
            cap = {
                "sequences": fits,
                "context_tokens": (plan_result.get("inputs") or {}).get("context_tokens"),
            }
    return {
        "available": True,
        "knee_batch_size": batch,
        "recommended_batch_size": cap["sequences"] if cap else batch,
        "capped_by_plan": cap,
        "measured": measured,
        "predicted": predicted,
        "predicted_reason": (
            ""
            if predicted
            else (prediction_info.get("reason") or "the plan made no full-size prediction")
        ),
        "largest_batch": largest,
        "by_dtype": by_dtype,
        "knee_rule": result.get("knee_rule") or "",
        "stopped": [
            f"{s.get('dtype')} prompt {s.get('prompt_len')}: stopped at batch "
            f"{s.get('batch_size')} ({first_line(s.get('reason'), 160)})"
            for s in result.get("stopped") or []
            if isinstance(s, Mapping)
        ],
        "skipped_dtypes": dict(result.get("skipped_dtypes") or {}),
        "prompt_lens": list((result.get("options") or {}).get("prompt_lens") or []),
    }


def _precision(state: StageState) -> dict[str, Any]:
    result = state.result or {}
    dtypes = result.get("dtypes") if isinstance(result.get("dtypes"), Mapping) else None
    if state.status not in ("succeeded", "failed") or dtypes is None:
        return {"available": False, "status": state.status, "reason": state.reason}
    rows = []
    for dtype, entry in dtypes.items():
        if not isinstance(entry, Mapping):
            continue
        rows.append(
            {
                "dtype": dtype,
                "passed": bool(entry.get("passed")),
                "top1_agreement": entry.get("top1_agreement"),
                "max_abs_error": entry.get("max_abs_error"),
                "cosine_similarity": entry.get("cosine_similarity"),
                "kl_divergence": entry.get("kl_divergence"),
                "first_divergent_layer": entry.get("first_divergent_layer"),
                "first_divergent_module": entry.get("first_divergent_module"),
                "reason": first_line(entry.get("reason"), 240),
            }
        )
    return {
        "available": True,
        "status": state.status,
        "passed": bool(rows) and all(r["passed"] for r in rows),
        "dtypes": rows,
        "skipped_dtypes": dict(result.get("skipped_dtypes") or {}),
        "reference": result.get("reference"),
        "target_device": result.get("target_device"),
    }


def _operators(state: StageState) -> dict[str, Any]:
    result = state.result or {}
    if not state.succeeded or not isinstance(result.get("counts"), Mapping):
        return {"available": False, "status": state.status, "reason": state.reason}
    missing = [
        {
            "name": op.get("name"),
            "feature": op.get("feature") or "",
            "missing_dtypes": list(op.get("missing_dtypes") or []),
        }
        for op in result.get("operators") or []
        if isinstance(op, Mapping) and op.get("status") == "missing"
    ]
    return {
        "available": True,
        "counts": dict(result["counts"]),
        "checked_against": result.get("checked_against"),
        "device": result.get("device"),
        "dtype": result.get("dtype"),
        "missing": missing,
    }


def _stability(state: StageState) -> dict[str, Any]:
    result = state.result or {}
    if state.status not in ("succeeded", "failed") or "passed" not in result:
        return {"available": False, "status": state.status, "reason": state.reason}
    workload = result.get("workload") or {}
    return {
        "available": True,
        "passed": bool(result.get("passed")),
        "verdict": "passed" if result.get("passed") else "failed",
        "reason": first_line(result.get("reason") or state.reason, 400),
        "duration_s": result.get("duration_s"),
        "steps": result.get("steps"),
        "memory_slope_bytes_per_step": result.get("memory_slope_bytes_per_step"),
        "step_time_drift": result.get("step_time_drift"),
        "nonfinite_outputs": result.get("nonfinite_outputs"),
        "errors": result.get("errors"),
        "dtype": workload.get("dtype"),
        "device": workload.get("device"),
    }


def _split_text(split: Mapping[str, Any] | None) -> str:
    """A plan's split as the configuration writes it: "TP 8 · PP 1 · EP 8 · DP 1"."""
    if not split:
        return "—"
    return " · ".join(f"{key.upper()} {split.get(key)}" for key in ("tp", "pp", "ep", "dp"))


def _validated_text(split: Mapping[str, Any]) -> str:
    """The split the distributed stage ran: "TP 2", "TP 2 · EP 2"."""
    ep = split.get("ep")
    return f"TP {split.get('tp')}" + (f" · EP {ep}" if isinstance(ep, int) and ep > 1 else "")


def _ep_why(distributed: Mapping[str, Any]) -> str:
    """Why expert parallelism was not validated (the stage's `ep_note`), as Markdown text."""
    note = str(distributed.get("ep_note") or "")
    if note.lower().startswith(EP_NOT_VALIDATED):
        note = note[len(EP_NOT_VALIDATED) :]
    return text(note).rstrip(".")


def _distributed(state: StageState, configuration: Mapping[str, Any]) -> dict[str, Any]:
    """The multi-device validation: the split the stage ran on the twin (TP/EP, processes,
    backend) against the plan's, its worst logit error and top-1 agreement against the
    single-process reference, decode step time at TP=N and TP=1, the share of time in
    collectives and the measured scaling efficiency."""
    result = state.result or {}
    plan_split = result.get("plan") if isinstance(result.get("plan"), Mapping) else None
    if plan_split is None and configuration.get("available"):
        plan_split = configuration.get("split")
    base: dict[str, Any] = {
        "status": state.status,
        "plan_split": dict(plan_split) if plan_split else None,
    }
    if state.status not in ("succeeded", "failed") or "validated" not in result:
        return base | {"available": False, "validated": False, "reason": state.reason}
    reason = first_line(result.get("reason") or state.reason, 400)
    if result.get("validated") is not True:
        return base | {
            "available": True,
            "validated": False,
            "passed": None,
            "reason": reason,
            "device_type": result.get("device_type"),
            "backend": result.get("backend"),
        }
    twin = result.get("twin") if isinstance(result.get("twin"), Mapping) else {}
    tolerance = result.get("tolerance") if isinstance(result.get("tolerance"), Mapping) else {}
    divergent = result.get("first_divergent")
    return base | {
        "available": True,
        "validated": True,
        "passed": result.get("passed") is True,
        "verdict": "passed" if result.get("passed") is True else "failed",
        "reason": reason,
        "label": MEASURED_FULL if twin.get("weights_source") == "real" else MEASURED_TWIN,
        "split": {
            "tp": result.get("tp"),
            "ep": result.get("ep"),
            "processes": result.get("world_size"),
            "backend": result.get("backend"),
            "device_type": result.get("device_type"),
        },
        "degree_reason": result.get("degree_reason") or "",
        "max_abs_error": result.get("max_abs_error"),
        "tolerance": tolerance.get("max_abs_error"),
        "top1_agreement": result.get("top1_agreement"),
        "first_divergent": (
            {key: divergent.get(key) for key in ("module", "layer", "kind")}
            if isinstance(divergent, Mapping)
            else None
        ),
        "failed_rank": result.get("failed_rank"),
        "failed_rank_status": next(
            (
                fmt.exit_status(entry.get("exit_code"))
                for entry in result.get("rank_logs") or []
                if isinstance(entry, Mapping) and entry.get("rank") == result.get("failed_rank")
            ),
            None,
        ),
        "step_time_s": result.get("step_time_s"),
        "step_time_tp1_s": result.get("step_time_tp1_s"),
        "tokens_per_s": result.get("tokens_per_s"),
        "tokens_per_s_tp1": result.get("tokens_per_s_tp1"),
        "comm_fraction": result.get("comm_fraction"),
        "scaling_efficiency": result.get("scaling_efficiency"),
        "ep_note": result.get("ep_note") or "",
    }


def _limitations(limitations: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The open limitations, most severe first (then as given: newest first)."""
    rows = [
        {
            "title": str(item.get("title") or ""),
            "body": str(item.get("body") or ""),
            "severity": str(item.get("severity") or "major"),
            "status": str(item.get("status") or "open"),
            "stage": str(item.get("stage") or ""),
            "pool": item.get("pool") or None,
        }
        for item in limitations
        if isinstance(item, Mapping)
    ]
    rank = {name: i for i, name in enumerate(SEVERITY_ORDER)}
    return sorted(rows, key=lambda r: rank.get(r["severity"], len(rank)))


def _multi_device(configuration: Mapping[str, Any], distributed: Mapping[str, Any]) -> str:
    """What was not validated of serving on several devices: the plan's split at full size
    always; on the twin, what the distributed stage did not run, pass or validate."""
    devices = configuration.get("devices") or 1
    split = configuration.get("split") or {}
    planned = (
        f"TP {split.get('tp')} x PP {split.get('pp')} x EP {split.get('ep')} x DP "
        f"{split.get('dp')} on {devices} devices"
    )
    if distributed.get("validated") and distributed.get("passed"):
        ran = distributed["split"]
        where = (
            f"{_validated_text(ran)} across {fmt.count(ran.get('processes'))} "
            f"{code(ran.get('backend') or '?')} processes"
        )
        if devices > 1:
            return (
                f"Multi-device serving was validated on the twin only ({where}); the plan's "
                f"split {planned} was not run at full size, its communication and scaling are "
                "predicted only."
            )
        return f"Serving on more than one device was validated on the twin only ({where})."
    if distributed.get("available") and not distributed.get("validated"):
        why = text(distributed.get("reason") or "no reason given").rstrip(".")
        if devices > 1:
            return (
                f"Multi-device serving was not validated: {why}; the split {planned}, its "
                "communication and scaling are predicted only."
            )
        return f"Serving on more than one device was not validated: {why}."
    if distributed.get("validated"):  # it ran and failed: the stage's line above says why
        ran = _validated_text(distributed["split"])
        if devices > 1:
            return (
                f"Multi-device serving did not pass on the twin ({ran}, see `distributed`): "
                f"the split {planned} is not validated."
            )
        return f"Serving on more than one device did not pass on the twin ({ran})."
    if devices > 1:
        return (
            f"Multi-device serving was not run: the split {planned}, its communication and "
            "scaling are predicted only."
        )
    return "Serving on more than one device was not validated."


def _not_validated(
    states: Mapping[str, StageState],
    configuration: Mapping[str, Any],
    distributed: Mapping[str, Any],
    performance: Mapping[str, Any],
    precision: Mapping[str, Any],
    stability: Mapping[str, Any],
    twin: Mapping[str, Any] | None,
    real_weights: bool,
) -> list[str]:
    items: list[str] = []
    for name, state in states.items():
        if state.succeeded:
            continue
        if state.status == _NOT_RUN:
            items.append(f"`{name}`: not run in this job.")
        else:
            why = f": {text(state.reason).rstrip(':; ')}" if state.reason else ""
            items.append(f"`{name}`: {text(state.status)}{why}.")
    ran_twin = [n for n in TWIN_STAGES if _ran_twin(states[n])]
    if ran_twin and not real_weights:
        size = f" ({fmt.params(twin.get('parameters'))} parameters" if twin else " ("
        weights = "seeded weights)" if (twin or {}).get("weights_source") != "real" else "real)"
        items.append(
            "The full-size weights were never run: "
            + ", ".join(f"`{n}`" for n in ran_twin)
            + f" ran a scaled twin{size}, {weights} with the release's structure; its speed, "
            "memory and errors are the twin's, not the full model's."
        )
    if configuration.get("available"):
        items.append(_multi_device(configuration, distributed))
        if distributed.get("ep_note"):
            items.append(
                f"Expert parallelism was not validated on the twin: {_ep_why(distributed)}."
            )
        validated = {row["dtype"] for row in precision.get("dtypes") or []}
        dtype = configuration.get("dtype")
        serving = _serving_dtype(str(dtype or ""), str(configuration.get("dtype_label") or ""))
        if dtype and serving not in validated:
            items.append(
                f"The serving dtype {text(configuration.get('dtype_label') or dtype)} was not "
                "checked by `precision` (checked: "
                + (", ".join(sorted(validated)) or "none")
                + ")."
            )
        if not performance.get("available") or performance.get("predicted") is None:
            items.append("No full-size speed was predicted for the recommended batch.")
        else:
            items.append(
                "Full-size speed is predicted by the plan's roofline, never measured here."
            )
        context = configuration.get("context_tokens")
        prompt_lens = performance.get("prompt_lens") or []
        if context and prompt_lens and max(prompt_lens) < context:
            items.append(
                f"Prompts up to {max(prompt_lens):,} tokens were measured; the planned context "
                f"of {context:,} tokens was not exercised."
            )
    for dtype, why in (precision.get("skipped_dtypes") or {}).items():
        why_text = text(first_line(why, 200))
        items.append(f"Precision in {code(dtype)} was not checked: {why_text}.")
    for dtype, why in (performance.get("skipped_dtypes") or {}).items():
        why_text = text(first_line(why, 200))
        items.append(f"Performance in {code(dtype)} was not measured: {why_text}.")
    if stability.get("available") and fmt.finite(stability.get("duration_s")) is not None:
        items.append(
            f"Stability ran for {fmt.seconds(stability['duration_s'])} on the twin, not for hours "
            "at full size under production traffic."
        )
    return items


_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn"}


def _serving_dtype(dtype: str, label: str) -> str:
    """The plan's serving dtype as the precision stage names dtypes (torch names): "fp8" →
    "float8_e4m3fn"; "checkpoint" reads the checkpoint's own from the label ("checkpoint
    (bf16)" → "bfloat16"; a quantized format such as mxfp4 stays as it is)."""
    if dtype == "checkpoint" and "(" in label:
        dtype = label.partition("(")[2].rsplit(")", 1)[0].strip()
    dtype = dtype.lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(dtype, dtype)


# --- the document -----------------------------------------------------------------------------


def _md_release(section: Mapping[str, Any]) -> list[str]:
    out = [f"# Release notes: {text(section['repo_id'])} on pool {text(section['pool'])}", ""]
    out.append(f"Revision {code(section['revision'])}.")
    if section.get("architecture"):
        facts = [
            f"{code(section['architecture'])} ({text(section.get('family') or '?')})",
            f"{fmt.params(section.get('total_params'))} parameters "
            f"({fmt.params(section.get('active_params'))} active per token)",
        ]
        if section.get("attention"):
            facts.append(f"{text(section['attention'])} attention")
        if section.get("experts"):
            experts = section["experts"]
            facts.append(
                f"MoE, {fmt.count(experts.get('routed'))} routed experts, "
                f"{fmt.count(experts.get('per_token'))} per token"
            )
        if section.get("max_context_tokens"):
            facts.append(f"max context {fmt.count(section['max_context_tokens'])} tokens")
        if section.get("quantization"):
            facts.append(f"checkpoint quantized as {text(section['quantization'])}")
        facts.append(f"weights {fmt.gib(section.get('weight_bytes'))}")
        if section.get("mtp_layers"):
            facts.append(f"{section['mtp_layers']} MTP module(s)")
        out += ["", "; ".join(facts) + "."]
        if section.get("new_against_known"):
            out += ["", "New against the families seen before:", ""]
            out += [f"- {text(item)}" for item in section["new_against_known"]]
    out += [
        "",
        f"> Figures labelled *{MEASURED_TWIN}* were measured on a scaled twin of the release "
        "(its structure at a small size), never on the full model; figures labelled "
        f"*{PREDICTED_FULL}* are the plan's roofline for the full model on the pool's "
        "accelerators.",
    ]
    return out


def _unavailable(lead: str, stage: str, section: Mapping[str, Any]) -> str:
    """The sentence of a section whose stage gave nothing to write from: "Not checked: the
    precision stage failed: <reason>."."""
    reason = f": {text(section['reason'])}" if section.get("reason") else ""
    return f"{lead}: the {stage} stage {text(section.get('status'))}{reason}."


def _md_configuration(config: Mapping[str, Any]) -> list[str]:
    out = ["", "## Configuration", ""]
    if not config.get("available"):
        out.append(_unavailable("No serving configuration", "plan", config))
        suggestions = config.get("suggestions") or {}
        if suggestions:
            out += ["", "What would fit:", ""]
            if suggestions.get("devices"):
                out.append(f"- {fmt.count(suggestions['devices'])} devices")
            if suggestions.get("context_tokens"):
                out.append(f"- a context of {fmt.count(suggestions['context_tokens'])} tokens")
            if suggestions.get("dtype"):
                out.append(f"- serving dtype {code(suggestions['dtype'])}")
        return out
    split = config.get("split") or {}
    layout = config.get("pool_layout") or {}
    accelerator = config.get("accelerator_name") or config.get("accelerator") or "?"
    memory = config.get("memory_per_device_bytes") or {}
    rows = [
        [
            "Recommended pool",
            f"{code(config['pool'])}: {text(accelerator)}"
            + (
                f", {fmt.count(layout.get('devices_per_node'))} per node x "
                f"{fmt.count(layout.get('nodes'))} node(s)"
                if layout
                else ""
            ),
        ],
        [
            "Parallel split",
            f"TP {split.get('tp')} · PP {split.get('pp')} · EP {split.get('ep')} · "
            f"DP {split.get('dp')} on {fmt.count(config.get('devices'))} device(s), "
            f"{fmt.count(config.get('nodes'))} node(s)",
        ],
        ["Serving dtype", text(config.get("dtype_label") or config.get("dtype"))],
        ["Context", f"{fmt.count(config.get('context_tokens'))} tokens per sequence"],
        [
            "Max concurrency",
            f"{fmt.count(config.get('max_concurrency'))} sequences at the full context "
            f"(sized for {fmt.count(config.get('concurrency'))})",
        ],
        [
            "Memory per device",
            f"{fmt.gib(memory.get('total_used'))} of {fmt.gib(memory.get('capacity'))}: weights "
            f"{fmt.gib(memory.get('weights'))}, KV cache {fmt.gib(memory.get('kv_cache'))}, "
            f"activations {fmt.gib(memory.get('activations_workspace'))}, runtime "
            f"{fmt.gib(memory.get('runtime_overhead'))}",
        ],
    ]
    out.append(_table(["Setting", "Value"], rows))
    launch = config.get("launch") or {}
    if launch:
        out += ["", "### Launch commands", ""]
        for engine, title in (("vllm", "vLLM"), ("sglang", "SGLang")):
            if engine in launch:
                out += [f"{title}:", "", code_block(launch[engine], "sh"), ""]
        out += [f"- {text(note)}" for note in config.get("launch_notes") or []]
        if out[-1] == "":
            out.pop()
    flags = [*config.get("validity_flags", []), *config.get("notes", [])]
    if flags:
        out += ["", "Plan notes:", ""] + [f"- {text(flag)}" for flag in flags]
    return out


def _md_distributed(dist: Mapping[str, Any]) -> list[str]:
    out = ["", "## Multi-device validation", ""]
    planned = _split_text(dist.get("plan_split"))
    not_run = (
        f" The plan's split ({planned}) was not run across processes."
        if dist.get("plan_split")
        else ""
    )
    if not dist.get("available"):
        status = dist.get("status")
        out.append(
            (
                "Not run: this job has no distributed stage"
                if status == _NOT_RUN
                else f"Not run: the distributed stage {text(status)}"
                + (f": {text(dist['reason']).rstrip(':; ')}" if dist.get("reason") else "")
            )
            + f".{not_run}"
        )
        return out
    if not dist.get("validated"):
        out.append(
            f"**Not validated** here: {text(dist.get('reason') or 'no reason given').rstrip('.')}."
            f"{not_run}"
        )
        return out
    split = dist["split"]
    ran = _validated_text(split)
    label = dist["label"]
    where = (
        f"{ran} across {fmt.count(split.get('processes'))} processes "
        f"({code(split.get('backend') or '?')} on {code(split.get('device_type') or '?')})"
    )
    if dist["passed"]:
        out.append(
            f"**Passed**: the twin split {where} matches the single-process float32 reference "
            f"on every rank; {label}."
        )
    else:
        reason = text(dist.get("reason") or "the run failed").rstrip(".:; ")
        out.append(f"**Failed**: {reason}.")
    if dist.get("degree_reason"):
        degree = text(dist["degree_reason"]).rstrip(".")
        out += ["", f"Against the plan's split {planned}: {degree}."]
    rows = [
        ["Validated split", where],
        ["Plan's split", planned],
    ]
    if dist.get("failed_rank") is not None:
        status = dist.get("failed_rank_status") or fmt.exit_status(None)
        rows.append(["Failed rank", f"rank {dist['failed_rank']} {status}"])
    tp = split.get("tp")
    if fmt.finite(dist.get("max_abs_error")) is not None:
        rows.append(
            [
                "Max \\|logit error\\| (worst rank)",
                f"{fmt.scientific(dist['max_abs_error'])} "
                f"(tolerance {fmt.scientific(dist.get('tolerance'))})",
            ]
        )
    if fmt.finite(dist.get("top1_agreement")) is not None:
        rows.append(["Top-1 agreement (worst rank)", fmt.percent(dist["top1_agreement"])])
    for key, rate, name in (
        ("step_time_s", "tokens_per_s", f"TP={tp}"),
        ("step_time_tp1_s", "tokens_per_s_tp1", "TP=1"),
    ):
        if fmt.finite(dist.get(key)) is not None:
            rows.append(
                [
                    f"Decode step, {name}",
                    f"{fmt.ms(dist[key])} ({fmt.rate(dist.get(rate))} tokens/s), {label}",
                ]
            )
    if fmt.finite(dist.get("comm_fraction")) is not None:
        rows.append(["Time in collectives", f"{fmt.percent(dist['comm_fraction'])}, {label}"])
    if fmt.finite(dist.get("scaling_efficiency")) is not None:
        rows.append(
            [
                "Scaling efficiency",
                f"{fmt.sig(dist['scaling_efficiency'])} (TP=1 step / ({tp} x TP={tp} step); "
                f"1 = linear), {label}",
            ]
        )
    out += ["", _table(["Figure", "Value"], rows)]
    step, step_tp1 = fmt.finite(dist.get("step_time_s")), fmt.finite(dist.get("step_time_tp1_s"))
    if split.get("device_type") == "cpu" and step and step_tp1 and step > step_tp1:
        out += [
            "",
            f"On a CPU host the twin's TP={tp} step is slower than its TP=1 step: a model this "
            "small spends its step in per-step framework and gloo overhead, not in the work "
            "the split divides. That is the honest reading of these figures, not the full "
            "model's scaling on the pool's accelerators.",
        ]
    if dist.get("ep_note"):
        out += ["", f"Expert parallelism was not validated: {_ep_why(dist)}."]
    return out


def _md_performance(perf: Mapping[str, Any]) -> list[str]:
    out = ["", "## Performance recommendations", ""]
    if not perf.get("available"):
        out.append(_unavailable("No recommendation", "performance", perf))
        return out
    measured = perf["measured"]
    knee_word = "knee" if measured.get("found") else "largest measured batch (no knee found)"
    cap = perf.get("capped_by_plan")
    curve = (
        f"the {knee_word} of the {code(measured.get('dtype'))} curve at prompt length "
        f"{fmt.count(measured.get('prompt_len'))}"
    )
    if cap:
        out.append(
            f"Recommended batch size: **{fmt.count(cap['sequences'])}** sequences, the most the "
            f"plan fits at its context of {fmt.count(cap.get('context_tokens'))} tokens; on the "
            f"twin, {curve} is at {fmt.count(perf['knee_batch_size'])} (a twin's memory is "
            "not the release's)."
        )
    else:
        out.append(
            f"Recommended batch size: **{fmt.count(perf['knee_batch_size'])}** sequences, {curve}."
        )
    if perf.get("knee_rule"):
        out += ["", text(perf["knee_rule"]) + ("" if perf["knee_rule"].endswith(".") else ".")]
    rows = [
        [
            f"**{measured['label']}**",
            fmt.count(measured.get("batch_size")),
            fmt.ms(measured.get("tpot_s")),
            fmt.rate(measured.get("decode_tokens_per_s")),
            f"{text(measured.get('model'))} on {code(measured.get('device') or '?')}, "
            f"{code(measured.get('dtype'))}",
        ]
    ]
    predicted = perf.get("predicted")
    if predicted:
        rows.append(
            [
                f"**{predicted['label']}**",
                fmt.count(predicted.get("batch_size")),
                fmt.ms(predicted.get("tpot_s")),
                fmt.rate(predicted.get("decode_tokens_per_s")),
                f"roofline on {text(predicted.get('accelerator') or '?')}, "
                f"{text(predicted.get('dtype'))}, "
                f"context {fmt.count(predicted.get('context_tokens'))}",
            ]
        )
        calibrated = predicted.get("calibrated")
        if calibrated:
            rows.append(
                [
                    f"**{calibrated['label']}**",
                    fmt.count(predicted.get("batch_size")),
                    fmt.ms(calibrated.get("tpot_s")),
                    fmt.rate(calibrated.get("decode_tokens_per_s")),
                    "the roofline x the pool's measured efficiency",
                ]
            )
    out += [
        "",
        f"At batch {fmt.count(perf['knee_batch_size'])}:",
        "",
        _table(["Figure", "Batch", "TPOT", "Decode tokens/s", "Basis"], rows),
    ]
    if not predicted:
        out += ["", f"No full-size prediction: {text(perf.get('predicted_reason') or '?')}."]
    largest = perf.get("largest_batch")
    if largest:
        out += [
            "",
            f"Largest batch that fits, {largest['label']}: "
            f"{fmt.count(largest.get('concurrent_sequences'))} sequences, TPOT "
            f"{fmt.ms(largest.get('tpot_s'))}, "
            f"{fmt.rate(largest.get('decode_tokens_per_s'))} decode tokens/s.",
        ]
    if len(perf.get("by_dtype") or []) > 1:
        out += ["", f"Knee per dtype, {measured['label']}:", ""]
        out.append(
            _table(
                ["dtype", "Prompt", "Batch", "TPOT", "Decode tokens/s"],
                [
                    [
                        code(row.get("dtype")),
                        fmt.count(row.get("prompt_len")),
                        fmt.count(row.get("batch_size")) + ("" if row.get("found") else " (end)"),
                        fmt.ms(row.get("tpot_s")),
                        fmt.rate(row.get("decode_tokens_per_s")),
                    ]
                    for row in perf["by_dtype"]
                ],
            )
        )
    if perf.get("stopped"):
        out += ["", "Sweeps stopped early:", ""] + [f"- {text(s)}" for s in perf["stopped"]]
    return out


def _md_precision(precision: Mapping[str, Any]) -> list[str]:
    out = ["", "## Precision", ""]
    if not precision.get("available"):
        out.append(_unavailable("Not checked", "precision", precision))
        return out
    reference = precision.get("reference") or {}
    verdict = "Every dtype passed" if precision["passed"] else "**At least one dtype failed**"
    out.append(
        f"{verdict}: the twin on {code(precision.get('target_device') or '?')} against "
        f"{code(reference.get('dtype') or 'float32')} on {code(reference.get('device') or 'cpu')}; "
        f"{MEASURED_TWIN}."
    )
    out += [
        "",
        _table(
            ["dtype", "Verdict", "Top-1 agreement", "Max abs error", "Cosine", "KL (nats)"],
            [
                [
                    code(row["dtype"]),
                    "passed" if row["passed"] else "**failed**",
                    fmt.percent(row.get("top1_agreement")),
                    fmt.sig(row.get("max_abs_error")),
                    fmt.sig(row.get("cosine_similarity"), 6),
                    fmt.sig(row.get("kl_divergence")),
                ]
                for row in precision["dtypes"]
            ],
        ),
    ]
    failed = [row for row in precision["dtypes"] if not row["passed"]]
    if failed:
        out += [""] + [f"- {text(row['reason'])}" for row in failed]
    return out


def _md_operators(operators: Mapping[str, Any]) -> list[str]:
    out = ["", "## Operator coverage", ""]
    if not operators.get("available"):
        out.append(_unavailable("Not checked", "operators", operators))
        return out
    counts = operators["counts"]
    out.append(
        f"{fmt.count(counts.get('covered'))} covered, {fmt.count(counts.get('missing'))} missing, "
        f"{fmt.count(counts.get('fallback'))} through a fallback, checked against "
        f"{text(operators.get('checked_against') or '?')} on "
        f"{code(operators.get('device') or '?')}; {MEASURED_TWIN}."
    )
    if operators.get("missing"):
        out.append("")
    for op in operators.get("missing") or []:
        dtypes = f" for {text(', '.join(op['missing_dtypes']))}" if op["missing_dtypes"] else ""
        need = f" (needed by {text(op['feature'])})" if op["feature"] else ""
        out.append(f"- missing: {code(op['name'])}{dtypes}{need}")
    return out


def _md_stability(stability: Mapping[str, Any]) -> list[str]:
    out = ["", "## Stability", ""]
    if not stability.get("available"):
        out.append(_unavailable("Not run", "stability", stability))
        return out
    verdict = "Passed" if stability["passed"] else "Failed"
    slope = fmt.finite(stability.get("memory_slope_bytes_per_step"))
    drift = fmt.finite(stability.get("step_time_drift"))
    out.append(
        f"**{verdict}**: {text(stability.get('reason') or '')}"
        + ("" if str(stability.get("reason") or "").endswith(".") else ".")
    )
    out += [
        "",
        f"{fmt.count(stability.get('steps'))} steps in "
        f"{fmt.seconds(stability.get('duration_s'))} on "
        f"{code(stability.get('device') or '?')} in {code(stability.get('dtype') or '?')}, "
        f"{MEASURED_TWIN}: memory slope "
        + ("—" if slope is None else f"{slope:,.0f} bytes/step")
        + ", step-time drift "
        + ("—" if drift is None else f"{drift:+.1%}")
        + f", {fmt.count(stability.get('nonfinite_outputs'))} NaN/Inf outputs, "
        f"{fmt.count(stability.get('errors'))} exceptions.",
    ]
    return out


def _md_limitations(limitations: Sequence[Mapping[str, Any]]) -> list[str]:
    out = ["", "## Known limitations", ""]
    if not limitations:
        out.append("No open known limitation.")
        return out
    for severity in [*SEVERITY_ORDER, None]:
        group = [
            item
            for item in limitations
            if (item["severity"] == severity)
            or (severity is None and item["severity"] not in SEVERITY_ORDER)
        ]
        if not group:
            continue
        title = SEVERITY_TITLES.get(severity or "", "Other")
        out += [f"### {title}", ""]
        for item in group:
            where = "every pool" if not item.get("pool") else f"pool {text(item['pool'])}"
            raised = f"raised by `{item['stage']}`" if item.get("stage") else "added by a person"
            out.append(f"- **{text(item['title'])}** ({where}; {raised})")
            if item["body"].strip():
                out += ["", _indent(item["body"].strip()), ""]
        if out[-1] != "":
            out.append("")
    while out and out[-1] == "":
        out.pop()
    return out


def _md_not_validated(items: Sequence[str]) -> list[str]:
    out = ["", "## What was not validated", ""]
    out += [f"- {item}" for item in items] or ["Nothing left out."]
    return out


def build_release_notes(
    *,
    release: Any,
    pool: Any,
    results: Mapping[str, Mapping[str, Any]],
    limitations: Sequence[Mapping[str, Any]] = (),
    states: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The release notes of `release` (a `ReleaseRef`: `repo_id`, `revision`) on `pool` (a
    `PoolSpec`) from the earlier stages' `results` (succeeded ones, by stage name), the
    open `limitations` (plain dicts: title, body, severity, status, stage, pool name or None
    for every pool) and, where known, every stage's `states` (see `stage_states`).

    Returns {"format": `NOTES_FORMAT`, "markdown": the document, "sections": {"summary",
    "release", "configuration", "distributed", "performance", "precision", "operators",
    "stability", "limitations", "not_validated", "stages" ([{"name", "status", "reason"}])},
    "summary": one line}."""
    by_stage = stage_states(results, states)
    twin, real_weights = _twin_description(by_stage)
    analysis = by_stage["analyze"].result if by_stage["analyze"].succeeded else None
    release_section = _release_section(release, pool, analysis)
    configuration = _configuration(pool, by_stage["plan"])
    distributed = _distributed(by_stage["distributed"], configuration)
    performance = _performance(by_stage["performance"], by_stage["plan"], twin)
    precision = _precision(by_stage["precision"])
    operators = _operators(by_stage["operators"])
    stability = _stability(by_stage["stability"])
    open_limitations = _limitations(limitations)
    not_validated = _not_validated(
        by_stage,
        configuration,
        distributed,
        performance,
        precision,
        stability,
        twin,
        real_weights,
    )
    lines = [
        *_md_release(release_section),
        *_md_configuration(configuration),
        *_md_distributed(distributed),
        *_md_performance(performance),
        *_md_precision(precision),
        *_md_operators(operators),
        *_md_stability(stability),
        *_md_limitations(open_limitations),
        *_md_not_validated(not_validated),
    ]
    summary = _summary(
        configuration, distributed, performance, precision, stability, open_limitations
    )
    sections = {
        "summary": summary,
        "release": release_section,
        "configuration": configuration,
        "distributed": distributed,
        "performance": performance,
        "precision": precision,
        "operators": operators,
        "stability": stability,
        "limitations": open_limitations,
        "not_validated": not_validated,
        "stages": [
            {"name": s.name, "status": s.status, "reason": s.reason} for s in by_stage.values()
        ],
    }
    return {
        "format": NOTES_FORMAT,
        "markdown": "\n".join(lines).strip() + "\n",
        "sections": sections,
        "summary": summary,
    }


def _summary(
    configuration: Mapping[str, Any],
    distributed: Mapping[str, Any],
    performance: Mapping[str, Any],
    precision: Mapping[str, Any],
    stability: Mapping[str, Any],
    limitations: Sequence[Mapping[str, Any]],
) -> str:
    """One line: split and dtype (or why none), knee, precision, multi-device and stability
    verdicts, and the count of open limitations."""
    parts = []
    if configuration.get("available"):
        split = configuration["split"]
        parts.append(
            f"TP{split.get('tp')}/PP{split.get('pp')}/EP{split.get('ep')}/DP{split.get('dp')} "
            f"on {configuration.get('devices')} device(s), {configuration.get('dtype_label')}"
        )
    else:
        parts.append("no fitting plan")
    if performance.get("available"):
        parts.append(f"knee batch {performance['knee_batch_size']} ({MEASURED_TWIN})")
        if performance.get("capped_by_plan"):
            parts.append(f"recommended batch {performance['recommended_batch_size']} (plan's fit)")
    if precision.get("available"):
        parts.append("precision " + ("passed" if precision["passed"] else "failed"))
    if distributed.get("validated"):
        split = distributed["split"]
        ran = f"TP={split.get('tp')}" + (
            f" EP={split['ep']}" if isinstance(split.get("ep"), int) and split["ep"] > 1 else ""
        )
        parts.append(f"multi-device {ran} {distributed['verdict']}")
    elif distributed.get("available"):
        parts.append("multi-device not validated")
    if stability.get("available"):
        parts.append("stability " + stability["verdict"])
    parts.append(f"{len(limitations)} open limitation(s)")
    return "; ".join(parts)


def run(ctx: StageContext) -> dict[str, Any]:
    """Write the release notes from `ctx.previous` (every earlier stage succeeded, or this
    stage would have been skipped; a stage the job does not have is "not run") and the
    release's open known limitations on the pool (`ctx.limitations`)."""
    notes = build_release_notes(
        release=ctx.release,
        pool=ctx.pool,
        results=ctx.previous,
        limitations=ctx.limitations,
    )
    ctx.log(f"release notes: {notes['summary']}")
    return notes
