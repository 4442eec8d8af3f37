"""The plan stage's result, typed: what `run.run` returns (`Plan.to_dict()` plus
`catalog_version` and the calibrated prediction) or what a plan that fits nothing keeps
(`run.no_fit_result`), read back, and every judgement made of it.

`PlanResult.from_stored(mapping)` reads a stored row whatever version of the stage wrote it:
a missing key reads as None or empty, a value of the wrong type is ignored (`engine.stored`),
and it never raises. The stage's release-notes section, the release page's plan panel and
its charts, the compare-pools rows and the full-size readers (the serve and performance
panels, the reports, the release notes' full-size section) ask it, never the raw dict; the
judgements (whether it fits, where its speeds come from, the sequences it holds, the KV room
per device, the launch commands) are its methods, written once here.

Memory is in bytes, times in seconds, throughput tokens/s. Plain Python: neither Django nor
torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.formatting import finite
from engine.stored import as_count, as_list, as_mapping, flag, text, whole_number

# The scopes `refit.py` writes for fits of published serving results (one accelerator and
# engine, the engine over every accelerator, or every row); `fits.pool_fit` writes "pool",
# `fits.fit_for` "prior".
PUBLISHED_SCOPES = ("accelerator+engine", "engine", "all")

# Where a plan's speed figures come from (`PlanResult.speeds_from`): the accelerator catalog's
# datasheet figures; a cpu pool whose performance runs measured nothing yet (no speed
# predicted); a cpu pool, on what its performance runs measured.
CATALOG = "catalog"
CPU_UNMEASURED = "cpu-unmeasured"
CPU_MEASURED = "cpu-measured"

# The deployment artifacts a plan writes (`artifacts.build_artifacts`), in the order shown.
ARTIFACT_KINDS = ("vllm", "sglang", "kubernetes_deployment")
# The engines whose launch command the release notes quote.
LAUNCH_ENGINES = ("vllm", "sglang")
# The collectives per generated token (`communication.Communication.to_dict`): the split's
# degree and the key its bytes per token are stored under.
COLLECTIVES = (("tp", "tp_allreduce"), ("ep", "ep_alltoall"), ("pp", "pp_p2p"))


def _texts(value: Any) -> list[str]:
    """A stored list as text, item by item (a list of another shape reads as empty)."""
    return [str(item) for item in as_list(value)]


# --- the split and the pool ---------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    """A parallel split as the planner gives it: tensor, pipeline, expert and data parallel
    degrees (None where the row lacks one; `formatting.split` writes "TP1 PP1 EP8 DP8")."""

    tp: int | None = None
    pp: int | None = None
    ep: int | None = None
    dp: int | None = None

    @classmethod
    def from_stored(cls, value: Any) -> Split:
        row = as_mapping(value)
        return cls(*(whole_number(row.get(key)) for key in ("tp", "pp", "ep", "dp")))

    def to_dict(self) -> dict[str, int | None]:
        return {"tp": self.tp, "pp": self.pp, "ep": self.ep, "dp": self.dp}

    @property
    def any(self) -> bool:
        """Whether the row names any degree."""
        return any(size is not None for size in (self.tp, self.pp, self.ep, self.dp))

    def launched_at(self, tp: int) -> Split:
        """The split a launch of this plan at `tp` runs at (the serve stage's full-size run
        and its smaller degrees): the plan's PP and DP (1 where not said), its EP group being
        TP x DP where the plan has expert parallelism, else 1."""
        pp, dp, ep = self.pp or 1, self.dp or 1, self.ep or 1
        return Split(tp=tp, pp=pp, ep=tp * dp if ep > 1 else 1, dp=dp)


@dataclass(frozen=True)
class PoolShape:
    """The pool a plan was made for: devices per node, nodes and devices in all."""

    devices_per_node: int | None
    nodes: int | None
    devices: int | None

    @classmethod
    def from_stored(cls, value: Any) -> PoolShape | None:
        pool = as_mapping(value)
        if not pool:
            return None
        return cls(
            devices_per_node=whole_number(pool.get("devices_per_node")),
            nodes=whole_number(pool.get("nodes")),
            devices=whole_number(pool.get("devices")),
        )

    def to_dict(self) -> dict[str, int | None]:
        return {
            "devices_per_node": self.devices_per_node,
            "nodes": self.nodes,
            "devices": self.devices,
        }


@dataclass(frozen=True)
class PlanInputs:
    """What the plan was made for: context (tokens per sequence), concurrent sequences, the
    serving dtype and the KV cache's ("" where not said)."""

    context_tokens: int | None
    concurrency: int | None
    dtype: str
    kv_dtype: str = ""

    @classmethod
    def from_stored(cls, value: Any) -> PlanInputs | None:
        inputs = as_mapping(value)
        if not inputs:
            return None
        return cls(
            context_tokens=whole_number(inputs.get("context_tokens")),
            concurrency=whole_number(inputs.get("concurrency")),
            dtype=text(inputs.get("dtype")),
            kv_dtype=text(inputs.get("kv_dtype")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The inputs as the plan options name them, those set only."""
        values = {
            "context_tokens": self.context_tokens,
            "concurrency": self.concurrency,
            "dtype": self.dtype,
            "kv_dtype": self.kv_dtype,
        }
        return {key: value for key, value in values.items() if value not in (None, "")}


@dataclass(frozen=True)
class Suggestions:
    """What the planner says would fit when nothing does (`NoFittingPlan.suggestions`): that
    many devices of the pool's kind, a context of that many tokens, or a serving dtype (each
    None or "" where it would not)."""

    devices: int | None = None
    context_tokens: int | None = None
    dtype: str = ""

    @classmethod
    def from_stored(cls, value: Any) -> Suggestions:
        row = as_mapping(value)
        return cls(
            devices=whole_number(row.get("devices")),
            context_tokens=whole_number(row.get("context_tokens")),
            dtype=text(row.get("dtype")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The suggestions made, as the planner names them."""
        values = {
            "devices": self.devices,
            "context_tokens": self.context_tokens,
            "dtype": self.dtype,
        }
        return {key: value for key, value in values.items() if value}


@dataclass(frozen=True)
class MeasuredDevice:
    """The cpu figures a plan predicted on, measured by the pool's performance runs (not a
    datasheet's): memory bandwidth (bytes/s), BF16 FLOP/s, where they come from, and whether
    only probes on a busy host had them (`plan.planner.measured_device`)."""

    memory_bandwidth_bytes_per_s: float | None
    dense_bf16_flops: float | None
    source: str
    host_busy: bool

    @classmethod
    def from_stored(cls, value: Any) -> MeasuredDevice | None:
        device = as_mapping(value)
        if not device:
            return None
        return cls(
            memory_bandwidth_bytes_per_s=finite(device.get("memory_bandwidth_bytes_per_s")),
            dense_bf16_flops=finite(device.get("dense_bf16_flops")),
            source=text(device.get("source")),
            host_busy=device.get("host_busy") is True,
        )


# --- the predictions ----------------------------------------------------------------------


@dataclass(frozen=True)
class StoredFit:
    """The fit a full-size prediction names (`fits.Fit.to_dict`): the accelerator and engine
    it was fitted for ("*": every one), its `scope` as stored, the points it was fitted on,
    its residual (the geometric-mean error factor on them, 1.0 exact; None for a prior) and
    its source."""

    accelerator: str
    engine: str
    scope: str
    points: int | None
    residual: float | None
    source: str

    @classmethod
    def from_stored(cls, value: Any) -> StoredFit | None:
        """A stored fit (`predicted.fit`, `full_size.predicted_before.fit`), None without
        one."""
        fit = as_mapping(value)
        if not fit:
            return None
        return cls(
            accelerator=text(fit.get("accelerator")),
            engine=text(fit.get("engine")),
            scope=text(fit.get("scope")),
            points=whole_number(fit.get("points")),
            residual=finite(fit.get("residual")),
            source=text(fit.get("source")),
        )

    @property
    def basis(self) -> str:
        """What the fit rests on: "pool" (the pool's own full-size sweeps), "published"
        (published serving results) or "prior" (no data: the literature's prior)."""
        if self.scope == "pool":
            return "pool"
        return "published" if self.scope in PUBLISHED_SCOPES else "prior"

    def to_dict(self) -> dict[str, Any]:
        """{"accelerator", "engine", "scope", "basis", "points", "residual", "source"}."""
        return {
            "accelerator": self.accelerator,
            "engine": self.engine,
            "scope": self.scope,
            "basis": self.basis,
            "points": self.points,
            "residual": self.residual,
            "source": self.source,
        }


@dataclass(frozen=True)
class DecodePoint:
    """A predicted decode point (`predictor.decode_point`): concurrent sequences, tokens/s
    over all replicas, time per output token (s), tokens/s per sequence, and the average
    context each sequence's KV cache is read at (tokens); None where the row has none."""

    sequences: int | None = None
    tokens_per_s: float | None = None
    tpot_s: float | None = None
    per_sequence: float | None = None
    context_tokens: float | None = None

    @classmethod
    def from_stored(cls, value: Any) -> DecodePoint:
        point = as_mapping(value)
        return cls(
            sequences=whole_number(point.get("concurrent_sequences")),
            tokens_per_s=finite(point.get("decode_tokens_per_s")),
            tpot_s=finite(point.get("tpot_s")),
            per_sequence=finite(point.get("decode_tokens_per_s_per_sequence")),
            context_tokens=finite(point.get("context_tokens")),
        )


@dataclass(frozen=True)
class PrefillPoint:
    """The predicted time to first token (s) of one idle prompt of `prompt_tokens`."""

    prompt_tokens: int | None
    ttft_s: float | None

    @classmethod
    def from_stored(cls, value: Any) -> PrefillPoint:
        point = as_mapping(value)
        return cls(whole_number(point.get("prompt_tokens")), finite(point.get("ttft_s")))


@dataclass(frozen=True)
class SpeedPrediction:
    """A plan's speed prediction, raw or calibrated: decode at batch 1 and at the largest
    batch that fits (None when the row has none), the decode curve from batch 1 to it, and
    the time to first token per prompt length."""

    batch_1: DecodePoint
    largest: DecodePoint | None
    decode_curve: list[DecodePoint]
    prefill: list[PrefillPoint]

    @classmethod
    def from_stored(cls, value: Any) -> SpeedPrediction | None:
        """None when the prediction is not available (its `reason` says why)."""
        predicted = as_mapping(value)
        if not predicted.get("available"):
            return None
        largest = as_mapping(predicted.get("largest_batch"))
        return cls(
            batch_1=DecodePoint.from_stored(predicted.get("batch_1")),
            largest=DecodePoint.from_stored(largest) if largest else None,
            decode_curve=[
                DecodePoint.from_stored(p)
                for p in as_list(predicted.get("decode_curve"))
                if isinstance(p, Mapping)
            ],
            prefill=[
                PrefillPoint.from_stored(p)
                for p in as_list(predicted.get("prefill"))
                if isinstance(p, Mapping)
            ],
        )


@dataclass(frozen=True)
class Calibration:
    """What the pool's running calibration says beside the plan's prediction
    (`predicted["calibrated"]`, `calibration.calibrated_predictions`): a calibrated prediction
    where an older plan applied one (None otherwise: `reason` says why), its name, the decode
    and prefill factors, the runs it rests on, and its basis, caveat and warning."""

    prediction: SpeedPrediction | None
    reason: str = ""
    label: str = ""
    decode_factor: float | None = None
    prefill_factor: float | None = None
    runs: int | None = None
    basis: str = ""
    caveat: str = ""
    warning: str = ""

    @classmethod
    def from_stored(cls, value: Any) -> Calibration | None:
        """None when the plan holds nothing of a calibration."""
        calibrated = as_mapping(value)
        if not calibrated:
            return None
        if not calibrated.get("available"):
            return cls(prediction=None, reason=text(calibrated.get("reason")))
        return cls(
            prediction=SpeedPrediction.from_stored(calibrated),
            label=text(calibrated.get("label")),
            decode_factor=finite(calibrated.get("decode_factor")),
            prefill_factor=finite(calibrated.get("prefill_factor")),
            runs=whole_number(calibrated.get("runs")),
            basis=text(calibrated.get("basis")),
            caveat=text(calibrated.get("caveat")),
            warning=text(calibrated.get("warning")),
        )


@dataclass(frozen=True)
class PredictedPoint:
    """One predicted load of a served workload (`predictor.py` `workload`): requests in
    flight, sequences decoded at once, output tokens/s over every device (and per device,
    where the plan gives it), TTFT, TPOT and end-to-end (s)."""

    concurrency: int | float | None
    batch: float | None
    output_tokens_per_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    output_tokens_per_s_per_device: float | None = None

    @classmethod
    def from_stored(cls, value: Any) -> PredictedPoint:
        """A stored predicted point ({"concurrency", "batch", "output_tokens_per_s",
        "ttft_s", "tpot_s", "e2e_s", "output_tokens_per_s_per_device"}); a missing figure
        reads None."""
        point = as_mapping(value)
        return cls(
            concurrency=as_count(point.get("concurrency")),
            batch=finite(point.get("batch")),
            output_tokens_per_s=finite(point.get("output_tokens_per_s")),
            ttft_s=finite(point.get("ttft_s")),
            tpot_s=finite(point.get("tpot_s")),
            e2e_s=finite(point.get("e2e_s")),
            output_tokens_per_s_per_device=finite(point.get("output_tokens_per_s_per_device")),
        )


def predicted_points(value: Any) -> list[PredictedPoint]:
    """A stored curve's points, those without a concurrency left out."""
    points = [PredictedPoint.from_stored(p) for p in as_list(value)]
    return [p for p in points if p.concurrency is not None]


@dataclass(frozen=True)
class PlanPool:
    """One pool of a disaggregated deployment as the plan predicts it: requests in flight,
    tokens/s of its phase (input for prefill, output for decode) and its latency (TTFT for
    prefill, TPOT for decode; s)."""

    concurrency: int | float | None
    tokens_per_s: float | None
    latency_s: float | None

    @classmethod
    def from_stored(cls, value: Any, tokens_key: str, latency_key: str) -> PlanPool | None:
        pool = as_mapping(value)
        if not pool:
            return None
        return cls(
            concurrency=as_count(pool.get("concurrency")),
            tokens_per_s=finite(pool.get(tokens_key)),
            latency_s=finite(pool.get(latency_key)),
        )


@dataclass(frozen=True)
class PlanWorkload:
    """The plan's predicted served workload (`predicted.workload`): the lengths, KV dtype and
    engine it was predicted for, the throughput-optimal load (`max_load`, with what bounds
    its batch: "kv_cache", "engine" (its running cap) or "concurrency", and the KV cache's
    sequences), the curve from concurrency 1 to it, the prefill and decode pools, and the
    fit it names."""

    input_tokens: int | None
    output_tokens: int | None
    kv_dtype: str
    engine: str
    max_load: PredictedPoint | None
    bound_by: str
    kv_capacity_sequences: int | None
    curve: list[PredictedPoint]
    prefill_pool: PlanPool | None
    decode_pool: PlanPool | None
    fit: StoredFit | None

    @classmethod
    def from_stored(cls, predicted: Any) -> PlanWorkload | None:
        """The workload of a plan's `predicted`, None when it predicted none (an older plan,
        or one without a prediction: its `predicted.reason` says why)."""
        predicted = as_mapping(predicted)
        workload = as_mapping(predicted.get("workload"))
        if not predicted.get("available") or not workload:
            return None
        best = as_mapping(workload.get("max_load"))
        return cls(
            input_tokens=whole_number(workload.get("input_tokens")),
            output_tokens=whole_number(workload.get("output_tokens")),
            kv_dtype=text(workload.get("kv_dtype")),
            engine=text(workload.get("engine")),
            max_load=PredictedPoint.from_stored(best) if best else None,
            bound_by=text(best.get("batch_bound_by")),
            kv_capacity_sequences=whole_number(best.get("kv_capacity_sequences")),
            curve=predicted_points(workload.get("curve")),
            prefill_pool=PlanPool.from_stored(
                workload.get("prefill_pool"), "input_tokens_per_s", "ttft_s"
            ),
            decode_pool=PlanPool.from_stored(
                workload.get("decode_pool"), "output_tokens_per_s", "tpot_s"
            ),
            fit=StoredFit.from_stored(predicted.get("fit")),
        )


# --- the tables ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ScalingPoint:
    """One device count of the predicted scaling curve (`scaling.scaling_curve`): its best
    fitting split, the nodes it takes, the decode tokens/s in all and per device, the
    efficiency per device against the curve's first count, and whether the pool has that
    many devices."""

    devices: int
    nodes: int | float | None
    split: Split
    tokens_per_s: float | None
    tokens_per_s_per_device: float | None
    efficiency: float | None
    within_pool: bool

    @classmethod
    def from_stored(cls, value: Any) -> ScalingPoint | None:
        """None for a row without a device count."""
        point = as_mapping(value)
        devices = whole_number(point.get("devices"))
        if not devices:
            return None
        return cls(
            devices=devices,
            nodes=as_count(point.get("nodes")),
            split=Split.from_stored(point),
            tokens_per_s=finite(point.get("decode_tokens_per_s")),
            tokens_per_s_per_device=finite(point.get("decode_tokens_per_s_per_device")),
            efficiency=finite(point.get("efficiency_per_device")),
            within_pool=point.get("within_pool", True) is not False,
        )

    @property
    def above_one(self) -> bool:
        """Whether the efficiency per device, to two decimals, is above 1 (more devices
        leave more memory for the KV cache, so a larger batch fits per device)."""
        return self.efficiency is not None and round(self.efficiency, 2) > 1


@dataclass(frozen=True)
class RunnerUp:
    """A split the planner did not choose, with its predicted memory per device and decode
    tokens/s at its largest batch, and why it lost (the planner's words)."""

    split: Split
    devices: int | None
    fits: bool
    memory_bytes: float | None
    tokens_per_s: float | None
    why_lost: str

    @classmethod
    def from_stored(cls, value: Any) -> RunnerUp:
        row = as_mapping(value)
        return cls(
            split=Split.from_stored(row),
            devices=whole_number(row.get("devices")),
            fits=row.get("fits") is True,
            memory_bytes=finite(row.get("memory_per_device_bytes")),
            tokens_per_s=finite(row.get("decode_tokens_per_s")),
            why_lost=text(row.get("why_lost")),
        )


@dataclass(frozen=True)
class CommRow:
    """One collective per generated token of the chosen split: `kind` ("tp": all-reduce,
    "ep": all-to-all, "pp": point-to-point), bytes per token per device, whether it crosses
    nodes, and whether the split uses it at all."""

    kind: str
    bytes_per_token: float | None
    crosses_nodes: bool
    used: bool


@dataclass(frozen=True)
class Communication:
    """The chosen split's communication per generated token (`communication.Communication`):
    a row per collective, whether any crosses nodes, collectives per forward step and the
    formula the volumes come from."""

    rows: list[CommRow]
    crosses_nodes: bool
    collectives_per_step: int | float | None
    formula: str

    @classmethod
    def from_stored(cls, value: Any) -> Communication | None:
        comm = as_mapping(value)
        if not comm:
            return None
        rows = []
        for kind, key in COLLECTIVES:
            volume = finite(comm.get(f"{key}_bytes_per_token"))
            rows.append(
                CommRow(
                    kind=kind,
                    bytes_per_token=volume,
                    crosses_nodes=comm.get(f"{kind}_crosses_nodes") is True,
                    used=bool(volume),
                )
            )
        return cls(
            rows=rows,
            crosses_nodes=comm.get("crosses_nodes") is True,
            collectives_per_step=as_count(comm.get("collectives_per_step")),
            formula=text(comm.get("formula")),
        )


@dataclass(frozen=True)
class Artifacts:
    """The plan's deployment artifacts (`artifacts.build_artifacts`): the text of each kind
    it wrote (`ARTIFACT_KINDS`; "" where none) and its notes."""

    texts: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_stored(cls, value: Any) -> Artifacts:
        artifacts = as_mapping(value)
        return cls(
            texts={
                kind: artifacts[kind]
                for kind in ARTIFACT_KINDS
                if isinstance(artifacts.get(kind), str) and artifacts[kind]
            },
            notes=_texts(artifacts.get("notes")),
        )

    def launch(self) -> dict[str, str]:
        """The engines' launch commands the plan wrote (`LAUNCH_ENGINES`), by engine."""
        return {engine: self.texts[engine] for engine in LAUNCH_ENGINES if engine in self.texts}


# --- the result ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanResult:
    """A plan run's result (module docstring): the release and the accelerator planned for
    (kind, name, memory per device), the catalog's version, the pool's shape; whether it fits
    (`fits`: None where the row does not say) and, when nothing does, the planner's reason
    and what would fit; for a plan that fits, the chosen split, devices and nodes, serving
    dtype, memory per device by part (bytes; only the finite figures), weights per serving
    dtype, KV bytes of one sequence per device, sequences held at the planned context,
    validity flags, the speed prediction (None without one: `predicted_reason` says why) with
    the served workload, the fit it names and the calibration, the runners-up, communication
    per token, the scaling curve, the deployment artifacts, the assumptions, the inputs
    planned for, notes, and the cpu figures it predicted on."""

    release: str = ""
    fits: bool | None = None
    reason: str = ""
    error: str = ""
    suggestions: Suggestions = field(default_factory=Suggestions)
    accelerator: str = ""
    accelerator_name: str = ""
    accelerator_memory_bytes: float | None = None
    catalog_version: str = ""
    pool: PoolShape | None = None
    split: Split = field(default_factory=Split)
    devices: int | None = None
    nodes: int | float | None = None
    dtype: str = ""
    dtype_label: str = ""
    memory_per_device_bytes: dict[str, float] = field(default_factory=dict)
    memory_weights_by_dtype_bytes: dict[str, float | None] = field(default_factory=dict)
    kv_bytes_per_sequence_per_device: float | None = None
    max_sequences_at_context: int | None = None
    validity_flags: list[str] = field(default_factory=list)
    predicted: SpeedPrediction | None = None
    predicted_reason: str = ""
    largest_batch_sequences: int | None = None
    workload: PlanWorkload | None = None
    fit: StoredFit | None = None
    calibration: Calibration | None = None
    runners_up: list[RunnerUp] = field(default_factory=list)
    communication: Communication | None = None
    scaling: list[ScalingPoint] = field(default_factory=list)
    artifacts: Artifacts = field(default_factory=Artifacts)
    assumptions: list[str] = field(default_factory=list)
    inputs: PlanInputs | None = None
    notes: list[str] = field(default_factory=list)
    measured_device: MeasuredDevice | None = None

    @classmethod
    def from_stored(cls, value: Any) -> PlanResult:
        """The result of a stored row; never raises (anything but a mapping reads as an
        empty result)."""
        result = as_mapping(value)
        predicted = as_mapping(result.get("predicted"))
        memory = as_mapping(result.get("memory_per_device_bytes"))
        return cls(
            release=text(result.get("release")),
            fits=flag(result.get("fits")),
            reason=text(result.get("reason")),
            error=text(result.get("error")),
            suggestions=Suggestions.from_stored(result.get("suggestions")),
            accelerator=text(result.get("accelerator")),
            accelerator_name=text(result.get("accelerator_name")),
            accelerator_memory_bytes=finite(result.get("accelerator_memory_bytes")),
            catalog_version=text(result.get("catalog_version")),
            pool=PoolShape.from_stored(result.get("pool")),
            split=Split.from_stored(result),
            devices=whole_number(result.get("devices")),
            nodes=as_count(result.get("nodes")),
            dtype=text(result.get("dtype")),
            dtype_label=text(result.get("dtype_label")),
            memory_per_device_bytes={
                str(part): number
                for part, size in memory.items()
                if (number := finite(size)) is not None
            },
            memory_weights_by_dtype_bytes={
                str(label): finite(size)
                for label, size in as_mapping(result.get("memory_weights_by_dtype_bytes")).items()
            },
            kv_bytes_per_sequence_per_device=finite(result.get("kv_bytes_per_sequence_per_device")),
            max_sequences_at_context=whole_number(result.get("max_sequences_at_context")),
            validity_flags=_texts(result.get("validity_flags")),
            predicted=SpeedPrediction.from_stored(predicted),
            predicted_reason="" if predicted.get("available") else text(predicted.get("reason")),
            largest_batch_sequences=whole_number(predicted.get("largest_batch_sequences")),
            workload=PlanWorkload.from_stored(predicted),
            fit=StoredFit.from_stored(predicted.get("fit")),
            calibration=Calibration.from_stored(predicted.get("calibrated")),
            runners_up=[
                RunnerUp.from_stored(row)
                for row in as_list(result.get("runners_up"))
                if isinstance(row, Mapping)
            ],
            communication=Communication.from_stored(result.get("communication")),
            scaling=[
                point
                for row in as_list(result.get("scaling"))
                if (point := ScalingPoint.from_stored(row)) is not None
            ],
            artifacts=Artifacts.from_stored(result.get("artifacts")),
            assumptions=_texts(result.get("assumptions")),
            inputs=PlanInputs.from_stored(result.get("inputs")),
            notes=_texts(result.get("notes")),
            measured_device=MeasuredDevice.from_stored(result.get("measured_device")),
        )

    @property
    def planned(self) -> bool:
        """Whether the planner found a split that fits the pool."""
        return self.fits is True

    @property
    def does_not_fit(self) -> bool:
        """Whether the planner said nothing fits the pool (a plan that failed otherwise, or
        a row that does not say, is not that)."""
        return self.fits is False

    @property
    def dtype_shown(self) -> str:
        """The serving dtype as the planner labels it ("checkpoint (fp8 e4m3 ...)"), else its
        name ("" where the row says neither)."""
        return self.dtype_label or self.dtype

    @property
    def checkpoint_format(self) -> str:
        """The checkpoint's own serving dtype as its format's first word: "checkpoint (fp8
        e4m3 (128x128 blocks))" → "fp8" ("" for any other dtype, shown as labelled)."""
        prefix = "checkpoint ("
        label = self.dtype_label
        if self.dtype != "checkpoint" or not label.startswith(prefix) or not label.endswith(")"):
            return ""
        words = label[len(prefix) : -1].split()
        return words[0] if words else ""

    @property
    def max_concurrency(self) -> int | None:
        """The most sequences the plan holds at once at its context: the largest batch it
        predicted, else what memory alone holds (a plan without speed figures)."""
        return self.largest_batch_sequences or self.max_sequences_at_context

    @property
    def concurrency(self) -> int | None:
        """The concurrency the plan was made for (its inputs'; None where not said)."""
        return self.inputs.concurrency if self.inputs is not None else None

    @property
    def context_tokens(self) -> int | None:
        """The context the plan was made for (tokens per sequence; None where not said)."""
        return self.inputs.context_tokens if self.inputs is not None else None

    @property
    def speeds_from(self) -> str:
        """Where the plan's speed figures come from: `CATALOG` (a datasheet kind),
        `CPU_UNMEASURED` (a cpu pool without measured figures: nothing predicted) or
        `CPU_MEASURED` (a cpu pool, on what its performance runs measured)."""
        if self.accelerator != "cpu":
            return CATALOG
        return CPU_MEASURED if self.predicted is not None else CPU_UNMEASURED

    @property
    def scaling_predicted(self) -> bool:
        """Whether any device count of the scaling curve has a predicted speed (a plan
        without a full-size prediction has a split per count but no speed to draw)."""
        return any(point.tokens_per_s is not None for point in self.scaling)

    def kv_room_bytes(self) -> float | None:
        """Bytes per device left for the KV cache: the budget less the weights, activations
        and workspace, and the runtime overhead (counted 0 where not said). None without a
        budget, weights or activations figure."""
        memory = self.memory_per_device_bytes
        parts = [memory.get(key) for key in ("budget", "weights", "activations_workspace")]
        if None in parts:
            return None
        budget, weights, activations = parts
        return budget - weights - activations - memory.get("runtime_overhead", 0.0)
