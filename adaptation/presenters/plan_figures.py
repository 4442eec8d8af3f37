"""A plan result's figures as values, for the release page's plan panel and the compare-pools
page: the split, the predicted decode and prefill (raw or calibrated), and what the planner
says would fit instead. `partials/split.html`, `nodes.html` and `would_fit.html` word them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.formatting import finite
from engine.stored import as_list, as_mapping


def whole(value: Any) -> int | None:
    """`value` when it is an int (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Split:
    """A parallel split as the planner gives it: tensor, pipeline, expert and data parallel
    degrees (None where the result lacks one; `partials/split.html` writes "TP1 PP1 EP8 DP8")."""

    tp: Any = None
    pp: Any = None
    ep: Any = None
    dp: Any = None

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> Split:
        return cls(*(item.get(key) for key in ("tp", "pp", "ep", "dp")))


@dataclass(frozen=True)
class Suggestion:
    """One thing the planner said would fit instead (`kind`): "devices" (that many devices of
    `accelerator`, on `nodes` nodes of `per_node` when the pool's node size is known),
    "context" (this pool with a context of `context_tokens`) or "dtype" (this pool at
    `dtype`)."""

    kind: str
    devices: int | None = None
    accelerator: str = ""
    nodes: int | None = None
    per_node: int | None = None
    context_tokens: float | None = None
    dtype: str = ""


def would_fit(suggestions: Mapping[str, Any], *, kind: str, per_node: Any) -> list[Suggestion]:
    """What the planner said would fit (its `suggestions`): more devices (on how many whole
    nodes of `per_node`), a smaller context, a lower dtype."""
    shown = []
    devices = finite(suggestions.get("devices"))
    if devices:
        size = whole(per_node)
        shown.append(
            Suggestion(
                "devices",
                devices=int(devices),
                accelerator=kind,
                nodes=-(-int(devices) // size) if size else None,
                per_node=size,
            )
        )
    context = finite(suggestions.get("context_tokens"))
    if context:
        shown.append(Suggestion("context", context_tokens=context))
    if suggestions.get("dtype"):
        shown.append(Suggestion("dtype", dtype=str(suggestions["dtype"])))
    return shown


@dataclass(frozen=True)
class Decode:
    """A predicted decode point: concurrent sequences, tokens/s over all replicas, time per
    output token (s) and tokens/s per sequence (None where the plan has none)."""

    sequences: Any
    tokens_per_s: float | None
    tpot_s: float | None
    per_sequence: float | None = None

    @classmethod
    def of(cls, point: Mapping[str, Any]) -> Decode:
        return cls(
            sequences=point.get("concurrent_sequences"),
            tokens_per_s=finite(point.get("decode_tokens_per_s")),
            tpot_s=finite(point.get("tpot_s")),
            per_sequence=finite(point.get("decode_tokens_per_s_per_sequence")),
        )


@dataclass(frozen=True)
class Prefill:
    """The predicted time to first token (s) of one prompt of `prompt_tokens`."""

    prompt_tokens: float | None
    ttft_s: float | None


@dataclass(frozen=True)
class Prediction:
    """A plan's prediction, raw or calibrated: decode at batch 1 and at the largest batch that
    fits (None when the plan has none), and the time to first token per prompt length."""

    batch_1: Decode
    largest: Decode | None
    prefill: list[Prefill]

    @classmethod
    def of(cls, predicted: Mapping[str, Any]) -> Prediction | None:
        """None when the prediction is not available (its `reason` says why)."""
        if not predicted.get("available"):
            return None
        largest = as_mapping(predicted.get("largest_batch"))
        return cls(
            batch_1=Decode.of(as_mapping(predicted.get("batch_1"))),
            largest=Decode.of(largest) if largest else None,
            prefill=[
                Prefill(finite(p.get("prompt_tokens")), finite(p.get("ttft_s")))
                for p in (as_mapping(x) for x in as_list(predicted.get("prefill")))
            ],
        )


@dataclass(frozen=True)
class Calibration:
    """The prediction corrected by the pool's running calibration (`predicted["calibrated"]`):
    its figures (None when there is no calibration: `reason` says why), its name, the decode
    and prefill factors, and its basis, caveat and warning."""

    prediction: Prediction | None
    reason: str = ""
    label: str = ""
    decode_factor: float | None = None
    prefill_factor: float | None = None
    basis: str = ""
    caveat: str = ""
    warning: str = ""


def calibration(calibrated: Mapping[str, Any]) -> Calibration | None:
    """A plan's calibrated prediction (`predicted["calibrated"]`), None when it has none."""
    if not calibrated:
        return None
    if not calibrated.get("available"):
        return Calibration(prediction=None, reason=str(calibrated.get("reason") or ""))
    return Calibration(
        prediction=Prediction.of(calibrated),
        label=str(calibrated.get("label") or ""),
        decode_factor=finite(calibrated.get("decode_factor")),
        prefill_factor=finite(calibrated.get("prefill_factor")),
        basis=str(calibrated.get("basis") or ""),
        caveat=str(calibrated.get("caveat") or ""),
        warning=str(calibrated.get("warning") or ""),
    )
