"""A pool's running calibration and the device figures its performance runs measured."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adaptation.models import (
    AcceleratorPool,
    PerformancePoint,
    StageRun,
    StageStatus,
)
from adaptation.selectors.full_size import pool_full_size_sweeps
from engine import formatting as fmt
from engine.stages.performance.result import PerformanceResult
from engine.stages.plan.calibration import (
    DEFAULT_CALIBRATION_RUNS,
    EFFICIENCY_METRICS,
    running_calibration,
    usable_efficiency,
)

# The plan's measured device figures (cpu pools) are the median of this many newest
# successful performance runs' probes: one probe swings about 2x run to run.
MEASURED_FIGURES_RUNS = 5
# What a stored probe says of its host (`engine/probe_repeats.py`), best first: the plan's
# figures come from the best kind the pool has. A probe from before the host was measured
# ranks under a quiet one and over a busy one.
QUIET_HOST = "quiet"
HOST_NOT_MEASURED = "not measured"
BUSY_HOST = "busy"
HOST_LABELS = (QUIET_HOST, HOST_NOT_MEASURED, BUSY_HOST)
HOST_SOURCE_WORDS = {
    QUIET_HOST: ", each taken on a quiet host",
    HOST_NOT_MEASURED: ", taken before probes measured their host's load",
    BUSY_HOST: ", taken on a busy host: no probe on the pool was quiet",
}


def pool_calibration(
    *, pool: AcceleratorPool, runs: int = DEFAULT_CALIBRATION_RUNS
) -> dict[str, Any]:
    """The pool's running calibration (`engine.stages.plan.calibration.running_calibration`):
    the median over its last `runs` successful performance runs of each run's median
    efficiency of the scaled twin, measured / roofline-predicted (from the run's
    `PerformancePoint` rows "decode_efficiency" and "prefill_efficiency"), and the device
    device figures as `pool_measured_figures` gives them (the median over the newest
    `MEASURED_FIGURES_RUNS` of those runs). An efficiency above the roofline (over 1) is a
    probe error: it is left out and counted in the run's "probe_errors", never calibrates.
    "available" False, with "no calibration yet" as the reason, for a pool without such runs.
    The plan stage corrects its predictions with it and, on a cpu pool, predicts on its
    "device" figures; "full_size" holds the pool's full-size sweeps measured on its engine
    (`adaptation.selectors.full_size`), which refit the plan's constants (the closed loop)."""
    latest = _latest_performance_runs(pool, runs)
    values: dict[int, dict[str, list[float]]] = {run.pk: {} for run in latest}
    dtypes: dict[int, set[str]] = {run.pk: set() for run in latest}
    probe_errors: dict[int, int] = dict.fromkeys(values, 0)
    rows = PerformancePoint.objects.filter(
        stage_run__in=[run.pk for run in latest], metric__in=EFFICIENCY_METRICS
    ).values_list("stage_run_id", "metric", "dtype", "value")
    for run_id, metric, dtype, value in rows:
        if usable_efficiency(value) is None:
            probe_errors[run_id] += 1
            continue
        values[run_id].setdefault(metric, []).append(value)
        dtypes[run_id].add(dtype)
    summaries = []
    for run in latest:
        calibration = PerformanceResult.from_stored(run.result).calibration
        summaries.append(
            {
                "stage_run": run.pk,
                "job": run.job_id,
                "release": run.job.release.repo_id,
                "finished_at": run.finished_at.isoformat() if run.finished_at else None,
                "worker_host": run.worker_host,
                "decode_efficiency": values[run.pk].get("decode_efficiency", []),
                "prefill_efficiency": values[run.pk].get("prefill_efficiency", []),
                "dtypes": sorted(dtypes[run.pk]),
                "probe_errors": probe_errors[run.pk],
                "twin_params": calibration.twin_params if calibration else None,
                "device": calibration.device if calibration else None,
            }
        )
    result = running_calibration(pool.name, summaries, window=runs)
    result["device"] = pool_measured_figures(pool=pool)
    result["full_size"] = pool_full_size_sweeps(pool=pool)
    return result


def _performance_runs(pool: AcceleratorPool):
    """The pool's successful performance runs, newest first (a queryset)."""
    return StageRun.objects.filter(
        job__pool=pool, stage="performance", status=StageStatus.SUCCEEDED
    ).order_by("-finished_at", "-id")


def _latest_performance_runs(pool: AcceleratorPool, runs: int) -> list[StageRun]:
    """The pool's last `runs` successful performance runs, newest first."""
    return list(_performance_runs(pool).select_related("job__release")[:runs])


def _probed_runs(pool: AcceleratorPool, host: str):
    """The pool's successful performance runs whose stored probe says `host` (one of
    `HOST_LABELS`) of its host, newest first (a queryset)."""
    runs = _performance_runs(pool)
    if host == QUIET_HOST:
        return runs.filter(result__calibration__device__host_busy=False)
    if host == BUSY_HOST:
        return runs.filter(result__calibration__device__host_busy=True)
    return runs.filter(result__calibration__device__has_key="memory_bandwidth_bytes_per_s").exclude(
        result__calibration__device__has_key="host_busy"
    )


def _probed_device(run: StageRun) -> Mapping[str, Any] | None:
    """The device figures a performance run's calibration probed (a dict), None where it
    probed none."""
    calibration = PerformanceResult.from_stored(run.result).calibration
    return calibration.device if calibration is not None else None


def _positive_figure(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 < value < float("inf") else None


def _median_of(values: list[float]) -> float:
    """The median of a non-empty list."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def median_device_figures(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The median device figures over performance runs (summaries as `pool_calibration`
    builds them, newest first, each with the run's measured "device" probe or None): memory
    bandwidth and each dtype's matmul FLOP/s are each the median over the runs that measured
    them (one probe swings about 2x run to run). The newest probe's other keys are kept;
    "runs" lists the stage runs used, "source" says so. None when no run measured a memory
    bandwidth."""
    probed = [
        run
        for run in runs
        if isinstance(run.get("device"), dict)
        and _positive_figure(run["device"].get("memory_bandwidth_bytes_per_s"))
    ]
    if not probed:
        return None
    devices = [run["device"] for run in probed]
    flops: dict[str, float] = {}
    for dtype in sorted({d for dev in devices for d in (dev.get("flops") or {})}):
        values = [
            v
            for dev in devices
            if (v := _positive_figure((dev.get("flops") or {}).get(dtype))) is not None
        ]
        if values:
            flops[dtype] = _median_of(values)
    bandwidths = [float(dev["memory_bandwidth_bytes_per_s"]) for dev in devices]
    hosts = sorted({str(run["worker_host"]) for run in probed if run.get("worker_host")})
    ids = [run.get("stage_run") for run in probed]
    return dict(devices[0]) | {
        "memory_bandwidth_bytes_per_s": _median_of(bandwidths),
        "flops": flops,
        "runs": ids,
        "source": (
            f"median of {fmt.counted(len(probed), 'performance run')} "
            f"(stage runs {', '.join(str(i) for i in ids)})"
            + (f" on {', '.join(hosts)}" if hosts else "")
            + ": STREAM triad and matmul probes (engine/device_probe.py)"
        ),
    }


def pool_measured_figures(
    *, pool: AcceleratorPool, runs: int = MEASURED_FIGURES_RUNS
) -> dict[str, Any] | None:
    """The device figures the plan predicts on for a cpu pool, as `pool_calibration(pool)`'s
    "device": the median (`median_device_figures`) over the newest `runs` successful
    performance runs whose probes were taken on a quiet host; where the pool has none, over
    those whose probes did not measure their host (stored before it was measured); only where
    it has neither, over those taken on a busy host. So a probe taken on a busy host never
    replaces a quiet one, however many come after it. Adds "host" (`HOST_LABELS`: which kind
    the figures come from), "host_busy" (they come from busy probes) and "busy_left_out"
    (busy probes newer than the newest kept one, left out). None when no run measured any.
    One read for the plan stage (via `pool_calibration`), `manage.py plan --pool` and Compare
    pools."""
    for host in HOST_LABELS:
        kept = [
            {
                "stage_run": run.pk,
                "worker_host": run.worker_host,
                "finished_at": run.finished_at,
                "device": _probed_device(run),
            }
            for run in _probed_runs(pool, host)[:runs]
        ]
        figures = median_device_figures(kept)
        if figures is None:
            continue
        newest = kept[0]
        newer_busy = (
            _probed_runs(pool, BUSY_HOST).filter(finished_at__gt=newest["finished_at"])
            if host != BUSY_HOST and newest["finished_at"]
            else None
        )
        return figures | {
            "source": figures["source"] + HOST_SOURCE_WORDS[host],
            "host": host,
            "host_busy": host == BUSY_HOST,
            "busy_left_out": newer_busy.count() if newer_busy is not None else 0,
        }
    return None
