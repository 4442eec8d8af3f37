"""The accelerator catalog as the site sees it: the shipped file plus the admin's rows, and a
pool's layout for the planner.

The file (`workers/catalog/accelerators.json`) is versioned with the code; an
`AcceleratorKind` row adds a kind or, with the same kind, replaces the file's entry. Both are
parsed by the same checks (`workers.catalog.parse_catalog`), so a row without a source for a
figure is refused like a file entry would be.
"""

from __future__ import annotations

from typing import Any

from adaptation.models import AcceleratorKind, AcceleratorPool
from workers.catalog import Catalog, CatalogError, load_catalog, parse_catalog
from workers.stages.plan import PoolLayout

GIB = 1024**3


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else float(value) * factor


def accelerator_kind_entry(row: AcceleratorKind) -> dict[str, Any]:
    """The catalog-file entry (bytes, bytes/s, FLOP/s) for an admin row entered in GiB, TB/s,
    TFLOP/s and GB/s."""
    return {
        "kind": row.kind,
        "name": row.name,
        "vendor": row.vendor,
        "memory_bytes": round(row.memory_gib * GIB),
        "memory_datasheet": f"{row.memory_gib:g} GiB (admin row)",
        "memory_bandwidth_bytes_per_s": _scaled(row.memory_bandwidth_tbps, 1e12),
        "dense_bf16_flops": _scaled(row.dense_bf16_tflops, 1e12),
        "dense_fp8_flops": _scaled(row.dense_fp8_tflops, 1e12),
        "low_precision_kind": row.low_precision_kind or None,
        "dtypes": list(row.dtypes or []),
        "intra_node_bandwidth_bytes_per_s": _scaled(row.intra_node_bandwidth_gbps, 1e9),
        "inter_node_bandwidth_bytes_per_s": _scaled(row.inter_node_bandwidth_gbps, 1e9),
        "devices_per_node": row.devices_per_node,
        "device_resource": row.device_resource,
        "sources": dict(row.sources or {}),
        "notes": [line for line in (row.notes or "").splitlines() if line.strip()],
    }


def catalog_current(rows: list[AcceleratorKind] | None = None) -> Catalog:
    """The shipped catalog with the admin's `AcceleratorKind` rows applied (a row replaces the
    file's entry of the same kind, or adds one). Raises `CatalogError` when an entry is
    malformed (a row is checked when saved, so that means the file)."""
    base = load_catalog()
    rows = list(AcceleratorKind.objects.all()) if rows is None else rows
    if not rows:
        return base
    entries = {kind: acc.to_dict() for kind, acc in base.accelerators.items()}
    for row in rows:
        entries[row.kind] = accelerator_kind_entry(row)
    return parse_catalog(
        {
            "catalog_version": f"{base.version}+{len(rows)} admin row(s)",
            "conventions": dict(base.conventions),
            "accelerators": list(entries.values()),
        }
    )


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


def pool_layout(pool: AcceleratorPool, catalog: Catalog | None = None) -> PoolLayout:
    """The planner's `PoolLayout` for `pool`: a blank `devices_per_node` takes the catalog's
    figure for the kind (1 for "cpu"), bandwidths in GB/s become bytes/s. Raises
    `CatalogError` for an unknown kind."""
    kind = pool_accelerator_kind(pool)
    per_node = pool.devices_per_node
    if per_node is None:
        accelerator = (catalog or catalog_current()).accelerator(kind)
        per_node = accelerator.devices_per_node
    return PoolLayout(
        accelerator=kind,
        devices_per_node=per_node,
        nodes=pool.nodes,
        intra_node_bandwidth_bytes_per_s=_scaled(pool.intra_node_bandwidth_gbps, 1e9),
        inter_node_bandwidth_bytes_per_s=_scaled(pool.inter_node_bandwidth_gbps, 1e9),
    )


__all__ = [
    "CatalogError",
    "accelerator_kind_entry",
    "catalog_current",
    "pool_accelerator_kind",
    "pool_layout",
]
