"""The pools page: each pool's inventory (`selectors.inventory`) with where its live workers
and its layout disagree, and each worker's devices grouped as the page lists them.
`partials/pools_live.html` words them (`partials/device_warning.html`, also the API's pool
`warnings`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from html import unescape

from django.template.loader import render_to_string

from adaptation.selectors.inventory import PoolInventory, WorkerState

DEVICE_WARNING_TEMPLATE = "adaptation/partials/device_warning.html"


@dataclass(frozen=True)
class DeviceWarning:
    """A backend pool's live workers and layout disagreeing. `kind` "other-backend": worker
    `worker` runs on `backend` ("" when it reported none), not the pool's `pool_backend`, so
    its `devices` do not count; "layout-exceeds": the layout declares `devices_per_node` per
    node x `nodes` nodes, more than the `reported` devices of the live workers."""

    kind: str
    pool_backend: str
    worker: str = ""
    backend: str = ""
    devices: int = 0
    devices_per_node: int = 0
    nodes: int = 0
    reported: int = 0


def device_warnings(inventory: PoolInventory) -> list[DeviceWarning]:
    """Where the pool's live workers and layout disagree (a backend pool with a live worker,
    not cpu or manifest): each worker on another backend, whose devices do not count, then a
    layout declaring more devices than the live workers report."""
    backend = inventory.pool.backend
    warnings = [
        DeviceWarning(
            kind="other-backend",
            pool_backend=backend,
            worker=state.worker.name,
            backend=state.worker.backend or "",
            devices=state.device_count,
        )
        for state in inventory.other_backend_workers
    ]
    layout = inventory.layout
    if layout is not None and inventory.layout_exceeds_reported:
        warnings.append(
            DeviceWarning(
                kind="layout-exceeds",
                pool_backend=backend,
                devices_per_node=layout.devices_per_node,
                nodes=layout.nodes,
                reported=inventory.devices_reported,
            )
        )
    return warnings


def device_warning_text(warning: DeviceWarning) -> str:
    """The warning in the pools page's words, as plain text: the API's pool `warnings`."""
    html = render_to_string(DEVICE_WARNING_TEMPLATE, {"warning": warning})
    return unescape(" ".join(html.split()))


@dataclass(frozen=True)
class DeviceGroup:
    """Alike devices a worker reported: how many, their name and memory (bytes, None when
    not reported)."""

    count: int
    name: str
    memory_bytes: int | None


def device_groups(state: WorkerState) -> list[DeviceGroup]:
    """The worker's reported devices, alike ones together, in the order first reported:
    eight identical GPUs are one line."""
    groups: dict[tuple[str, int | None], int] = {}
    for device in state.worker.devices or []:
        if isinstance(device, dict):
            key = (
                str(device.get("name") or device.get("type") or "?"),
                device.get("memory_bytes"),
            )
            groups[key] = groups.get(key, 0) + 1
    return [DeviceGroup(count, name, memory) for (name, memory), count in groups.items()]


@dataclass(frozen=True)
class WorkerRow:
    """A worker of a pool as the page lists it: its state and its devices grouped."""

    state: WorkerState
    device_groups: list[DeviceGroup]


@dataclass(frozen=True)
class PoolCard:
    """A pool on the pools page: its inventory, its warnings and its workers (live first)."""

    inventory: PoolInventory
    warnings: list[DeviceWarning]
    workers: list[WorkerRow]


def pool_cards(inventories: Iterable[PoolInventory]) -> list[PoolCard]:
    """A card per pool, in the inventories' order."""
    return [
        PoolCard(
            inventory=inventory,
            warnings=device_warnings(inventory),
            workers=[WorkerRow(state, device_groups(state)) for state in inventory.workers],
        )
        for inventory in inventories
    ]
