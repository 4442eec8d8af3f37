"""The pools page: each pool's inventory (`selectors.inventory`) with where its live workers
and its layout disagree, each worker's devices grouped as the page lists them, and the
pool's software stack with its workers that serve with another and its latest changes.
`partials/pools_live.html` words them (`partials/device_warning.txt`, also the API's pool
`warnings`; `partials/pool_stack.html` the stacks)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from adaptation.models import StackChange
from adaptation.selectors.inventory import PoolInventory, WorkerState
from adaptation.selectors.pools import worker_pool_stack
from adaptation.template_text import template_text

DEVICE_WARNING_TEMPLATE = "adaptation/partials/device_warning.txt"


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
    """The warning in the pools page's words, as plain text: the API's pool `warnings` (the
    page's template from the same `warning`, nothing HTML-escaped)."""
    return template_text(DEVICE_WARNING_TEMPLATE, {"warning": warning})


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


# --- software stacks ------------------------------------------------------------------------

STACK_PARTS = ("torch", "driver", "engine")


@dataclass(frozen=True)
class StackItem:
    """One version of a stack (`selectors.pools.worker_pool_stack`): `part` "torch" (of the
    worker process), "driver" or "engine"; `name` the driver's or engine's component
    ("cuda", "nvidia", "rocm", "amdgpu"; "vllm", "sglang", "openai", or "torch", the
    engine environment's own), "" for the worker's torch; `version` None when unknown."""

    part: str
    name: str
    version: str | None


def stack_items(stack: Mapping[str, Any] | None) -> dict[tuple[str, str], str | None]:
    """A stack's versions by (part, name), torch first, then the driver's, then the
    engine's, as reported. A host without accelerator (driver None) and a pool without
    engine ({}) have no item of that part."""
    if not isinstance(stack, Mapping):
        return {}
    items: dict[tuple[str, str], str | None] = {("torch", ""): _text(stack.get("torch"))}
    for part in ("driver", "engine"):
        versions = stack.get(part)
        if isinstance(versions, Mapping):
            for name, version in versions.items():
                items[(part, str(name))] = _text(version)
    return items


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class StackView:
    """A stack as the page shows it. `reported` False: none reported yet; `driver` None: no
    accelerator driver (a cpu host), [] an accelerator whose driver could not be read;
    `engine` [] a pool without serving engine."""

    reported: bool
    torch: str | None = None
    driver: list[StackItem] | None = None
    engine: list[StackItem] = field(default_factory=list)


def stack_view(stack: Mapping[str, Any] | None) -> StackView:
    """`stack` ({"torch", "driver", "engine"}, a pool's or a worker's for its pool) shaped
    for the page."""
    if not isinstance(stack, Mapping) or not stack:
        return StackView(reported=False)
    items = stack_items(stack)
    return StackView(
        reported=True,
        torch=items.get(("torch", "")),
        driver=None
        if stack.get("driver") is None
        else [StackItem("driver", n, v) for (p, n), v in items.items() if p == "driver"],
        engine=[StackItem("engine", n, v) for (p, n), v in items.items() if p == "engine"],
    )


@dataclass(frozen=True)
class StackDifference:
    """A version that differs between two stacks: `before` and `after` None where that side
    has none (or does not know it)."""

    part: str
    name: str
    before: str | None
    after: str | None


def stack_differences(
    before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
) -> list[StackDifference]:
    """The versions that differ from `before` to `after`, torch first, then the driver's,
    then the engine's."""
    old, new = stack_items(before), stack_items(after)
    keys = sorted(
        dict.fromkeys([*old, *new]),
        key=lambda key: STACK_PARTS.index(key[0]) if key[0] in STACK_PARTS else len(STACK_PARTS),
    )
    return [
        StackDifference(part, name, old.get((part, name)), new.get((part, name)))
        for part, name in keys
        if old.get((part, name)) != new.get((part, name))
    ]


@dataclass(frozen=True)
class WorkerStack:
    """A live worker of the pool serving it with another stack than the pool's: what
    differs, from the pool's version to the worker's."""

    worker: str
    differences: list[StackDifference]


@dataclass(frozen=True)
class StackChangeRow:
    """A change of the pool's stack: when, by whose report, what changed (`first`: the first
    stack the pool reported, `stack` then being it) and the suite run it started, if any."""

    detected_at: datetime
    worker: str
    first: bool
    stack: StackView
    differences: list[StackDifference]
    suite_run_id: int | None


def stack_change_row(change: StackChange) -> StackChangeRow:
    first = not change.previous
    return StackChangeRow(
        detected_at=change.detected_at,
        worker=change.worker_name,
        first=first,
        stack=stack_view(change.current),
        differences=[] if first else stack_differences(change.previous, change.current),
        suite_run_id=change.suite_run_id,
    )


@dataclass(frozen=True)
class PoolStack:
    """The pool's stack, its live workers serving it with another, its latest changes."""

    stack: StackView
    differing_workers: list[WorkerStack]
    changes: list[StackChangeRow]


def pool_stack(inventory: PoolInventory, changes: Iterable[StackChange]) -> PoolStack:
    """The stack part of a pool's card: its stack (`AcceleratorPool.stack`), each live
    worker whose report for the pool differs from it, and `changes` (its latest, newest
    first: `selectors.pools.recent_stack_changes`)."""
    pool = inventory.pool
    differing = []
    for state in inventory.live_workers:
        reported = worker_pool_stack(state.worker.software, pool.name)
        if reported is not None and pool.stack and reported != pool.stack:
            differences = stack_differences(pool.stack, reported)
            if differences:
                differing.append(WorkerStack(state.worker.name, differences))
    return PoolStack(
        stack=stack_view(pool.stack),
        differing_workers=differing,
        changes=[stack_change_row(change) for change in changes],
    )


@dataclass(frozen=True)
class PoolCard:
    """A pool on the pools page: its inventory, its warnings, its workers (live first) and
    its software stack."""

    inventory: PoolInventory
    warnings: list[DeviceWarning]
    workers: list[WorkerRow]
    stack: PoolStack


def pool_cards(
    inventories: Iterable[PoolInventory],
    stack_changes: Mapping[int, list[StackChange]] | None = None,
) -> list[PoolCard]:
    """A card per pool, in the inventories' order; `stack_changes` the latest stack changes
    by pool id (`selectors.pools.recent_stack_changes`; none listed where absent)."""
    stack_changes = stack_changes or {}
    return [
        PoolCard(
            inventory=inventory,
            warnings=device_warnings(inventory),
            workers=[WorkerRow(state, device_groups(state)) for state in inventory.workers],
            stack=pool_stack(inventory, stack_changes.get(inventory.pool.pk, [])),
        )
        for inventory in inventories
    ]
