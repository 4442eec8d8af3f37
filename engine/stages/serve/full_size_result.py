"""The serve stage's full-size run read back (`full_size` in the serve result; `full_size.py`
writes it, docs/stages/serve.md "Full size"), and which of the plan's predictions belongs
beside each workload it measured: one reader for the serve, performance and plan panels and
the release notes.

Two kinds of figure, never mixed up:

- **measured**: the plan's own command launched on the pool's engine at full size with dummy
  weights (`--load-format dummy`: random weights from the config alone) and workloads swept:
  speed, memory and scheduling of the full-size model on the engine, nothing of precision;
- **predicted**: the planner's step-time model for the same workload, with the fit it names
  (the prediction the serve stage kept before it measured, `full_size.predicted_before`,
  else the plan's own workload curve for the same lengths, `plan.result.PlanWorkload`).

A stored result is read tolerantly (`engine.stored`): a field of the wrong shape reads as
empty. Times are seconds, throughput tokens/s, memory bytes. Plain Python: neither Django
nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine import formatting
from engine.formatting import finite
from engine.stages.plan.result import (
    PlanWorkload,
    PredictedPoint,
    Split,
    StoredFit,
    predicted_points,
)
from engine.stored import as_count, as_list, as_mapping, as_mappings, text, texts, whole_number

from .command import CommandChange, command_changes
from .full_size_settings import PRIMARY

STATUSES = ("measured", "skipped", "failed")
MEASURED = "measured"
# The run's key in the serve result.
RESULT_KEY = "full_size"
# The keys of a run a report reads in the database (it loads no whole result): its status,
# the TP it launched at and the primary workload's settings; `FullSizeRun.from_stored` reads
# a mapping of just these.
SUMMARY_KEYS = ("status", "tp", "sweep_settings")


def launch_split(tp: int, plan: Split) -> str:
    """The split a full-size launch at `tp` ran at (`Split.launched_at`: the plan's PP and DP,
    its EP group being TP x DP where the plan has expert parallelism), as the planner writes
    it: "TP2 PP1 EP1 DP1"."""
    return formatting.split(plan.launched_at(tp))


@dataclass(frozen=True)
class Level:
    """One concurrency level of a sweep on the engine (the twin's sweep and the full-size
    run's): requests sent, completed and failed, output tokens/s and requests/s, TTFT and TPOT
    p50/p95, end-to-end p50/p99 (s); at full size also the engine's KV cache usage (a
    fraction) and running and waiting requests at their peak during the level (None
    elsewhere); `knee`: whether it is the twin's sweep's knee (`ServeResult.sweep` sets it)."""

    concurrency: int | None
    requests: int | None = None
    completed: int | None = None
    errors: int | None = None
    output_tokens_per_s: float | None = None
    requests_per_s: float | None = None
    ttft_s_p50: float | None = None
    ttft_s_p95: float | None = None
    tpot_s_p50: float | None = None
    tpot_s_p95: float | None = None
    e2e_s_p50: float | None = None
    e2e_s_p99: float | None = None
    kv_cache_usage_peak: float | None = None
    running_peak: float | None = None
    waiting_peak: float | None = None
    knee: bool = False

    @property
    def failed_requests(self) -> bool:
        return bool(self.errors)

    def to_dict(self) -> dict[str, Any]:
        """The level as a stored sweep point holds what `levels_of` reads of it (the knee
        mark is the reader's, not stored)."""
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "completed": self.completed,
            "errors": self.errors,
            **{key: getattr(self, key) for key in _LEVEL_FIGURES},
        }


_LEVEL_FIGURES = (
    "output_tokens_per_s",
    "requests_per_s",
    "ttft_s_p50",
    "ttft_s_p95",
    "tpot_s_p50",
    "tpot_s_p95",
    "e2e_s_p50",
    "e2e_s_p99",
    "kv_cache_usage_peak",
    "running_peak",
    "waiting_peak",
)


def levels_of(value: Any) -> list[Level]:
    """The levels of a stored sweep, by concurrency (a level without one is left out)."""
    levels = []
    for point in as_mappings(value):
        concurrency = whole_number(point.get("concurrency"))
        if concurrency is None:
            continue
        levels.append(
            Level(
                concurrency=concurrency,
                requests=whole_number(point.get("requests")),
                completed=whole_number(point.get("completed")),
                errors=whole_number(point.get("errors")),
                **{key: finite(point.get(key)) for key in _LEVEL_FIGURES},
            )
        )
    return sorted(levels, key=lambda level: level.concurrency or 0)


# The engine's /metrics figures each scrape keeps (`metrics.METRIC_NAMES`, with `t_s`).
_SAMPLE_FIGURES = (
    "kv_cache_usage",
    "running",
    "waiting",
    "preemptions",
    "prefix_cache_hits",
    "prefix_cache_queries",
)


@dataclass(frozen=True)
class MetricsSample:
    """One scrape of the engine's /metrics (`metrics.Scraper`): seconds since the first
    (`t_s`), the KV cache's share in use (a fraction), requests running and waiting, the
    engine's preemptions and prefix-cache hit and looked-up tokens since it started (None
    where the engine did not expose one)."""

    t_s: float | None
    kv_cache_usage: float | None = None
    running: int | float | None = None
    waiting: int | float | None = None
    preemptions: int | float | None = None
    prefix_cache_hits: int | float | None = None
    prefix_cache_queries: int | float | None = None


def metrics_samples(value: Any) -> list[MetricsSample]:
    """The samples of a stored metrics `series`, in order; a sample that is not a mapping
    reads as empty."""
    return [
        MetricsSample(
            t_s=finite(sample.get("t_s")),
            kv_cache_usage=finite(sample.get("kv_cache_usage")),
            **{key: as_count(sample.get(key)) for key in _SAMPLE_FIGURES[1:]},
        )
        for sample in as_mappings(value)
    ]


@dataclass(frozen=True)
class MeasuredWorkload:
    """One workload swept on the engine at full size: its `label` ("primary", or the stage's
    "prefill-heavy" / "decode-heavy"), the tokens of each request's prompt and output, the TP
    it ran at, its levels and why it stopped early ("" when every level finished, "time
    budget", or "error: ..." with the sweep's reason)."""

    label: str
    input_tokens: int | None
    output_tokens: int | None
    tp: int | None
    levels: list[Level]
    stopped: str = ""

    @property
    def best(self) -> Level | None:
        """The level of the highest output tokens/s (None when none has a figure)."""
        rated = [level for level in self.levels if level.output_tokens_per_s is not None]
        return max(rated, key=lambda level: level.output_tokens_per_s or 0.0, default=None)

    @property
    def primary(self) -> bool:
        return self.label == PRIMARY

    @property
    def key(self) -> str:
        """A name for element ids: "primary", "prefill-heavy"."""
        return "".join(c if c.isalnum() or c == "-" else "-" for c in self.label) or "workload"


@dataclass(frozen=True)
class Prediction:
    """The plan's prediction for a measured workload: `made` "before" (the one the serve
    stage kept beside its measurement, made by the plan's fit before it measured, at the
    launch's split: `full_size.predicted_before`) or "plan" (the plan's own workload curve,
    whose lengths are the workload's), the fit it names, the lengths, the points by
    concurrency and the split it was predicted at ("TP2 PP1 EP1 DP1"; "" where not said)."""

    made: str
    fit: StoredFit | None
    input_tokens: int | None
    output_tokens: int | None
    points: list[PredictedPoint]
    split: str = ""

    def at(self, concurrency: int | None) -> PredictedPoint | None:
        """The predicted point at `concurrency`, None when the prediction has none there."""
        return next((p for p in self.points if p.concurrency == concurrency), None)


@dataclass(frozen=True)
class TPLaunch:
    """A launch at a smaller TP degree for the scaling curve: its TP, load time (s), the
    command, the primary workload's levels there, why it stopped ("" when it did not), the KV
    cache's tokens the engine logged and its peak memory (bytes)."""

    tp: int | None
    load_s: float | None
    launched_command: str
    levels: list[Level]
    stopped: str
    engine_kv_cache_tokens: int | None
    peak_memory_bytes: float | None


@dataclass(frozen=True)
class TPLeftOut:
    """A TP degree the run did not launch, and why (`reason`: "invalid_split" with the
    engines' `rule`, "too_few_devices" with `devices_needed`, "does_not_fit")."""

    tp: int | None
    reason: str
    rule: str = ""
    devices_needed: int | None = None


@dataclass(frozen=True)
class ScalingPoint:
    """Multi-card scaling measured at full size: at `tp` and `concurrency`, output tokens/s,
    the smallest degree measured (`baseline_tp`), the speedup over it at the same level and
    the efficiency (speedup / the devices' ratio; on a cpu pool every degree runs on the same
    cores, so it is the speedup)."""

    tp: int | None
    concurrency: int | None
    output_tokens_per_s: float | None
    baseline_tp: int | None
    speedup: float | None
    efficiency: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "concurrency": self.concurrency,
            "output_tokens_per_s": self.output_tokens_per_s,
            "baseline_tp": self.baseline_tp,
            "speedup": self.speedup,
            "efficiency": self.efficiency,
        }


@dataclass(frozen=True)
class EnginePeaks:
    """The engine's /metrics over the full-size sweeps of the first launch: the largest KV
    cache usage (a fraction), running and waiting requests, the scrape interval (s) and how
    many samples were read."""

    kv_cache_usage: float | None
    running: int | float | None
    waiting: int | float | None
    interval_s: float | None
    samples: int


@dataclass(frozen=True)
class ServedModel:
    """What the full-size run served, read from the release's config: its architecture,
    layers, hidden size, attention and KV heads, vocabulary, parameters, weight bytes in the
    dtype served and KV cache bytes per token (bf16)."""

    architecture: str
    num_hidden_layers: int | None
    hidden_size: int | None
    num_attention_heads: int | None
    num_key_value_heads: int | None
    vocab_size: int | None
    parameters: int | None
    weight_bytes: int | None
    kv_cache_bytes_per_token: int | None


_MODEL_COUNTS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "parameters",
    "weight_bytes",
    "kv_cache_bytes_per_token",
)


def _model(value: Any) -> ServedModel | None:
    model = as_mapping(value)
    if not model:
        return None
    return ServedModel(
        architecture=text(model.get("architecture")),
        **{key: whole_number(model.get(key)) for key in _MODEL_COUNTS},
    )


@dataclass(frozen=True)
class FullSizeRun:
    """The serve stage's full-size run (`full_size`, docs/stages/serve.md "Full size").

    `status` "measured", "skipped" or "failed"; `reason` its code ("" when measured; a
    template words it); `load_format` ("dummy"). The first launch: its command and the flags
    that differ from the plan's, load time (s), TP, the dtype the engine computed in, peak
    memory (bytes), the engine's max model length and KV cache tokens. `settings`: the
    primary workload's lengths, the concurrency levels, requests per level, the time budget
    (s) and the load generator. `workloads`: the primary first, then the others swept on the
    same engine. `tp_launches`, `tp_left_out`, `scaling`: the smaller TP degrees launched, left
    out, and the scaling measured across them. `peaks` and `metrics_series` (samples for the
    chart): the engine's metrics. `predicted_before`: what the plan's fit predicted for each
    workload's levels before the measurement, by workload label (empty where the stage kept
    none; `predicted_before_reason` says why when it said).
    Skipped or failed, the figures that decided it: `devices_needed`, `devices_held`,
    `weight_bytes`, `max_weight_bytes`, `disabled_by`, `error`, `culprit`, `engine_lines`."""

    status: str
    reason: str = ""
    load_format: str = ""
    launched_command: str = ""
    changes: list[CommandChange] = field(default_factory=list)
    load_s: float | None = None
    tp: int | None = None
    dtype: str = ""
    peak_memory_bytes: float | None = None
    max_model_len: int | None = None
    engine_kv_cache_tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    concurrency_levels: list[int] = field(default_factory=list)
    requests_per_level: int | None = None
    time_budget_s: float | None = None
    load_generator: str = ""
    workloads: list[MeasuredWorkload] = field(default_factory=list)
    tp_launches: list[TPLaunch] = field(default_factory=list)
    tp_left_out: list[TPLeftOut] = field(default_factory=list)
    scaling: list[ScalingPoint] = field(default_factory=list)
    peaks: EnginePeaks | None = None
    metrics_series: list[MetricsSample] = field(default_factory=list)
    model: ServedModel | None = None
    predicted_before: dict[str, Prediction] = field(default_factory=dict)
    predicted_before_reason: str = ""
    duration_s: float | None = None
    devices_needed: int | None = None
    devices_held: int | None = None
    weight_bytes: int | None = None
    max_weight_bytes: int | None = None
    disabled_by: str = ""
    failed_checks: list[str] = field(default_factory=list)
    error: str = ""
    culprit: str = ""
    engine_lines: list[str] = field(default_factory=list)

    @classmethod
    def from_stored(cls, value: Any) -> FullSizeRun | None:
        """The run a stored `full_size` holds, whatever version of the stage wrote it (a field
        of the wrong shape reads as empty); None where it holds no run (no mapping, or a
        status that is none of `STATUSES`). Never raises."""
        full_size = as_mapping(value)
        status = text(full_size.get("status"))
        if status not in STATUSES:
            return None
        tp = whole_number(full_size.get("tp"))
        settings = as_mapping(full_size.get("sweep_settings"))
        workloads = _workloads(full_size, tp) if status != "skipped" else []
        metrics = as_mapping(full_size.get("engine_metrics"))
        model = _model(full_size.get("model"))
        before, before_reason = _predicted_before(full_size.get("predicted_before"), workloads)
        return cls(
            status=status,
            reason=text(full_size.get("reason")),
            load_format=text(full_size.get("load_format")),
            launched_command=text(full_size.get("launched_command")),
            changes=command_changes(full_size.get("command_diff")),
            load_s=finite(full_size.get("load_s")),
            tp=tp,
            dtype=text(full_size.get("dtype")),
            peak_memory_bytes=finite(full_size.get("peak_memory_bytes")),
            max_model_len=whole_number(full_size.get("max_model_len")),
            engine_kv_cache_tokens=whole_number(full_size.get("engine_kv_cache_tokens")),
            input_tokens=whole_number(settings.get("input_tokens")),
            output_tokens=whole_number(settings.get("output_tokens")),
            concurrency_levels=[
                c
                for c in (whole_number(v) for v in as_list(settings.get("concurrency")))
                if c is not None
            ],
            requests_per_level=whole_number(settings.get("requests_per_level")),
            time_budget_s=finite(settings.get("time_budget_s")),
            load_generator=text(settings.get("load_generator")),
            workloads=workloads,
            tp_launches=[_tp_launch(e) for e in as_mappings(full_size.get("tp_scaling"))],
            tp_left_out=[_tp_left_out(e) for e in as_mappings(full_size.get("tp_skipped"))],
            scaling=[_scaling_point(r) for r in as_mappings(full_size.get("scaling"))],
            peaks=_peaks(metrics),
            metrics_series=metrics_samples(metrics.get("series")),
            model=model,
            predicted_before=before,
            predicted_before_reason=before_reason,
            duration_s=finite(full_size.get("duration_s")),
            devices_needed=whole_number(full_size.get("devices_needed")),
            devices_held=whole_number(full_size.get("devices_held")),
            weight_bytes=whole_number(full_size.get("weight_bytes"))
            or (model.weight_bytes if model else None),
            max_weight_bytes=whole_number(full_size.get("max_weight_bytes")),
            disabled_by=text(full_size.get("by")),
            failed_checks=texts(full_size.get("checks")),
            error=text(full_size.get("error")),
            culprit=text(full_size.get("culprit")),
            engine_lines=texts(full_size.get("engine_lines")),
        )

    @property
    def measured(self) -> bool:
        return self.status == MEASURED

    @property
    def primary(self) -> MeasuredWorkload | None:
        return next((w for w in self.workloads if w.primary), None)

    @property
    def swept(self) -> list[MeasuredWorkload]:
        """The workloads with at least one level measured."""
        return [w for w in self.workloads if w.levels]

    @property
    def best(self) -> Level | None:
        """The primary workload's level of the highest output tokens/s."""
        primary = self.primary
        return primary.best if primary else None

    @property
    def weight_cap_exceeded(self) -> bool:
        return self.reason == "over_weight_cap"

    def prediction_for(
        self, workload: MeasuredWorkload, plan: PlanWorkload | None
    ) -> Prediction | None:
        """The plan's prediction for `workload`: the one the serve stage kept beside it (made
        before it measured, at the launch's split) where there is one for its label and
        lengths; else the plan's own workload curve when it was predicted for the same input
        and output tokens; else None (a prediction for other lengths is not this
        workload's)."""
        lengths = (workload.input_tokens, workload.output_tokens)
        before = self.predicted_before.get(workload.label)
        if before is not None and (before.input_tokens, before.output_tokens) == lengths:
            return before
        if plan is not None and plan.curve and (plan.input_tokens, plan.output_tokens) == lengths:
            return Prediction(
                made="plan",
                fit=plan.fit,
                input_tokens=plan.input_tokens,
                output_tokens=plan.output_tokens,
                points=plan.curve,
            )
        return None


def _predicted_before(
    value: Any, workloads: Sequence[MeasuredWorkload]
) -> tuple[dict[str, Prediction], str]:
    """The predictions the serve stage kept before measuring, by workload label ({"available",
    "fit", "split", "sweep" (the primary's), "workloads": [{"label", "input_tokens",
    "output_tokens", "sweep"}]}), and why there are none ("" when not said)."""
    before = as_mapping(value)
    if before.get("available") is False:
        return {}, text(before.get("reason"))
    fit, split = StoredFit.from_stored(before.get("fit")), text(before.get("split"))
    entries = as_mappings(before.get("workloads"))
    if not entries and before.get("sweep"):  # the primary workload's alone
        primary = next((w for w in workloads if w.primary), None)
        entries = [
            {
                "label": PRIMARY,
                "input_tokens": primary.input_tokens if primary else None,
                "output_tokens": primary.output_tokens if primary else None,
                "sweep": before.get("sweep"),
            }
        ]
    found = {}
    for entry in entries:
        points = predicted_points(entry.get("sweep"))
        if points:
            found[text(entry.get("label")) or PRIMARY] = Prediction(
                made="before",
                fit=fit,
                input_tokens=whole_number(entry.get("input_tokens")),
                output_tokens=whole_number(entry.get("output_tokens")),
                points=points,
                split=split,
            )
    return found, ""


def _workloads(full_size: Mapping[str, Any], tp: int | None) -> list[MeasuredWorkload]:
    settings = as_mapping(full_size.get("sweep_settings"))
    primary = MeasuredWorkload(
        label=PRIMARY,
        input_tokens=whole_number(settings.get("input_tokens")),
        output_tokens=whole_number(settings.get("output_tokens")),
        tp=tp,
        levels=levels_of(full_size.get("sweep")),
        stopped=text(full_size.get("stopped")),
    )
    others = [
        MeasuredWorkload(
            label=text(entry.get("label")) or "workload",
            input_tokens=whole_number(entry.get("input_tokens")),
            output_tokens=whole_number(entry.get("output_tokens")),
            tp=tp,
            levels=levels_of(entry.get("sweep")),
            stopped=text(entry.get("stopped")),
        )
        for entry in as_mappings(full_size.get("workloads"))
    ]
    return [primary, *others]


def _peaks(metrics: Mapping[str, Any]) -> EnginePeaks | None:
    if not metrics:
        return None
    peak = as_mapping(metrics.get("peak"))
    return EnginePeaks(
        kv_cache_usage=finite(peak.get("kv_cache_usage")),
        running=as_count(peak.get("running")),
        waiting=as_count(peak.get("waiting")),
        interval_s=finite(metrics.get("interval_s")),
        samples=len(as_list(metrics.get("series"))),
    )


def _tp_launch(entry: Mapping[str, Any]) -> TPLaunch:
    return TPLaunch(
        tp=whole_number(entry.get("tp")),
        load_s=finite(entry.get("load_s")),
        launched_command=text(entry.get("launched_command")),
        levels=levels_of(entry.get("sweep")),
        stopped=text(entry.get("stopped")),
        engine_kv_cache_tokens=whole_number(entry.get("engine_kv_cache_tokens")),
        peak_memory_bytes=finite(entry.get("peak_memory_bytes")),
    )


def _tp_left_out(entry: Mapping[str, Any]) -> TPLeftOut:
    return TPLeftOut(
        tp=whole_number(entry.get("tp")),
        reason=text(entry.get("reason")),
        rule=text(entry.get("rule")),
        devices_needed=whole_number(entry.get("devices_needed")),
    )


def _scaling_point(row: Mapping[str, Any]) -> ScalingPoint:
    return ScalingPoint(
        tp=whole_number(row.get("tp")),
        concurrency=whole_number(row.get("concurrency")),
        output_tokens_per_s=finite(row.get("output_tokens_per_s")),
        baseline_tp=whole_number(row.get("baseline_tp")),
        speedup=finite(row.get("speedup")),
        efficiency=finite(row.get("efficiency")),
    )


def full_size_run(serve_result: Any) -> FullSizeRun | None:
    """The full-size run of a serve result (its `full_size`, `FullSizeRun.from_stored`), None
    where it has none (a run stored before the stage measured the full size, or one that
    stopped before it). Never raises."""
    return FullSizeRun.from_stored(as_mapping(serve_result).get(RESULT_KEY))


@dataclass(frozen=True)
class ComparedLevel:
    """One measured level beside the prediction at the same concurrency (None where the
    prediction has no point there), and measured / predicted output tokens/s."""

    measured: Level
    predicted: PredictedPoint | None

    @property
    def ratio(self) -> float | None:
        measured = self.measured.output_tokens_per_s
        predicted = self.predicted.output_tokens_per_s if self.predicted else None
        if measured is None or not predicted:
            return None
        return measured / predicted


@dataclass(frozen=True)
class WorkloadComparison:
    """A measured workload beside the plan's prediction for it (None: none for its lengths),
    level by level."""

    workload: MeasuredWorkload
    prediction: Prediction | None

    @property
    def rows(self) -> list[ComparedLevel]:
        at = self.prediction.at if self.prediction else (lambda _c: None)
        return [ComparedLevel(level, at(level.concurrency)) for level in self.workload.levels]

    @property
    def at_best(self) -> ComparedLevel | None:
        """The workload's level of the highest output tokens/s beside the prediction there
        (None when no level has a figure)."""
        best = self.workload.best
        if best is None:
            return None
        return next(row for row in self.rows if row.measured is best)


def comparisons(run: FullSizeRun, plan: PlanWorkload | None) -> list[WorkloadComparison]:
    """Each workload the run measured (the primary first) with the plan's prediction for it."""
    return [
        WorkloadComparison(workload, run.prediction_for(workload, plan)) for workload in run.swept
    ]
