"""The host's interference around a run (engine/host_interference.py), on injected readers:
other processes' CPU time on the worker's CPUs, the run's own CPU time, the cgroup quota."""

from __future__ import annotations

import pytest

from engine.host_interference import (
    HostReaders,
    HostSample,
    interference,
    measure_interference,
    parse_busy_ticks,
    parse_cpu_quota_cores,
)

# /proc/stat's shape (proc(5)): user nice system idle iowait irq softirq steal guest guest_nice
PROC_STAT = """cpu  16838 0 5748 43765 969 0 164 3 0 0
cpu0 4404 0 1970 27113 210 0 21 1 0 0
cpu1 12434 0 3777 16652 758 0 142 2 0 0
intr 419757 0 0
ctxt 985515
"""


def test_busy_ticks_sum_the_busy_columns_of_the_worker_cpus_only():
    # cpu1: user 12434 + system 3777 + softirq 142 + steal 2; idle and iowait are not busy
    assert parse_busy_ticks(PROC_STAT, {1}) == 12434 + 3777 + 142 + 2
    assert parse_busy_ticks(PROC_STAT, {0, 1}) == (4404 + 1970 + 21 + 1) + 16355
    assert parse_busy_ticks(PROC_STAT, {0, 2}) is None  # no line for cpu2: cannot say


@pytest.mark.parametrize(
    ("text", "cores"),
    [("max 100000", None), ("150000 100000", 1.5), ("200000 100000\n", 2.0), ("junk", None)],
)
def test_a_cgroup_quota_reads_as_cores(text, cores):
    assert parse_cpu_quota_cores(text) == cores


def sample(wall: float, own: float, busy: float | None, load: float | None = 0.5) -> HostSample:
    return HostSample(wall=wall, own_cpu_s=own, busy_cpu_s=busy, loadavg_1m=load)


def judged(before, after, *, cpus=2, quota=None, threads=2, judge_own=True):
    return interference(
        before, after, cpus=cpus, quota_cores=quota, threads=threads, judge_own=judge_own
    )


def test_other_processes_on_a_quarter_of_the_cpus_make_the_host_busy():
    # 4 s on 2 CPUs: the probe took 3.2 CPU s, the CPUs were busy 8.4 s: others took 5.2 s
    busy = judged(sample(10, 1.0, 100.0), sample(14, 4.2, 108.4))
    assert busy["own_cores"] == pytest.approx(0.8) and busy["own_share"] == pytest.approx(0.4)
    assert busy["other_cpu_s"] == pytest.approx(5.2)
    assert busy["other_cores"] == pytest.approx(1.3) and busy["other_share"] == pytest.approx(0.65)
    assert busy["host_busy"] is True and busy["busy_because"] == ["other_processes"]
    # the same probe with others at 0.4 core (20% of the CPUs) is quiet
    quiet = judged(sample(10, 1.0, 100.0), sample(14, 4.2, 104.8))
    assert quiet["other_share"] == pytest.approx(0.2)
    assert quiet["host_busy"] is False and quiet["busy_because"] == []
    assert (quiet["loadavg_1m_before"], quiet["loadavg_1m_after"], quiet["cpus"]) == (0.5, 0.5, 2)


def test_a_starved_cpu_probe_is_busy_but_an_accelerator_one_is_not_judged_on_its_own_time():
    # 10 s of wall time, 3 s of own CPU time: 0.3 core; /proc/stat unreadable
    before, after = sample(0, 0, None, None), sample(10, 3.0, None, None)
    starved = judged(before, after)
    assert starved["other_share"] is None and starved["own_cores"] == pytest.approx(0.3)
    assert starved["host_busy"] is True and starved["busy_because"] == ["probe_starved"]
    waiting = judged(before, after, threads=None, judge_own=False)
    assert waiting["host_busy"] is False and waiting["busy_because"] == []


def test_the_cgroup_quota_bounds_the_cores_the_probe_could_use():
    # 64 CPUs, a quota of 2 cores, 8 torch threads: the probe could use 2 cores
    figures = judged(sample(0, 0, 0.0), sample(5, 9.0, 9.0), cpus=64, quota=2.0, threads=8)
    assert figures["usable_cores"] == 2.0 and figures["own_share"] == pytest.approx(0.9)
    assert figures["other_share"] == 0.0 and figures["host_busy"] is False


class FakeHost:
    """A host whose clock and CPU counters move only when `run` says."""

    def __init__(self) -> None:
        self.wall, self.own, self.busy = 50.0, 2.0, 900.0

    def run(self, seconds: float, *, own_cores: float, other_cores: float) -> None:
        self.wall += seconds
        self.own += own_cores * seconds
        self.busy += (own_cores + other_cores) * seconds

    def readers(self) -> HostReaders:
        return HostReaders(
            wall=lambda: self.wall,
            own_cpu_s=lambda: self.own,
            busy_cpu_s=lambda cpus: self.busy if cpus == frozenset({0, 1}) else None,
            loadavg_1m=lambda: 1.7,
            cpus=lambda: frozenset({0, 1}),
            quota_cores=lambda: None,
        )


def test_measure_interference_reads_the_host_around_the_run():
    host = FakeHost()
    value, figures = measure_interference(
        lambda: host.run(3.0, own_cores=1.5, other_cores=1.2) or "done",
        readers=host.readers(),
        threads=2,
    )
    assert value == "done"
    assert figures["wall_s"] == 3.0 and figures["own_cpu_s"] == pytest.approx(4.5)
    assert figures["other_share"] == pytest.approx(0.6) and figures["host_busy"] is True
    assert figures["loadavg_1m_before"] == 1.7
