"""The precision stage's result, typed: what `run.measure_precision` returns (its docstring
names every key) read back, and every judgement made of it.

`PrecisionStageResult.from_stored(mapping)` reads a stored row whatever version of the stage
wrote it: a missing key reads as None or empty, a value of the wrong type is ignored
(`engine.stored`), and it never raises. The stage's findings and release-notes section, the
release page's precision table, the stored `PrecisionResult` and `LayerDrift` rows and the
regression figures ask it, never the raw dict. Which checks a dtype crossed is judged here
once (`check_rows`, by `checks.CHECKS`), for the stage's own verdict (`metrics.failed_checks`)
and for every reader.

Errors are relative (fractions) unless named absolute (logit units); KL in nats. Plain
Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.formatting import finite
from engine.stored import as_list, as_mapping, flag, mapping_or_none, text, texts, whole_number

from .checks import CHECKS

# The logit metrics each dtype's entry holds (`metrics.logit_metrics`).
LOGIT_METRICS = (
    "max_abs_error",
    "mean_abs_error",
    "relative_logit_error",
    "max_relative_logit_error",
    "cosine_similarity",
    "min_cosine_similarity",
    "top1_agreement",
    "prefill_top1_agreement",
    "decode_top1_agreement",
    "kl_divergence",
    "reference_logit_rms",
)


@dataclass(frozen=True)
class CheckRow:
    """One of the stage's checks (`checks.CHECKS`) of a dtype whose threshold is set: how the
    stage's reason names it (`label`), the metric's key, its value (None: not measured or not
    finite), "max" or "min", and the limit."""

    label: str
    metric: str
    value: float | None
    side: str
    limit: float

    @property
    def crossed(self) -> bool:
        """Whether the value is over a "max" limit or under a "min" one (a value that was
        not measured crosses nothing)."""
        if self.value is None:
            return False
        return self.value > self.limit if self.side == "max" else self.value < self.limit

    @property
    def bound(self) -> str:
        """The bound the value must keep: "≤" for a "max" limit, "≥" for a "min" one."""
        return "≤" if self.side == "max" else "≥"

    @property
    def op(self) -> str:
        """How the stage's reason writes a crossing: ">" over a "max" limit, "<" under a
        "min" one."""
        return ">" if self.side == "max" else "<"


def check_rows(values: Mapping[str, Any], thresholds: Mapping[str, Any]) -> list[CheckRow]:
    """The stage's checks of one dtype (`checks.CHECKS`, in that order) whose threshold in
    `thresholds` is set, with the measured `values` (a threshold that is None is reported,
    not enforced: it has no row)."""
    rows = []
    for metric, key, side, label in CHECKS:
        limit = finite(thresholds.get(key))
        if limit is not None:
            rows.append(CheckRow(label, metric, finite(values.get(metric)), side, limit))
    return rows


@dataclass(frozen=True)
class JudgedFigure:
    """One figure the release page shows a dtype's verdict resting on (`figure`: its key in
    the stage's result), with its limit, the direction it must keep ("<=" or ">=") and
    whether it kept it (`within`) as the stage judged it: `DtypeComparison.judged_figures`
    makes it from the stage's own rules, and nothing judges it again."""

    figure: str
    value: float
    op: str
    limit: float
    within: bool

    @classmethod
    def of(cls, check: CheckRow) -> JudgedFigure | None:
        """The figure of one of the stage's checks, judged by the check's own rule
        (`CheckRow.crossed`); None when the check's figure was not measured (nothing to
        show)."""
        if check.value is None:
            return None
        op = "<=" if check.side == "max" else ">="
        return cls(check.metric, check.value, op, check.limit, within=not check.crossed)

    @property
    def similarity(self) -> bool:
        """A similarity, just under 1: shown with enough digits to tell it from its limit."""
        return "cosine" in self.figure


@dataclass(frozen=True)
class RoutingFlips:
    """An MoE layer's tokens whose top-k expert set differed from the reference's and were
    forced back: in the local prefill (`local`), end to end (`end_to_end`), of the prefill's
    routed tokens."""

    layer: int | None
    local: int | None
    end_to_end: int | None
    prefill_tokens: int | None

    @classmethod
    def from_stored(cls, value: Any) -> RoutingFlips:
        row = as_mapping(value)
        return cls(
            layer=whole_number(row.get("layer")),
            local=whole_number(row.get("local")),
            end_to_end=whole_number(row.get("end_to_end")),
            prefill_tokens=whole_number(row.get("prefill_tokens")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "local": self.local,
            "end_to_end": self.end_to_end,
            "prefill_tokens": self.prefill_tokens,
        }


@dataclass(frozen=True)
class LayerDriftRow:
    """One decoder sub-module's error against the reference (`drift.layer_drift`): its layer,
    kind ("attention", "mlp", "moe", "norm"...) and path in the twin; the accumulated absolute
    and relative errors, the LOCAL ones (fed the reference's input) and whether the local one
    is over the dtype's limit; for an MoE router the tokens routed otherwise (local, end to
    end) of its prefill tokens (None elsewhere). Non-finite errors read as None."""

    layer: int | None
    module: str
    name: str
    max_abs_error: float | None = None
    relative_error: float | None = None
    local_max_abs_error: float | None = None
    local_relative_error: float | None = None
    local_error_exceeds_limit: bool | None = None
    routing_flips: int | None = None
    end_to_end_routing_flips: int | None = None
    routed_tokens: int | None = None

    @classmethod
    def from_stored(cls, value: Any) -> LayerDriftRow:
        row = as_mapping(value)
        return cls(
            layer=whole_number(row.get("layer")),
            module=text(row.get("module")),
            name=text(row.get("name")),
            max_abs_error=finite(row.get("max_abs_error")),
            relative_error=finite(row.get("relative_error")),
            local_max_abs_error=finite(row.get("local_max_abs_error")),
            local_relative_error=finite(row.get("local_relative_error")),
            local_error_exceeds_limit=flag(row.get("local_error_exceeds_limit")),
            routing_flips=whole_number(row.get("routing_flips")),
            end_to_end_routing_flips=whole_number(row.get("end_to_end_routing_flips")),
            routed_tokens=whole_number(row.get("routed_tokens")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The row as the stage stores it; the routing keys only for an MoE router."""
        row = {
            "layer": self.layer,
            "module": self.module,
            "name": self.name,
            "max_abs_error": self.max_abs_error,
            "relative_error": self.relative_error,
            "local_max_abs_error": self.local_max_abs_error,
            "local_relative_error": self.local_relative_error,
            "local_error_exceeds_limit": self.local_error_exceeds_limit,
        }
        if self.routing_flips is not None:
            row |= {
                "routing_flips": self.routing_flips,
                "end_to_end_routing_flips": self.end_to_end_routing_flips,
                "routed_tokens": self.routed_tokens,
            }
        return row


@dataclass(frozen=True)
class DtypeComparison:
    """One dtype on the pool's device against the float32 reference (an entry of the
    result's `dtypes`): the verdict (`passed`; None where a row holds none) and its `reason`;
    the logit metrics (`LOGIT_METRICS`; None when the target's logits held NaN/Inf, counted in
    `non_finite_values`) over `positions` rows; the thresholds it was judged by (as the stage
    wrote them: `thresholds.thresholds_for`), the dtype's unit roundoff and the target's
    notes; the first divergent module (layer None: none) with its local error, the worst
    local error; routing flips and every module's drift."""

    dtype: str
    passed: bool | None
    reason: str = ""
    max_abs_error: float | None = None
    mean_abs_error: float | None = None
    relative_logit_error: float | None = None
    max_relative_logit_error: float | None = None
    cosine_similarity: float | None = None
    min_cosine_similarity: float | None = None
    top1_agreement: float | None = None
    prefill_top1_agreement: float | None = None
    decode_top1_agreement: float | None = None
    kl_divergence: float | None = None
    reference_logit_rms: float | None = None
    positions: int | None = None
    thresholds: dict[str, Any] = field(default_factory=dict)
    unit_roundoff: float | None = None
    notes: list[str] = field(default_factory=list)
    first_divergent_layer: int | None = None
    first_divergent_module: str = ""
    first_divergent_name: str = ""
    first_divergent_local_error: float | None = None
    worst_local_relative_error: float | None = None
    routing_flips: list[RoutingFlips] = field(default_factory=list)
    layers: list[LayerDriftRow] = field(default_factory=list)
    non_finite_values: int | None = None

    @classmethod
    def from_stored(cls, dtype: str, value: Any) -> DtypeComparison:
        entry = as_mapping(value)
        return cls(
            dtype=dtype,
            passed=flag(entry.get("passed")),
            reason=text(entry.get("reason")),
            **{key: finite(entry.get(key)) for key in LOGIT_METRICS},
            positions=whole_number(entry.get("positions")),
            thresholds=dict(as_mapping(entry.get("thresholds"))),
            unit_roundoff=finite(entry.get("unit_roundoff")),
            notes=texts(entry.get("notes")),
            first_divergent_layer=whole_number(entry.get("first_divergent_layer")),
            first_divergent_module=text(entry.get("first_divergent_module")),
            first_divergent_name=text(entry.get("first_divergent_name")),
            first_divergent_local_error=finite(entry.get("first_divergent_local_error")),
            worst_local_relative_error=finite(entry.get("worst_local_relative_error")),
            routing_flips=[
                RoutingFlips.from_stored(r) for r in as_list(entry.get("routing_flips"))
            ],
            layers=[LayerDriftRow.from_stored(r) for r in as_list(entry.get("layers"))],
            non_finite_values=whole_number(entry.get("non_finite_values")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The entry as the stage stores it (`non_finite_values` only where the target's
        logits held NaN/Inf)."""
        entry: dict[str, Any] = {
            "passed": self.passed,
            "reason": self.reason,
            **{key: getattr(self, key) for key in LOGIT_METRICS},
            "positions": self.positions,
            "thresholds": dict(self.thresholds),
            "unit_roundoff": self.unit_roundoff,
            "notes": list(self.notes),
            "first_divergent_layer": self.first_divergent_layer,
            "first_divergent_module": self.first_divergent_module or None,
            "first_divergent_name": self.first_divergent_name or None,
            "first_divergent_local_error": self.first_divergent_local_error,
            "worst_local_relative_error": self.worst_local_relative_error,
            "routing_flips": [r.to_dict() for r in self.routing_flips],
            "layers": [row.to_dict() for row in self.layers],
        }
        if self.non_finite_values is not None:
            entry["non_finite_values"] = self.non_finite_values
        return entry

    def limit(self, key: str) -> float | None:
        """The threshold `key` the dtype was judged by (None: not set or not a number)."""
        return finite(self.thresholds.get(key))

    @property
    def limits_source(self) -> str:
        """Where the thresholds come from ("" when not said)."""
        return text(self.thresholds.get("source"))

    @property
    def diverged(self) -> bool:
        """Whether a module's local error was over the dtype's limit (its first is named)."""
        return self.first_divergent_layer is not None

    @property
    def checks(self) -> list[CheckRow]:
        """The stage's checks whose threshold is set, with their values (`check_rows`)."""
        values = {key: getattr(self, key) for key in LOGIT_METRICS}
        return check_rows(values, self.thresholds)

    @property
    def crossed(self) -> list[CheckRow]:
        """The checks the dtype failed."""
        return [row for row in self.checks if row.crossed]

    @property
    def judged_figures(self) -> list[JudgedFigure]:
        """The figures the release page shows the dtype's verdict resting on, each judged as
        the stage judged it: the stage's checks whose limit is set and whose figure was
        measured (`checks`, in `checks.CHECKS`' order: the MEAN cosine against
        `min_cosine_similarity`, as the stage holds it), then the worst module's local error
        against `max_local_relative_error`, within unless a module diverged (`diverged`: the
        stage's own rule, which also fails a local error that is not finite)."""
        figures = [figure for row in self.checks if (figure := JudgedFigure.of(row)) is not None]
        worst, limit = self.worst_local_relative_error, self.limit("max_local_relative_error")
        if worst is not None and limit is not None:
            figures.append(
                JudgedFigure("worst_local_relative_error", worst, "<=", limit, not self.diverged)
            )
        return figures


@dataclass(frozen=True)
class PrecisionStageResult:
    """A precision run's result: each dtype compared (`dtypes`, in the stored order; None
    when the result holds no per-dtype comparison, as a run stopped before comparing), the
    dtypes the pool's device cannot run and why, the reference (device and dtype; "" where
    not said), the target's device, the decode steps and prompt shape, the twin that ran
    (its description, None where not said) and the run's verdict."""

    dtypes: dict[str, DtypeComparison] | None
    skipped_dtypes: dict[str, str] = field(default_factory=dict)
    reference_device: str = ""
    reference_dtype: str = ""
    target_device: str = ""
    decode_steps: int | None = None
    prompt_batch: int | None = None
    prompt_tokens: int | None = None
    twin: dict[str, Any] | None = None
    passed: bool | None = None

    @classmethod
    def from_stored(cls, value: Any) -> PrecisionStageResult:
        """The result of a stored row; never raises."""
        result = as_mapping(value)
        stored = result.get("dtypes")
        dtypes = (
            {
                str(dtype): DtypeComparison.from_stored(str(dtype), entry)
                for dtype, entry in stored.items()
                if isinstance(entry, Mapping)  # anything else is no comparison
            }
            if isinstance(stored, Mapping)
            else None
        )
        reference, prompt = as_mapping(result.get("reference")), as_mapping(result.get("prompt"))
        return cls(
            dtypes=dtypes,
            skipped_dtypes={
                str(dtype): text(why)
                for dtype, why in as_mapping(result.get("skipped_dtypes")).items()
            },
            reference_device=text(reference.get("device")),
            reference_dtype=text(reference.get("dtype")),
            target_device=text(result.get("target_device")),
            decode_steps=whole_number(result.get("decode_steps")),
            prompt_batch=whole_number(prompt.get("batch")),
            prompt_tokens=whole_number(prompt.get("tokens")),
            twin=mapping_or_none(result.get("twin")),
            passed=flag(result.get("passed")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The result as the stage stores it."""
        return {
            "reference": {"device": self.reference_device, "dtype": self.reference_dtype},
            "target_device": self.target_device,
            "dtypes": (
                None
                if self.dtypes is None
                else {dtype: entry.to_dict() for dtype, entry in self.dtypes.items()}
            ),
            "skipped_dtypes": dict(self.skipped_dtypes),
            "decode_steps": self.decode_steps,
            "prompt": {"batch": self.prompt_batch, "tokens": self.prompt_tokens},
            "twin": None if self.twin is None else dict(self.twin),
            "passed": self.passed,
        }

    @property
    def compared(self) -> list[DtypeComparison]:
        """The dtypes compared, in the stored order (none when the result holds none)."""
        return list((self.dtypes or {}).values())

    @property
    def every_dtype_passed(self) -> bool:
        """Whether the run compared at least one dtype and every one passed."""
        return bool(self.compared) and all(entry.passed for entry in self.compared)

    @property
    def failed(self) -> list[DtypeComparison]:
        """The dtypes that failed their thresholds (a verdict False, not a missing one)."""
        return [entry for entry in self.compared if entry.passed is False]

    @property
    def measured_on(self) -> str:
        """ "release" when the twin is the release's real model, else "twin" (as regressions
        name it)."""
        return "release" if (self.twin or {}).get("weights_source") == "real" else "twin"
