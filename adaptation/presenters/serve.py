"""The release page's "Serving engine" panel: each job's latest `serve` attempt.

The stage (`engine/stages/serve/`, docs/stages/serve.md) launches the pool's serving engine
from the plan's own command on a scaled twin's checkpoint (or a small release's real
weights), or attaches to an endpoint a team runs, and measures through the engine: loading,
precision against transformers on the same checkpoint, a load sweep, the engine's metrics
over it and the plan's TP against TP=1; every one of those figures is measured on the engine
serving that checkpoint, and the plan's predictions (full-size, its split) are drawn beside
the sweep in their own panels. Then, where the plan fits the pool, it launches the plan's
command at full size with dummy weights and sweeps workloads (`full_size`, read by
`engine/stages/serve/full_size_result.py`): measured · engine · full size · dummy weights,
beside the plan's prediction for the same workload; speed, memory and scheduling only, never
precision.
Values only: `panels/serve.html` and `partials/serve_full_size.html` word them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adaptation.charts import serve as serve_charts
from adaptation.models import AcceleratorPool, AdaptationJob, ModelRelease, StageRun, StageStatus
from adaptation.presenters.chart_slot import ChartSlot
from adaptation.presenters.plan_figures import Split
from adaptation.presenters.stages import SkippedBecause, settle_unfinished
from adaptation.selectors.jobs import latest_runs_by_stage
from engine import formatting
from engine.formatting import finite
from engine.stages.plan.predicted import PlanWorkload, plan_workload
from engine.stages.serve.command import CommandChange, command_changes
from engine.stages.serve.full_size_result import (
    FullSizeRun,
    WorkloadComparison,
    comparisons,
    full_size_run,
)
from engine.stored import as_list, as_mapping, numbers

SERVE_STAGE = "serve"
PLAN_STAGE = "plan"
# The result's own statuses (docs/stages/serve.md, "The result").
RESULT_STATES = {
    "served": "served",
    "attached": "attached",
    "not_configured": "not-configured",
    "failed": "failed",
}


def _yes_no(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


@dataclass(frozen=True)
class Failure:
    """Why the stage failed: the `phase` it failed in ("checkpoint", "launch", "precision",
    "tp", "sweep", "metrics"; "" when not said), its reason, the engine's own error lines, and
    who is at fault (`culprit`: "release", "infrastructure", "" when not said)."""

    phase: str
    reason: str
    engine_lines: list[str]
    culprit: str


def _failure(value: Any, *, fallback_reason: str) -> Failure:
    failure = as_mapping(value)
    return Failure(
        phase=str(failure.get("phase") or ""),
        reason=str(failure.get("reason") or fallback_reason or "").strip(),
        engine_lines=[str(line) for line in as_list(failure.get("engine_lines"))],
        culprit=str(failure.get("culprit") or ""),
    )


@dataclass(frozen=True)
class Engine:
    """The engine that served: its name and version, whether day0 launched it ("launched")
    or attached to a running endpoint ("attached"), the plan's command, the command launched
    and the flags that differ."""

    name: str
    version: str
    mode: str
    planned_command: str
    launched_command: str
    changes: list[CommandChange]


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _engine(result: Mapping[str, Any]) -> Engine | None:
    engine = as_mapping(result.get("engine"))
    if not engine:
        return None
    return Engine(
        name=_text(engine.get("name")),
        version=_text(engine.get("version")),
        mode=_text(result.get("mode")),
        planned_command=_text(engine.get("command")),
        launched_command=_text(engine.get("launched_command")),
        changes=command_changes(engine.get("command_diff")),
    )


@dataclass(frozen=True)
class Checkpoint:
    """What the engine loaded: "twin" (the scaled twin saved as a checkpoint) or "real" (the
    release's real weights), its parameters, bytes, dtype and tokenizer kind."""

    kind: str
    parameters: float | None
    bytes: float | None
    dtype: str
    tokenizer: str

    @property
    def real(self) -> bool:
        return self.kind == "real"


def _checkpoint(result: Mapping[str, Any]) -> Checkpoint | None:
    checkpoint = as_mapping(result.get("checkpoint"))
    if not checkpoint:
        return None
    return Checkpoint(
        kind="real" if checkpoint.get("kind") == "real" else "twin",
        parameters=finite(checkpoint.get("parameters")),
        bytes=finite(checkpoint.get("bytes")),
        dtype=_text(checkpoint.get("dtype")),
        tokenizer=_text(checkpoint.get("tokenizer")),
    )


@dataclass(frozen=True)
class TokenDivergence:
    """Where two runs' tokens first differ: the prompt (its index) and the position in the
    generated tokens; for the precision check also the engine's token and the reference's
    argmax there (ids, None where not said) and whether it was a near-tie (the reference's
    margin within the logprob limit; None: not said)."""

    prompt: Any
    position: Any
    engine_token: Any = None
    reference_token: Any = None
    tie: bool | None = None


def _divergence(value: Any) -> TokenDivergence | None:
    div = as_mapping(value)
    if not div:
        return None
    return TokenDivergence(
        prompt=div.get("prompt"),
        position=div.get("position"),
        engine_token=div.get("engine_token"),
        reference_token=div.get("reference_token"),
        tie=_yes_no(div.get("tie")),
    )


@dataclass(frozen=True)
class EnginePrecision:
    """The engine's tokens and log-probabilities against transformers in float32 on the same
    checkpoint: the dtype served, prompts and tokens compared, token agreement (a fraction),
    the first divergence (None: none), the largest |Δ logprob| and the KL over the top-k,
    each beside its limit, where the limits come from, and the verdict (None: not judged)."""

    dtype: str
    prompts: Any
    tokens_compared: Any
    token_agreement: float | None
    first_divergence: TokenDivergence | None
    max_abs_logprob_diff: float | None
    kl_top_k: float | None
    limit_max_abs_logprob_diff: float | None
    limit_kl_top_k: float | None
    limits_source: str
    passed: bool | None

    @property
    def logprob_within(self) -> bool | None:
        if self.max_abs_logprob_diff is None or self.limit_max_abs_logprob_diff is None:
            return None
        return self.max_abs_logprob_diff <= self.limit_max_abs_logprob_diff

    @property
    def kl_within(self) -> bool | None:
        if self.kl_top_k is None or self.limit_kl_top_k is None:
            return None
        return self.kl_top_k <= self.limit_kl_top_k


def _precision(result: Mapping[str, Any]) -> EnginePrecision | None:
    precision = as_mapping(result.get("precision"))
    if not precision:
        return None
    limits = as_mapping(precision.get("limits"))
    return EnginePrecision(
        dtype=_text(precision.get("dtype")),
        prompts=precision.get("prompts"),
        tokens_compared=precision.get("tokens_compared"),
        first_divergence=_divergence(precision.get("first_divergence")),
        limit_max_abs_logprob_diff=finite(limits.get("max_abs_logprob_diff")),
        limit_kl_top_k=finite(limits.get("kl_top_k")),
        limits_source=_text(limits.get("source")),
        passed=_yes_no(precision.get("passed")),
        **numbers(precision, "token_agreement", "max_abs_logprob_diff", "kl_top_k"),
    )


@dataclass(frozen=True)
class TPCheck:
    """The plan's tensor-parallel degree against TP=1 through the engine: TP planned and
    launched, the degree compared with, whether greedy decoding matched token for token
    (None: not compared), tokens compared, the first divergence, and why the degree
    launched differs or the check was not made ("" when it was)."""

    planned: Any
    launched: Any
    compared_with: Any
    greedy_match: bool | None
    tokens_compared: Any
    first_divergence: TokenDivergence | None
    reason: str

    @property
    def compared(self) -> bool:
        return self.greedy_match is not None


def _tp(result: Mapping[str, Any]) -> TPCheck | None:
    tp = as_mapping(result.get("tp"))
    if not tp:
        return None
    return TPCheck(
        planned=tp.get("planned"),
        launched=tp.get("launched"),
        compared_with=tp.get("compared_with"),
        greedy_match=_yes_no(tp.get("greedy_match")),
        tokens_compared=tp.get("tokens_compared"),
        first_divergence=_divergence(tp.get("first_divergence")),
        reason=_text(tp.get("reason")),
    )


@dataclass(frozen=True)
class SweepRow:
    """One concurrency level of the load sweep, through the engine: requests sent, completed
    and failed, TTFT and TPOT p50/p95 and end-to-end p99 (s), output tokens/s and requests/s,
    and whether it is the sweep's knee."""

    concurrency: Any
    requests: Any
    completed: Any
    errors: Any
    ttft_s_p50: float | None
    ttft_s_p95: float | None
    tpot_s_p50: float | None
    tpot_s_p95: float | None
    e2e_s_p99: float | None
    output_tokens_per_s: float | None
    requests_per_s: float | None
    knee: bool = False

    @property
    def failed_requests(self) -> bool:
        errors = finite(self.errors)
        return errors is not None and errors > 0


# The stage's knee codes (`engine/stages/serve/verdict.py` `knee`, its `reason`, by the
# performance stage's rule `find_knee`): "found" (from that level output tokens/s grew less
# than `growth_threshold` per doubling to every larger level), "beyond_sweep" (it kept growing
# to the largest level, which is given) or "one_level" (only one level to read). Results
# stored before the codes were renamed say "growth_below_threshold" or "largest_measured".
KNEE_RULES = ("found", "beyond_sweep", "one_level")
_EARLIER_KNEE_CODES = {"growth_below_threshold": "found", "largest_measured": "beyond_sweep"}


@dataclass(frozen=True)
class Knee:
    """The sweep's knee: the concurrency past which more requests in flight stop paying,
    output tokens/s and TPOT p50 (s) there, the rule that chose it (`KNEE_RULES`; "" when the
    result names none the panel knows), the growth per doubling the rule used and the growth
    from the knee to twice it (fractions; None when not stored)."""

    concurrency: Any
    output_tokens_per_s: float | None
    tpot_s_p50: float | None
    rule: str
    growth_threshold: float | None
    growth_at_knee: float | None


@dataclass(frozen=True)
class SweepSettings:
    """What each level sent: prompt and output tokens per request, the largest concurrency
    and the load generator."""

    input_tokens: Any
    output_tokens: Any
    max_concurrency: Any
    load_generator: str


def _sweep(result: Mapping[str, Any], knee: Knee | None) -> list[SweepRow]:
    knee_at = finite(knee.concurrency) if knee else None
    rows = []
    for level in (as_mapping(r) for r in as_list(result.get("sweep"))):
        at = finite(level.get("concurrency"))
        rows.append(
            SweepRow(
                concurrency=level.get("concurrency"),
                requests=level.get("requests"),
                completed=level.get("completed"),
                errors=level.get("errors"),
                knee=at is not None and at == knee_at,
                **numbers(
                    level,
                    "ttft_s_p50",
                    "ttft_s_p95",
                    "tpot_s_p50",
                    "tpot_s_p95",
                    "e2e_s_p99",
                    "output_tokens_per_s",
                    "requests_per_s",
                ),
            )
        )
    return rows


def _knee(result: Mapping[str, Any]) -> Knee | None:
    knee = as_mapping(result.get("knee"))
    if not knee or knee.get("concurrency") is None:
        return None
    rule = str(knee.get("reason") or "")
    rule = _EARLIER_KNEE_CODES.get(rule, rule)
    if rule not in KNEE_RULES:
        found = knee.get("found")
        rule = ("found" if found else "beyond_sweep") if isinstance(found, bool) else ""
    return Knee(
        concurrency=knee.get("concurrency"),
        rule=rule,
        **numbers(knee, "output_tokens_per_s", "tpot_s_p50", "growth_threshold", "growth_at_knee"),
    )


def _settings(result: Mapping[str, Any]) -> SweepSettings | None:
    settings = as_mapping(result.get("sweep_settings"))
    if not settings:
        return None
    return SweepSettings(
        input_tokens=settings.get("input_tokens"),
        output_tokens=settings.get("output_tokens"),
        max_concurrency=settings.get("max_concurrency"),
        load_generator=_text(settings.get("load_generator")),
    )


@dataclass(frozen=True)
class PlanPrediction:
    """The job's plan beside the sweep (predicted for the full-size model): its split and
    devices, its predicted decode curve ({"concurrent_sequences", "decode_tokens_per_s",
    "tpot_s"} at its batch sizes; empty when it predicted none) and its predicted served
    workload with the fit it names (None when it predicted none)."""

    split: Split
    devices: Any
    accelerator: str
    curve: list[Mapping[str, Any]]
    workload: PlanWorkload | None = None


def plan_prediction(job: AdaptationJob) -> PlanPrediction | None:
    """What the job's succeeded `plan` run predicted (runs prefetched), or None without one."""
    run = latest_runs_by_stage(job).get(PLAN_STAGE)
    if run is None or run.status != StageStatus.SUCCEEDED:
        return None
    result = as_mapping(run.result)
    if not result:
        return None
    predicted = as_mapping(result.get("predicted"))
    curve = (
        [as_mapping(p) for p in as_list(predicted.get("decode_curve"))]
        if predicted.get("available")
        else []
    )
    return PlanPrediction(
        split=Split.of(result),
        devices=result.get("devices"),
        accelerator=_text(result.get("accelerator")),
        curve=curve,
        workload=plan_workload(result),
    )


@dataclass
class ServePanel:
    """One job's serving-engine run: its latest `serve` attempt. `state` is "served",
    "attached", "not-configured", "failed", "waiting" (pending, queued, running), "skipped" or
    "cancelled"; `checkpoint_kind` ("twin" or "real") says what every figure was measured on."""

    job: AdaptationJob
    run: StageRun
    state: str = "waiting"
    waiting_for: AcceleratorPool | None = None
    skipped: SkippedBecause | None = None
    reason: str = ""  # a cancelled run's error
    failure: Failure | None = None
    passed: bool | None = None
    engine: Engine | None = None
    checkpoint: Checkpoint | None = None
    load_s: float | None = None
    peak_memory_bytes: float | None = None
    startup_log: list[str] = field(default_factory=list)
    precision: EnginePrecision | None = None
    tp: TPCheck | None = None
    sweep: list[SweepRow] = field(default_factory=list)
    sweep_settings: SweepSettings | None = None
    knee: Knee | None = None
    metrics_interval_s: float | None = None
    plan: PlanPrediction | None = None
    charts: list[ChartSlot] = field(default_factory=list)
    # The full-size run on the engine with dummy weights (None: the result has none), each
    # workload it measured beside the plan's prediction for it, and its metrics chart.
    full_size: FullSizeRun | None = None
    full_size_comparisons: list[WorkloadComparison] = field(default_factory=list)
    full_size_charts: list[ChartSlot] = field(default_factory=list)

    @property
    def dom_id(self) -> str:
        return f"serve-job-{self.job.pk}"

    @property
    def checkpoint_kind(self) -> str:
        return self.checkpoint.kind if self.checkpoint else "twin"

    @property
    def measured_anything(self) -> bool:
        """Whether the run measured a figure the panel shows under the engine."""
        return any(
            (
                self.load_s is not None,
                self.peak_memory_bytes is not None,
                self.precision is not None,
                self.tp is not None,
                bool(self.sweep),
                self.full_size is not None and self.full_size.status != "skipped",
            )
        )


def _charts(panel: ServePanel, result: Mapping[str, Any]) -> list[ChartSlot]:
    plan = panel.plan
    figures = (
        (
            "sweep",
            serve_charts.sweep(
                [as_mapping(r) for r in as_list(result.get("sweep"))],
                knee=as_mapping(result.get("knee")) or None,
                predicted=plan.curve if plan else [],
                checkpoint_kind=panel.checkpoint_kind,
                predicted_split=formatting.split(plan.split) if plan else "",
            ),
        ),
        (
            "metrics",
            serve_charts.engine_metrics(
                [as_mapping(s) for s in as_list(as_mapping(result.get("metrics")).get("series"))],
                checkpoint_kind=panel.checkpoint_kind,
            ),
        ),
    )
    return [
        ChartSlot(f"{panel.dom_id}-{name}", figure, name)
        for name, figure in figures
        if figure is not None
    ]


def _measured(panel: ServePanel, result: Mapping[str, Any]) -> None:
    """Fill what the run measured (a failed run keeps what it measured before failing)."""
    panel.engine = _engine(result)
    panel.checkpoint = _checkpoint(result)
    panel.load_s = finite(result.get("load_s"))
    panel.peak_memory_bytes = finite(result.get("peak_memory_bytes"))
    panel.startup_log = [str(line) for line in as_list(result.get("startup_log"))]
    panel.precision = _precision(result)
    panel.tp = _tp(result)
    panel.knee = _knee(result)
    panel.sweep = _sweep(result, panel.knee)
    panel.sweep_settings = _settings(result)
    panel.metrics_interval_s = finite(as_mapping(result.get("metrics")).get("interval_s"))
    panel.charts = _charts(panel, result)
    panel.full_size = full_size_run(result)
    if panel.full_size is not None:
        panel.full_size_comparisons = comparisons(
            panel.full_size, panel.plan.workload if panel.plan else None
        )
        metrics = serve_charts.engine_metrics(
            [dict(s) for s in panel.full_size.metrics_series], checkpoint_kind="full-size"
        )
        if metrics is not None:
            panel.full_size_charts = [
                ChartSlot(f"{panel.dom_id}-full-size-metrics", metrics, "metrics")
            ]


def serve_panel(
    job: AdaptationJob, *, pools_without_worker: Mapping[int, AcceleratorPool] | None = None
) -> ServePanel | None:
    """The serving-engine panel of `job` (stage runs prefetched), or None when it has no
    `serve` run. `pools_without_worker` (by id) marks a pending or queued run whose pool no
    live worker serves as waiting for one."""
    run = latest_runs_by_stage(job).get(SERVE_STAGE)
    if run is None:
        return None
    panel = ServePanel(job=job, run=run)
    if settle_unfinished(panel, job, run, pools_without_worker):
        return panel
    result = as_mapping(run.result)
    state = RESULT_STATES.get(str(result.get("status") or ""))
    if run.status == StageStatus.FAILED or state is None:
        state = "failed" if state != "not-configured" else state
    panel.state = state
    if state == "not-configured":
        return panel
    panel.passed = _yes_no(result.get("passed"))
    if state == "failed":
        panel.failure = _failure(result.get("failure"), fallback_reason=str(run.error or ""))
    panel.plan = plan_prediction(job)
    _measured(panel, result)
    return panel


def serve_panels(
    release: ModelRelease, *, pools_without_worker: Mapping[int, AcceleratorPool] | None = None
) -> list[ServePanel]:
    """A panel per job of the release with a `serve` run, newest job first (jobs and their
    stage runs prefetched, as `selectors.release_detail` does)."""
    return [
        panel
        for job in release.jobs.all()
        if (panel := serve_panel(job, pools_without_worker=pools_without_worker)) is not None
    ]
