"""The accelerator catalog as the site sees it: the shipped file plus the admin's rows, and a
pool's layout for the planner.

The file (`engine/catalog/accelerators.json`) is versioned with the code; an
`AcceleratorKind` row adds a kind or, with the same kind, replaces the file's entry. Both are
parsed by the same checks (`engine.catalog.parse_catalog`), so a row without a source for a
figure is refused like a file entry would be.

The "cpu" kind is the machine a cpu pool's worker runs on: `pool_catalog` describes it with
the cores and memory the pool's live worker registered at its start, or, with no live
worker, with this machine's own measure, and says which; its memory bandwidth and FLOP/s are
those the pool's performance runs measured (`selectors.pool_measured_figures`, as the plan
stage gets them: quiet probes over busy ones), said in the note, with "on a busy host" where
the pool has only probes taken on one.
"""

from __future__ import annotations

import os
from typing import Any

from adaptation.models import AcceleratorKind, AcceleratorPool
from adaptation.selectors.calibration import pool_measured_figures
from adaptation.selectors.workers import live_workers
from engine import formatting as fmt
from engine.catalog import Accelerator, Catalog, CatalogError, cpu_accelerator, load_catalog
from engine.stages.plan.layout import PoolLayout
from engine.units import gb_per_s_to_bytes_per_s


def accelerator_kind_row_entry(kind: str) -> dict[str, Any] | None:
    """The catalog entry of the admin's `AcceleratorKind` row for `kind`, or None when no
    row defines it (the shipped file's figures apply)."""
    row = AcceleratorKind.objects.filter(kind=kind).first() if kind else None
    return row.catalog_entry() if row is not None else None


def pool_accelerator_kind(pool: AcceleratorPool) -> str:
    """The catalog kind a pool's plan uses: its `accelerator`, or "cpu" (the machine its
    worker runs on) for a cpu pool without one. Raises `CatalogError` when neither."""
    if pool.accelerator:
        return pool.accelerator
    if pool.backend == "cpu":
        return "cpu"
    raise CatalogError(
        f"pool {pool.name!r} names no accelerator kind; set one (h100, h200, ...) in the admin"
    )


def pool_cpu_accelerator(pool: AcceleratorPool) -> tuple[Accelerator, str]:
    """The "cpu" kind for `pool`: (Accelerator, note saying where its figures come from).

    From the registered figures (cores, memory bytes) of the pool's live worker with the
    least memory (a job may land on any of them); with none, this machine measured now. Its
    memory bandwidth and BF16 FLOP/s are those the plan stage predicts on:
    `selectors.pool_measured_figures` (the median of the pool's last performance runs'
    probes), or none (no prediction) when no performance run measured them.
    """
    measured = pool_measured_figures(pool=pool)
    workers = [w for w in live_workers(pool) if w.memory_bytes]
    if workers:
        worker = min(workers, key=lambda w: w.memory_bytes)
        cpu = cpu_accelerator(
            cores=worker.cpu_cores,
            memory_bytes=worker.memory_bytes,
            measured_by=worker.name,
            measured_figures=measured,
        )
        others = f", the smallest of {len(workers)} live workers" if len(workers) > 1 else ""
        note = (
            f"cpu is the machine of worker {worker.name} as it registered at start "
            f"({worker.cpu_cores or '?'} cores, {fmt.gib(cpu.memory_bytes)}{others})"
        )
    else:
        cpu = cpu_accelerator(measured_figures=measured)
        note = (
            f"no live worker on {pool.queue}: cpu is this machine as measured here "
            f"({os.cpu_count() or 1} cores, {fmt.gib(cpu.memory_bytes)}); "
            "the worker's machine may differ"
        )
    return cpu, note + measured_figures_note(cpu, measured)


def measured_figures_note(cpu: Accelerator, measured: dict[str, Any] | None) -> str:
    """What a cpu kind's speed figures are, to end a note: measured (by which runs; "on a
    busy host" where the pool has only probes taken on one), or missing, so there is no
    prediction."""
    if cpu.memory_bandwidth_bytes_per_s and cpu.dense_bf16_flops:
        return (
            f"; memory bandwidth {fmt.gb_per_s(cpu.memory_bandwidth_bytes_per_s)} and BF16 "
            f"{fmt.tflops(cpu.dense_bf16_flops)} measured"
            + (" on a busy host" if cpu.measured_on_busy_host else "")
            + f", not a datasheet's: {(measured or {}).get('source', 'a performance run')}"
        )
    return "; no performance run on the pool measured its memory bandwidth and FLOP/s yet"


def pool_catalog(
    pool: AcceleratorPool, catalog: Catalog | None = None
) -> tuple[Catalog, PoolLayout, str]:
    """What the planner needs for `pool`, as the web side sees it: the current catalog
    (file plus admin rows; "cpu" described per `pool_cpu_accelerator` for a cpu pool), the
    pool's `PoolLayout`, and a note saying where the accelerator's figures come from.

    `catalog` is `AcceleratorKind.objects.catalog()` when the caller already loaded it (a
    page planning many pools loads it once); None: loaded here. Raises `CatalogError` when
    the pool names no kind (non-cpu backend) or an unknown one."""
    catalog = AcceleratorKind.objects.catalog() if catalog is None else catalog
    kind = pool_accelerator_kind(pool)
    if kind == "cpu":
        cpu, note = pool_cpu_accelerator(pool)
        catalog = catalog.with_cpu(cpu)
    else:
        accelerator = catalog.accelerator(kind)
        shipped = load_catalog()
        # An admin row replaces the file's entry with its own: the shipped object is not it.
        origin = (
            f"catalog {shipped.version}"
            if shipped.accelerators.get(kind) is accelerator
            else "the admin's catalog row"
        )
        note = f"{kind} ({accelerator.name}) figures from {origin}"
    return catalog, pool_layout(pool, catalog), note


def pool_layout(pool: AcceleratorPool, catalog: Catalog | None = None) -> PoolLayout:
    """The planner's `PoolLayout` for `pool`: a blank `devices_per_node` takes the catalog's
    figure for the kind (1 for "cpu"), bandwidths in GB/s become bytes/s. Raises
    `CatalogError` for an unknown kind."""
    kind = pool_accelerator_kind(pool)
    per_node = pool.devices_per_node
    if per_node is None:
        accelerator = (catalog or AcceleratorKind.objects.catalog()).accelerator(kind)
        per_node = accelerator.devices_per_node
    return PoolLayout(
        accelerator=kind,
        devices_per_node=per_node,
        nodes=pool.nodes,
        intra_node_bandwidth_bytes_per_s=gb_per_s_to_bytes_per_s(
            pool.intra_node_bandwidth_gb_per_s
        ),
        inter_node_bandwidth_bytes_per_s=gb_per_s_to_bytes_per_s(
            pool.inter_node_bandwidth_gb_per_s
        ),
    )


__all__ = [
    "accelerator_kind_row_entry",
    "measured_figures_note",
    "pool_accelerator_kind",
    "pool_catalog",
    "pool_cpu_accelerator",
    "pool_layout",
]
