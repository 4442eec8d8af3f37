"""One request for a plan and a served workload's prediction, as `manage.py plan` and
`POST /api/v1/plans/` both take it: where (a pool, or N devices of a catalog kind), how
(context, concurrency, serving and KV-cache dtypes, a given split) and, optionally, a
workload (input and output tokens per request, requests in flight, phase).

How the two concurrencies read together. Without a workload, `concurrency` is the plan's, as
in a job's plan options: sequences held at once across all devices, which the plan sizes the
KV cache for. With a workload (both lengths given) it is the workload's: requests in flight
across all devices, a number or "max" (the load of highest throughput the memory allows;
the default). The plan is then the one `predict_workload` makes for the workload: the split
with the fewest devices that holds the model and one of its sequences (context input +
output tokens, unless a context is given; 1 sequence), and the prediction says how many of
the requests that split runs at once (`batch`, `kv_capacity_sequences`) and what waiting
does to TTFT.

Each refusal of the request is a `PlanRequestError` naming its field (the API's name; the
command spells it as its flag, `flag_name`); the engine's own refusals (`PlanInputError`,
`NoFittingPlan`, `CatalogError`) pass through.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from adaptation.catalog import pool_catalog
from adaptation.models import AcceleratorKind, AcceleratorPool, ModelRelease
from adaptation.presenters.analysis import latest_analysis_run
from adaptation.selectors.full_size import pool_full_size_sweeps
from engine import formatting as fmt
from engine.architecture import AnalysisError, analyze_config
from engine.catalog import Catalog, CatalogError, cpu_accelerator
from engine.hubs.base import is_valid_repo_id
from engine.stages.plan.closed_loop import pool_fit_from
from engine.stages.plan.errors import PlanInputError
from engine.stages.plan.fits import Fit
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.model import (
    ModelShape,
    normalize_dtype,
)
from engine.stages.plan.planner import (
    MAX_CONCURRENCY,
    MAX_CONTEXT_TOKENS,
    plan_release,
)
from engine.stages.plan.run import pool_engine
from engine.stages.plan.split_notation import check_split_for, parse_split
from engine.stages.plan.steady_state import ENGINES, MAX_TOKENS, PHASES, normalize_kv_dtype
from engine.stages.plan.steady_state import MAX_CONCURRENCY as MAX_WORKLOAD_CONCURRENCY
from engine.stages.plan.validity import Split
from engine.stages.plan.workload import Workload, predict_workload

MAX = "max"  # a workload's concurrency: the load of highest throughput the memory allows
WORKLOAD_PLAN_CONCURRENCY = 1  # the plan of a workload holds one of its sequences

Spell = Callable[[str], str]


def api_name(field: str) -> str:
    """A field as the API names it: "input_len"."""
    return field


def flag_name(field: str) -> str:
    """A field as `manage.py plan` spells it: "--input-len" ("--context" for context_tokens)."""
    return "--context" if field == "context_tokens" else "--" + field.replace("_", "-")


class PlanRequestError(ValueError):
    """A value of the request that cannot be planned, with the `field` it is under (the
    API's name) and a one-line message."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# --- where: a pool, or devices of a catalog kind -------------------------------------------


def pool_engine_kind(name: str) -> str | None:
    """The serving engine whose fit a plan on the pool named `name` predicts with, as the
    plan stage picks it (`plan.run.pool_engine`); None for an unknown pool."""
    row = AcceleratorPool.objects.filter(name=name).only("engine").first()
    return pool_engine(row) if row is not None else None


def pool_fit_of(name: str, layout: PoolLayout, catalog: Catalog, engine: str | None) -> Fit | None:
    """The pool's own fit from its measured full-size sweeps (the plan stage's closed loop:
    `adaptation.selectors.full_size`, `closed_loop.pool_fit_from`), for `engine` (None: the
    pool's); None for an unknown pool or one whose sweeps made none."""
    row = AcceleratorPool.objects.filter(name=name).first()
    if row is None:
        return None
    fit, _left_out = pool_fit_from(
        pool_full_size_sweeps(pool=row),
        pool=name,
        layout=layout,
        catalog=catalog,
        engine=engine or pool_engine(row),
    )
    return fit


def place_of_pool(name: str) -> tuple[Catalog, PoolLayout, str]:
    """(catalog, layout, note on the accelerator's figures) of the pool named `name`
    (`adaptation.catalog.pool_catalog`: a cpu pool is its live worker's machine). Raises
    `PlanRequestError` under "pool" for an unknown name or a pool naming no kind."""
    row = AcceleratorPool.objects.filter(name=name).first()
    if row is None:
        known = ", ".join(AcceleratorPool.objects.order_by("name").values_list("name", flat=True))
        raise PlanRequestError("pool", f"no pool {name!r}; pools: {known or 'none'}")
    try:
        return pool_catalog(row)
    except CatalogError as exc:
        raise PlanRequestError("pool", _one_line(exc)) from exc


def layout_for_devices(
    catalog: Catalog,
    kind: str,
    devices: int,
    devices_per_node: int | None,
    *,
    spell: Spell = api_name,
) -> PoolLayout:
    """A pool of `devices` x `kind`: `devices_per_node` defaults to min(devices, the
    catalog's per-node figure); `devices` must be a whole number of nodes. Raises
    `PlanRequestError` under "devices" (and `CatalogError` for an unknown kind)."""
    accelerator = catalog.accelerator(kind)
    if devices_per_node is None:
        devices_per_node = min(devices, accelerator.devices_per_node)
        if devices % devices_per_node:
            lower = devices - devices % devices_per_node
            raise PlanRequestError(
                "devices",
                f"{spell('devices')} {devices} is not a whole number of {kind} nodes of "
                f"{devices_per_node}: use {lower} or {lower + devices_per_node}, or give "
                f"{spell('devices_per_node')}",
            )
    elif devices % devices_per_node:
        raise PlanRequestError(
            "devices",
            f"{spell('devices')} {devices} is not a multiple of {spell('devices_per_node')} "
            f"{devices_per_node}",
        )
    return PoolLayout(kind, devices_per_node=devices_per_node, nodes=devices // devices_per_node)


def place_of_devices(
    kind: str, devices: int, devices_per_node: int | None, *, spell: Spell = api_name
) -> tuple[Catalog, PoolLayout, str]:
    """(catalog, layout, note) for `devices` x `kind` of the catalog (the shipped file plus
    the admin's rows; "cpu" is this machine, measured here). Raises `PlanRequestError` under
    "accelerator" for an unknown kind (naming the known ones) and under "devices" for a
    count that is not whole nodes."""
    try:
        catalog = AcceleratorKind.objects.catalog()
        if kind == "cpu":
            cpu = cpu_accelerator()
            catalog = catalog.with_cpu(cpu)
            note = f"cpu is this machine as measured here ({fmt.gib(cpu.memory_bytes)})"
        else:
            catalog.accelerator(kind)
            note = ""
    except CatalogError as exc:
        raise PlanRequestError("accelerator", _one_line(exc)) from exc
    layout = layout_for_devices(catalog, kind, devices, devices_per_node, spell=spell)
    if not note:
        origin = (
            "the admin's catalog row"
            if AcceleratorKind.objects.filter(kind=kind).exists()
            else f"catalog {catalog.version}"
        )
        note = f"{kind} ({catalog.accelerator(kind).name}) figures from {origin}"
    return catalog, layout, note


# --- what: a release's analysis, or a config ---------------------------------------------


def release_analysis(release: ModelRelease) -> tuple[dict[str, Any], str]:
    """(the analysis to plan, a note on where it comes from) of `release`: its newest
    succeeded `analyze` result, else its stored config.json analysed now. `release` has its
    jobs and their stage runs prefetched. Raises `PlanRequestError` under "release" when it
    has neither, or when they cannot be planned (a malformed config, an analysis the planner
    refuses)."""
    run = latest_analysis_run(release)
    if run is not None and isinstance(run.result, Mapping):
        analysis, note = dict(run.result), f"the analysis of job {run.job_id} (stage run {run.pk})"
    elif isinstance(release.config, Mapping):
        try:
            analysis = analyze_config(dict(release.config)).to_dict()
        except AnalysisError as exc:
            raise PlanRequestError("release", f"its config.json: {_one_line(exc)}") from exc
        note = "its stored config.json, analysed now (no analyze stage has succeeded yet)"
    else:
        raise PlanRequestError(
            "release",
            f"release {release.pk} has no analysis and no stored config.json yet: run a job "
            "with the fetch and analyze stages first",
        )
    try:
        ModelShape.from_analysis(analysis)
    except PlanInputError as exc:
        raise PlanRequestError("release", f"{note} cannot be planned: {exc}") from exc
    return analysis, note


def config_analysis(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(the release's name, the analysis) of a config.json given as an object: named by its
    `_name_or_path` when that is an org/name repo id, else "config". Raises
    `PlanRequestError` under "config" for one the analysis or the planner refuses."""
    try:
        analysis = analyze_config(dict(config)).to_dict()
        ModelShape.from_analysis(analysis)
    except (AnalysisError, PlanInputError) as exc:
        raise PlanRequestError("config", _one_line(exc)) from exc
    named = config.get("_name_or_path")
    return (named if is_valid_repo_id(named) else "config"), analysis


# --- how, and the workload ---------------------------------------------------------------


@dataclass(frozen=True)
class PlanInputs:
    """A request's checked options: the plan's `context_tokens` and `concurrency` (None:
    the planner's defaults), the serving `dtype` (normalised, None: the checkpoint's), the
    `kv_dtype` (None: 16-bit, the engines' "auto"), a given `split` (None: the planner
    chooses), the `workload` (None: no prediction) and the `engine` whose fit predicts it
    (None: vLLM's)."""

    context_tokens: int | None = None
    concurrency: int | None = None
    dtype: str | None = None
    kv_dtype: str | None = None
    split: Split | None = None
    workload: Workload | None = None
    engine: str | None = None


def plan_inputs(
    *,
    context_tokens: int | None = None,
    concurrency: int | str | None = None,
    dtype: str | None = None,
    kv_dtype: str | None = None,
    split: str | None = None,
    input_len: int | None = None,
    output_len: int | None = None,
    phase: str | None = None,
    engine: str | None = None,
    spell: Spell = api_name,
) -> PlanInputs:
    """Check a request's options (whole numbers already read as ints; `concurrency` an int,
    its digits, or "max"; `split` in the plan's notation) and set the plan's context and
    concurrency from the workload as the module docstring says. Raises `PlanRequestError`
    under the field at fault: a number out of range, an unknown dtype, KV dtype or phase,
    a split not in the notation, one workload length without the other, "max" or a phase
    without a workload, a context shorter than the workload's sequences."""
    if context_tokens is not None:
        _bounded("context_tokens", context_tokens, MAX_CONTEXT_TOKENS, spell)
    conc = _concurrency(concurrency, spell)
    workload = _workload(input_len, output_len, conc, phase, spell)
    if workload is None:
        if conc is not None:
            _bounded("concurrency", conc, MAX_CONCURRENCY, spell)
        plan_concurrency = conc
    else:
        needed = workload.input_tokens + workload.output_tokens
        if context_tokens is not None and context_tokens < needed:
            raise PlanRequestError(
                "context_tokens",
                f"{spell('context_tokens')} {context_tokens:,} is shorter than the workload's "
                f"sequences ({spell('input_len')} + {spell('output_len')} = {needed:,} tokens)",
            )
        context_tokens = context_tokens or needed
        plan_concurrency = WORKLOAD_PLAN_CONCURRENCY
    try:
        serving = None if dtype is None else normalize_dtype(dtype)
    except PlanInputError as exc:
        raise PlanRequestError("dtype", f"{spell('dtype')}: {exc}") from exc
    try:
        kv = normalize_kv_dtype(kv_dtype)
    except PlanInputError as exc:
        raise PlanRequestError("kv_dtype", f"{spell('kv_dtype')}: {exc}") from exc
    if engine is not None and str(engine).strip().lower() not in ENGINES:
        raise PlanRequestError(
            "engine", f"{spell('engine')} must be one of {', '.join(ENGINES)}, got {engine!r}"
        )
    given = None
    if split is not None:
        try:
            given = parse_split(split)
        except PlanInputError as exc:
            raise PlanRequestError("split", f"{spell('split')}: {exc}") from exc
    return PlanInputs(
        context_tokens=context_tokens,
        concurrency=plan_concurrency,
        dtype=serving,
        kv_dtype=kv,
        split=given,
        workload=workload,
        engine=None if engine is None else str(engine).strip().lower(),
    )


def _concurrency(value: Any, spell: Spell) -> int | str | None:
    """None (not given), "max", or a whole number of at least 1 (an int or its digits)."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text == MAX:
            return MAX
        if text.isascii() and text.isdigit():
            value = int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanRequestError(
            "concurrency", f'{spell("concurrency")} must be a whole number or "max", got {value!r}'
        )
    return _bounded("concurrency", value, MAX_WORKLOAD_CONCURRENCY, spell)


def _workload(
    input_len: int | None,
    output_len: int | None,
    concurrency: int | str | None,
    phase: str | None,
    spell: Spell,
) -> Workload | None:
    """The engine's `Workload`, or None when neither length is given."""
    needs = f"give {spell('input_len')} and {spell('output_len')}"
    if input_len is None and output_len is None:
        if concurrency == MAX:
            raise PlanRequestError(
                "concurrency", f"{spell('concurrency')} max is a workload's: {needs}"
            )
        if phase is not None:
            raise PlanRequestError("phase", f"{spell('phase')} is a workload's: {needs}")
        return None
    for field, value, other in (
        ("input_len", input_len, "output_len"),
        ("output_len", output_len, "input_len"),
    ):
        if value is None:
            raise PlanRequestError(
                field, f"a workload needs {spell(field)} too, beside {spell(other)}"
            )
        _bounded(field, value, MAX_TOKENS, spell)
    phase = "both" if phase is None else phase
    if phase not in PHASES:
        raise PlanRequestError(
            "phase", f"{spell('phase')} must be one of {', '.join(PHASES)}, got {phase!r}"
        )
    assert input_len is not None and output_len is not None
    return Workload(
        input_tokens=input_len,
        output_tokens=output_len,
        concurrency=None if concurrency in (None, MAX) else int(concurrency),
        phase=phase,
    )


# --- the answer -------------------------------------------------------------------------------


def plan_and_workload(
    analysis: Mapping[str, Any],
    layout: PoolLayout,
    catalog: Catalog,
    inputs: PlanInputs,
    *,
    release: str,
    spell: Spell = api_name,
    pool: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the plan's dict with its `catalog_version`, the workload prediction's dict or None
    without a workload). On a `pool` (its name) both predict with the pool's own fit where
    its full-size sweeps made one (`pool_fit_of`), as the plan stage does.

    The plan is `plan_release`'s choice, or the given split checked, sized and predicted
    as each candidate is (`plan_release(split=...)`, no runners-up or scaling). The
    prediction is `predict_workload` on the plan's split, so both speak of one split. Raises
    `PlanRequestError` under "split" for a split larger than the pool or with EP on a dense
    model, `PlanInputError` and `CatalogError` for other unusable input, `NoFittingPlan` when
    nothing fits (or the given split does not)."""
    if inputs.split is not None:
        try:
            check_split_for(
                inputs.split,
                devices=layout.devices,
                moe=ModelShape.from_analysis(analysis).is_moe,
            )
        except PlanInputError as exc:
            raise PlanRequestError("split", f"{spell('split')}: {exc}") from exc
    fit = pool_fit_of(pool, layout, catalog, inputs.engine) if pool else None
    plan = plan_release(
        analysis,
        layout,
        context_tokens=inputs.context_tokens,
        concurrency=inputs.concurrency,
        dtype=inputs.dtype,
        release=release,
        catalog=catalog,
        split=inputs.split,
        fit=fit,
        **served_options(inputs),
    )
    result = plan.to_dict()
    result["catalog_version"] = catalog.version
    if inputs.workload is None:
        return result, None
    prediction = predict_workload(
        analysis,
        layout,
        inputs.workload,
        split=plan.split,
        dtype=inputs.dtype,
        kv_dtype=inputs.kv_dtype,
        engine=inputs.engine,
        fit=fit,
        catalog=catalog,
    )
    return result, prediction.to_dict()


def served_options(inputs: PlanInputs) -> dict[str, Any]:
    """The planner's options for what its predictions serve: the KV dtype and, with a
    workload, its input and output tokens per request (else the planner's defaults), so the
    plan's own predicted figures are of the workload too."""
    workload = inputs.workload
    return {
        "kv_dtype": inputs.kv_dtype,
        "engine": inputs.engine,
        "input_tokens": workload.input_tokens if workload else None,
        "output_tokens": workload.output_tokens if workload else None,
    }


def _bounded(field: str, value: int, limit: int, spell: Spell) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanRequestError(field, f"{spell(field)} must be a whole number, got {value!r}")
    if value < 1:
        raise PlanRequestError(field, f"{spell(field)} must be at least 1, got {value}")
    if value > limit:
        raise PlanRequestError(
            field, f"{spell(field)} = {value:,} is implausibly large (limit {limit:,})"
        )
    return value


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())
