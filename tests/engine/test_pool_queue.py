"""When a plan can start on its pool, from plain values (engine/pool_queue.py): the
queue simulated first come, first served, without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine.pool_queue import (
    Holding,
    Waiting,
    require_devices,
    start_estimate,
    start_wait_s,
)

NOW = datetime(2025, 7, 14, 8, 0, tzinfo=UTC)


def estimate(**overrides):
    """A plan needing 4 devices on an 8-device pool with a live worker, no history read yet."""
    arguments = {
        "pool": "h200",
        "queue": "pool.h200",
        "now": NOW,
        "devices": 4,
        "has_live_worker": True,
        "devices_reported": 8,
        "devices_declared": False,
        "holdings": [],
        "ahead": [],
        "stage_durations_s": lambda: [60.0, 120.0, 600.0],
    }
    return start_estimate(**{**arguments, **overrides})


def test_a_running_job_frees_its_devices_after_its_stages_left_at_the_median():
    # 8 devices, 6 held by a job 30 s into a stage with 2 stages left (100 s median):
    # 70 s for its running stage, 100 s for the next.
    wait = start_wait_s(
        devices=4,
        reported=8,
        free=2,
        holdings=[Holding(devices=6, running_s=30.0, remaining_stages=2)],
        ahead=[],
        median_s=100.0,
    )
    assert wait == 170.0


def test_a_job_ahead_is_served_first_and_holds_its_devices_for_its_stages():
    # 4 free; the job ahead takes them at once for 3 x 100 s; the running job frees its 4
    # after 50 s: the plan starts then, not after the job ahead.
    wait = start_wait_s(
        devices=4,
        reported=8,
        free=4,
        holdings=[Holding(devices=4, running_s=50.0, remaining_stages=1)],
        ahead=[Waiting(devices=4, remaining_stages=3)],
        median_s=100.0,
    )
    assert wait == 50.0
    # Needing all 8, it waits for the job ahead to finish too.
    whole = start_wait_s(
        devices=8,
        reported=8,
        free=4,
        holdings=[Holding(devices=4, running_s=50.0, remaining_stages=1)],
        ahead=[Waiting(devices=4, remaining_stages=3)],
        median_s=100.0,
    )
    assert whole == 300.0


def test_a_job_ahead_that_can_never_start_does_not_block_the_queue():
    wait = start_wait_s(
        devices=2,
        reported=8,
        free=8,
        holdings=[],
        ahead=[Waiting(devices=16, remaining_stages=5)],
        median_s=100.0,
    )
    assert wait == 0.0


def test_devices_that_are_never_freed_give_no_start():
    assert (
        start_wait_s(devices=4, reported=8, free=2, holdings=[], ahead=[], median_s=100.0) is None
    )


def test_the_estimate_reads_the_history_only_when_it_needs_it():
    def no_history_read():
        raise AssertionError("the stage durations were read")

    now = estimate(stage_durations_s=no_history_read)
    assert (now.blocked_by, now.basis, now.estimated_wait_s) == ("", "now", 0.0)
    assert now.estimated_start_at == NOW and now.can_start_now
    no_worker = estimate(has_live_worker=False, stage_durations_s=no_history_read)
    assert (no_worker.blocked_by, no_worker.basis) == ("no-live-worker", "no-live-worker")
    too_small = estimate(devices=16, stage_durations_s=no_history_read)
    assert (too_small.blocked_by, too_small.basis) == ("pool-too-small", "pool-too-small")


def test_the_estimate_waits_at_the_median_of_the_history():
    answer = estimate(
        holdings=[Holding(devices=6, running_s=20.0, remaining_stages=1)],
        stage_durations_s=lambda: [60.0, 120.0, 600.0],
    )
    assert (answer.devices_held, answer.devices_free, answer.running_jobs) == (6, 2, 1)
    assert (answer.blocked_by, answer.basis) == ("waits", "median-stage")
    assert (answer.median_stage_s, answer.history_stages) == (120.0, 3)
    assert answer.estimated_wait_s == 100.0
    assert answer.estimated_start_at == NOW + timedelta(seconds=100)
    # Every device held and no succeeded stage on the pool yet: it waits, without an estimate.
    full = [Holding(devices=8, running_s=0.0, remaining_stages=1)]
    empty = estimate(holdings=full, stage_durations_s=list)
    assert (empty.blocked_by, empty.basis, empty.estimated_start_at) == (
        "waits",
        "no-history",
        None,
    )


@pytest.mark.parametrize("devices", [0, -1, True, 2.0, "2"])
def test_a_plan_needs_a_positive_whole_number_of_devices(devices):
    with pytest.raises(ValueError, match="positive integer"):
        require_devices(devices)
    assert require_devices(3) == 3
