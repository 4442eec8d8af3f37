"""Timers and memory probes for running a twin on a pool's device (performance, stability).

Timing: on CUDA a pair of `torch.cuda.Event(enable_timing=True)` recorded on the device's
current stream around the work, then `Event.synchronize()` and `elapsed_time` (PyTorch docs,
"CUDA semantics: asynchronous execution": host timers measure only the launch of queued
kernels unless the device is synchronised); on another accelerator the device-generic
`torch.Event` the same way, or `synchronize()` around `time.perf_counter_ns` where its backend
has no timing events; on the CPU `time.perf_counter_ns`. Seconds out.

Memory: on an accelerator, the bytes torch's caching allocator has handed out
(`max_memory_allocated` after `reset_peak_memory_stats`: tensors, weights included, not the
allocator's cached blocks nor the driver's context), kind "device_allocated". On the CPU the
whole process's resident set (kind "process_rss", Python and torch's libraries included): its
high-water mark VmHWM from /proc/self/status, reset per measurement by writing "5" to
/proc/self/clear_refs (Linux >= 4.0, proc(5)), and the current VmRSS sampled at step
boundaries; where neither is readable (not Linux), `resource.getrusage`'s ru_maxrss, the
process's lifetime peak, which cannot be reset. Before each measurement and sample the C
heap's free memory is handed back to the system (glibc's `malloc_trim(0)`, where the C library
is glibc), so the resident set follows the memory in use rather than what the allocator
keeps cached from earlier, larger points.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import inspect
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

T = TypeVar("T")

DEVICE_ALLOCATED = "device_allocated"
PROCESS_RSS = "process_rss"
UNAVAILABLE = "unavailable"

_PROC_STATUS = Path("/proc/self/status")
_PROC_STATM = Path("/proc/self/statm")
_PROC_CLEAR_REFS = Path("/proc/self/clear_refs")
# Messages of the CPU allocator and the drivers when an allocation fails, besides the
# exception types (torch.OutOfMemoryError, MemoryError).
_OOM_TEXTS = (
    "out of memory",
    "can't allocate memory",
    "not enough memory",
    "cannot allocate memory",
)


def one_line(exc: BaseException) -> str:
    """ "TypeName: first line of the message" (300 characters at most): how the performance
    and stability stages name a twin's exception in their results."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}".rstrip(": ")


def p95(samples: Sequence[float]) -> float:
    """The 95th percentile of `samples` (at least one), linear interpolation between order
    statistics (`statistics.quantiles(..., method="inclusive")`, numpy's default)."""
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=20, method="inclusive")[18]


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` says memory ran out: `torch.OutOfMemoryError` (CUDA/XPU allocators),
    `MemoryError`, or a RuntimeError with an allocator's out-of-memory message (the CPU
    allocator's "DefaultCPUAllocator: can't allocate memory", MPS's "out of memory")."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _OOM_TEXTS)


def _device_module(device: torch.device) -> Any:
    return getattr(torch, device.type, None)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on `device` (nothing to wait for on the CPU)."""
    if device.type == "cpu":
        return
    sync = getattr(_device_module(device), "synchronize", None)
    if callable(sync):
        try:
            sync(device)
        except TypeError:  # a backend whose synchronize takes no device
            sync()


def free_memory(device: torch.device) -> None:
    """Collect garbage and hand the allocator's cached blocks back (after an out-of-memory)."""
    gc.collect()
    if device.type == "cpu":
        return
    empty = getattr(_device_module(device), "empty_cache", None)
    if callable(empty):
        empty()


class StepTimer:
    """Times a callable on a device; `name` says how ("torch.cuda.Event", ...)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._event_cls: Any = None
        if device.type == "cuda":
            self._event_cls = torch.cuda.Event
            self.name = "torch.cuda.Event (elapsed_time after Event.synchronize)"
        elif device.type != "cpu" and self._events_work():
            self._event_cls = torch.Event
            self.name = f"torch.Event on {device.type} (elapsed_time after synchronize)"
        elif device.type != "cpu":
            self.name = f"time.perf_counter_ns around {device.type} synchronize()"
        else:
            self.name = "time.perf_counter_ns"

    def _events_work(self) -> bool:
        try:
            start = torch.Event(self.device, enable_timing=True)
            end = torch.Event(self.device, enable_timing=True)
            start.record()
            end.record()
            end.synchronize()
            start.elapsed_time(end)
        except (RuntimeError, TypeError, AttributeError, NotImplementedError, ValueError):
            return False
        return True

    def time(self, fn: Callable[[], T]) -> tuple[T, float]:
        """(what `fn` returns, its duration in seconds on the device)."""
        if self._event_cls is not None:
            on_device = (
                torch.cuda.device(self.device)
                if self.device.type == "cuda"
                else contextlib.nullcontext()
            )
            with on_device:
                if self.device.type == "cuda":
                    start = self._event_cls(enable_timing=True)
                    end = self._event_cls(enable_timing=True)
                else:
                    start = self._event_cls(self.device, enable_timing=True)
                    end = self._event_cls(self.device, enable_timing=True)
                start.record()
                out = fn()
                end.record()
                end.synchronize()
                return out, start.elapsed_time(end) / 1000.0
        synchronize(self.device)
        begin = time.perf_counter_ns()
        out = fn()
        synchronize(self.device)
        return out, (time.perf_counter_ns() - begin) / 1e9


@functools.cache
def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def trim_heap() -> bool:
    """Hand the C heap's free memory back to the system (glibc `malloc_trim(0)`); False where
    the C library has no `malloc_trim`."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def _status_kib(field: str) -> int | None:
    try:
        for line in _PROC_STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_rss_bytes() -> int | None:
    """The process's resident set now, in bytes (/proc/self/statm), or None off Linux."""
    try:
        pages = int(_PROC_STATM.read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * resource.getpagesize()


def _ru_maxrss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB else


class MemoryProbe:
    """Peak and current memory for one device: `kind` is "device_allocated" (accelerators),
    "process_rss" (CPU) or "unavailable" (a backend without memory statistics); `method`
    says how it is read. Bytes throughout; None where nothing can be read."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._sampled_max = 0
        self._can_reset_hwm = False
        module = _device_module(device)
        if device.type == "cpu":
            self.kind = PROCESS_RSS
            if process_rss_bytes() is not None and _status_kib("VmHWM") is not None:
                self._can_reset_hwm = self._clear_hwm()
                self.method = (
                    "VmHWM of /proc/self/status, reset per measurement through "
                    "/proc/self/clear_refs, and VmRSS sampled at step boundaries"
                    if self._can_reset_hwm
                    else "VmRSS of /proc/self/statm sampled at step boundaries"
                )
            else:
                self.method = "ru_maxrss (the process's lifetime peak; cannot be reset)"
        elif all(
            callable(getattr(module, name, None))
            for name in ("reset_peak_memory_stats", "max_memory_allocated", "memory_allocated")
        ):
            self.kind = DEVICE_ALLOCATED
            self.method = (
                f"torch.{device.type}.max_memory_allocated after reset_peak_memory_stats "
                "(tensors handed out by the caching allocator, weights included)"
            )
        else:
            self.kind = UNAVAILABLE
            self.method = f"torch.{device.type} has no memory statistics"

    @staticmethod
    def _clear_hwm() -> bool:
        try:
            _PROC_CLEAR_REFS.write_text("5")
        except OSError:
            return False
        return True

    def reset_peak(self) -> None:
        """Start a new peak measurement."""
        if self.kind == DEVICE_ALLOCATED:
            synchronize(self.device)
            _device_module(self.device).reset_peak_memory_stats(self.device)
        elif self.kind == PROCESS_RSS:
            gc.collect()
            trim_heap()
            if self._can_reset_hwm:
                self._clear_hwm()
            self._sampled_max = process_rss_bytes() or 0

    def current_bytes(self, *, trim: bool = False) -> int | None:
        """Memory in use now (and noted for the peak on the CPU); `trim` first hands the C
        heap's free memory back (`trim_heap`), for a resident set that follows what is in
        use."""
        if self.kind == DEVICE_ALLOCATED:
            return int(_device_module(self.device).memory_allocated(self.device))
        if self.kind == PROCESS_RSS:
            if trim:
                trim_heap()
            now = process_rss_bytes()
            if now is not None:
                self._sampled_max = max(self._sampled_max, now)
            return now
        return None

    def peak_bytes(self) -> int | None:
        """The peak since `reset_peak`."""
        if self.kind == DEVICE_ALLOCATED:
            synchronize(self.device)
            return int(_device_module(self.device).max_memory_allocated(self.device))
        if self.kind == PROCESS_RSS:
            self.current_bytes()
            if self._can_reset_hwm:
                return max(_status_kib("VmHWM") or 0, self._sampled_max)
            if self._sampled_max:
                return self._sampled_max
            return _ru_maxrss_bytes()
        return None


def random_prompt(
    vocab_size: int, batch: int, tokens: int, *, seed: int, pad_token_id: int | None = None
) -> torch.Tensor:
    """Seeded prompt token ids [batch, tokens] in [3, vocab) avoiding a last-id pad token
    (as `build.prompt_ids`, for any batch and length)."""
    gen = torch.Generator().manual_seed(seed)
    high = vocab_size - 1 if pad_token_id == vocab_size - 1 else vocab_size
    return torch.randint(3, high, (batch, tokens), generator=gen)


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers as stored (its dtype)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def forward_kwargs(model: torch.nn.Module) -> dict[str, Any]:
    """`logits_to_keep=1` where the model's forward takes it: a serving engine computes the
    prompt's last-position logits only (the one the first token is sampled from)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}


def prefill_step(
    model: torch.nn.Module, input_ids: torch.Tensor, extra: dict[str, Any]
) -> tuple[Any, torch.Tensor]:
    """(KV cache, next-token logits [batch, vocab]) of one prefill forward of `input_ids`."""
    out = model(input_ids=input_ids, use_cache=True, **extra)
    return out.cache, out.logits[:, -1]


def decode_step(
    model: torch.nn.Module, tokens: torch.Tensor, cache: Any
) -> tuple[Any, torch.Tensor]:
    """(KV cache, next-token logits [batch, vocab]) of one decode forward of `tokens` [batch]
    through `cache`."""
    out = model(input_ids=tokens[:, None], cache=cache, use_cache=True)
    return out.cache, out.logits[:, -1]
