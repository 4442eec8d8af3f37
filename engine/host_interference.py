"""How busy the host was while something ran on it: the CPU time other processes took on the
CPUs this process may use, and the CPU time this process got.

A device probe (`engine/device_probe.py`) measures whatever share of the machine it gets: a
probe run beside another job reads the other job's leftovers, not the machine (one taken on
a busy host read 2.8 GB/s and 0.01 TFLOP/s). `measure_interference(fn)` runs `fn` and reads,
before and after it:

- the busy time of each CPU this process may run on (`os.sched_getaffinity`), from the
  per-CPU lines of /proc/stat (user + nice + system + irq + softirq + steal ticks, over
  `SC_CLK_TCK`; proc(5)). Less this process's own CPU time, that is what other processes (and,
  through steal, other virtual machines) took from those CPUs: `other_cores` (cores' worth on
  average over the run) and `other_share` (of those CPUs);
- this process's own CPU time (`time.process_time`, every thread): `own_cores`, and
  `own_share` of the cores it could use (its torch threads, at most the usable cores: the
  CPUs, bounded by the cgroup's CPU quota in /sys/fs/cgroup/cpu.max where one is set);
- the 1-minute load average before and after (`os.getloadavg`), recorded only: it counts this
  worker's own threads of the minute before (the performance sweep that runs just before its
  probe) and, in a container, the whole host's tasks, so it does not decide.

The host was busy (`host_busy`) when other processes took at least `BUSY_OTHER_SHARE` (25%)
of the CPUs, or, where the own CPU time is judged (a probe on the CPU itself, not one that
waits on an accelerator), the run got less than `STARVED_OWN_CORES` (half) of one core's time:
its main thread alone runs the whole time on a quiet host. Figures measured on a 2-core host
around `probe_device` (2 torch threads): quiet, others 3-6% and own 1.5-1.6 cores; beside one
`yes` loop, others 42-56%; beside two, others 56-67% and own 0.66-0.69 cores, the probe's
bandwidth halved (29 to 13-15 GB/s) and its BF16 matmul down 2x-4x (1.65 to 0.40-0.83
TFLOP/s). With 1 torch thread on the quiet host, own 0.99 cores.

Where /proc/stat cannot be read (not Linux), others' time is None and only the own CPU time
judges; the readers are injectable (`HostReaders`) so tests feed a busy or quiet host.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

PROC_STAT = Path("/proc/stat")
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
# Other processes taking this share of the CPUs this process may use make the host busy.
BUSY_OTHER_SHARE = 0.25
# A run on the CPU that got less than this many cores' time on average was starved.
STARVED_OWN_CORES = 0.5
# /proc/stat's per-CPU columns: user nice system idle iowait irq softirq steal (proc(5)).
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
OTHER_PROCESSES = "other_processes"
PROBE_STARVED = "probe_starved"


def usable_cpus() -> frozenset[int]:
    """The CPU ids this process may run on (`os.sched_getaffinity`; all CPUs where the OS
    has no affinity call)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def parse_cpu_quota_cores(text: str) -> float | None:
    """Cores' worth of a cgroup v2 `cpu.max` ("200000 100000": 2.0); None for "max" (no
    quota) or text that is not two numbers."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def cpu_quota_cores(path: Path = CGROUP_CPU_MAX) -> float | None:
    """This cgroup's CPU quota in cores (`parse_cpu_quota_cores`); None without one or where
    the file cannot be read."""
    try:
        return parse_cpu_quota_cores(path.read_text())
    except OSError:
        return None


def parse_busy_ticks(text: str, cpus: Iterable[int]) -> int | None:
    """Busy clock ticks summed over `cpus` from /proc/stat's text (user + nice + system + irq
    + softirq + steal of each "cpuN" line); None when a CPU of `cpus` has no line."""
    wanted = set(cpus)
    busy = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in wanted:
            continue
        columns = [int(value) for value in rest.split()]
        busy += sum(columns[i] for i in _BUSY_COLUMNS if i < len(columns))
        wanted.discard(int(name[3:]))
    return None if wanted else busy


def busy_cpu_s(cpus: Iterable[int], path: Path = PROC_STAT) -> float | None:
    """Seconds the CPUs `cpus` have been busy since boot (/proc/stat over `SC_CLK_TCK`);
    None where it cannot be read."""
    try:
        ticks = parse_busy_ticks(path.read_text(), cpus)
        per_s = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    return None if ticks is None or per_s <= 0 else ticks / per_s


def loadavg_1m() -> float | None:
    """The 1-minute load average (`os.getloadavg`); None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@dataclass(frozen=True)
class HostReaders:
    """Where the figures come from (the defaults read this host; tests inject their own):
    `wall` (s, monotonic), `own_cpu_s` (this process's CPU seconds), `busy_cpu_s` (busy
    seconds of the given CPUs, or None), `loadavg_1m`, `cpus` (ids this process may use),
    `quota_cores` (cgroup quota in cores, or None)."""

    wall: Callable[[], float] = time.monotonic
    own_cpu_s: Callable[[], float] = time.process_time
    busy_cpu_s: Callable[[frozenset[int]], float | None] = busy_cpu_s
    loadavg_1m: Callable[[], float | None] = loadavg_1m
    cpus: Callable[[], frozenset[int]] = usable_cpus
    quota_cores: Callable[[], float | None] = cpu_quota_cores


@dataclass(frozen=True)
class HostSample:
    """The readers' figures at one moment: wall (s), own CPU (s), busy CPU (s, or None),
    1-minute load average (or None)."""

    wall: float
    own_cpu_s: float
    busy_cpu_s: float | None
    loadavg_1m: float | None

    @classmethod
    def read(cls, readers: HostReaders, cpus: frozenset[int]) -> HostSample:
        return cls(
            wall=readers.wall(),
            own_cpu_s=readers.own_cpu_s(),
            busy_cpu_s=readers.busy_cpu_s(cpus),
            loadavg_1m=readers.loadavg_1m(),
        )


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


def interference(
    before: HostSample,
    after: HostSample,
    *,
    cpus: int,
    quota_cores: float | None,
    threads: int | None,
    judge_own: bool,
) -> dict[str, Any]:
    """The figures of one run between two samples (module docstring): {"wall_s", "own_cpu_s",
    "own_cores", "own_share", "threads", "other_cpu_s", "other_cores", "other_share" (None
    where /proc/stat was not read), "cpus", "usable_cores", "loadavg_1m_before",
    "loadavg_1m_after", "host_busy", "busy_because" (keys: "other_processes",
    "probe_starved")}; s, cores, fractions. A run of no wall time judges nothing."""
    wall_s = after.wall - before.wall
    own_cpu_s = max(0.0, after.own_cpu_s - before.own_cpu_s)
    usable = min(float(cpus), quota_cores) if quota_cores else float(cpus)
    probe_cores = min(float(threads), usable) if threads else usable
    other_cpu_s = None
    if before.busy_cpu_s is not None and after.busy_cpu_s is not None:
        other_cpu_s = max(0.0, after.busy_cpu_s - before.busy_cpu_s - own_cpu_s)
    own_cores = own_cpu_s / wall_s if wall_s > 0 else None
    other_cores = other_cpu_s / wall_s if other_cpu_s is not None and wall_s > 0 else None
    other_share = other_cores / cpus if other_cores is not None else None
    because = []
    if other_share is not None and other_share >= BUSY_OTHER_SHARE:
        because.append(OTHER_PROCESSES)
    if judge_own and own_cores is not None and own_cores < STARVED_OWN_CORES:
        because.append(PROBE_STARVED)
    return {
        "wall_s": _rounded(wall_s),
        "own_cpu_s": _rounded(own_cpu_s),
        "own_cores": _rounded(own_cores),
        "own_share": _rounded(own_cores / probe_cores if own_cores is not None else None),
        "threads": threads,
        "other_cpu_s": _rounded(other_cpu_s),
        "other_cores": _rounded(other_cores),
        "other_share": _rounded(other_share),
        "cpus": cpus,
        "usable_cores": _rounded(usable),
        "loadavg_1m_before": _rounded(before.loadavg_1m, 2),
        "loadavg_1m_after": _rounded(after.loadavg_1m, 2),
        "host_busy": bool(because),
        "busy_because": because,
    }


def measure_interference(
    fn: Callable[[], T],
    *,
    readers: HostReaders | None = None,
    threads: int | None = None,
    judge_own: bool = True,
) -> tuple[T, dict[str, Any]]:
    """(fn(), the host's interference while it ran: `interference`'s figures). `threads` is
    how many threads `fn` runs (None: as many as the usable cores); `judge_own` False leaves
    the own CPU time out of the verdict (a run that waits on an accelerator)."""
    readers = readers or HostReaders()
    cpus = readers.cpus() or frozenset({0})
    quota = readers.quota_cores()
    before = HostSample.read(readers, cpus)
    value = fn()
    after = HostSample.read(readers, cpus)
    figures = interference(
        before, after, cpus=len(cpus), quota_cores=quota, threads=threads, judge_own=judge_own
    )
    return value, figures


__all__ = [
    "BUSY_OTHER_SHARE",
    "OTHER_PROCESSES",
    "PROBE_STARVED",
    "STARVED_OWN_CORES",
    "HostReaders",
    "HostSample",
    "busy_cpu_s",
    "cpu_quota_cores",
    "interference",
    "loadavg_1m",
    "measure_interference",
    "parse_busy_ticks",
    "parse_cpu_quota_cores",
    "usable_cpus",
]
