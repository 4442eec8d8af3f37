"""The release notes' full-size figures (`sections["full_size"]`): what the serve stage measured
on the pool's engine serving the full-size model with dummy weights, beside what the plan
predicted for the same workloads and the fit it named
(`templates/release_notes/full_size.md` words them).

Two labels, never mixed: `MEASURED_ENGINE_FULL` for the serve result's `full_size`
(docs/stages/serve.md, "Full size": random weights from the config, `--load-format dummy`,
so speed, memory and scheduling at full size, nothing of precision) and `PREDICTED_FULL` for
the plan's step-time model (`predicted.workload`, `predicted.fit`; or the prediction the
serve stage kept beside its measurement, `full_size.predicted_before`, made before it
measured). The release_notes stage builds it (not a stage's own `notes` module) because it
reads two stages: the serve stage's measurement and the plan's prediction.

The section: {"status": "measured" | "skipped" | "failed" | "none" (the serve stage left
no full-size run), "reason" (the skip or failure code, None when measured), "label",
"engine_name", "engine_version", "load_format", "tp", "dtype", "load_s" (s),
"peak_memory_bytes", "model" ({"architecture", "num_hidden_layers", "hidden_size",
"parameters"} or None), "workloads" ([{"label", "input_tokens", "output_tokens", "tp",
"stopped", "levels": [{"concurrency", "output_tokens_per_s", "ttft_s_p50", "tpot_s_p50",
"predicted_output_tokens_per_s", "predicted_ttft_s", "predicted_tpot_s"}], "predicted":
{"label", "made": "before" | "plan", "fit", "split"} or None}]), "predicted_before_reason"
(why the serve stage made no prediction before measuring, None when it made one or did not
say), "scaling" ([{"tp", "concurrency",
"output_tokens_per_s", "baseline_tp", "speedup", "efficiency"}]), "predicted" (the plan's
own workload at its throughput-optimal load: {"label", "input_tokens", "output_tokens",
"engine", "concurrency", "output_tokens_per_s", "ttft_s", "tpot_s", "fit"} or None), and for
a skip or failure the figures that decided it ("devices_needed", "devices_held",
"weight_bytes", "max_weight_bytes", "by", "error")}. A fit is {"accelerator", "engine",
"scope", "basis": "pool" | "published" | "prior", "points", "residual", "source"}.

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.formatting import finite
from engine.notes import MEASURED_ENGINE_FULL, PREDICTED_FULL, StageState

SECTION = "full_size"
# Fit scopes (engine/stages/plan/fits.py) resting on published serving results.
PUBLISHED_SCOPES = ("accelerator+engine", "engine", "all", "all published")
_SKIP_FIGURES = ("devices_needed", "devices_held", "weight_bytes", "max_weight_bytes", "by")


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _whole(value: Any) -> int | None:
    number = finite(value)
    return int(number) if number is not None and number.is_integer() else None


def fit(value: Any) -> dict[str, Any] | None:
    """A stored fit (`predicted.fit`) as the notes keep it, with what it rests on."""
    stored = _mapping(value)
    if not stored:
        return None
    scope = str(stored.get("scope") or "")
    return {
        "accelerator": str(stored.get("accelerator") or ""),
        "engine": str(stored.get("engine") or ""),
        "scope": scope,
        "basis": "pool"
        if scope == "pool"
        else ("published" if scope in PUBLISHED_SCOPES else "prior"),
        "points": _whole(stored.get("points")),
        "residual": finite(stored.get("residual")),
        "source": str(stored.get("source") or ""),
    }


def _predicted_points(value: Any) -> dict[int, Mapping[str, Any]]:
    points = {}
    for point in (_mapping(p) for p in _items(value)):
        concurrency = _whole(point.get("concurrency"))
        if concurrency is not None:
            points[concurrency] = point
    return points


def _kept_before(before: Mapping[str, Any], label: str) -> Mapping[str, Any]:
    """The serve stage's prediction for workload `label` made before it measured
    (`full_size.predicted_before`: {"available", "fit", "split", "sweep" (the primary's),
    "workloads": [{"label", "input_tokens", "output_tokens", "sweep"}]}), {} without one."""
    if before.get("available") is False:
        return {}
    for entry in (_mapping(w) for w in _items(before.get("workloads"))):
        if str(entry.get("label") or "") == label:
            return entry
    return {}


def _prediction(
    workload: Mapping[str, Any], label: str, before: Mapping[str, Any], plan: Mapping[str, Any]
) -> tuple[dict[str, Any] | None, dict[int, Mapping[str, Any]]]:
    """(how the prediction for `workload` was made with its fit, its points by concurrency):
    the one the serve stage kept before measuring for its label and lengths, else the plan's
    curve where it was predicted for the same lengths; (None, {}) otherwise."""
    lengths = (workload.get("input_tokens"), workload.get("output_tokens"))
    kept = _kept_before(before, label)
    if (
        _predicted_points(kept.get("sweep"))
        and (kept.get("input_tokens"), kept.get("output_tokens")) == lengths
    ):
        made = {
            "label": PREDICTED_FULL,
            "made": "before",
            "fit": fit(before.get("fit")),
            "split": str(before.get("split") or ""),
        }
        return made, _predicted_points(kept.get("sweep"))
    if plan and lengths == (plan.get("input_tokens"), plan.get("output_tokens")):
        points = _predicted_points(plan.get("curve"))
        if points:
            made = {"label": PREDICTED_FULL, "made": "plan", "fit": plan.get("fit"), "split": ""}
            return made, points
    return None, {}


def _workload(
    entry: Mapping[str, Any],
    *,
    label: str,
    tp: int | None,
    before: Mapping[str, Any],
    plan: Mapping[str, Any],
) -> dict[str, Any]:
    predicted, points = _prediction(entry, label, before, plan)
    levels = []
    for level in (_mapping(p) for p in _items(entry.get("sweep"))):
        concurrency = _whole(level.get("concurrency"))
        if concurrency is None:
            continue
        there = points.get(concurrency) or {}
        levels.append(
            {
                "concurrency": concurrency,
                "output_tokens_per_s": finite(level.get("output_tokens_per_s")),
                "ttft_s_p50": finite(level.get("ttft_s_p50")),
                "tpot_s_p50": finite(level.get("tpot_s_p50")),
                "predicted_output_tokens_per_s": finite(there.get("output_tokens_per_s")),
                "predicted_ttft_s": finite(there.get("ttft_s")),
                "predicted_tpot_s": finite(there.get("tpot_s")),
            }
        )
    return {
        "label": label,
        "input_tokens": _whole(entry.get("input_tokens")),
        "output_tokens": _whole(entry.get("output_tokens")),
        "tp": tp,
        "stopped": str(entry.get("stopped") or "") or None,
        "levels": sorted(levels, key=lambda level: level["concurrency"]),
        "predicted": predicted,
    }


def _plan_workload(plan_result: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's predicted workload as the section reads it ({} without one)."""
    predicted = _mapping(plan_result.get("predicted"))
    workload = _mapping(predicted.get("workload"))
    if not predicted.get("available") or not workload:
        return {}
    return {
        "input_tokens": _whole(workload.get("input_tokens")),
        "output_tokens": _whole(workload.get("output_tokens")),
        "engine": str(workload.get("engine") or ""),
        "curve": _items(workload.get("curve")),
        "max_load": _mapping(workload.get("max_load")),
        "fit": fit(predicted.get("fit")),
    }


def full_size_section(states: Mapping[str, StageState]) -> dict[str, Any] | None:
    """The full-size figures of a job (module docstring) from its serve and plan states;
    None when there is neither a full-size run nor a plan's workload prediction."""
    serve = states.get("serve")
    plan_state = states.get("plan")
    serve_result = _mapping(serve.result if serve is not None else None)
    plan_result = _mapping(
        plan_state.result if plan_state is not None and plan_state.succeeded else None
    )
    run = _mapping(serve_result.get("full_size"))
    plan = _plan_workload(plan_result)
    status = str(run.get("status") or "")
    if status not in ("measured", "skipped", "failed"):
        status = "none"
    if status == "none" and not plan:
        return None
    engine = _mapping(serve_result.get("engine"))
    best = _mapping(plan.get("max_load"))
    settings = _mapping(run.get("sweep_settings"))
    tp = _whole(run.get("tp"))
    before = _mapping(run.get("predicted_before"))
    model = _mapping(run.get("model"))
    workloads = []
    if status == "measured":
        primary = {
            "input_tokens": settings.get("input_tokens"),
            "output_tokens": settings.get("output_tokens"),
            "sweep": run.get("sweep"),
            "stopped": run.get("stopped"),
        }
        entries = [primary, *(_mapping(e) for e in _items(run.get("workloads")))]
        workloads = [
            _workload(
                entry,
                label="primary" if index == 0 else str(entry.get("label") or ""),
                tp=tp,
                before=before,
                plan=plan,
            )
            for index, entry in enumerate(entries)
        ]
        workloads = [w for w in workloads if w["levels"]]
    return {
        "status": status,
        "reason": str(run.get("reason") or "") or None,
        "label": MEASURED_ENGINE_FULL,
        "engine_name": str(engine.get("name") or ""),
        "engine_version": str(engine.get("version") or ""),
        "load_format": str(run.get("load_format") or ""),
        "tp": tp,
        "dtype": str(run.get("dtype") or ""),
        "load_s": finite(run.get("load_s")),
        "peak_memory_bytes": _whole(run.get("peak_memory_bytes")),
        "model": {
            "architecture": str(model.get("architecture") or ""),
            "num_hidden_layers": _whole(model.get("num_hidden_layers")),
            "hidden_size": _whole(model.get("hidden_size")),
            "parameters": _whole(model.get("parameters")),
        }
        if model
        else None,
        "workloads": workloads,
        "scaling": [
            {
                "tp": _whole(row.get("tp")),
                "concurrency": _whole(row.get("concurrency")),
                "output_tokens_per_s": finite(row.get("output_tokens_per_s")),
                "baseline_tp": _whole(row.get("baseline_tp")),
                "speedup": finite(row.get("speedup")),
                "efficiency": finite(row.get("efficiency")),
            }
            for row in (_mapping(r) for r in _items(run.get("scaling")))
        ]
        if status == "measured"
        else [],
        "predicted": {
            "label": PREDICTED_FULL,
            "input_tokens": plan["input_tokens"],
            "output_tokens": plan["output_tokens"],
            "engine": plan["engine"],
            "concurrency": _whole(best.get("concurrency")),
            "output_tokens_per_s": finite(best.get("output_tokens_per_s")),
            "ttft_s": finite(best.get("ttft_s")),
            "tpot_s": finite(best.get("tpot_s")),
            "fit": plan["fit"],
        }
        if best
        else None,
        "predicted_before_reason": str(before.get("reason") or "") or None
        if before.get("available") is False
        else None,
        "error": str(run.get("error") or "") or None,
        **{key: run.get(key) for key in _SKIP_FIGURES if key in run},
    }
