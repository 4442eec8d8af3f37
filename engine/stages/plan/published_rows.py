"""Published serving results with their conditions (`published/results.csv`), read as
predictions to check: each row names a config, a split, a dtype, an engine, input/output
lengths, a concurrency and one published figure (the folder's README says where each row
comes from).

`load_rows()` reads and checks the file; `row_prediction(row, efficiency)` predicts the row's
figure with `workload.solve` under given constants, which is what the fit minimises and the
accuracy benchmark prints. Metrics (the folder's README): `offline_out_tps`, `bench_out_tps`,
`offline_total_tps`, `out_tps_gpu`, `decode_out_tps_gpu`, `prefill_in_tps_gpu`, `tpot_ms`,
`ttft_ms`, `e2e_s`.
"""

from __future__ import annotations

import csv
import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.architecture import analyze_config
from engine.catalog import CatalogError, load_catalog

from .errors import NoFittingPlan, PlanInputError
from .fits import CONFIGS_DIR, RESULTS_CSV, Observation
from .layout import PoolLayout
from .split_notation import parse_split
from .steady_state import normalize_kv_dtype
from .step_time import Efficiency
from .workload import split_predictor

METRICS = (
    "offline_out_tps",
    "bench_out_tps",
    "offline_total_tps",
    "out_tps_gpu",
    "decode_out_tps_gpu",
    "prefill_in_tps_gpu",
    "tpot_ms",
    "ttft_ms",
    "e2e_s",
)
ENGINE_FAMILIES = (("tensorrt", "tensorrt-llm"), ("trt", "tensorrt-llm"), ("sglang", "sglang"))


def engine_family(engine: str) -> str:
    """ "TensorRT-LLM ~1.0" -> "tensorrt-llm", "SGLang 0.4.1.post2" -> "sglang", anything
    else (vLLM and its builds) -> "vllm"."""
    low = engine.strip().lower()
    for needle, family in ENGINE_FAMILIES:
        if needle in low:
            return family
    return "vllm"


@dataclass(frozen=True)
class PublishedRow:
    """One published figure and the conditions it was measured under."""

    id: str
    source: str
    model: str
    config: str
    dtype: str
    kv_dtype: str
    accelerator: str
    devices: int
    split: str
    engine: str
    isl: int
    osl: int
    concurrency: int | None  # None: max load (offline)
    metric: str
    published: float
    confidence: str

    @property
    def engine_family(self) -> str:
        return engine_family(self.engine)

    @property
    def phase(self) -> str:
        if self.metric == "decode_out_tps_gpu":
            return "decode"
        if self.metric == "prefill_in_tps_gpu":
            return "prefill"
        return "both"


def _row(raw: dict[str, str], where: str) -> PublishedRow:
    try:
        conc = raw["concurrency"].strip()
        metric = raw["metric"].strip()
        if metric not in METRICS:
            raise PlanInputError(f"unknown metric {metric!r}")
        dtype = raw["dtype"].strip()
        kv = normalize_kv_dtype((raw.get("kv_dtype") or "").strip() or None) or "bfloat16"
        return PublishedRow(
            id=raw["id"].strip(),
            source=raw["source"].strip(),
            model=raw["model"].strip(),
            config=raw["config"].strip(),
            dtype=dtype,
            kv_dtype=kv,
            accelerator=raw["accelerator"].strip(),
            devices=int(raw["devices"]),
            split=raw["split"].strip(),
            engine=raw["engine"].strip(),
            isl=int(raw["isl"]),
            osl=int(raw["osl"]),
            concurrency=None if conc in ("max-load", "max", "") else int(conc),
            metric=metric,
            published=float(raw["published"]),
            confidence=raw.get("confidence", "").strip(),
        )
    except (KeyError, ValueError) as exc:
        raise PlanInputError(f"{where}: unusable row ({exc})") from exc


def load_rows(path: Path = RESULTS_CSV) -> list[PublishedRow]:
    """Every row of the published results file. Raises `PlanInputError` naming the row."""
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        return [_row(raw, f"{path.name} line {n + 2}") for n, raw in enumerate(reader)]


@functools.lru_cache(maxsize=64)
def _analysis(config_name: str, configs_dir: str) -> dict[str, Any]:
    config = json.loads((Path(configs_dir) / config_name).read_text(encoding="utf-8"))
    return analyze_config(config).to_dict()


def _layout(row: PublishedRow, per_node: int) -> PoolLayout:
    per_node = min(row.devices, per_node)
    return PoolLayout(row.accelerator, per_node, nodes=math.ceil(row.devices / per_node))


def row_predictor(
    row: PublishedRow, configs_dir: Path = CONFIGS_DIR
) -> Callable[[Efficiency], float]:
    """A function of the constants that predicts `row`'s published figure, in its unit: the
    row's split sized and checked once (`planner.evaluate_split`), then its workload solved
    under the constants given. Raises `PlanInputError` for a row that cannot be planned (an
    accelerator the catalog lacks, a split that does not fit)."""
    analysis = _analysis(row.config, str(configs_dir))
    accelerator = load_catalog().accelerator(row.accelerator)
    base = split_predictor(
        analysis,
        _layout(row, accelerator.devices_per_node),
        parse_split(row.split),
        input_tokens=row.isl,
        output_tokens=row.osl,
        dtype=row.dtype,
        kv_dtype=row.kv_dtype,
        engine=row.engine_family,
    )

    def predict(efficiency: Efficiency) -> float:
        predictor = replace(base, fit=replace(base.fit, efficiency=efficiency))
        return metric_value(row, predictor.workload(row.concurrency, row.phase))

    return predict


def metric_value(row: PublishedRow, state: dict[str, Any]) -> float:
    """The figure of `state` (`workload.solve`'s result) that `row.metric` names."""
    out, inp = state["output_tokens_per_s"], state["input_tokens_per_s"]
    metric = row.metric
    if metric in ("offline_out_tps", "bench_out_tps"):
        return out
    if metric == "offline_total_tps":
        return out + inp
    if metric in ("out_tps_gpu", "decode_out_tps_gpu"):
        return out / row.devices
    if metric == "prefill_in_tps_gpu":
        return inp / row.devices
    if metric == "tpot_ms":
        return state["tpot_s"] * 1000
    if metric == "ttft_ms":
        return state["ttft_s"] * 1000
    return state["e2e_s"]


# Latencies: a higher prediction is the slower one. log(pred / published) is read as a
# throughput error, so latency rows flip it (a prediction that is 2x fast reads 2x
# optimistic either way).
LATENCY_METRICS = frozenset({"tpot_ms", "ttft_ms", "e2e_s"})


def optimism(row: PublishedRow, predicted: float) -> float:
    """How much better the prediction is than the published figure (> 1: optimistic)."""
    ratio = predicted / row.published
    return 1 / ratio if row.metric in LATENCY_METRICS else ratio


def observation(row: PublishedRow, configs_dir: Path = CONFIGS_DIR) -> Observation:
    """`row` as a `fits.Observation` (latency rows flagged)."""
    return Observation(
        row_predictor(row, configs_dir), row.published, row.metric in LATENCY_METRICS
    )


def plannable(
    rows: Sequence[PublishedRow], configs_dir: Path = CONFIGS_DIR
) -> tuple[list[tuple[PublishedRow, Observation]], list[tuple[PublishedRow, str]]]:
    """`rows` the planner can predict, as observations, and those it refuses with the reason
    (a split the planner finds does not fit its devices' memory, an accelerator the catalog
    lacks): the benchmark prints the refused ones."""
    kept, refused = [], []
    for row in rows:
        try:
            kept.append((row, observation(row, configs_dir)))
        except (PlanInputError, NoFittingPlan, CatalogError) as err:
            refused.append((row, str(err)))
    return kept, refused
