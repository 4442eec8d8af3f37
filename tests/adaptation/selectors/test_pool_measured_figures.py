"""The cpu pool's stored probes (adaptation/selectors/calibration.py): a probe taken on a busy
host never replaces a quiet one, however many come after it; it drives a plan only where the
pool has nothing better, and then says so."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from adaptation.selectors.calibration import pool_calibration, pool_measured_figures
from tests.factories import cpu_pool, make_job

pytestmark = pytest.mark.django_db

GB = 1e9


def probed_run(pool, bandwidth_gb: float, tflops: float, *, busy: bool | None, minutes_ago: int):
    """A succeeded performance run of `pool` that finished `minutes_ago`, whose probe read
    these figures on a busy (True) or quiet (False) host, or did not measure it (None)."""
    device = {
        "kind": "measured",
        "device": "cpu",
        "memory_bandwidth_bytes_per_s": bandwidth_gb * GB,
        "flops": {"bfloat16": tflops * 1e12},
    }
    if busy is not None:
        device["host_busy"] = busy
    job = make_job(
        stages=("performance",),
        pool=pool,
        statuses={"performance": "succeeded"},
        results={"performance": {"calibration": {"device": device}}},
    )
    run = job.stage_runs.get()
    run.finished_at = timezone.now() - timedelta(minutes=minutes_ago)
    run.worker_host = "cpu@host"
    run.save(update_fields=["finished_at", "worker_host"])
    return run


def test_busy_probes_after_a_quiet_one_do_not_replace_it():
    pool = cpu_pool()
    quiet = probed_run(pool, 29.0, 1.6, busy=False, minutes_ago=60)
    # six newer busy probes, more than the window of 5: the trial's 2.8 GB/s among them
    for minutes, (bw, fl) in enumerate([(2.8, 0.01), (13.0, 0.4), (14.0, 0.8)] * 2):
        probed_run(pool, bw, fl, busy=True, minutes_ago=minutes)
    figures = pool_measured_figures(pool=pool)
    assert figures["memory_bandwidth_bytes_per_s"] == 29.0 * GB
    assert figures["flops"] == {"bfloat16": 1.6e12}
    assert figures["runs"] == [quiet.pk]
    assert figures["host"] == "quiet" and figures["host_busy"] is False
    assert figures["busy_left_out"] == 6
    assert figures["source"].endswith(", each taken on a quiet host")
    # the plan stage reads the same figures through the running calibration
    assert pool_calibration(pool=pool)["device"] == figures


def test_the_quiet_probes_median_leaves_unmeasured_and_busy_ones_out():
    pool = cpu_pool()
    probed_run(pool, 10.0, 0.3, busy=None, minutes_ago=90)  # from before hosts were measured
    runs = [
        probed_run(pool, bw, 1.6, busy=False, minutes_ago=m)
        for bw, m in ((27.0, 50), (29.0, 40), (31.0, 30))
    ]
    probed_run(pool, 3.0, 0.02, busy=True, minutes_ago=1)
    figures = pool_measured_figures(pool=pool)
    assert figures["memory_bandwidth_bytes_per_s"] == 29.0 * GB  # median of 27, 29, 31
    assert sorted(figures["runs"]) == sorted(r.pk for r in runs)
    assert figures["busy_left_out"] == 1


def test_probes_that_did_not_measure_their_host_rank_over_busy_ones():
    pool = cpu_pool()
    old = probed_run(pool, 20.0, 1.0, busy=None, minutes_ago=30)
    probed_run(pool, 3.0, 0.02, busy=True, minutes_ago=1)
    figures = pool_measured_figures(pool=pool)
    assert figures["runs"] == [old.pk] and figures["host"] == "not measured"
    assert figures["host_busy"] is False


def test_busy_probes_drive_the_figures_only_where_nothing_better_exists_and_say_so():
    pool = cpu_pool()
    runs = [
        probed_run(pool, bw, fl, busy=True, minutes_ago=m)
        for bw, fl, m in ((13.0, 0.4, 3), (2.8, 0.01, 2), (14.0, 0.8, 1))
    ]
    figures = pool_measured_figures(pool=pool)
    assert figures["memory_bandwidth_bytes_per_s"] == 13.0 * GB  # median of 13, 2.8, 14
    assert figures["flops"]["bfloat16"] == pytest.approx(0.4e12)
    assert sorted(figures["runs"]) == sorted(r.pk for r in runs)
    assert figures["host"] == "busy" and figures["host_busy"] is True
    assert figures["busy_left_out"] == 0
    assert figures["source"].endswith(", taken on a busy host: no probe on the pool was quiet")
    # the first quiet probe replaces them all
    probed_run(pool, 29.0, 1.6, busy=False, minutes_ago=0)
    assert pool_measured_figures(pool=pool)["memory_bandwidth_bytes_per_s"] == 29.0 * GB


def test_a_pool_without_probes_has_no_figures():
    assert pool_measured_figures(pool=cpu_pool()) is None


def plan_json(*args: str) -> dict:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("plan", *args, "--format", "json", stdout=out)
    return json.loads(out.getvalue())


def test_manage_py_plan_shows_which_host_the_cpu_figures_were_measured_on():
    from tests.adaptation.management.test_plan_command import GPT_OSS_20B, make_worker

    pool = cpu_pool()
    make_worker("cpu@small", 24)
    busy = probed_run(pool, 2.8, 0.01, busy=True, minutes_ago=5)
    plan = plan_json(GPT_OSS_20B, "--pool", "cpu")
    assert plan["measured_device"]["memory_bandwidth_bytes_per_s"] == 2.8 * GB
    assert plan["measured_device"]["host_busy"] is True
    assert "BF16 0.01 TFLOP/s measured on a busy host, not a datasheet's" in plan["note"]
    assert f"(stage runs {busy.pk}) on cpu@host" in plan["measured_device"]["source"]
    # a quiet probe, older than the busy one, is what the next plan predicts on
    probed_run(pool, 29.0, 1.6, busy=False, minutes_ago=60)
    plan = plan_json(GPT_OSS_20B, "--pool", "cpu")
    assert plan["measured_device"]["memory_bandwidth_bytes_per_s"] == 29.0 * GB
    assert plan["measured_device"]["host_busy"] is False
    assert "measured on a busy host" not in plan["note"]
