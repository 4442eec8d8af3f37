"""Shapes the `plan` stage's results for the release page, and plans a release on every pool
and catalog kind for the compare-pools page.

A plan is the planner's prediction from the architecture analysis (`engine/stages/plan/`):
memory per device, decode and prefill speeds and the scaling curve are computed, never
measured, and every figure and table here says so. The one measured figure beside them is
the scaling efficiency the job's `distributed` stage measured on the scaled twin, drawn on the
scaling chart and written under its table, labelled measured on the twin.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlencode

from django.utils.dateparse import parse_datetime

from adaptation.catalog import pool_catalog
from adaptation.charts import compare_pools as compare_pools_charts
from adaptation.charts import plan as plan_charts
from adaptation.inventory import plan_start_estimate
from adaptation.models import (
    AcceleratorKind,
    AcceleratorPool,
    AdaptationJob,
    JobStatus,
    ModelRelease,
    StageRun,
    StageStatus,
)
from adaptation.presenters.analysis import latest_analysis_run
from adaptation.selectors.jobs import latest_runs_by_stage
from engine.catalog import Accelerator, Catalog, CatalogError
from engine.formatting import MISSING, bytes_per_token, gib
from engine.formatting import finite as _number
from engine.stages.plan.errors import NoFittingPlan, PlanInputError
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from engine.stored import as_list, as_mapping

PLAN_STAGE = "plan"
DISTRIBUTED_STAGE = "distributed"
# Why the predicted efficiency per device can exceed 1 (said where it does).
EFFICIENCY_ABOVE_ONE = (
    "above 1: more devices leave more memory for the KV cache, so a larger batch fits per device"
)
# The compare page plans a catalog kind on one node, then on as many nodes as it needs, up to:
COMPARE_MAX_NODES = 16
# Serving dtypes the compare page offers (the planner's names; "checkpoint" is the default).
SERVING_DTYPES = ("checkpoint", "bfloat16", "float16", "fp8", "int8")


# --- number formats -------------------------------------------------------------------------


def tokens_per_s_text(value: Any) -> str:
    """A predicted speed: 5775.99 → "5,776 tokens/s", 42.26 → "42.3 tokens/s"."""
    number = _number(value)
    if number is None:
        return MISSING
    return f"{number:,.0f} tokens/s" if abs(number) >= 100 else f"{number:,.1f} tokens/s"


def ms_text(seconds: Any) -> str:
    """Seconds as milliseconds: 0.0166205 → "16.6 ms"."""
    number = _number(seconds)
    if number is None:
        return MISSING
    return f"{number * 1000:,.1f} ms"


def split_text(item: Mapping[str, Any]) -> str:
    """A split as the planner writes it: "TP1 PP1 EP8 DP8"."""
    return " ".join(f"{k.upper()}{item.get(k, MISSING)}" for k in ("tp", "pp", "ep", "dp"))


def validated_split_label(result: Mapping[str, Any]) -> str:
    """The split a `distributed` run validated, as its reason writes it: "TP=2 EP=2" (EP only
    when above 1)."""
    ep = result.get("ep")
    return f"TP={result.get('tp', MISSING)}" + (
        f" EP={ep}" if isinstance(ep, int) and ep > 1 else ""
    )


def measured_scaling(run: StageRun | None) -> dict[str, Any] | None:
    """The scaling point a job's `distributed` run measured on the scaled twin, for the plan's
    scaling chart and table: {"devices" (processes), "efficiency" (the twin's TP=1 step time
    over N x its TP=N step time; 1 = linear), "split" ("TP=2 EP=2"), "backend", "passed"}.

    None unless the run finished (succeeded, or failed with its figures: a wrong shard still
    times its steps) and validated the split on at least 2 processes with an efficiency."""
    if run is None or run.status not in (StageStatus.SUCCEEDED, StageStatus.FAILED):
        return None
    result = as_mapping(run.result)
    devices = result.get("world_size")
    efficiency = _number(result.get("scaling_efficiency"))
    if (
        result.get("validated") is not True
        or efficiency is None
        or not isinstance(devices, int)
        or isinstance(devices, bool)
        or devices < 2
    ):
        return None
    return {
        "devices": devices,
        "efficiency": efficiency,
        "split": validated_split_label(result),
        "tp": result.get("tp"),
        "ep": result.get("ep"),
        "backend": str(result.get("backend") or ""),
        "passed": result.get("passed") is True and run.status == StageStatus.SUCCEEDED,
    }


def measured_scaling_text(measured: Mapping[str, Any], *, first_devices: Any = None) -> str:
    """The measured scaling point in words, beside the plan's predicted scaling table."""
    devices, split, efficiency = measured["devices"], measured["split"], measured["efficiency"]
    processes = " ".join(filter(None, (str(devices), measured.get("backend"), "processes")))
    text = (
        f"Measured on the scaled twin (Multi-device validation): {split} on {processes}, "
        f"scaling efficiency {efficiency:.2f} x linear ({efficiency * 100:.1f} %: the twin's "
        f"TP=1 decode step time over {devices} x its TP={devices} step time)"
    )
    if not measured.get("passed"):
        text += "; its outputs did not match the float32 reference"
    if first_devices is not None:
        text += (
            f". The predicted efficiencies are the full model's per device against "
            f"{devices_text(first_devices)}, the first count, so the two are not the same ratio"
        )
    return text + "."


def short_dtype_label(dtype: Any, label: Any) -> str:
    """A serving dtype in a few words for a table cell: the checkpoint's own as its format's
    first word ("checkpoint (fp8 e4m3 (128x128 blocks))" → "fp8 (checkpoint)"), any other as
    the planner names it ("bfloat16")."""
    text = str(label or dtype or MISSING)
    prefix = "checkpoint ("
    if dtype == "checkpoint" and text.startswith(prefix) and text.endswith(")"):
        words = text[len(prefix) : -1].split()
        return f"{words[0]} (checkpoint)" if words else "checkpoint"
    return text


def _nodes_text(nodes: Any, per_node: Any) -> str:
    n = _number(nodes)
    if n is None:
        return MISSING
    unit = "node" if n == 1 else "nodes"
    shown = f"{n:g}"
    return f"{shown} {unit} of {per_node}" if per_node else f"{shown} {unit}"


def plan_query(options: Mapping[str, Any] | None) -> str:
    """The compare page's query string (context, concurrency, dtype) for plan options as the
    planner names them ({"context_tokens": 8192, "concurrency": 16, "dtype": "fp8"})."""
    options = options or {}
    pairs = [
        (name, options[key])
        for name, key in (
            ("context", "context_tokens"),
            ("concurrency", "concurrency"),
            ("dtype", "dtype"),
        )
        if options.get(key) not in (None, "")
    ]
    return urlencode(pairs)


# --- the release page's panel ---------------------------------------------------------------


@dataclass(frozen=True)
class ChartSlot:
    """A plotly figure and the element ids `static/charts.js` pairs: the figure's JSON in
    `<script id="{stem}-figure">` is drawn into `<div id="{stem}-chart">`."""

    stem: str
    figure: dict[str, Any]
    label: str
    css: str = ""

    @property
    def chart_id(self) -> str:
        return f"{self.stem}-chart"

    @property
    def figure_id(self) -> str:
        return f"{self.stem}-figure"


@dataclass(frozen=True)
class Fact:
    """A labelled value, ready to show."""

    label: str
    value: str
    note: str = ""


@dataclass(frozen=True)
class RunnerUp:
    """A split the planner did not choose, and why (predicted figures)."""

    split: str
    devices: int | None
    fits: bool
    memory: str
    decode: str
    why_lost: str


@dataclass(frozen=True)
class CommRow:
    """One kind of communication per generated token of the chosen split."""

    kind: str
    bytes_per_token: str
    crosses_nodes: bool
    used: bool


@dataclass(frozen=True)
class ScalingRow:
    """One device count of the predicted scaling curve."""

    devices: int
    nodes: str
    split: str
    decode: str
    per_device: str
    efficiency: str
    within_pool: bool
    above_one: bool = False  # efficiency above 1: see `EFFICIENCY_ABOVE_ONE`


@dataclass(frozen=True)
class Artifact:
    """A deployment artifact to copy: a launch command or a Kubernetes manifest."""

    title: str
    text: str
    element_id: str


@dataclass(frozen=True)
class PlanFailure:
    """Why a plan did not fit (or could not be made), and what would fit."""

    reason: str
    fits_false: bool
    would_fit: list[str]


@dataclass
class PlanPanel:
    """The plan of one job's pool: its latest `plan` attempt, shaped for the page."""

    job: AdaptationJob
    run: StageRun
    pool_name: str
    accelerator: str = ""
    state: str = "waiting"  # "planned", "failed" or "waiting" (pending, queued, running)
    # Pending or queued on a pool no live worker serves: that pool (it says so), else None.
    waiting_for: AcceleratorPool | None = None
    facts: list[Fact] = field(default_factory=list)
    split: str = ""
    memory: list[Fact] = field(default_factory=list)
    weights_by_dtype: list[Fact] = field(default_factory=list)
    predicted: list[Fact] = field(default_factory=list)
    prefill: list[Fact] = field(default_factory=list)
    predicted_reason: str = ""
    # The raw prediction corrected by the pool's running calibration (`predicted["calibrated"]`)
    calibrated: list[Fact] = field(default_factory=list)
    calibrated_prefill: list[Fact] = field(default_factory=list)
    calibrated_facts: list[Fact] = field(default_factory=list)  # factor, basis, caveat, warning
    calibrated_reason: str = ""  # "no calibration yet: ..." when there is none
    figures_source: str = ""  # where the accelerator's speed figures come from
    charts: list[ChartSlot] = field(default_factory=list)
    scaling: list[ScalingRow] = field(default_factory=list)
    scaling_reason: str = ""  # why there is no scaling curve (no prediction), "" when there is
    scaling_note: str = ""  # `EFFICIENCY_ABOVE_ONE` when a row's efficiency exceeds 1
    # The scaling efficiency the job's `distributed` run measured on the twin, in words ("" when
    # none): `measured_scaling`, drawn on the scaling chart too.
    measured_scaling: str = ""
    runners_up: list[RunnerUp] = field(default_factory=list)
    communication: list[CommRow] = field(default_factory=list)
    communication_facts: list[Fact] = field(default_factory=list)
    artifacts: list[Artifact] = field(default_factory=list)
    artifact_notes: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failure: PlanFailure | None = None
    start: list[Fact] = field(default_factory=list)
    compare_query: str = ""

    @property
    def dom_id(self) -> str:
        return f"plan-job-{self.job.pk}"


_MEMORY_ROWS = (
    ("weights", "Weights"),
    ("kv_cache", "KV cache"),
    ("activations_workspace", "Activations + workspace"),
    ("runtime_overhead", "Runtime overhead"),
    ("total_used", "Used"),
    ("budget", "Budget"),
    ("free", "Free (capacity minus used)"),
    ("capacity", "Capacity"),
)

_ARTIFACTS = (
    ("vllm", "vLLM"),
    ("sglang", "SGLang"),
    ("kubernetes_deployment", "Kubernetes Deployment"),
)


def _facts(result: Mapping[str, Any]) -> list[Fact]:
    pool = as_mapping(result.get("pool"))
    inputs = as_mapping(result.get("inputs"))
    per_node = pool.get("devices_per_node")
    facts = [
        Fact("Tensor parallel (TP)", str(result.get("tp", MISSING))),
        Fact("Pipeline parallel (PP)", str(result.get("pp", MISSING))),
        Fact("Expert parallel (EP)", str(result.get("ep", MISSING))),
        Fact("Data parallel (DP)", str(result.get("dp", MISSING))),
        Fact(
            "Devices",
            f"{result.get('devices', MISSING)}"
            + (f" of the pool's {pool['devices']}" if pool.get("devices") else ""),
        ),
        Fact("Nodes", _nodes_text(result.get("nodes"), per_node)),
        Fact("Serving dtype", str(result.get("dtype_label") or result.get("dtype") or MISSING)),
    ]
    if inputs:
        facts.append(
            Fact(
                "Planned for",
                f"{_number(inputs.get('context_tokens')) or 0:,.0f} tokens of context x "
                f"{inputs.get('concurrency', MISSING)} concurrent sequences",
            )
        )
    return facts


def _predicted(
    predicted: Mapping[str, Any], label: str = "predicted"
) -> tuple[list[Fact], list[Fact]]:
    """Decode rows (batch 1, the largest batch) and TTFT rows of a prediction, raw or
    calibrated, each decode label ending "({label})" (a TTFT row's too, but the raw one's:
    its table's caption says predicted)."""
    if not predicted.get("available"):
        return [], []
    batch_1, largest = (
        as_mapping(predicted.get("batch_1")),
        as_mapping(predicted.get("largest_batch")),
    )
    rows = [
        Fact(
            f"Decode at batch 1 ({label})",
            tokens_per_s_text(batch_1.get("decode_tokens_per_s")),
            f"TPOT {ms_text(batch_1.get('tpot_s'))}",
        )
    ]
    if largest:
        rows.append(
            Fact(
                f"Decode at {largest.get('concurrent_sequences', MISSING)} concurrent sequences, "
                f"the largest batch that fits ({label})",
                tokens_per_s_text(largest.get("decode_tokens_per_s")),
                f"TPOT {ms_text(largest.get('tpot_s'))}"
                + (
                    f"; {tokens_per_s_text(per_sequence)} per sequence"
                    if (per_sequence := largest.get("decode_tokens_per_s_per_sequence")) is not None
                    else ""
                ),
            )
        )
    prefill = [
        Fact(
            f"{_number(p.get('prompt_tokens')) or 0:,.0f} prompt tokens"
            + ("" if label == "predicted" else f" ({label})"),
            ms_text(p.get("ttft_s")),
        )
        for p in (as_mapping(x) for x in as_list(predicted.get("prefill")))
    ]
    return rows, prefill


def _calibrated(panel: PlanPanel, calibrated: Mapping[str, Any]) -> None:
    """Fill the panel's calibrated prediction (`predicted["calibrated"]`) beside the raw one:
    its speeds, the factor, basis, caveat and warning; or why there is none."""
    if not calibrated:
        return
    label = str(calibrated.get("label") or "calibrated prediction")
    if not calibrated.get("available"):
        panel.calibrated_reason = str(calibrated.get("reason") or "no calibration yet")
        return
    panel.calibrated, panel.calibrated_prefill = _predicted(calibrated, label)
    facts = []
    for key, name in (("decode_factor", "Decode factor"), ("prefill_factor", "Prefill factor")):
        factor = _number(calibrated.get(key))
        if factor is not None:
            facts.append(Fact(name, f"{factor:.3f}"))
    for key, name in (("basis", "Basis"), ("caveat", "Caveat"), ("warning", "Warning")):
        if calibrated.get(key):
            facts.append(Fact(name, str(calibrated[key])))
    panel.calibrated_facts = facts


def _figures_source(result: Mapping[str, Any], predicted: Mapping[str, Any]) -> str:
    """Where the plan's speed figures come from: the accelerator catalog (datasheets), or,
    for the cpu kind, what the pool's performance runs measured."""
    if result.get("accelerator") != "cpu":
        return "speeds predicted on the accelerator catalog's (datasheet) figures, not measured"
    if not predicted.get("available"):
        return "cpu: no measured memory bandwidth or FLOP/s, so no speed is predicted"
    measured = next(
        (str(n) for n in as_list(result.get("notes")) if str(n).startswith("cpu memory bandwidth")),
        "",
    )
    return (
        "speeds predicted on the memory bandwidth and FLOP/s measured by the pool's performance "
        "runs, not a datasheet's" + (f" ({measured})" if measured else "")
    )


def _runner_up(item: Mapping[str, Any]) -> RunnerUp:
    return RunnerUp(
        split=split_text(item),
        devices=item.get("devices"),
        fits=bool(item.get("fits")),
        memory=gib(item.get("memory_per_device_bytes")),
        decode=tokens_per_s_text(item.get("decode_tokens_per_s")),
        why_lost=str(item.get("why_lost") or ""),
    )


def _communication(comm: Mapping[str, Any]) -> tuple[list[CommRow], list[Fact]]:
    if not comm:
        return [], []
    rows = [
        CommRow(
            kind=kind,
            bytes_per_token=bytes_per_token(comm.get(volume)),
            crosses_nodes=bool(comm.get(crosses)),
            used=bool(_number(comm.get(volume))),
        )
        for kind, volume, crosses in (
            ("TP all-reduce", "tp_allreduce_bytes_per_token", "tp_crosses_nodes"),
            ("EP all-to-all", "ep_alltoall_bytes_per_token", "ep_crosses_nodes"),
            ("PP point-to-point", "pp_p2p_bytes_per_token", "pp_crosses_nodes"),
        )
    ]
    facts = [
        Fact(
            "Crosses nodes",
            "yes: part of the traffic takes the inter-node network"
            if comm.get("crosses_nodes")
            else "no: every group stays inside one node",
        ),
        Fact("Collectives per forward step", f"{comm.get('collectives_per_step', MISSING)}"),
    ]
    if comm.get("formula"):
        facts.append(Fact("Formula", str(comm["formula"])))
    return rows, facts


def _scaling(scaling: Iterable[Any], per_node: Any) -> list[ScalingRow]:
    rows = []
    for point in (as_mapping(p) for p in scaling):
        if not point.get("devices"):
            continue
        efficiency = _number(point.get("efficiency_per_device"))
        rows.append(
            ScalingRow(
                devices=point["devices"],
                nodes=_nodes_text(point.get("nodes"), per_node),
                split=split_text(point),
                decode=tokens_per_s_text(point.get("decode_tokens_per_s")),
                per_device=tokens_per_s_text(point.get("decode_tokens_per_s_per_device")),
                efficiency=MISSING if efficiency is None else f"{efficiency:.2f}",
                within_pool=bool(point.get("within_pool", True)),
                above_one=efficiency is not None and round(efficiency, 2) > 1,
            )
        )
    return rows


def _would_fit(suggestions: Mapping[str, Any], *, kind: str, per_node: Any) -> list[str]:
    """What the planner said would fit: more devices, a smaller context, a lower dtype."""
    would = []
    devices = _number(suggestions.get("devices"))
    if devices:
        nodes = f" ({_nodes_text(-(-int(devices) // int(per_node)), per_node)})" if per_node else ""
        would.append(f"{int(devices)} x {kind or 'devices'}{nodes}")
    context = _number(suggestions.get("context_tokens"))
    if context:
        would.append(f"this pool with a context of {context:,.0f} tokens")
    if suggestions.get("dtype"):
        would.append(f"this pool at dtype {suggestions['dtype']}")
    return would


def _failure(run: StageRun, result: Mapping[str, Any]) -> PlanFailure:
    reason = str(result.get("reason") or result.get("error") or run.error or "").strip()
    pool = as_mapping(result.get("pool"))
    per_node = pool.get("devices_per_node") or run.job.pool.devices_per_node
    kind = str(result.get("accelerator") or run.job.pool.accelerator or "")
    return PlanFailure(
        reason=reason or "the plan stage failed without a reason",
        fits_false=result.get("fits") is False,
        would_fit=_would_fit(as_mapping(result.get("suggestions")), kind=kind, per_node=per_node),
    )


def _planned(
    panel: PlanPanel, result: Mapping[str, Any], measured: Mapping[str, Any] | None = None
) -> None:
    """Fill `panel` from a succeeded plan's result, with the scaling point the job's
    `distributed` run measured on the twin (`measured_scaling`) when there is one."""
    stem = panel.dom_id
    memory = as_mapping(result.get("memory_per_device_bytes"))
    predicted = as_mapping(result.get("predicted"))
    per_node = as_mapping(result.get("pool")).get("devices_per_node")
    panel.state = "planned"
    panel.split = split_text(result)
    panel.facts = _facts(result)
    panel.memory = [
        Fact(label, gib(memory.get(key))) for key, label in _MEMORY_ROWS if key in memory
    ]
    panel.weights_by_dtype = [
        Fact(str(label), gib(value))
        for label, value in as_mapping(result.get("memory_weights_by_dtype_bytes")).items()
    ]
    panel.predicted, panel.prefill = _predicted(predicted)
    if not predicted.get("available"):
        panel.predicted_reason = str(predicted.get("reason") or "no prediction")
    _calibrated(panel, as_mapping(predicted.get("calibrated")))
    panel.figures_source = _figures_source(result, predicted)
    figures = (
        (
            "memory",
            plan_charts.memory_per_device(memory, split=result),
            "Memory per device by part, in GiB (predicted)",
            "chart-short",
        ),
        (
            "decode",
            plan_charts.decode_curve(predicted),
            "Predicted decode tokens/s and TPOT against concurrent sequences",
            "",
        ),
        (
            "prefill",
            plan_charts.prefill_curve(predicted),
            "Predicted time to first token against prompt length",
            "",
        ),
        (
            "scaling",
            plan_charts.scaling_curve(as_list(result.get("scaling")), measured),
            "Predicted decode tokens/s and efficiency per device against device count"
            + (", with the scaling efficiency measured on the twin" if measured else ""),
            "",
        ),
    )
    panel.charts = [
        ChartSlot(f"{stem}-{name}", figure, label, css)
        for name, figure, label, css in figures
        if figure is not None
    ]
    scaling = [as_mapping(p) for p in as_list(result.get("scaling"))]
    if measured:
        first = next((p["devices"] for p in scaling if p.get("devices")), None)
        panel.measured_scaling = measured_scaling_text(measured, first_devices=first)
    if any(_number(p.get("decode_tokens_per_s")) is not None for p in scaling):
        panel.scaling = _scaling(scaling, per_node)
        if any(row.above_one for row in panel.scaling):
            panel.scaling_note = EFFICIENCY_ABOVE_ONE
    else:  # a split per count, but no speed to draw: say why instead of an empty chart
        panel.scaling_reason = panel.predicted_reason or str(
            predicted.get("reason") or "no prediction for any device count"
        )
    panel.runners_up = [_runner_up(as_mapping(r)) for r in as_list(result.get("runners_up"))]
    panel.communication, panel.communication_facts = _communication(
        as_mapping(result.get("communication"))
    )
    artifacts = as_mapping(result.get("artifacts"))
    panel.artifacts = [
        Artifact(title, str(artifacts[key]), f"{stem}-artifact-{key.replace('_', '-')}")
        for key, title in _ARTIFACTS
        if artifacts.get(key)
    ]
    panel.artifact_notes = [str(n) for n in as_list(artifacts.get("notes"))]
    panel.assumptions = [str(a) for a in as_list(result.get("assumptions"))]
    panel.notes = [str(n) for n in as_list(result.get("notes"))] + [
        f"validity: {flag}" for flag in as_list(result.get("validity_flags"))
    ]


def start_facts(estimate: Mapping[str, Any]) -> list[Fact]:
    """`inventory.plan_start_estimate`'s answer as facts: whether the plan can start now on
    its pool, the devices it needs against those reported and free, its place in the queue,
    and the estimated start with its basis (an estimate, never a promise)."""
    start = parse_datetime(str(estimate.get("estimated_start_at") or ""))
    source = str(estimate.get("devices_source") or "reported")
    counted = (
        f"live workers report {estimate.get('devices_reported', MISSING)}"
        if source == "reported"
        else f"{estimate.get('devices_reported', MISSING)} {source}"
    )
    facts = [
        Fact("Can start now", "yes" if estimate.get("can_start_now") else "no"),
        Fact(
            "Devices needed",
            f"{estimate.get('devices_needed', MISSING)}; {counted}, "
            f"{estimate.get('devices_free', MISSING)} free",
        ),
        Fact("Jobs ahead in the queue", str(estimate.get("queue_position", MISSING))),
        Fact(
            "Estimated start",
            f"{start:%Y-%m-%d %H:%M:%S} UTC (estimate)" if start else "no estimate",
            str(estimate.get("estimate_basis") or ""),
        ),
    ]
    if estimate.get("reason"):
        facts.append(Fact("Why", str(estimate["reason"])))
    return facts


def plan_panel(
    job: AdaptationJob, *, pools_without_worker: Mapping[int, AcceleratorPool] | None = None
) -> PlanPanel | None:
    """The plan panel of `job` (stage runs prefetched), or None when it has no `plan` run.
    `pools_without_worker` (by id, `selectors.workers.pools_without_live_worker`) marks a pending or
    queued plan whose pool no live worker serves as waiting for one."""
    latest = latest_runs_by_stage(job)
    run = latest.get(PLAN_STAGE)
    if run is None:
        return None
    result = as_mapping(run.result)
    panel = PlanPanel(
        job=job,
        run=run,
        pool_name=job.pool.name,
        accelerator=str(result.get("accelerator_name") or job.pool.accelerator or ""),
        compare_query=plan_query(
            as_mapping(result.get("inputs")) or as_mapping(job.options).get("plan")
        ),
    )
    if run.status == StageStatus.SUCCEEDED and result:
        _planned(panel, result, measured_scaling(latest.get(DISTRIBUTED_STAGE)))
        devices = result.get("devices")
        # "When can it run" only while the job is active: a finished job has run.
        if (
            job.status in (JobStatus.PENDING, JobStatus.RUNNING)
            and isinstance(devices, int)
            and not isinstance(devices, bool)
            and devices >= 1
        ):
            panel.start = start_facts(plan_start_estimate(pool=job.pool, devices=devices, job=job))
    elif run.status == StageStatus.FAILED:
        panel.state = "failed"
        panel.failure = _failure(run, result)
    elif run.status in (StageStatus.PENDING, StageStatus.QUEUED):
        panel.waiting_for = (pools_without_worker or {}).get(job.pool_id)
    return panel


def plan_panels(
    release: ModelRelease, *, pools_without_worker: Mapping[int, AcceleratorPool] | None = None
) -> list[PlanPanel]:
    """A plan panel per job of the release with a `plan` run, newest job first (jobs and
    their stage runs prefetched, as `selectors.release_detail` does); `pools_without_worker`
    as for `plan_panel`."""
    return [
        panel
        for job in release.jobs.all()
        if (panel := plan_panel(job, pools_without_worker=pools_without_worker)) is not None
    ]


# --- compare pools --------------------------------------------------------------------------


@dataclass(frozen=True)
class CompareRow:
    """How one configured pool, or one catalog kind on as many nodes as it needs, would serve
    the release. Speeds, TPOT and memory are the planner's predictions.

    `verdict` is short ("does not fit the pool"); `would_fit` what the planner says would,
    and `reason` the planner's whole explanation (why it does not fit, or why a fitting row
    has no prediction). `fewest_devices` and `most_tokens_per_device` mark the fitting rows
    that need the fewest devices and that predict the most decode tokens/s per device."""

    name: str
    source: str  # "pool" or "catalog kind"
    accelerator: str
    layout: str
    fits: bool
    verdict: str
    devices: int | None = None
    nodes: int | None = None
    split: str = MISSING
    dtype: str = MISSING  # the planner's label, in full
    dtype_short: str = MISSING  # the same in a few words, for a table cell
    batch_1_tokens_per_s: float | None = None
    largest_tokens_per_s: float | None = None
    largest_sequences: int | None = None
    tpot_batch_1_s: float | None = None
    tpot_largest_s: float | None = None
    memory_used_bytes: float | None = None
    memory_capacity_bytes: float | None = None
    reason: str = ""
    would_fit: str = ""
    note: str = ""
    inputs: Mapping[str, Any] = field(default_factory=dict)
    fewest_devices: bool = False
    most_tokens_per_device: bool = False

    def sort_key(self) -> tuple:
        """Fitting rows first; among them the fewest nodes, then the most predicted decode
        tokens/s per device at the largest batch (devices of different kinds are not worth
        the same: a count of devices alone ranks a slow kind first), then fewer devices."""
        return (
            not self.fits,
            self.nodes if self.fits and self.nodes else float("inf"),
            -(self.tokens_per_s_per_device or 0.0),
            self.devices if self.fits and self.devices else float("inf"),
            self.source != "pool",
            self.name,
        )

    @property
    def tokens_per_s_per_device(self) -> float | None:
        """Predicted decode tokens/s at the largest batch, per device of the split."""
        if self.largest_tokens_per_s is None or not self.devices:
            return None
        return self.largest_tokens_per_s / self.devices

    @property
    def per_device_text(self) -> str:
        return tokens_per_s_text(self.tokens_per_s_per_device)

    @property
    def unpredicted(self) -> bool:
        """A fitting row without predicted speeds: `reason` says why."""
        return self.fits and self.batch_1_tokens_per_s is None and self.largest_tokens_per_s is None

    @property
    def batch_1_text(self) -> str:
        return tokens_per_s_text(self.batch_1_tokens_per_s)

    @property
    def largest_text(self) -> str:
        return tokens_per_s_text(self.largest_tokens_per_s)

    @property
    def tpot_batch_1_text(self) -> str:
        return ms_text(self.tpot_batch_1_s)

    @property
    def tpot_largest_text(self) -> str:
        return ms_text(self.tpot_largest_s)

    @property
    def memory_text(self) -> str:
        if self.memory_used_bytes is None:
            return MISSING
        return f"{gib(self.memory_used_bytes)} of {gib(self.memory_capacity_bytes)}"


@dataclass
class Comparison:
    """The compare-pools table of one release's analysis, in `CompareRow.sort_key` order."""

    analysis_run: StageRun | None
    rows: list[CompareRow] = field(default_factory=list)
    error: str = ""
    inputs: str = ""
    chart: ChartSlot | None = None


def _row_from_plan(
    plan: Mapping[str, Any], *, name: str, source: str, layout: str, verdict: str
) -> CompareRow:
    predicted = as_mapping(plan.get("predicted"))
    batch_1, largest = (
        as_mapping(predicted.get("batch_1")),
        as_mapping(predicted.get("largest_batch")),
    )
    memory = as_mapping(plan.get("memory_per_device_bytes"))
    return CompareRow(
        name=name,
        source=source,
        accelerator=str(plan.get("accelerator_name") or plan.get("accelerator") or ""),
        layout=layout,
        fits=bool(plan.get("fits")),
        verdict=verdict,
        devices=plan.get("devices"),
        nodes=plan.get("nodes"),
        split=split_text(plan),
        dtype=str(plan.get("dtype_label") or plan.get("dtype") or MISSING),
        dtype_short=short_dtype_label(plan.get("dtype"), plan.get("dtype_label")),
        batch_1_tokens_per_s=_number(batch_1.get("decode_tokens_per_s")),
        largest_tokens_per_s=_number(largest.get("decode_tokens_per_s")),
        largest_sequences=largest.get("concurrent_sequences"),
        tpot_batch_1_s=_number(batch_1.get("tpot_s")),
        tpot_largest_s=_number(largest.get("tpot_s")),
        memory_used_bytes=_number(memory.get("total_used")),
        memory_capacity_bytes=_number(memory.get("capacity")),
        reason="" if predicted.get("available") else str(predicted.get("reason") or ""),
        inputs=as_mapping(plan.get("inputs")),
    )


def devices_text(count: Any) -> str:
    """A device count with its noun: "1 device", "8 devices"."""
    return f"{count} device" if count == 1 else f"{count} devices"


def _devices_verdict(devices: int, nodes: int, per_node: int) -> str:
    if nodes > 1:
        return f"needs {nodes} nodes ({devices_text(devices)})"
    return f"fits on {devices_text(devices)} of one node of {per_node}"


def _plan_kind(
    analysis: Mapping[str, Any],
    accelerator: Accelerator,
    *,
    release: str,
    catalog: Catalog,
    options: Mapping[str, Any],
) -> CompareRow:
    """A catalog kind on one node of its `devices_per_node`, else on the fewest whole nodes
    the planner says would fit, up to `COMPARE_MAX_NODES`."""
    per_node = accelerator.devices_per_node
    name, source = accelerator.kind, "catalog kind"
    failed = {"name": name, "source": source, "accelerator": accelerator.name, "fits": False}
    nodes = 1
    try:
        try:
            plan = plan_release(
                analysis,
                PoolLayout(accelerator.kind, per_node, 1),
                release=release,
                catalog=catalog,
                **options,
            )
        except NoFittingPlan as err:
            devices = _number(err.suggestions.get("devices"))
            if not devices:
                return CompareRow(
                    **failed,
                    layout=_nodes_text(1, per_node),
                    verdict="does not fit",
                    reason=str(err),
                )
            nodes = -(-int(devices) // per_node)
            if nodes > COMPARE_MAX_NODES:
                return CompareRow(
                    **failed,
                    layout=_nodes_text(COMPARE_MAX_NODES, per_node),
                    verdict=f"needs {nodes} nodes ({devices_text(int(devices))})",
                    reason=f"more than the {COMPARE_MAX_NODES} nodes compared here; {err}",
                )
            plan = plan_release(
                analysis,
                PoolLayout(accelerator.kind, per_node, nodes),
                release=release,
                catalog=catalog,
                **options,
            )
    except (NoFittingPlan, PlanInputError, CatalogError) as err:
        return CompareRow(
            **failed, layout=_nodes_text(nodes, per_node), verdict="cannot plan", reason=str(err)
        )
    result = plan.to_dict()
    return _row_from_plan(
        result,
        name=name,
        source=source,
        layout=_nodes_text(result["nodes"], per_node),
        verdict=_devices_verdict(result["devices"], result["nodes"], per_node),
    )


def _plan_pool(
    analysis: Mapping[str, Any],
    pool: AcceleratorPool,
    *,
    release: str,
    options: Mapping[str, Any],
    catalog: Catalog,
) -> CompareRow:
    """A configured pool with its real layout (nodes, devices per node, bandwidths) and its
    catalog as `catalog.pool_catalog` gives it (a cpu pool: its live worker's machine), from
    `catalog` (`AcceleratorKind.objects.catalog()`, loaded once for every row)."""
    failed = {"name": pool.name, "source": "pool", "fits": False}
    try:
        catalog, layout, note = pool_catalog(pool, catalog)
        accelerator = catalog.accelerator(layout.accelerator)
    except (CatalogError, PlanInputError) as err:
        return CompareRow(
            **failed, accelerator="", layout=MISSING, verdict="cannot plan", reason=str(err)
        )
    shape = f"{_nodes_text(layout.nodes, layout.devices_per_node)} ({devices_text(layout.devices)})"
    try:
        plan = plan_release(analysis, layout, release=release, catalog=catalog, **options)
    except NoFittingPlan as err:
        would = _would_fit(err.suggestions, kind=accelerator.kind, per_node=layout.devices_per_node)
        return CompareRow(
            **failed,
            accelerator=accelerator.name,
            layout=shape,
            verdict="does not fit the pool",
            would_fit="; ".join(would),
            reason=str(err),
            note=note,
        )
    except (PlanInputError, CatalogError) as err:
        return CompareRow(
            **failed,
            accelerator=accelerator.name,
            layout=shape,
            verdict="cannot plan",
            reason=str(err),
            note=note,
        )
    result = plan.to_dict()
    row = _row_from_plan(
        result,
        name=pool.name,
        source="pool",
        layout=shape,
        verdict=(
            f"fits the pool on {result['devices']} of its {devices_text(layout.devices)}"
            if layout.devices != 1
            else "fits the pool's single device"
        ),
    )
    return replace(row, note=note)


def _marked(rows: list[CompareRow]) -> list[CompareRow]:
    """`rows` with the fitting ones that need the fewest devices marked `fewest_devices`, and
    those predicting the most decode tokens/s per device marked `most_tokens_per_device`
    (ties all marked)."""
    fitting = [r for r in rows if r.fits and r.devices]
    fewest = min((r.devices for r in fitting), default=None)
    if len({r.devices for r in fitting}) < 2:
        fewest = None  # every fitting row needs as many devices: the badge would say nothing
    fastest = max((r.tokens_per_s_per_device or 0.0 for r in fitting), default=0.0)
    return [
        replace(
            row,
            fewest_devices=row.fits and fewest is not None and row.devices == fewest,
            most_tokens_per_device=row.fits
            and fastest > 0
            and row.tokens_per_s_per_device == fastest,
        )
        for row in rows
    ]


def _inputs_text(rows: Sequence[CompareRow], options: Mapping[str, Any]) -> str:
    inputs = next((r.inputs for r in rows if r.inputs), None)
    if not inputs:
        return ""
    defaults = [
        name
        for name, key in (("context", "context_tokens"), ("concurrency", "concurrency"))
        if options.get(key) is None
    ]
    dtype = options.get("dtype") or "checkpoint"
    text = (
        f"Planned for {_number(inputs.get('context_tokens')) or 0:,.0f} tokens of context x "
        f"{inputs.get('concurrency', MISSING)} concurrent sequences, serving dtype {dtype}"
    )
    if defaults:
        text += f" ({' and '.join(defaults)}: the planner's default)"
    return text + "."


def compare_pools(
    release: ModelRelease,
    *,
    pools: Iterable[AcceleratorPool],
    context_tokens: int | None = None,
    concurrency: int | None = None,
    dtype: str | None = None,
    catalog: Catalog | None = None,
) -> Comparison:
    """Plan the release's latest succeeded analysis on each catalog kind and each given pool.

    Rows that fit come first, by fewest nodes, then the most predicted decode tokens/s per
    device at the largest batch; then those that do not fit. No row is "best": kinds differ,
    so two marks say what each row is best at (`fewest_devices`, `most_tokens_per_device`).
    A row that cannot be planned says why; nothing raises. The catalog (file plus admin
    rows) is loaded once for all rows. `release` has its jobs and stage runs prefetched."""
    run = latest_analysis_run(release)
    comparison = Comparison(analysis_run=run)
    if run is None or not isinstance(run.result, Mapping):
        return comparison
    try:
        catalog = catalog or AcceleratorKind.objects.catalog()
    except CatalogError as err:
        comparison.error = f"The accelerator catalog cannot be read: {err}"
        return comparison
    options = {"context_tokens": context_tokens, "concurrency": concurrency, "dtype": dtype}
    rows = [
        _plan_pool(run.result, pool, release=release.repo_id, options=options, catalog=catalog)
        for pool in pools
    ]
    rows += [
        _plan_kind(
            run.result,
            catalog.accelerator(kind),
            release=release.repo_id,
            catalog=catalog,
            options=options,
        )
        for kind in catalog.kinds()
    ]
    rows.sort(key=CompareRow.sort_key)
    comparison.rows = _marked(rows)
    comparison.inputs = _inputs_text(rows, options)
    figure = compare_pools_charts.throughput(
        [
            (
                r.name,
                r.devices,
                r.batch_1_tokens_per_s,
                r.largest_tokens_per_s,
            )
            for r in rows
            if r.fits
        ]
    )
    if figure is not None:
        comparison.chart = ChartSlot(
            "compare-pools", figure, "Predicted decode tokens/s of each pool that fits"
        )
    return comparison
