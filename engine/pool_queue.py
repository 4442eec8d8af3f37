"""When a plan can start on its pool: the pool's queue simulated first come, first served.

Plain values in, a `StartEstimate` out: no Django, no database. The app's
`plan_start_estimate` (`adaptation/selectors/inventory.py`) reads the pool (its live workers'
devices, the jobs holding devices and those waiting ahead, its latest stage durations) and
hands them here; the plan panel words the answer (`partials/start_reason.html`,
`start_basis.html`).

The estimate assumes every stage on the pool takes the median duration of its latest
succeeded stages: a running job frees its devices after its running stage's median less its
time so far (never below zero) plus the median for each stage after it; a waiting job, once
it starts, holds its devices for the median times its remaining stages. A waiting job that
can never start on the pool as it is (it needs more devices than the pool has, or the
running jobs never free enough) does not block the jobs behind it.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Holding:
    """A job holding `devices` of the pool now: its running stage has run `running_s`
    seconds, and `remaining_stages` stages (the running one included) are not finished."""

    devices: int
    running_s: float
    remaining_stages: int


@dataclass(frozen=True)
class Waiting:
    """A job waiting for the pool: it will hold `devices` for its `remaining_stages`."""

    devices: int
    remaining_stages: int


@dataclass(frozen=True)
class StartEstimate:
    """When a plan needing `devices_needed` devices can start on pool `pool` (queue `queue`),
    against the pool as it was at `as_of`. The start time is an estimate, never a promise:
    `basis` says how it was made.

    `blocked_by` says why it cannot start now: "no-live-worker", "pool-too-small" (the
    pool's devices, `devices_reported`, are fewer than it needs), "waits" (for the
    `queue_position` jobs ahead of it, and for devices while `devices_free` <
    `devices_needed`), or "" when it can. `basis` is "now" (enough devices are free),
    "median-stage" (the estimate: each of the `running_jobs` and `queue_position` jobs ahead
    frees its devices after its remaining stages x the median stage duration on the pool,
    `median_stage_s` over its last `history_stages` succeeded stages, a running stage less
    its time so far), or why there is no estimate: "no-live-worker", "pool-too-small",
    "no-history", "never-frees" (the running jobs would never free enough).
    `devices_declared`: the pool's devices are its declared layout (a manifest pool), not
    what its workers report."""

    pool: str
    queue: str
    as_of: datetime
    devices_needed: int
    devices_reported: int
    devices_declared: bool
    devices_held: int
    devices_free: int
    queue_position: int
    running_jobs: int
    blocked_by: str
    basis: str
    estimated_start_at: datetime | None = None
    estimated_wait_s: float | None = None
    median_stage_s: float | None = None
    history_stages: int = 0

    @property
    def can_start_now(self) -> bool:
        return self.blocked_by == ""


def require_devices(devices: object) -> int:
    """`devices` as the device count a plan needs. Raises `ValueError` unless it is a
    positive integer (a bool is not one)."""
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a positive integer, got {devices!r}")
    return devices


def start_wait_s(
    *,
    devices: int,
    reported: int,
    free: int,
    holdings: Sequence[Holding],
    ahead: Sequence[Waiting],
    median_s: float,
) -> float | None:
    """Seconds until `devices` of the pool's `reported` are free (`free` of them are now),
    serving the jobs `ahead` first, in order, each stage taking `median_s` seconds (see the
    module's docstring). None when they never are."""
    releases: list[tuple[float, int]] = []  # (seconds from now, devices freed then)
    for holding in holdings:
        left = max(median_s - holding.running_s, 0.0) + median_s * (holding.remaining_stages - 1)
        heapq.heappush(releases, (left, holding.devices))
    clock = 0.0

    def wait_until_free(need: int) -> bool:
        nonlocal clock, free
        while free < need and releases:
            at, count = heapq.heappop(releases)
            clock = max(clock, at)
            free = min(free + count, reported)
        return free >= need

    for waiting in ahead:
        if waiting.devices > reported or not wait_until_free(waiting.devices):
            continue  # it can never start on the pool as it is: it does not block others
        free -= waiting.devices
        heapq.heappush(releases, (clock + median_s * waiting.remaining_stages, waiting.devices))
    return clock if wait_until_free(devices) else None


def start_estimate(
    *,
    pool: str,
    queue: str,
    now: datetime,
    devices: int,
    has_live_worker: bool,
    devices_reported: int,
    devices_declared: bool,
    holdings: Sequence[Holding],
    ahead: Sequence[Waiting],
    stage_durations_s: Callable[[], Sequence[float]],
) -> StartEstimate:
    """When a plan needing `devices` can start on pool `pool` (queue `queue`) at `now`: the
    pool has a live worker or not, `devices_reported` devices (`devices_declared`: its
    declared layout's), the jobs `holdings` hold devices (the plan's own job left out) and
    the jobs `ahead` wait before it, oldest first. `stage_durations_s` gives the pool's
    latest succeeded stage durations (seconds); it is called only when the answer needs an
    estimate (it costs the caller a query)."""
    held = sum(holding.devices for holding in holdings)
    free = max(devices_reported - held, 0)
    facts = {
        "pool": pool,
        "queue": queue,
        "as_of": now,
        "devices_needed": devices,
        "devices_reported": devices_reported,
        "devices_declared": devices_declared,
        "devices_held": held,
        "devices_free": free,
        "queue_position": len(ahead),
        "running_jobs": len(holdings),
    }
    if not has_live_worker:
        return StartEstimate(**facts, blocked_by="no-live-worker", basis="no-live-worker")
    if devices_reported < devices:
        return StartEstimate(**facts, blocked_by="pool-too-small", basis="pool-too-small")
    if free >= devices and not ahead:
        return StartEstimate(
            **facts, blocked_by="", basis="now", estimated_start_at=now, estimated_wait_s=0.0
        )
    durations = list(stage_durations_s())
    if not durations:
        return StartEstimate(**facts, blocked_by="waits", basis="no-history")
    median_s = statistics.median(durations)
    history = {"median_stage_s": round(median_s, 3), "history_stages": len(durations)}
    wait_s = start_wait_s(
        devices=devices,
        reported=devices_reported,
        free=free,
        holdings=holdings,
        ahead=ahead,
        median_s=median_s,
    )
    if wait_s is None:
        return StartEstimate(**facts, **history, blocked_by="waits", basis="never-frees")
    return StartEstimate(
        **facts,
        **history,
        blocked_by="waits",
        basis="median-stage",
        estimated_wait_s=round(wait_s, 3),
        estimated_start_at=now + timedelta(seconds=wait_s),
    )
