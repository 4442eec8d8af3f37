"""`plan_release`: the split that fits a pool with the fewest devices, then the best decode.

Device counts tried, in order: powers of two below one node (1, 2, 4, ...), then whole
nodes (1, 2, 3, ... up to the pool's). At each count every TP x PP x DP (x EP) split is
checked (`validity`), sized (`memory`) and, if it fits, predicted (`predictor`); the first
count with a fitting split wins, and among its fitting splits the best predicted decode
tokens/s at the largest batch that fits (fewer bytes per device when no prediction can be
made). When nothing fits, `NoFittingPlan` says what would.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from engine import formatting as fmt
from engine.catalog import Accelerator, Catalog, load_catalog

from .artifacts import build_artifacts
from .communication import Links, communication
from .errors import NoFittingPlan, PlanInputError
from .fits import Fit, fit_for
from .layout import SEARCH_LIMIT_DEVICES, Candidate, PoolLayout
from .memory import MEMORY_ASSUMPTIONS, device_weights, memory_per_device
from .model import (
    DEFAULT_CONCURRENCY,
    ModelShape,
    default_context_tokens,
    normalize_dtype,
)
from .predictor import PREDICTION_ASSUMPTIONS, FullSizePredictor, default_lengths
from .scaling import scaling_curve
from .steady_state import normalize_kv_dtype
from .step_time import KV_DTYPE_BYTES
from .validity import Split, Validity, check_split, splits_for

MAX_CONTEXT_TOKENS = 100_000_000
MAX_CONCURRENCY = 1_000_000
MIN_SUGGESTED_CONTEXT = 512
MAX_RUNNERS_UP = 10


@dataclass(frozen=True)
class Plan:
    """The chosen split on a pool and everything said about it."""

    release: str
    accelerator: Accelerator
    layout: PoolLayout
    chosen: Candidate
    dtype: str
    context_tokens: int
    concurrency: int
    runners_up: list[dict]
    scaling: list[dict]
    memory_by_dtype: dict[str, int]
    assumptions: list[str]
    shape: ModelShape
    notes: list[str] = field(default_factory=list)
    kv_dtype: str = "bfloat16"  # the KV cache's dtype the predictions and commands use

    @property
    def split(self) -> Split:
        return self.chosen.split

    @property
    def fits(self) -> bool:
        return self.chosen.fits

    def to_dict(self) -> dict[str, Any]:
        split, mem = self.split, self.chosen.memory
        assert mem is not None and self.chosen.comm is not None
        nodes = -(-split.devices // self.layout.devices_per_node)
        predicted = (
            self.chosen.predictor.predictions(self.context_tokens)
            if self.chosen.predictor
            else {"kind": "predicted", "available": False, "reason": "no fitting split"}
        )
        max_seqs = self.chosen.predictor.max_batch() if self.chosen.predictor else 1
        return {
            "release": self.release,
            "accelerator": self.accelerator.kind,
            "accelerator_name": self.accelerator.name,
            "pool": {
                "devices_per_node": self.layout.devices_per_node,
                "nodes": self.layout.nodes,
                "devices": self.layout.devices,
            },
            "tp": split.tp,
            "pp": split.pp,
            "ep": split.ep,
            "dp": split.dp,
            "devices": split.devices,
            "nodes": nodes,
            "dtype": self.dtype,
            "dtype_label": self.shape.dtype_label(self.dtype),
            "fits": self.fits,
            "memory_per_device_bytes": mem.to_dict(),
            "memory_weights_by_dtype_bytes": dict(self.memory_by_dtype),
            "kv_bytes_per_sequence_per_device": round(mem.kv_bytes_per_sequence),
            # Memory alone (no speed figures needed): the KV room of every DP replica.
            "max_sequences_at_context": max(0, max_seqs) * split.dp
            if self.chosen.predictor
            else None,
            "validity_flags": list(self.chosen.validity.flags),
            "predicted": predicted,
            "runners_up": list(self.runners_up),
            "communication": self.chosen.comm.to_dict(),
            "scaling": list(self.scaling),
            "artifacts": build_artifacts(
                self.release,
                split,
                self.dtype,
                self.accelerator,
                devices_per_node=self.layout.devices_per_node,
                context_tokens=self.context_tokens,
                max_num_seqs=max(1, max_seqs),
                checkpoint_bytes=self.shape.weight_parts(self.dtype).total,
                redundant_experts=self.chosen.validity.redundant_experts,
                kv_dtype=self.kv_dtype,
            ),
            "assumptions": list(self.assumptions),
            "inputs": {
                "context_tokens": self.context_tokens,
                "concurrency": self.concurrency,
                "dtype": self.dtype,
                "kv_dtype": self.kv_dtype,
            },
            "notes": list(self.notes),
            **measured_device(self.accelerator),
        }


def measured_device(accelerator: Accelerator) -> dict[str, Any]:
    """{"measured_device": the speed figures a cpu plan predicts on, measured by the pool's
    performance runs: {"memory_bandwidth_bytes_per_s" (bytes/s), "dense_bf16_flops"
    (FLOP/s), "source", "host_busy" (probes taken on a busy host, the pool having no quiet
    one)}}; {} for a datasheet kind or a cpu kind without measured figures."""
    if accelerator.kind != "cpu" or not accelerator.memory_bandwidth_bytes_per_s:
        return {}
    return {
        "measured_device": {
            "memory_bandwidth_bytes_per_s": accelerator.memory_bandwidth_bytes_per_s,
            "dense_bf16_flops": accelerator.dense_bf16_flops,
            "source": accelerator.sources.get("memory_bandwidth_bytes_per_s", ""),
            "host_busy": accelerator.measured_on_busy_host,
        }
    }


@dataclass(frozen=True)
class Served:
    """How the plan's predictions serve the model: the engine, its fit, the KV dtype and the
    workload's input/output tokens per request (None: `default_lengths` of the context)."""

    engine: str = "vllm"
    fit: Fit | None = None
    kv_dtype: str = "bfloat16"
    input_tokens: int | None = None
    output_tokens: int | None = None

    def lengths(self, context: int) -> tuple[int, int]:
        default = default_lengths(context)
        return (self.input_tokens or default[0], self.output_tokens or default[1])


def served(
    *,
    engine: str | None,
    fit: Fit | None,
    kv_dtype: str | None,
    input_tokens: int | None,
    output_tokens: int | None,
) -> Served:
    """`Served` from the planner's options, checked. Raises `PlanInputError`."""
    lengths = [
        _positive_option(name, value, MAX_CONTEXT_TOKENS)
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens))
    ]
    return Served(
        engine=(engine or "vllm").strip().lower(),
        fit=fit,
        kv_dtype=normalize_kv_dtype(kv_dtype) or "bfloat16",
        input_tokens=lengths[0],
        output_tokens=lengths[1],
    )


class _Planner:
    """Evaluation of splits for one model, pool, dtype, context and concurrency."""

    def __init__(
        self,
        shape: ModelShape,
        accelerator: Accelerator,
        layout: PoolLayout,
        links: Links,
        served: Served | None = None,
    ) -> None:
        self.shape = shape
        self.accelerator = accelerator
        self.layout = layout
        self.links = links
        self.served = served or Served()
        self.fit = self.served.fit or fit_for(accelerator.kind, self.served.engine)
        self._validity: dict[Split, Validity] = {}

    def validity(self, split: Split) -> Validity:
        if split not in self._validity:
            self._validity[split] = check_split(self.shape, split)
        return self._validity[split]

    def evaluate(
        self, split: Split, *, dtype: str, context: int, concurrency: int, predict: bool = True
    ) -> Candidate:
        validity = self.validity(split)
        if not validity.valid:
            return Candidate(split, validity, None, None, None)
        mem = memory_per_device(
            self.shape,
            split,
            validity,
            dtype=dtype,
            context_tokens=context,
            concurrency=concurrency,
            capacity_bytes=self.accelerator.memory_bytes,
            kv_scale=KV_DTYPE_BYTES[self.served.kv_dtype] / 2,
        )
        comm = communication(self.shape, split, self.links)
        predictor = None
        if predict and mem.fits:
            isl, osl = self.served.lengths(context)
            predictor = FullSizePredictor(
                self.shape,
                split,
                validity,
                dtype,
                self.accelerator,
                mem,
                comm,
                self.links,
                self.fit,
                engine=self.served.engine,
                kv_dtype=self.served.kv_dtype,
                input_tokens=isl,
                output_tokens=osl,
            )
        return Candidate(split, validity, mem, predictor, comm)

    def candidates(
        self, devices: int, *, dtype: str, context: int, concurrency: int, predict: bool = True
    ) -> list[Candidate]:
        return [
            self.evaluate(s, dtype=dtype, context=context, concurrency=concurrency, predict=predict)
            for s in splits_for(self.shape, devices)
        ]

    def first_fit(
        self, counts: Iterator[int] | list[int], *, dtype: str, context: int, concurrency: int
    ) -> tuple[int, list[Candidate]] | None:
        """The first device count with a fitting split, and all its candidates."""
        for n in counts:
            cands = self.candidates(
                n, dtype=dtype, context=context, concurrency=concurrency, predict=False
            )
            if any(c.fits for c in cands):
                return n, self.candidates(n, dtype=dtype, context=context, concurrency=concurrency)
        return None


def device_counts(devices_per_node: int, max_devices: int) -> Iterator[int]:
    """1, 2, 4, ... below a node, then whole nodes; after 16 nodes the node count doubles."""
    n = 1
    while n < devices_per_node and n <= max_devices:
        yield n
        n *= 2
    nodes = 1
    while nodes * devices_per_node <= max_devices:
        yield nodes * devices_per_node
        nodes = nodes + 1 if nodes < 16 else nodes * 2


def _positive_option(name: str, value: int | None, limit: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanInputError(f"{name} must be a positive integer, got {value!r}")
    if value > limit:
        raise PlanInputError(f"{name} = {value} is implausibly large (limit {limit})")
    return value


# Catalog dtype names (torch's) that carry FP8 weights and activations, and 4-bit ones.
FP8_DTYPE_NAMES = frozenset({"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2"})
FP4_DTYPE_NAMES = frozenset({"float4_e2m1fn_x2", "nvfp4", "mxfp4"})


def serves_dtype(accelerator: Accelerator, dtype: str) -> bool:
    """Whether the accelerator's catalog dtypes include the normalised serving `dtype`
    ("bfloat16", "float16", "fp8", "int8", "fp4")."""
    names = set(accelerator.dtypes)
    if dtype == "fp8":
        return bool(names & FP8_DTYPE_NAMES)
    if dtype == "fp4":
        return bool(names & FP4_DTYPE_NAMES)
    return dtype in names


def resolve_serving_dtype(
    shape: ModelShape, accelerator: Accelerator, dtype: str
) -> tuple[str, list[str]]:
    """The dtype the plan serves at on `accelerator`, and notes on the choice.

    An explicit dtype the accelerator does not list raises `PlanInputError` naming the ones
    it does. "checkpoint" of an FP8 checkpoint on a device without FP8 (A100, Ascend 910B:
    catalog dtypes) is planned dequantized to bfloat16 (float16 where there is no bf16), as
    serving engines load it there (vLLM's "fp8" quantization needs compute capability 8.9+,
    docs "FP8 W8A8"); a weight-only 4-bit checkpoint (MXFP4, AWQ, GPTQ) is served as stored.
    """
    if dtype != "checkpoint":
        if not serves_dtype(accelerator, dtype):
            raise PlanInputError(
                f"{accelerator.kind} ({accelerator.name}) does not serve {dtype}: its dtypes "
                f"are {', '.join(accelerator.dtypes) or 'not listed'}"
            )
        return dtype, []
    stored_fp8 = shape.quant_method == "fp8" or "fp8" in shape.checkpoint_dtype
    if not stored_fp8 or serves_dtype(accelerator, "fp8"):
        return dtype, []
    for fallback in ("bfloat16", "float16"):
        if serves_dtype(accelerator, fallback):
            return fallback, [
                f"{accelerator.kind} has no FP8 (its dtypes: {', '.join(accelerator.dtypes)}): "
                f"the {shape.checkpoint_dtype} checkpoint is planned dequantized to {fallback}"
            ]
    raise PlanInputError(
        f"{accelerator.kind} serves neither the checkpoint's {shape.checkpoint_dtype} nor "
        "bfloat16/float16"
    )


def _pool_words(devices: int, per_node: int, accelerator: Accelerator) -> str:
    """ "16 x h100 (2 nodes of 8)", "8 x h200 (one node of 8)", "2 x cpu (2 machines)"."""
    if accelerator.kind == "cpu":
        return f"{devices} x cpu ({'one machine' if devices == 1 else f'{devices} machines'})"
    nodes = -(-devices // per_node)
    where = f"{nodes} nodes of {per_node}" if nodes > 1 else f"one node of {per_node}"
    return f"{devices} x {accelerator.kind} ({where})"


def _low_precision_dtype(accelerator: Accelerator) -> str | None:
    kind = accelerator.low_precision_kind
    if kind in ("fp8", "int8") and serves_dtype(accelerator, kind):
        return kind
    return None


def _why_lost(cand: Candidate, chosen: Candidate) -> str:
    if not cand.validity.valid:
        return "invalid: " + "; ".join(cand.validity.reasons)
    assert cand.memory is not None
    if not cand.fits:
        return (
            f"does not fit: needs {fmt.gib(cand.memory.used)} per device, budget "
            f"{fmt.gib(cand.memory.budget)}"
        )
    if cand.split.devices > chosen.split.devices:
        return f"uses more devices ({cand.split.devices} > {chosen.split.devices})"
    ours, theirs = chosen.decode_tokens_per_s, cand.decode_tokens_per_s
    if ours is not None and theirs is not None:
        return (
            f"lower predicted output tokens/s at its throughput-optimal load ({theirs:,.0f} vs "
            f"{ours:,.0f} tokens/s)"
        )
    return f"more memory per device ({fmt.gib(cand.memory.used)} vs {fmt.gib(chosen.memory.used)})"


def _runner_up(cand: Candidate, chosen: Candidate) -> dict:
    return {
        "tp": cand.split.tp,
        "pp": cand.split.pp,
        "ep": cand.split.ep,
        "dp": cand.split.dp,
        "devices": cand.split.devices,
        "fits": cand.fits,
        "memory_per_device_bytes": round(cand.memory.used) if cand.memory else None,
        "decode_tokens_per_s": cand.decode_tokens_per_s,
        "kind": "predicted",
        "why_lost": _why_lost(cand, chosen),
    }


def _runners_up(cands: list[Candidate], chosen: Candidate, smaller: list[Candidate]) -> list[dict]:
    others = [c for c in cands if c is not chosen]
    fitting = sorted((c for c in others if c.fits), key=Candidate.sort_key)
    valid_unfit = sorted(
        (c for c in others if c.validity.valid and not c.fits), key=lambda c: c.memory.used
    )
    invalid = [c for c in others if not c.validity.valid]
    rows = [_runner_up(c, chosen) for c in fitting + valid_unfit[:3] + invalid[:3]]
    smaller_valid = sorted(
        (c for c in smaller if c.validity.valid and c.memory), key=lambda c: c.memory.used
    )
    if smaller_valid:
        best = smaller_valid[0]
        row = _runner_up(best, chosen)
        row["why_lost"] = (
            f"fewer devices ({best.split.devices}) but does not fit: needs "
            f"{fmt.gib(best.memory.used)} per device, budget {fmt.gib(best.memory.budget)}"
        )
        rows.append(row)
    return rows[:MAX_RUNNERS_UP]


def _no_fit_message(
    planner: _Planner, *, dtype: str, context: int, concurrency: int, release: str
) -> NoFittingPlan:
    layout, acc, shape = planner.layout, planner.accelerator, planner.shape
    pool_counts = list(device_counts(layout.devices_per_node, layout.devices))
    best_mem = None
    cands = planner.candidates(
        layout.devices, dtype=dtype, context=context, concurrency=concurrency, predict=False
    )
    valid = [c for c in cands if c.validity.valid and c.memory]
    if valid:
        best_mem = min(valid, key=lambda c: c.memory.used)
    parts = [
        f"{release} does not fit {_pool_words(layout.devices, layout.devices_per_node, acc)}, "
        f"{fmt.gib(acc.memory_bytes)} each, at dtype "
        f"{shape.dtype_label(dtype)}, context {context:,} tokens x {concurrency} sequences"
    ]
    if best_mem is not None:
        m = best_mem.memory
        parts.append(
            f"the tightest split ({best_mem.split.label()}) needs {fmt.gib(m.used)} per device "
            f"(weights {fmt.gib(m.weights)}, KV {fmt.gib(m.kv_cache)}) against a budget of "
            f"{fmt.gib(m.budget)}"
        )
    elif cands:
        parts.append("no split of the pool is valid: " + "; ".join(cands[0].validity.reasons))
    suggestions: dict[str, Any] = {}
    # A pool that is part of one node (1 of a kind built 8 to a node) grows into whole nodes
    # of the kind, not into more one-device nodes.
    search = planner
    if layout.nodes == 1 and layout.devices_per_node < acc.devices_per_node:
        per_node = acc.devices_per_node
        search = _Planner(
            shape,
            acc,
            replace(layout, devices_per_node=per_node),
            replace(planner.links, devices_per_node=per_node),
            planner.served,
        )
    per_node = search.layout.devices_per_node
    more = search.first_fit(
        (n for n in device_counts(per_node, SEARCH_LIMIT_DEVICES) if n > layout.devices),
        dtype=dtype,
        context=context,
        concurrency=concurrency,
    )
    if more is not None:
        n = more[0]
        suggestions["devices"] = n
        parts.append(f"more devices would fit: {_pool_words(n, per_node, acc)}")
    else:
        parts.append(f"no pool of up to {SEARCH_LIMIT_DEVICES:,} {acc.kind} devices fits")
    ctx = context // 2
    if shape.max_position_embeddings:
        ctx = min(ctx, shape.max_position_embeddings)
    while ctx >= MIN_SUGGESTED_CONTEXT:
        if planner.first_fit(pool_counts, dtype=dtype, context=ctx, concurrency=concurrency):
            suggestions["context_tokens"] = ctx
            parts.append(f"a smaller context would fit this pool: {ctx:,} tokens")
            break
        ctx //= 2
    else:
        parts.append(
            f"no context down to {MIN_SUGGESTED_CONTEXT} tokens fits this pool at this dtype"
        )
    low = _low_precision_dtype(acc)
    if low and low != dtype:
        low_bytes = shape.weight_parts(low).total
        if low_bytes < 0.95 * shape.weight_parts(dtype).total:
            if planner.first_fit(pool_counts, dtype=low, context=context, concurrency=concurrency):
                suggestions["dtype"] = low
                parts.append(f"a lower-precision dtype would fit this pool: {low}")
            else:
                parts.append(f"{low} does not fit this pool either")
    return NoFittingPlan("; ".join(parts), suggestions=suggestions)


def _planner_on(
    shape: ModelShape, layout: PoolLayout, catalog: Catalog | None, serving: Served
) -> _Planner:
    """The planner of `shape` on `layout`'s accelerators (from `catalog`, default the
    repository's) and links. Raises `PlanInputError` for a layout that is not one or fails
    its checks, `CatalogError` for an accelerator kind the catalog lacks."""
    if not isinstance(layout, PoolLayout):
        raise PlanInputError(f"layout must be a PoolLayout, got {type(layout).__name__}")
    layout.check()
    accelerator = (catalog or load_catalog()).accelerator(layout.accelerator)
    return _Planner(shape, accelerator, layout, layout.links(accelerator), serving)


def plan_release(
    analysis: Mapping[str, Any],
    layout: PoolLayout,
    *,
    context_tokens: int | None = None,
    concurrency: int | None = None,
    dtype: str | None = None,
    release: str | None = None,
    catalog: Catalog | None = None,
    kv_dtype: str | None = None,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    engine: str | None = None,
    fit: Fit | None = None,
    split: Split | None = None,
) -> Plan:
    """Plan serving the analysed release on `layout` (or, with `split`, on that split).

    `analysis` is `analyze_config(config).to_dict()`; `context_tokens` defaults to the
    release's max context capped at 32,768, `concurrency` to 4 sequences, `dtype` to the
    checkpoint's own ("checkpoint"; or "bfloat16", "float16", "fp8", "int8", "fp4");
    `kv_dtype` None/"auto" keeps a 16-bit KV cache, "fp8" halves it. The predictions serve
    `input_tokens` / `output_tokens` per request (default 1,000 / 1,000 within the context)
    on `engine` ("vllm" by default) with `fit` (default: the accelerator x engine's fit on
    published results, `fits.fit_for`). A given `split` is checked, sized and predicted as
    each candidate is, and planned in place of a choice (no runners-up or scaling). Raises
    `PlanInputError` for unusable input and `NoFittingPlan` when no split fits (or the given
    one is refused by the engines' rules or does not fit, saying what it needs).
    """
    shape = ModelShape.from_analysis(analysis)
    planner = _planner_on(
        shape,
        layout,
        catalog,
        served(
            engine=engine,
            fit=fit,
            kv_dtype=kv_dtype,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        ),
    )
    context = _positive_option("context_tokens", context_tokens, MAX_CONTEXT_TOKENS)
    context = context or default_context_tokens(shape)
    conc = _positive_option("concurrency", concurrency, MAX_CONCURRENCY) or DEFAULT_CONCURRENCY
    accelerator = planner.accelerator
    serving, notes = resolve_serving_dtype(shape, accelerator, normalize_dtype(dtype))
    if shape.max_position_embeddings and context > shape.max_position_embeddings:
        notes.append(
            f"context {context:,} exceeds the release's max_position_embeddings "
            f"{shape.max_position_embeddings:,}"
        )
    name = release or str(analysis.get("family") or analysis.get("architecture") or "the model")
    if split is not None:
        return _given_split_plan(
            planner, split, dtype=serving, context=context, concurrency=conc, release=name,
            notes=notes,
        )  # fmt: skip
    counts = list(device_counts(layout.devices_per_node, layout.devices))
    found = planner.first_fit(counts, dtype=serving, context=context, concurrency=conc)
    if found is None:
        no_fit = _no_fit_message(
            planner, dtype=serving, context=context, concurrency=conc, release=name
        )
        if notes:  # e.g. why the dtype is not the checkpoint's
            raise NoFittingPlan(
                "; ".join([str(no_fit), *notes]), suggestions=no_fit.suggestions
            ) from None
        raise no_fit
    n, cands = found
    chosen = min((c for c in cands if c.fits), key=Candidate.sort_key)
    smaller = []
    idx = counts.index(n)
    if idx > 0:
        smaller = planner.candidates(
            counts[idx - 1], dtype=serving, context=context, concurrency=conc, predict=False
        )
    by_dtype = _weights_by_dtype(shape, accelerator, chosen)
    assumptions = _assumptions(
        planner,
        context=context,
        concurrency=conc,
        dtype=serving,
        defaults=context_tokens is None and concurrency is None,
    )
    return Plan(
        kv_dtype=planner.served.kv_dtype,
        release=name,
        accelerator=accelerator,
        layout=layout,
        chosen=chosen,
        dtype=serving,
        context_tokens=context,
        concurrency=conc,
        runners_up=_runners_up(cands, chosen, smaller),
        scaling=scaling_curve(
            lambda count: planner.candidates(
                count, dtype=serving, context=context, concurrency=conc
            ),
            planner.layout,
            first=n,
        ),
        memory_by_dtype=by_dtype,
        assumptions=assumptions,
        shape=shape,
        notes=notes,
    )


def _weights_by_dtype(
    shape: ModelShape, accelerator: Accelerator, chosen: Candidate
) -> dict[str, int]:
    """Weight bytes per device of the chosen split at the checkpoint's and each dtype the
    accelerator serves."""
    dtypes = ["checkpoint"]
    for d in accelerator.dtypes:
        try:
            norm = normalize_dtype(d)
        except PlanInputError:
            continue
        if norm not in dtypes:
            dtypes.append(norm)
    return {
        shape.dtype_label(d): round(device_weights(shape, chosen.split, chosen.validity, d).total)
        for d in dtypes
    }


def _assumptions(
    planner: _Planner, *, context: int, concurrency: int, dtype: str, defaults: bool
) -> list[str]:
    return [
        f"context {context:,} tokens x {concurrency} concurrent sequences"
        + (" (defaults)" if defaults else ""),
        f"serving dtype {planner.shape.dtype_label(dtype)}",
        *MEMORY_ASSUMPTIONS,
        *PREDICTION_ASSUMPTIONS,
        f"predicted with the {planner.fit.label()}",
        "DP replicas without EP are independent engine instances; with EP (vLLM "
        "--enable-expert-parallel) the EP group is TP x DP and attention runs data-parallel",
    ]


def _given_split_plan(
    planner: _Planner,
    split: Split,
    *,
    dtype: str,
    context: int,
    concurrency: int,
    release: str,
    notes: list[str],
) -> Plan:
    """The plan of one given split: checked, sized and predicted as each candidate is, held
    in place of a choice with no runners-up or scaling (nothing was chosen). Raises
    `NoFittingPlan` for a split the engines refuse for this model (the rules' reasons) or one
    that does not fit the devices' memory (what it needs against the budget)."""
    shape, accelerator, label = planner.shape, planner.accelerator, split.label()
    if split.devices > planner.layout.devices:
        raise PlanInputError(
            f"the split {label} uses {split.devices:,} devices (TP x PP x DP); the pool has "
            f"{planner.layout.devices:,}"
        )
    candidate = planner.evaluate(split, dtype=dtype, context=context, concurrency=concurrency)
    if not candidate.validity.valid:
        raise NoFittingPlan(
            f"the split {label} does not load {release}: " + "; ".join(candidate.validity.reasons)
        )
    memory = candidate.memory
    assert memory is not None
    if not candidate.fits:
        raise NoFittingPlan(
            f"{release} at {label} does not fit {split.devices} x {accelerator.kind}, "
            f"{fmt.gib(accelerator.memory_bytes)} each, at dtype {shape.dtype_label(dtype)}, "
            f"context {context:,} tokens x {fmt.counted(concurrency, 'sequence')}: it needs "
            f"{fmt.gib(memory.used)} per device (weights {fmt.gib(memory.weights)}, KV "
            f"{fmt.gib(memory.kv_cache)}) against a budget of {fmt.gib(memory.budget)}"
        )
    assumptions = _assumptions(
        planner, context=context, concurrency=concurrency, dtype=dtype, defaults=False
    )
    assumptions.insert(2, f"split {label} given, not chosen by the planner")
    return Plan(
        kv_dtype=planner.served.kv_dtype,
        release=release,
        accelerator=accelerator,
        layout=planner.layout,
        chosen=candidate,
        dtype=dtype,
        context_tokens=context,
        concurrency=concurrency,
        runners_up=[],
        scaling=[],
        memory_by_dtype=_weights_by_dtype(shape, accelerator, candidate),
        assumptions=assumptions,
        shape=shape,
        notes=[*notes, f"the split {label} was given: the planner's choice is not compared"],
    )


def evaluate_split(
    analysis: Mapping[str, Any],
    layout: PoolLayout,
    split: Split,
    *,
    context_tokens: int | None = None,
    concurrency: int | None = None,
    dtype: str | None = None,
    catalog: Catalog | None = None,
    kv_dtype: str | None = None,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    engine: str | None = None,
    fit: Fit | None = None,
) -> Candidate:
    """Check, size and predict one given split (for comparisons with a published setup,
    e.g. a benchmark run at TP 8; the options as `plan_release` reads them). Raises
    `PlanInputError` for unusable input."""
    shape = ModelShape.from_analysis(analysis)
    planner = _planner_on(
        shape,
        layout,
        catalog,
        served(
            engine=engine,
            fit=fit,
            kv_dtype=kv_dtype,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        ),
    )
    context = _positive_option("context_tokens", context_tokens, MAX_CONTEXT_TOKENS)
    conc = _positive_option("concurrency", concurrency, MAX_CONCURRENCY) or DEFAULT_CONCURRENCY
    serving, _notes = resolve_serving_dtype(shape, planner.accelerator, normalize_dtype(dtype))
    return planner.evaluate(
        split,
        dtype=serving,
        context=context or default_context_tokens(shape),
        concurrency=conc,
    )
