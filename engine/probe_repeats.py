"""The device probe repeated until it agrees with itself, each repeat labelled quiet or busy.

One probe (`device_probe.probe_device`) measures the share of the machine it got: one taken
on a busy host read 2.8 GB/s and 0.01 TFLOP/s, and a plan predicted on it a 5-minute TTFT for
128 tokens. `probe_until_stable` therefore:

1. sizes the probe once (`probe_device`, with `SIZING_SHARE` of the time cap), then measures
   it again at the sizes it chose (`device_probe.remeasure_device`: about the cost of its last
   size), each repeat inside `host_interference.measure_interference`, which labels it busy
   when other processes took a quarter of the worker's CPUs or the probe got under half a
   core (that module's docstring, with the figures measured);
2. repeats until two quiet repeats agree: the best quiet reading of every figure (the triad's
   bandwidth and each dtype's matmul FLOP/s) is within `STABLE_TOLERANCE` (10%) of the next
   best quiet one; or `MAX_PROBE_REPEATS` (5) repeats, or the time cap (a repeat is not
   started when it would pass the cap, at the last repeat's cost);
3. keeps, per figure, the best of the quiet repeats (STREAM reports the best run too: the
   others include interruptions; McCalpin, https://www.cs.virginia.edu/stream/ref.html), or
   of all repeats when none was quiet, and then labels the probe `host_busy`.

A probe labelled busy is stored as measured but never replaces a quiet probe of the same pool
(`adaptation/selectors/calibration.py`); a plan predicted on busy figures says so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from engine import device_probe
from engine.device_probe import PROBE_TIME_CAP_S, STABLE_TOLERANCE, agree
from engine.host_interference import (
    BUSY_OTHER_SHARE,
    STARVED_OWN_CORES,
    HostReaders,
    measure_interference,
)

MAX_PROBE_REPEATS = 5
# The share of the time cap the first, sizing probe may take; the repeats share the rest.
SIZING_SHARE = 0.5
BANDWIDTH = "memory_bandwidth"
REPEATS_METHOD = (
    "sized once, then measured again at the same sizes until the best two quiet repeats "
    "of every figure agree within {tolerance:.0%} (at most {most} repeats, or the time cap); "
    "a repeat is busy when other processes took {busy_share:.0%} of the worker's CPUs or it "
    "got under {starved:g} core's time; each figure is the best quiet repeat's (all "
    "repeats' when none was quiet: host_busy)"
)

Reading = dict[str, Any]


def _reading(figures: Mapping[str, Any], load: Mapping[str, Any]) -> Reading:
    return {
        "memory_bandwidth_bytes_per_s": float(figures["memory_bandwidth_bytes_per_s"]),
        "copy_bytes_per_s": float(figures.get("copy_bytes_per_s") or 0.0),
        "flops": {k: float(v) for k, v in (figures.get("flops") or {}).items()},
        "host_busy": bool(load["host_busy"]),
        "interference": dict(load),
    }


def _values(readings: list[Reading], figure: str) -> list[tuple[float, int]]:
    """(value, repeat index) of `figure` (BANDWIDTH or a dtype) over `readings`."""
    out = []
    for index, reading in enumerate(readings):
        value = (
            reading["memory_bandwidth_bytes_per_s"]
            if figure == BANDWIDTH
            else reading["flops"].get(figure, 0.0)
        )
        out.append((value, index))
    return out


def _kept_from(readings: list[Reading]) -> set[int]:
    """The repeats a kept figure comes from: the quiet ones, or all when none is quiet."""
    quiet = {i for i, r in enumerate(readings) if not r["host_busy"]}
    return quiet or set(range(len(readings)))


def repeats_agree(
    readings: list[Reading], figures: Iterable[str], tolerance: float = STABLE_TOLERANCE
) -> bool:
    """Whether at least two repeats are quiet and, for every figure (BANDWIDTH or a dtype),
    the best quiet reading is within `tolerance` of the next best quiet one."""
    quiet = [r for r in readings if not r["host_busy"]]
    if len(quiet) < 2:
        return False
    for figure in figures:
        best, second = sorted((v for v, _ in _values(quiet, figure)), reverse=True)[:2]
        if not agree(best, second, tolerance):
            return False
    return True


def kept_figures(readings: list[Reading], dtypes: Iterable[str]) -> dict[str, Any]:
    """Per figure, the best reading of the quiet repeats (of all when none is quiet):
    {"memory_bandwidth_bytes_per_s", "copy_bytes_per_s" (the kept bandwidth repeat's),
    "flops" ({dtype: FLOP/s}), "kept" ({"memory_bandwidth": repeat index, "flops": {dtype:
    index}}), "spread" ({"memory_bandwidth", "flops": {dtype}}: (max - min) / max over the
    readings kept from), "host_busy" (no repeat was quiet)}."""
    indexes = _kept_from(readings)

    def best(figure: str) -> tuple[float, int, float]:
        values = [(v, i) for v, i in _values(readings, figure) if i in indexes]
        top, at = max(values)
        low = min(v for v, _ in values)
        return top, at, (top - low) / top if top > 0 else 0.0

    bandwidth, at, spread = best(BANDWIDTH)
    flops, kept, spreads = {}, {}, {}
    for dtype in dtypes:
        flops[dtype], kept[dtype], spreads[dtype] = best(dtype)
    return {
        "memory_bandwidth_bytes_per_s": bandwidth,
        "copy_bytes_per_s": readings[at]["copy_bytes_per_s"],
        "flops": flops,
        "kept": {BANDWIDTH: at, "flops": kept},
        "spread": {
            BANDWIDTH: round(spread, 4),
            "flops": {k: round(v, 4) for k, v in spreads.items()},
        },
        "host_busy": all(r["host_busy"] for r in readings),
    }


def probe_until_stable(
    device: torch.device,
    dtypes: Iterable[str] = ("bfloat16",),
    *,
    time_cap_s: float | None = None,
    max_repeats: int = MAX_PROBE_REPEATS,
    tolerance: float = STABLE_TOLERANCE,
    readers: HostReaders | None = None,
    sized_probe: Callable[..., dict[str, Any]] | None = None,
    remeasure: Callable[[torch.device, Mapping[str, Any]], Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The probe of `device` in `dtypes` repeated until stable (module docstring), within
    `time_cap_s` (at most `device_probe.PROBE_TIME_CAP_S`).

    Returns `probe_device`'s result with the kept figures in place of the first probe's
    ("memory_bandwidth_bytes_per_s", "triad_bytes_per_s", "copy_bytes_per_s", "flops"), and:
    "host_busy" (no repeat was quiet), "repeats" ([{"memory_bandwidth_bytes_per_s",
    "copy_bytes_per_s", "flops", "host_busy", "interference" (the host's figures while it
    ran: `host_interference.interference`)}], the first the sizing probe's), "kept" (the
    repeat each figure comes from), "spread" ((max - min) / max over the repeats kept from),
    "repeats_stable" (two quiet repeats agreed), "repeats_stopped" ("stable", "most repeats",
    "time cap", "error"), "repeat_error" (when a repeat raised), "loadavg_1m" (before the
    probe), "method"["repeats"], "duration_s" (the whole, s). Raises what the first probe
    raises; a later repeat's error stops the repeats.

    `readers`, `sized_probe` (`probe_device`'s signature) and `remeasure` (`device,
    sized -> figures`, default `device_probe.remeasure_device`) are injectable for tests."""
    if max_repeats < 1:
        raise ValueError(f"max_repeats must be at least 1, got {max_repeats}")
    readers = readers or HostReaders()
    sized_probe = sized_probe or device_probe.probe_device
    remeasure = remeasure or device_probe.remeasure_device
    cap = min(PROBE_TIME_CAP_S, time_cap_s) if time_cap_s is not None else PROBE_TIME_CAP_S
    on_cpu = device.type == "cpu"
    threads = torch.get_num_threads() if on_cpu else None
    measure = functools.partial(
        measure_interference, readers=readers, threads=threads, judge_own=on_cpu
    )
    started = readers.wall()
    sized, load = measure(lambda: sized_probe(device, dtypes, time_cap_s=cap * SIZING_SHARE))
    names = list(sized.get("flops") or {})
    readings = [_reading(sized, load)]
    stopped, error = "most repeats", None
    while True:
        if repeats_agree(readings, [BANDWIDTH, *names], tolerance):
            stopped = "stable"
            break
        if len(readings) >= max_repeats:
            break
        left = cap - (readers.wall() - started)
        if (readings[-1]["interference"]["wall_s"] or 0.0) > left:
            stopped = "time cap"
            break
        try:
            figures, load = measure(functools.partial(remeasure, device, sized))
        except (RuntimeError, MemoryError) as exc:  # out of memory on a repeat
            stopped, error = "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            break
        readings.append(_reading(figures, load))
    kept = kept_figures(readings, names)
    result = dict(sized)
    result.update(
        {
            "memory_bandwidth_bytes_per_s": kept["memory_bandwidth_bytes_per_s"],
            "triad_bytes_per_s": kept["memory_bandwidth_bytes_per_s"],
            "copy_bytes_per_s": kept["copy_bytes_per_s"],
            "flops": kept["flops"],
            "host_busy": kept["host_busy"],
            "kept": kept["kept"],
            "spread": kept["spread"],
            "repeats": readings,
            "repeats_stable": stopped == "stable",
            "repeats_stopped": stopped,
            "loadavg_1m": readings[0]["interference"]["loadavg_1m_before"],
            "method": dict(sized.get("method") or {})
            | {
                "repeats": REPEATS_METHOD.format(
                    tolerance=tolerance,
                    most=max_repeats,
                    busy_share=BUSY_OTHER_SHARE,
                    starved=STARVED_OWN_CORES,
                )
            },
            "units": dict(sized.get("units") or {}) | {"spread": "fraction"},
            "duration_s": readers.wall() - started,
        }
    )
    if error:
        result["repeat_error"] = error
    return result
