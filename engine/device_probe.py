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
- FLOP/s: a square matmul `a @ b` per dtype, 2 n^3 FLOPs, n doubled from 256 until one product
  takes at least `MIN_MATMUL_S` (or n reaches 4,096 on a CPU, 8,192 on an accelerator).

Each figure is the best of `repeats` timed runs after one untimed run (STREAM reports the best
too: the others include interruptions). Timers: `twin.measure.StepTimer` (CUDA events on GPUs,
`time.perf_counter_ns` on the CPU). The whole probe takes one to two seconds on a CPU core.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterable
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
STREAM_SOURCE = "https://www.cs.virginia.edu/stream/ref.html"
BANDWIDTH_METHOD = (
    "STREAM triad a = b + s x c (torch.add(b, c, alpha=s, out=a)) over three float32 arrays "
    "of {array_mib:,.0f} MiB each, 3 x 4 bytes per element counted, best of {repeats} runs "
    "after one untimed run; copy a = b (2 x 4 bytes per element) reported beside it "
    "(McCalpin, STREAM, " + STREAM_SOURCE + ")"
)
FLOPS_METHOD = (
    "square matmul a @ b, 2 n^3 FLOPs, n doubled from 256 until one product takes at least "
    "{min_s:g} s, best of {repeats} runs after one untimed run"
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


def measure_memory_bandwidth(
    device: torch.device, *, repeats: int = DEFAULT_REPEATS, array_bytes: int | None = None
) -> dict[str, Any]:
    """STREAM copy and triad on `device` (module docstring): {"memory_bandwidth_bytes_per_s"
    (the triad's), "copy_bytes_per_s", "triad_bytes_per_s", "array_bytes",
    "last_level_cache_bytes", "stream_rule_met", "method"}; bytes/s, bytes."""
    size, cache = stream_array_bytes(device)
    if array_bytes is not None:
        size = array_bytes
    n = size // 4
    try:
        copy_s, triad_s = _stream(device, n, repeats)
    finally:
        free_memory(device)
    copy = 2 * 4 * n / copy_s
    triad = 3 * 4 * n / triad_s
    return {
        "memory_bandwidth_bytes_per_s": triad,
        "copy_bytes_per_s": copy,
        "triad_bytes_per_s": triad,
        "array_bytes": 4 * n,
        "last_level_cache_bytes": cache,
        "stream_rule_met": bool(cache) and 4 * n >= 4 * cache,
        "method": BANDWIDTH_METHOD.format(array_mib=4 * n / MIB, repeats=repeats),
    }


def measure_matmul_flops(
    device: torch.device, dtype: torch.dtype, *, repeats: int = DEFAULT_REPEATS
) -> tuple[float, int]:
    """(FLOP/s, n) of an n x n matmul in `dtype` on `device` (module docstring)."""
    timer = StepTimer(device)
    limit = CPU_MATMUL_MAX_N if device.type == "cpu" else ACCELERATOR_MATMUL_MAX_N
    # Random operands made on the device (zeros run faster on some tensor cores), seeded
    # apart from torch's global generator.
    gen = torch.Generator(device=device).manual_seed(0)
    n = MATMUL_START_N
    try:
        while True:
            a = torch.randn(n, n, generator=gen, device=device).to(dtype)
            b = torch.randn(n, n, generator=gen, device=device).to(dtype)
            product = functools.partial(torch.matmul, a, b)
            product()  # untimed: library set-up (a cuBLAS handle, oneDNN's kernel choice)
            _, seconds = timer.time(product)
            if seconds >= MIN_MATMUL_S or n >= limit:
                break
            n *= 2
        best = _best_seconds(timer, product, repeats)
    finally:
        free_memory(device)
    return 2 * n**3 / best, n


def probe_device(
    device: torch.device,
    dtypes: Iterable[str] = ("bfloat16",),
    *,
    repeats: int = DEFAULT_REPEATS,
    array_bytes: int | None = None,
) -> dict[str, Any]:
    """Memory bandwidth and matmul FLOP/s of `device` in each of `dtypes` (torch names),
    measured now with torch's current threads. Returns {"kind": "measured", "device",
    "threads" (CPU: torch.get_num_threads(); None elsewhere), "memory_bandwidth_bytes_per_s",
    "copy_bytes_per_s", "triad_bytes_per_s", "array_bytes", "last_level_cache_bytes",
    "stream_rule_met", "flops" ({dtype: FLOP/s}), "matmul_n" ({dtype: n}), "units",
    "method" ({"memory_bandwidth", "flops"}), "duration_s"}. A dtype whose matmul the device
    cannot run is left out, with the reason under "skipped"."""
    started = time.perf_counter()
    bandwidth = measure_memory_bandwidth(device, repeats=repeats, array_bytes=array_bytes)
    flops: dict[str, float] = {}
    sizes: dict[str, int] = {}
    skipped: dict[str, str] = {}
    for name in dict.fromkeys(dtypes):
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            skipped[name] = "not a torch dtype"
            continue
        try:
            flops[name], sizes[name] = measure_matmul_flops(device, dtype, repeats=repeats)
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    method = bandwidth.pop("method")
    return {
        "kind": "measured",
        "device": str(device),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        **bandwidth,
        "flops": flops,
        "matmul_n": sizes,
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
            "flops": FLOPS_METHOD.format(min_s=MIN_MATMUL_S, repeats=repeats),
        },
        "duration_s": time.perf_counter() - started,
    }
