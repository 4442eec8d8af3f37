"""Memory bandwidth and matmul FLOP/s of the device a stage measures on, measured with torch.

A CPU has no datasheet figures a roofline can use (the machine, its memory channels and the
worker's thread count decide them), so the performance stage measures them on the device and
with the threads it measures the twin with, and labels them "measured":

- Memory bandwidth: STREAM's copy (a[i] = b[i]: 2 words moved per element) and triad
  (a[i] = b[i] + s x c[i]: 3 words; `torch.add(b, c, alpha=s, out=a)`, one pass) kernels
  (McCalpin, "STREAM: Sustainable Memory Bandwidth in High Performance Computers",
  https://www.cs.virginia.edu/stream/ref.html) over float32 arrays of `array_bytes` each, at
  least 4 times the last-level cache as STREAM's rules ask where that fits (64 MiB to 256 MiB
  per array on a CPU, 1 GiB on an accelerator; `stream_rule_met` says whether it did). Bytes
  counted as STREAM counts them (no write-allocate traffic). The figure the roofline uses,
  `memory_bandwidth_bytes_per_s`, is the triad's.
- FLOP/s: a square matmul `a @ b` per dtype, 2 n^3 FLOPs.

Each probe is sized until its figure is stable, per dtype: the arrays are measured at half
the chosen size and at it (doubling further while memory allows), the matmul at n = 256,
512, 1,024, ..., until two successive sizes agree within `STABLE_TOLERANCE` (10%) and, for
the matmul, one product takes at least `MIN_MATMUL_S`; or until the largest size (4,096 on a
CPU, 8,192 on an accelerator) or the probe's time cap. The figure is the last size's;
`stable` / `flops_stable` say whether two sizes agreed, and `sizes` / `matmul_sizes` keep
what each size measured. (A probe stopped at its first size that took long enough read
1.17 GFLOP/s for float16 at n = 256 against 71.5 for bfloat16 on one CPU: a small product's
set-up cost, not the device.) The time cap (`time_cap_s`, what the stage's budget leaves it;
at most `PROBE_TIME_CAP_S`) is shared out: a size is not started when its predicted cost
(8x the last size's for the matmul, 2x for the arrays) would pass its share.

Each figure is the best of `repeats` timed runs after one untimed run (STREAM reports the best
too: the others include interruptions). Timers: `twin.measure.StepTimer` (CUDA events on GPUs,
`time.perf_counter_ns` on the CPU). The whole probe takes one to a few seconds on a CPU core.
A figure the roofline then finds exceeded (an efficiency above 1) is a probe error, flagged
and left out of the calibration (`engine/stages/plan/calibration.py`).

One probe measures the share of the machine it got. The performance stage therefore runs it
through `engine/probe_repeats.py`: sized once here, measured again at the same sizes
(`remeasure_device`) until two repeats taken on a quiet host agree, each repeat labelled busy
or quiet from the host's interference (`engine/host_interference.py`).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from engine.twin.measure import StepTimer, free_memory

MIB = 2**20
CPU_ARRAY_BYTES_MIN = 64 * MIB
CPU_ARRAY_BYTES_MAX = 256 * MIB
ACCELERATOR_ARRAY_BYTES_MIN = 256 * MIB
ACCELERATOR_ARRAY_BYTES_MAX = 1024 * MIB
MIN_MATMUL_S = 0.01
MATMUL_START_N = 256
CPU_MATMUL_MAX_N = 4096
ACCELERATOR_MATMUL_MAX_N = 8192
DEFAULT_REPEATS = 3
# Two successive probe sizes agreeing within this fraction make a figure stable.
STABLE_TOLERANCE = 0.10
# The whole probe's time cap (s) when the caller gives none or more.
PROBE_TIME_CAP_S = 20.0
STREAM_SOURCE = "https://www.cs.virginia.edu/stream/ref.html"
BANDWIDTH_METHOD = (
    "STREAM triad a = b + s x c (torch.add(b, c, alpha=s, out=a)) over three float32 arrays "
    "of {array_mib:,.0f} MiB each, 3 x 4 bytes per element counted, best of {repeats} runs "
    "after one untimed run; copy a = b (2 x 4 bytes per element) reported beside it "
    "(McCalpin, STREAM, " + STREAM_SOURCE + ")"
)
FLOPS_METHOD = (
    "square matmul a @ b, 2 n^3 FLOPs, n doubled from 256 until two successive sizes agree "
    "within {tolerance:.0%} and one product takes at least {min_s:g} s (or the largest size, "
    "or the time cap), best of {repeats} runs after one untimed run"
)


def last_level_cache_bytes() -> int | None:
    """The CPU's last-level cache in bytes: the sum of the distinct highest-level caches
    Linux lists under /sys/devices/system/cpu (one per group of CPUs sharing it); None
    where it cannot say."""
    caches: dict[tuple[int, str], int] = {}
    root = Path("/sys/devices/system/cpu")
    try:
        for index in root.glob("cpu[0-9]*/cache/index[0-9]*"):
            kind = (index / "type").read_text().strip()
            if kind == "Instruction":
                continue
            level = int((index / "level").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
            size = (index / "size").read_text().strip().upper()
            scale = {"K": 1024, "M": MIB, "G": 1024 * MIB}.get(size[-1:], 1)
            caches[(level, shared)] = int(size.rstrip("KMG")) * scale
    except (OSError, ValueError):
        return None
    if not caches:
        return None
    top = max(level for level, _ in caches)
    return sum(size for (level, _), size in caches.items() if level == top)


def _physical_memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _cache_bytes(device: torch.device) -> int | None:
    if device.type == "cpu":
        return last_level_cache_bytes()
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return int(getattr(props, "L2_cache_size", 0)) or None
    return None


def stream_array_bytes(device: torch.device) -> tuple[int, int | None]:
    """(bytes per STREAM array, the last-level cache in bytes or None) for `device`."""
    cache = _cache_bytes(device)
    if device.type == "cpu":
        low, high = CPU_ARRAY_BYTES_MIN, CPU_ARRAY_BYTES_MAX
        memory = _physical_memory_bytes()
        if memory:
            high = max(low, min(high, memory // 16))
    else:
        low, high = ACCELERATOR_ARRAY_BYTES_MIN, ACCELERATOR_ARRAY_BYTES_MAX
        module = getattr(torch, device.type, None)
        mem_get_info = getattr(module, "mem_get_info", None)
        if callable(mem_get_info):
            free, _total = mem_get_info(device)
            high = max(16 * MIB, min(high, free // 8))
            low = min(low, high)
    wanted = 4 * cache if cache else low
    return int(min(high, max(low, wanted))) // 4 * 4, cache


def _best_seconds(timer: StepTimer, fn, repeats: int) -> float:
    fn()  # untimed: first touch of the pages, kernel selection
    return min(timer.time(fn)[1] for _ in range(repeats))


def _stream(device: torch.device, n: int, repeats: int) -> tuple[float, float]:
    """Best seconds of STREAM copy and triad over float32 arrays of `n` elements."""
    timer = StepTimer(device)
    a = torch.empty(n, dtype=torch.float32, device=device)
    b = torch.full((n,), 1.0, dtype=torch.float32, device=device)
    c = torch.full((n,), 2.0, dtype=torch.float32, device=device)
    copy_s = _best_seconds(timer, functools.partial(a.copy_, b), repeats)
    triad_s = _best_seconds(timer, functools.partial(torch.add, b, c, alpha=3.0, out=a), repeats)
    return copy_s, triad_s


def agree(a: float, b: float, tolerance: float = STABLE_TOLERANCE) -> bool:
    """Whether two positive figures differ by at most `tolerance` of the larger."""
    return a > 0 and b > 0 and abs(a - b) <= tolerance * max(a, b)


def measure_memory_bandwidth(
    device: torch.device,
    *,
    repeats: int = DEFAULT_REPEATS,
    array_bytes: int | None = None,
    time_cap_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """STREAM copy and triad on `device` (module docstring), sized until stable: at half the
    array size and at it, then doubling while memory allows (`array_bytes` fixes the largest
    size), until two sizes' triads agree within `STABLE_TOLERANCE` or `time_cap_s` would
    pass. Returns {"memory_bandwidth_bytes_per_s" (the last size's triad),
    "copy_bytes_per_s", "triad_bytes_per_s", "array_bytes", "last_level_cache_bytes",
    "stream_rule_met", "stable", "sizes" ([{"array_bytes", "triad_bytes_per_s",
    "copy_bytes_per_s"}]), "method"}; bytes/s, bytes."""
    size, cache = stream_array_bytes(device)
    largest = size
    if array_bytes is not None:
        size = largest = array_bytes
    elif device.type == "cpu":
        largest = max(size, stream_array_bytes_max(device))
    started = clock()
    sizes: list[dict[str, Any]] = []
    n = max(1, size // 8)  # elements of half the size
    stable = False
    try:
        while True:
            began = clock()
            copy_s, triad_s = _stream(device, n, repeats)
            free_memory(device)
            sizes.append(
                {
                    "array_bytes": 4 * n,
                    "copy_bytes_per_s": 2 * 4 * n / copy_s,
                    "triad_bytes_per_s": 3 * 4 * n / triad_s,
                }
            )
            cost = clock() - began
            if len(sizes) >= 2:
                stable = agree(sizes[-1]["triad_bytes_per_s"], sizes[-2]["triad_bytes_per_s"])
                if stable or 8 * n > largest:
                    break
            elif 4 * n * 2 > largest:
                break
            if time_cap_s is not None and clock() - started + 2 * cost > time_cap_s:
                break
            n *= 2
    finally:
        free_memory(device)
    last = sizes[-1]
    return {
        "memory_bandwidth_bytes_per_s": last["triad_bytes_per_s"],
        "copy_bytes_per_s": last["copy_bytes_per_s"],
        "triad_bytes_per_s": last["triad_bytes_per_s"],
        "array_bytes": last["array_bytes"],
        "last_level_cache_bytes": cache,
        "stream_rule_met": bool(cache) and last["array_bytes"] >= 4 * cache,
        "stable": stable,
        "sizes": sizes,
        "method": BANDWIDTH_METHOD.format(array_mib=last["array_bytes"] / MIB, repeats=repeats),
    }


def stream_array_bytes_max(device: torch.device) -> int:
    """The largest STREAM array the CPU probe may double to (bytes)."""
    high = CPU_ARRAY_BYTES_MAX
    memory = _physical_memory_bytes()
    if memory:
        high = max(CPU_ARRAY_BYTES_MIN, min(high, memory // 16))
    return high


def _matmul_seconds(
    timer: StepTimer,
    gen: torch.Generator,
    device: torch.device,
    dtype: torch.dtype,
    n: int,
    repeats: int,
) -> float:
    """Best seconds of an n x n matmul in `dtype` over random operands drawn from `gen`."""
    a = torch.randn(n, n, generator=gen, device=device).to(dtype)
    b = torch.randn(n, n, generator=gen, device=device).to(dtype)
    # untimed first run: library set-up (a cuBLAS handle, oneDNN's kernel choice)
    best = _best_seconds(timer, functools.partial(torch.matmul, a, b), repeats)
    del a, b
    return best


def measure_matmul_flops(
    device: torch.device,
    dtype: torch.dtype,
    *,
    repeats: int = DEFAULT_REPEATS,
    time_cap_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """An n x n matmul in `dtype` on `device`, n sized until stable (module docstring):
    {"flops" (FLOP/s at the last n), "n", "stable" (two successive sizes agreed within
    `STABLE_TOLERANCE`), "sizes" ([{"n", "flops", "seconds"}]), "stopped" (why the sizing
    ended: "stable", "largest size", "time cap")}."""
    timer = StepTimer(device)
    limit = CPU_MATMUL_MAX_N if device.type == "cpu" else ACCELERATOR_MATMUL_MAX_N
    # Random operands made on the device (zeros run faster on some tensor cores), seeded
    # apart from torch's global generator.
    gen = torch.Generator(device=device).manual_seed(0)
    started = clock()
    sizes: list[dict[str, Any]] = []
    n = MATMUL_START_N
    stable, stopped = False, "largest size"
    try:
        while True:
            began = clock()
            best = _matmul_seconds(timer, gen, device, dtype, n, repeats)
            sizes.append({"n": n, "flops": 2 * n**3 / best, "seconds": best})
            cost = clock() - began
            stable = len(sizes) >= 2 and agree(sizes[-1]["flops"], sizes[-2]["flops"])
            if stable and best >= MIN_MATMUL_S:
                stopped = "stable"
                break
            if n >= limit:
                stopped = "largest size"
                break
            if time_cap_s is not None and clock() - started + 8 * cost > time_cap_s:
                stopped = "time cap"
                break
            n *= 2
    finally:
        free_memory(device)
    last = sizes[-1]
    return {
        "flops": last["flops"],
        "n": last["n"],
        "stable": stable,
        "sizes": sizes,
        "stopped": stopped,
    }


def probe_device(
    device: torch.device,
    dtypes: Iterable[str] = ("bfloat16",),
    *,
    repeats: int = DEFAULT_REPEATS,
    array_bytes: int | None = None,
    time_cap_s: float | None = None,
) -> dict[str, Any]:
    """Memory bandwidth and matmul FLOP/s of `device` in each of `dtypes` (torch names),
    measured now with torch's current threads, each sized until stable (module docstring)
    within `time_cap_s` (at most `PROBE_TIME_CAP_S`; shared equally between the bandwidth
    and each dtype, what one leaves passing on). Returns {"kind": "measured", "device",
    "threads" (CPU: torch.get_num_threads(); None elsewhere), "memory_bandwidth_bytes_per_s",
    "copy_bytes_per_s", "triad_bytes_per_s", "array_bytes", "last_level_cache_bytes",
    "stream_rule_met", "stable" (the bandwidth's), "sizes" (the bandwidth's), "flops"
    ({dtype: FLOP/s}), "matmul_n" ({dtype: n}), "flops_stable" ({dtype: bool}),
    "matmul_sizes" ({dtype: [{"n", "flops", "seconds"}]}), "time_cap_s", "units",
    "method" ({"memory_bandwidth", "flops"}), "duration_s"}. A dtype whose matmul the device
    cannot run is left out, with the reason under "skipped"."""
    started = time.perf_counter()
    cap = min(PROBE_TIME_CAP_S, time_cap_s) if time_cap_s is not None else PROBE_TIME_CAP_S
    names = list(dict.fromkeys(dtypes))

    def share(parts_left: int) -> float:
        return max(0.0, cap - (time.perf_counter() - started)) / max(1, parts_left)

    bandwidth = measure_memory_bandwidth(
        device, repeats=repeats, array_bytes=array_bytes, time_cap_s=share(1 + len(names))
    )
    flops: dict[str, float] = {}
    sizes: dict[str, int] = {}
    stable: dict[str, bool] = {}
    trail: dict[str, list[dict[str, Any]]] = {}
    skipped: dict[str, str] = {}
    for index, name in enumerate(names):
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            skipped[name] = "not a torch dtype"
            continue
        try:
            matmul = measure_matmul_flops(
                device, dtype, repeats=repeats, time_cap_s=share(len(names) - index)
            )
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            continue
        flops[name], sizes[name] = matmul["flops"], matmul["n"]
        stable[name], trail[name] = matmul["stable"], matmul["sizes"]
    method = bandwidth.pop("method")
    return {
        "kind": "measured",
        "device": str(device),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        **bandwidth,
        "flops": flops,
        "matmul_n": sizes,
        "flops_stable": stable,
        "matmul_sizes": trail,
        "time_cap_s": cap,
        "skipped": skipped,
        "units": {
            "memory_bandwidth_bytes_per_s": "bytes/s",
            "copy_bytes_per_s": "bytes/s",
            "triad_bytes_per_s": "bytes/s",
            "array_bytes": "bytes",
            "last_level_cache_bytes": "bytes",
            "flops": "FLOP/s",
        },
        "method": {
            "memory_bandwidth": method,
            "flops": FLOPS_METHOD.format(
                tolerance=STABLE_TOLERANCE, min_s=MIN_MATMUL_S, repeats=repeats
            ),
        },
        "duration_s": time.perf_counter() - started,
    }


def remeasure_device(
    device: torch.device, sized: Mapping[str, Any], *, repeats: int = DEFAULT_REPEATS
) -> dict[str, Any]:
    """`sized`'s figures (a `probe_device` result) measured again at the sizes it chose, with
    no sizing: STREAM copy and triad over arrays of `sized["array_bytes"]` and each dtype's
    matmul at `sized["matmul_n"][dtype]`, each the best of `repeats` runs after one untimed
    run. Returns {"memory_bandwidth_bytes_per_s" (the triad's), "triad_bytes_per_s",
    "copy_bytes_per_s", "flops" ({dtype: FLOP/s})}; bytes/s, FLOP/s. Costs about the
    probe's last size alone (`engine/probe_repeats.py` repeats the probe with it). Raises
    what torch raises (out of memory)."""
    n = max(1, int(sized["array_bytes"]) // 4)
    try:
        copy_s, triad_s = _stream(device, n, repeats)
    finally:
        free_memory(device)
    timer = StepTimer(device)
    flops: dict[str, float] = {}
    try:
        for name, size in (sized.get("matmul_n") or {}).items():
            gen = torch.Generator(device=device).manual_seed(0)
            best = _matmul_seconds(timer, gen, device, getattr(torch, name), size, repeats)
            flops[name] = 2 * size**3 / best
    finally:
        free_memory(device)
    triad = 3 * 4 * n / triad_s
    return {
        "memory_bandwidth_bytes_per_s": triad,
        "triad_bytes_per_s": triad,
        "copy_bytes_per_s": 2 * 4 * n / copy_s,
        "flops": flops,
    }
