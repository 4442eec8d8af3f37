"""The `release_notes` stage: what users of a release need to deploy it on a pool, written
from the earlier stages' results.

The notes are one Markdown document (`markdown`) and the same content as data (`sections`):

- **configuration**: the recommended pool (the job's), the plan's TP/PP/EP/DP split, serving
  dtype, context, concurrency (sized for, and the largest batch that fits), memory per
  device, and the plan's vLLM and SGLang launch commands copied as the plan wrote them; a
  plan that fits nothing says why and what would fit.
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
  one device, short prompts and a short stability run leave unproven.

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

from workers.stages.base import StageContext

NOTES_FORMAT = 1
# The stages whose results the notes read, in job order.
READS = ("fetch", "analyze", "operators", "precision", "plan", "performance", "stability")
# The stages whose figures come from a scaled twin (unless run on the release's real weights).
TWIN_STAGES = ("operators", "precision", "performance", "stability")
SEVERITY_ORDER = ("blocker", "major", "minor", "info")
SEVERITY_TITLES = {"blocker": "Blocker", "major": "Major", "minor": "Minor", "info": "Info"}

# How each figure is labelled, in the document and in `sections`.
MEASURED_TWIN = "measured (twin)"
MEASURED_FULL = "measured (full-size, real weights)"
PREDICTED_FULL = "predicted (full-size)"
CALIBRATED_FULL = "calibrated prediction (full-size)"

GIB = 2**30
_NOT_RUN = "not run"


# --- formatting -------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    """`value` as a float when it is a finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if number == number and abs(number) != float("inf") else None


def _count(value: Any) -> str:
    number = _number(value)
    return "—" if number is None else f"{round(number):,}"


def _gib(value: Any) -> str:
    number = _number(value)
    if number is None:
        return "—"
    size = number / GIB
    return f"{size:.3f} GiB" if 0 < abs(size) < 1 else f"{size:,.1f} GiB"


def _params(value: Any) -> str:
    number = _number(value)
    if number is None:
        return "—"
    if abs(number) >= 1e9:
        return f"{number / 1e9:,.2f} B" if abs(number) < 1e10 else f"{number / 1e9:,.1f} B"
    if abs(number) >= 1e6:
        return f"{number / 1e6:,.1f} M"
    return f"{number:,.0f}"


def _ms(seconds: Any) -> str:
    number = _number(seconds)
    if number is None:
        return "—"
    millis = number * 1000
    return f"{millis:,.3g} ms" if millis < 100 else f"{millis:,.0f} ms"


def _rate(value: Any) -> str:
    number = _number(value)
    if number is None:
        return "—"
    return f"{number:,.3g}" if number < 100 else f"{number:,.0f}"


def _sig(value: Any, digits: int = 3) -> str:
    number = _number(value)
    return "—" if number is None else f"{number:.{digits}g}"


def _percent(value: Any) -> str:
    number = _number(value)
    return "—" if number is None else f"{number * 100:.1f} %"


def _seconds(value: Any) -> str:
    number = _number(value)
    return "—" if number is None else f"{number:,.1f} s"


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


def _twin_description(states: Mapping[str, StageState]) -> tuple[Mapping[str, Any] | None, bool]:
    """(the twin description of the first twin stage that kept one, whether every twin stage
    that ran did so on the release's real weights at full size)."""
    described = [
        s.result["twin"]
        for name in TWIN_STAGES
        if (s := states[name]).result and isinstance(s.result.get("twin"), Mapping)
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
                "new_against_known": [
                    f"{item.get('aspect')}: {item.get('detail')}"
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
        "max_concurrency": predicted.get("largest_batch_sequences"),
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
            and _number(point.get("tpot_s")) is not None
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
            if _number(at.get("calibrated_tpot_s")) is not None:
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
    return {
        "available": True,
        "knee_batch_size": batch,
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


def _not_validated(
    states: Mapping[str, StageState],
    configuration: Mapping[str, Any],
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
            why = f": {text(state.reason)}" if state.reason else ""
            items.append(f"`{name}`: {text(state.status)}{why}.")
    ran_twin = [n for n in TWIN_STAGES if states[n].result is not None]
    if ran_twin and not real_weights:
        size = f" ({_params(twin.get('parameters'))} parameters" if twin else " ("
        weights = "seeded weights)" if (twin or {}).get("weights_source") != "real" else "real)"
        items.append(
            "The full-size weights were never run: "
            + ", ".join(f"`{n}`" for n in ran_twin)
            + f" ran a scaled twin{size}, {weights} with the release's structure; its speed, "
            "memory and errors are the twin's, not the full model's."
        )
    if configuration.get("available"):
        devices = configuration.get("devices") or 1
        if devices > 1:
            split = configuration.get("split") or {}
            items.append(
                f"Multi-device serving was not run: the split TP {split.get('tp')} x PP "
                f"{split.get('pp')} x EP {split.get('ep')} x DP {split.get('dp')} on "
                f"{devices} devices, its communication and scaling are predicted only."
            )
        else:
            items.append("Serving on more than one device was not validated.")
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
    if stability.get("available") and _number(stability.get("duration_s")) is not None:
        items.append(
            f"Stability ran for {_seconds(stability['duration_s'])} on the twin, not for hours "
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
            f"{_params(section.get('total_params'))} parameters "
            f"({_params(section.get('active_params'))} active per token)",
        ]
        if section.get("attention"):
            facts.append(f"{text(section['attention'])} attention")
        if section.get("experts"):
            experts = section["experts"]
            facts.append(
                f"MoE, {_count(experts.get('routed'))} routed experts, "
                f"{_count(experts.get('per_token'))} per token"
            )
        if section.get("max_context_tokens"):
            facts.append(f"max context {_count(section['max_context_tokens'])} tokens")
        if section.get("quantization"):
            facts.append(f"checkpoint quantized as {text(section['quantization'])}")
        facts.append(f"weights {_gib(section.get('weight_bytes'))}")
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


def _md_configuration(config: Mapping[str, Any]) -> list[str]:
    out = ["", "## Configuration", ""]
    if not config.get("available"):
        out.append(
            f"No serving configuration: the plan stage {text(config.get('status'))}"
            + (f": {text(config['reason'])}" if config.get("reason") else "")
            + "."
        )
        suggestions = config.get("suggestions") or {}
        if suggestions:
            out += ["", "What would fit:", ""]
            if suggestions.get("devices"):
                out.append(f"- {_count(suggestions['devices'])} devices")
            if suggestions.get("context_tokens"):
                out.append(f"- a context of {_count(suggestions['context_tokens'])} tokens")
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
                f", {_count(layout.get('devices_per_node'))} per node x "
                f"{_count(layout.get('nodes'))} node(s)"
                if layout
                else ""
            ),
        ],
        [
            "Parallel split",
            f"TP {split.get('tp')} · PP {split.get('pp')} · EP {split.get('ep')} · "
            f"DP {split.get('dp')} on {_count(config.get('devices'))} device(s), "
            f"{_count(config.get('nodes'))} node(s)",
        ],
        ["Serving dtype", text(config.get("dtype_label") or config.get("dtype"))],
        ["Context", f"{_count(config.get('context_tokens'))} tokens per sequence"],
        [
            "Max concurrency",
            f"{_count(config.get('max_concurrency'))} sequences at the full context "
            f"(sized for {_count(config.get('concurrency'))})",
        ],
        [
            "Memory per device",
            f"{_gib(memory.get('total_used'))} of {_gib(memory.get('capacity'))}: weights "
            f"{_gib(memory.get('weights'))}, KV cache {_gib(memory.get('kv_cache'))}, "
            f"activations {_gib(memory.get('activations_workspace'))}, runtime "
            f"{_gib(memory.get('runtime_overhead'))}",
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


def _md_performance(perf: Mapping[str, Any]) -> list[str]:
    out = ["", "## Performance recommendations", ""]
    if not perf.get("available"):
        out.append(
            f"No recommendation: the performance stage {text(perf.get('status'))}"
            + (f": {text(perf['reason'])}" if perf.get("reason") else "")
            + "."
        )
        return out
    measured = perf["measured"]
    knee_word = "knee" if measured.get("found") else "largest measured batch (no knee found)"
    out.append(
        f"Recommended batch size: **{_count(perf['knee_batch_size'])}** sequences, the "
        f"{knee_word} of the {code(measured.get('dtype'))} curve at prompt length "
        f"{_count(measured.get('prompt_len'))}."
    )
    if perf.get("knee_rule"):
        out += ["", text(perf["knee_rule"]) + ("" if perf["knee_rule"].endswith(".") else ".")]
    rows = [
        [
            f"**{measured['label']}**",
            _count(measured.get("batch_size")),
            _ms(measured.get("tpot_s")),
            _rate(measured.get("decode_tokens_per_s")),
            f"{text(measured.get('model'))} on {code(measured.get('device') or '?')}, "
            f"{code(measured.get('dtype'))}",
        ]
    ]
    predicted = perf.get("predicted")
    if predicted:
        rows.append(
            [
                f"**{predicted['label']}**",
                _count(predicted.get("batch_size")),
                _ms(predicted.get("tpot_s")),
                _rate(predicted.get("decode_tokens_per_s")),
                f"roofline on {text(predicted.get('accelerator') or '?')}, "
                f"{text(predicted.get('dtype'))}, "
                f"context {_count(predicted.get('context_tokens'))}",
            ]
        )
        calibrated = predicted.get("calibrated")
        if calibrated:
            rows.append(
                [
                    f"**{calibrated['label']}**",
                    _count(predicted.get("batch_size")),
                    _ms(calibrated.get("tpot_s")),
                    _rate(calibrated.get("decode_tokens_per_s")),
                    "the roofline x the pool's measured efficiency",
                ]
            )
    out += [
        "",
        f"At batch {_count(perf['knee_batch_size'])}:",
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
            f"{_count(largest.get('concurrent_sequences'))} sequences, TPOT "
            f"{_ms(largest.get('tpot_s'))}, {_rate(largest.get('decode_tokens_per_s'))} decode "
            "tokens/s.",
        ]
    if len(perf.get("by_dtype") or []) > 1:
        out += ["", f"Knee per dtype, {measured['label']}:", ""]
        out.append(
            _table(
                ["dtype", "Prompt", "Batch", "TPOT", "Decode tokens/s"],
                [
                    [
                        code(row.get("dtype")),
                        _count(row.get("prompt_len")),
                        _count(row.get("batch_size")) + ("" if row.get("found") else " (end)"),
                        _ms(row.get("tpot_s")),
                        _rate(row.get("decode_tokens_per_s")),
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
        out.append(
            f"Not checked: the precision stage {text(precision.get('status'))}"
            + (f": {text(precision['reason'])}" if precision.get("reason") else "")
            + "."
        )
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
                    _percent(row.get("top1_agreement")),
                    _sig(row.get("max_abs_error")),
                    _sig(row.get("cosine_similarity"), 6),
                    _sig(row.get("kl_divergence")),
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
        out.append(
            f"Not checked: the operators stage {text(operators.get('status'))}"
            + (f": {text(operators['reason'])}" if operators.get("reason") else "")
            + "."
        )
        return out
    counts = operators["counts"]
    out.append(
        f"{_count(counts.get('covered'))} covered, {_count(counts.get('missing'))} missing, "
        f"{_count(counts.get('fallback'))} through a fallback, checked against "
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
        out.append(
            f"Not run: the stability stage {text(stability.get('status'))}"
            + (f": {text(stability['reason'])}" if stability.get("reason") else "")
            + "."
        )
        return out
    verdict = "Passed" if stability["passed"] else "Failed"
    slope = _number(stability.get("memory_slope_bytes_per_step"))
    drift = _number(stability.get("step_time_drift"))
    out.append(
        f"**{verdict}**: {text(stability.get('reason') or '')}"
        + ("" if str(stability.get("reason") or "").endswith(".") else ".")
    )
    out += [
        "",
        f"{_count(stability.get('steps'))} steps in {_seconds(stability.get('duration_s'))} on "
        f"{code(stability.get('device') or '?')} in {code(stability.get('dtype') or '?')}, "
        f"{MEASURED_TWIN}: memory slope "
        + ("—" if slope is None else f"{slope:,.0f} bytes/step")
        + ", step-time drift "
        + ("—" if drift is None else f"{drift:+.1%}")
        + f", {_count(stability.get('nonfinite_outputs'))} NaN/Inf outputs, "
        f"{_count(stability.get('errors'))} exceptions.",
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
    "release",
    "configuration", "performance", "precision", "operators", "stability", "limitations",
    "not_validated", "stages" ([{"name", "status", "reason"}])}, "summary": one line}."""
    by_stage = stage_states(results, states)
    twin, real_weights = _twin_description(by_stage)
    analysis = by_stage["analyze"].result if by_stage["analyze"].succeeded else None
    release_section = _release_section(release, pool, analysis)
    configuration = _configuration(pool, by_stage["plan"])
    performance = _performance(by_stage["performance"], by_stage["plan"], twin)
    precision = _precision(by_stage["precision"])
    operators = _operators(by_stage["operators"])
    stability = _stability(by_stage["stability"])
    open_limitations = _limitations(limitations)
    not_validated = _not_validated(
        by_stage, configuration, performance, precision, stability, twin, real_weights
    )
    lines = [
        *_md_release(release_section),
        *_md_configuration(configuration),
        *_md_performance(performance),
        *_md_precision(precision),
        *_md_operators(operators),
        *_md_stability(stability),
        *_md_limitations(open_limitations),
        *_md_not_validated(not_validated),
    ]
    summary = _summary(configuration, performance, precision, stability, open_limitations)
    sections = {
        "summary": summary,
        "release": release_section,
        "configuration": configuration,
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
    performance: Mapping[str, Any],
    precision: Mapping[str, Any],
    stability: Mapping[str, Any],
    limitations: Sequence[Mapping[str, Any]],
) -> str:
    """One line: split and dtype (or why none), knee, precision and stability verdicts, and
    the count of open limitations."""
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
    if precision.get("available"):
        parts.append("precision " + ("passed" if precision["passed"] else "failed"))
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
