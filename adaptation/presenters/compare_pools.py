"""The compare-pools page: the release's latest analysis planned on every enabled pool and on
every accelerator kind of the catalog (one node, or as many whole nodes as it needs). Every
speed, TPOT and memory figure is the planner's prediction."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from adaptation.catalog import pool_catalog
from adaptation.charts import compare_pools as compare_pools_charts
from adaptation.models import AcceleratorKind, AcceleratorPool, ModelRelease, StageRun
from adaptation.presenters.analysis import latest_analysis_run
from adaptation.presenters.chart_slot import ChartSlot
from adaptation.presenters.plan_figures import Suggestion, would_fit
from engine.catalog import Accelerator, Catalog, CatalogError
from engine.formatting import finite
from engine.stages.plan.errors import NoFittingPlan, PlanInputError
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from engine.stages.plan.result import DecodePoint, PlanInputs, PlanResult, Split, Suggestions

# A catalog kind is planned on one node, then on as many nodes as it needs, up to:
COMPARE_MAX_NODES = 16
# Serving dtypes the page offers (the planner's names; "checkpoint" is the default).
SERVING_DTYPES = ("checkpoint", "bfloat16", "float16", "fp8", "int8")

# A row's verdict: the template words it with the row's figures.
FITS_POOL = "fits-pool"  # on `verdict_devices` of the pool's `layout_devices`
FITS_NODE = "fits-node"  # on `verdict_devices` of one node of `layout_per_node`
NEEDS_NODES = "needs-nodes"  # `verdict_nodes` nodes (`verdict_devices` devices)
POOL_TOO_SMALL = "pool-too-small"  # does not fit the pool: `would_fit` says what would
TOO_BIG = "too-big"  # does not fit the kind on any number of nodes the planner tried
CANNOT_PLAN = "cannot-plan"  # the planner could not plan it: `reason` says why


@dataclass(frozen=True)
class CompareRow:
    """How one configured pool (`source` "pool"), or one catalog kind on as many nodes as it
    needs ("catalog kind"), would serve the release.

    The layout planned on is `layout_nodes` nodes of `layout_per_node` (and for a pool its
    `layout_devices` in all; None: no layout read). `reason` is the planner's explanation (why
    it does not fit, or why a fitting row has no prediction); `beyond_compared` marks a kind
    that needs more than `COMPARE_MAX_NODES`. `fewest_devices` and `most_tokens_per_device`
    mark the fitting rows that need the fewest devices and that predict the most decode
    tokens/s per device."""

    name: str
    source: str
    accelerator: str
    fits: bool
    verdict: str
    layout_nodes: Any = None
    layout_per_node: Any = None
    layout_devices: Any = None
    verdict_devices: Any = None
    verdict_nodes: Any = None
    devices: int | None = None
    nodes: int | None = None
    split: Split | None = None
    dtype: str = ""  # the planner's label, in full
    checkpoint_format: str = ""  # the checkpoint's own dtype: its format's first word ("fp8")
    batch_1: DecodePoint | None = None
    largest: DecodePoint | None = None
    memory_used_bytes: float | None = None
    memory_capacity_bytes: float | None = None
    reason: str = ""
    beyond_compared: bool = False
    would_fit: list[Suggestion] = field(default_factory=list)
    note: str = ""  # where the accelerator's figures come from
    inputs: PlanInputs | None = None
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
        if self.largest is None or self.largest.tokens_per_s is None or not self.devices:
            return None
        return self.largest.tokens_per_s / self.devices

    @property
    def unpredicted(self) -> bool:
        """A fitting row without predicted speeds: `reason` says why."""
        return self.fits and (
            (self.batch_1 is None or self.batch_1.tokens_per_s is None)
            and (self.largest is None or self.largest.tokens_per_s is None)
        )


@dataclass
class Comparison:
    """The compare-pools table of one release's analysis, in `CompareRow.sort_key` order, the
    inputs it was planned for (`defaults`: which of context and concurrency are the planner's
    defaults) and its chart; `catalog_error` when the catalog cannot be read."""

    analysis_run: StageRun | None
    rows: list[CompareRow] = field(default_factory=list)
    catalog_error: str = ""
    context_tokens: float | None = None
    concurrency: Any = None
    dtype: str = ""
    defaults: list[str] = field(default_factory=list)
    chart: ChartSlot | None = None
    max_nodes: int = COMPARE_MAX_NODES


def _row_from_plan(plan: Mapping[str, Any], **row: Any) -> CompareRow:
    """A row of a fitting plan (`Plan.to_dict()`), read through `PlanResult`."""
    result = PlanResult.from_stored(plan)
    predicted = result.predicted
    memory = result.memory_per_device_bytes
    return CompareRow(
        accelerator=result.accelerator_name or result.accelerator,
        fits=result.planned,
        devices=result.devices,
        nodes=result.nodes,
        split=result.split,
        dtype=result.dtype_shown,
        checkpoint_format=result.checkpoint_format,
        batch_1=predicted.batch_1 if predicted else DecodePoint(),
        largest=predicted.largest if predicted else None,
        memory_used_bytes=memory.get("total_used"),
        memory_capacity_bytes=memory.get("capacity"),
        reason=result.predicted_reason,
        inputs=result.inputs,
        **row,
    )


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
            devices = finite(err.suggestions.get("devices"))
            if not devices:
                return CompareRow(
                    **failed, verdict=TOO_BIG, layout_nodes=1, layout_per_node=per_node,
                    reason=str(err),
                )  # fmt: skip
            nodes = -(-int(devices) // per_node)
            if nodes > COMPARE_MAX_NODES:
                return CompareRow(
                    **failed,
                    verdict=NEEDS_NODES,
                    verdict_nodes=nodes,
                    verdict_devices=int(devices),
                    layout_nodes=COMPARE_MAX_NODES,
                    layout_per_node=per_node,
                    reason=str(err),
                    beyond_compared=True,
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
            **failed, verdict=CANNOT_PLAN, layout_nodes=nodes, layout_per_node=per_node,
            reason=str(err),
        )  # fmt: skip
    result = plan.to_dict()
    return _row_from_plan(
        result,
        name=name,
        source=source,
        verdict=NEEDS_NODES if result["nodes"] > 1 else FITS_NODE,
        verdict_nodes=result["nodes"],
        verdict_devices=result["devices"],
        layout_nodes=result["nodes"],
        layout_per_node=per_node,
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
        return CompareRow(**failed, accelerator="", verdict=CANNOT_PLAN, reason=str(err))
    shape = {
        "accelerator": accelerator.name,
        "layout_nodes": layout.nodes,
        "layout_per_node": layout.devices_per_node,
        "layout_devices": layout.devices,
        "note": note,
    }
    try:
        plan = plan_release(analysis, layout, release=release, catalog=catalog, **options)
    except NoFittingPlan as err:
        return CompareRow(
            **failed,
            **shape,
            verdict=POOL_TOO_SMALL,
            would_fit=would_fit(
                Suggestions.from_stored(err.suggestions),
                kind=accelerator.kind,
                per_node=layout.devices_per_node,
            ),
            reason=str(err),
        )
    except (PlanInputError, CatalogError) as err:
        return CompareRow(**failed, **shape, verdict=CANNOT_PLAN, reason=str(err))
    result = plan.to_dict()
    return _row_from_plan(
        result,
        name=pool.name,
        source="pool",
        verdict=FITS_POOL,
        verdict_devices=result["devices"],
        **{key: value for key, value in shape.items() if key != "accelerator"},
    )


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
        comparison.catalog_error = str(err)
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
    inputs = next((r.inputs for r in rows if r.inputs), None)
    if inputs:
        comparison.context_tokens = inputs.context_tokens
        comparison.concurrency = inputs.concurrency
        comparison.dtype = dtype or "checkpoint"
        comparison.defaults = [
            name
            for name, key in (("context", "context_tokens"), ("concurrency", "concurrency"))
            if options.get(key) is None
        ]
    figure = compare_pools_charts.throughput(
        [
            (
                r.name,
                r.devices,
                r.batch_1.tokens_per_s if r.batch_1 else None,
                r.largest.tokens_per_s if r.largest else None,
            )
            for r in rows
            if r.fits
        ]
    )
    if figure is not None:
        comparison.chart = ChartSlot("compare-pools", figure, "throughput")
    return comparison
