"""The managers' reports: how fast releases are adapted, reduced from the rows
`adaptation.selectors.reports` reads (`report_rows`: six queries whatever the number of
releases) to the per-release and per-pool figures. Plain code, no query: the reports page
and its CSV (`adaptation.presenters.reports` shapes them) and the weekly summary the
notifications send (`ReportSummary.as_dict`) read the same figures from here.

Definitions (the page, the CSV and the weekly summary share them):

- A report covers the releases **discovered** in the period (dates inclusive, UTC) and, when
  pools are chosen, having a job on one of them; only those pools' jobs count.
- **time to detect** = discovered - published (unknown without a publication time).
- **time to Day-0** = ready - published, or ready - discovered when the hub gave no
  publication time (`day0_basis` says which); "ready" is the first `ready_at` of the
  release's jobs on the chosen pools (every stage the `complete` level requires passed).
- **adapted within 24 h**: the share of the releases seen whose time to Day-0 is at most
  24 h (a release not ready counts against it).
- **median / p90 time to Day-0**: over the ready releases, linear interpolation between
  the closest ranks (numpy's default percentile).
- **failures by stage**: failed stage attempts per stage, every attempt counted.
- **failures by class**: the same attempts by whose fault they were (`StageRun.
  failure_class`, docs/limitations.md "Failure classes"): the infrastructure's (a time limit,
  a lost worker, memory, the network or broker, a day0 error) or the release's.
- **a success** is a full job that succeeded: a job that runs every stage the readiness
  levels require (`DAY0_READINESS`, up to `complete`; `is_full_job`) and all of whose stages
  succeeded. A partial job (a subset of stages: a webhook's three-stage job, a re-check of one
  stage) is neither a success nor a failure: it is counted apart ("partial").
- **regressions detected**: the figures found worse than their last good runs
  (docs/regressions.md) whose detection falls in the period, of jobs on the chosen pools
  (whatever the release's discovery date: a regression is news when it is found), and how
  many jobs they are of.
- **success rate per pool**: successes / finished full jobs (succeeded + failed) on the pool;
  partial, cancelled and unfinished jobs are left out. A failed job is put down to the class
  of its newest failed stage attempt (failed by the infrastructure, by the release).

- **output tokens/s at full size**: measured on the pool's engine with dummy weights where a
  serve run of the release's jobs measured it (the primary workload's best level at the run's
  TP), else the plan's predicted workload at its throughput-optimal load; the newest job with a
  figure gives it, and `Throughput.kind` says which (the page labels it, the CSV's
  `full_size_basis` names it).

Hours are rounded to 2 decimals and percentages to 1, once, here: the page, the CSV and the
weekly summary carry the same numbers.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from adaptation.domain.stages import stage_title
from adaptation.models import FailureClass, JobStatus
from adaptation.readiness import readiness_thresholds
from adaptation.selectors.reports import (
    FailedAttempt,
    JobFacts,
    MeasuredThroughput,
    PredictedThroughput,
    ReleaseFacts,
    ReportQuery,
    ReportRows,
)
from engine.stages.plan.result import StoredFit

DAY_S = 24 * 3600
WITHIN_S = DAY_S  # "adapted within 24 h"
EXCERPT_CHARS = 200


def hours(seconds: float | None) -> float | None:
    """Seconds as hours, rounded to 2 decimals (None stays None)."""
    return None if seconds is None else round(seconds / 3600, 2)


def percent(part: int, whole: int) -> float | None:
    """`part` of `whole` in percent, rounded to 1 decimal (None when `whole` is 0)."""
    return round(100 * part / whole, 1) if whole else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`-th percentile (0-100) of `values` by linear interpolation between the closest
    ranks (numpy's default method); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# An exception's name at the start of a line ("KeyError: ...", "engine.contract.StageFailed: ...",
# "SoftTimeLimitExceeded()"), as errors stored before failure classes held them.
_EXCEPTION_NAME = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exceeded|Failed|Interrupt|Exit)"
    r"(?:\(\))?(?::\s*|$)"
)
_TIME_LIMIT_NAMES = ("SoftTimeLimitExceeded", "TimeLimitExceeded")


def error_excerpt(head: str, tail: str) -> str:
    """The line that says why a stage failed, in words: the last line of a traceback (read
    from the error's `tail`), else the error's first line (from its `head`), without an
    exception's class name (a time limit reads "ran past its time budget"; errors stored
    since failure classes are words already), cut to `EXCERPT_CHARS`."""
    head, tail = (head or "").strip(), (tail or "").strip()
    if head.startswith("Traceback") and tail:
        line = tail.splitlines()[-1].strip()
    else:
        line = head.splitlines()[0].strip() if head else ""
    if any(name in line for name in _TIME_LIMIT_NAMES):
        line = "ran past its time budget (a time limit of the host, not the release)"
    else:
        named = _EXCEPTION_NAME.match(line)
        if named:
            line = line[named.end() :].strip() or "an unexpected error (see the stage's log)"
    return line if len(line) <= EXCERPT_CHARS else line[: EXCERPT_CHARS - 1] + "…"


def full_job_stages() -> frozenset[str]:
    """The stages a full job runs: every stage the readiness levels require
    (`DAY0_READINESS`, up to `complete`)."""
    return frozenset(name for names in readiness_thresholds().values() for name in names)


def is_full_job(stages: Iterable[str], required: frozenset[str] | None = None) -> bool:
    """Whether a job running `stages` is a full one (it runs every stage of `required`,
    default `full_job_stages()`), not a partial one."""
    required = full_job_stages() if required is None else required
    return required.issubset(stages)


# --- per release ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailedStage:
    """A stage that failed for a release: how many attempts failed, on which pools, and the
    newest failure's reason and class ("infrastructure", "release"; "" when unknown)."""

    stage: str
    attempts: int
    pools: tuple[str, ...]
    error: str
    failure_class: str = ""


@dataclass(frozen=True)
class Throughput:
    """A release's output tokens/s at full size, as a report shows it: `kind` "measured" (on
    its pool's engine serving the full-size model with dummy weights: the best level of the
    primary workload, at `tp`) where a serve run measured one, else "predicted" (its plan's
    served workload at the throughput-optimal load, naming its `fit`); the pool and job it is
    of, the input and output tokens a request, and the concurrency."""

    kind: str
    output_tokens_per_s: float | None
    pool: str
    job_id: int
    input_tokens: int | None
    output_tokens: int | None
    concurrency: int | float | None
    tp: int | None = None
    fit: StoredFit | None = None


def throughputs(
    measured: Iterable[MeasuredThroughput], predicted: Iterable[PredictedThroughput]
) -> dict[int, Throughput]:
    """Each release's throughput (both lists newest job first): its newest measured figure,
    else its newest prediction."""
    found: dict[int, Throughput] = {}
    for m in measured:
        found.setdefault(
            m.release_id,
            Throughput(
                kind="measured",
                output_tokens_per_s=m.output_tokens_per_s,
                pool=m.pool,
                job_id=m.job_id,
                input_tokens=m.input_tokens,
                output_tokens=m.output_tokens,
                concurrency=m.concurrency,
                tp=m.tp,
            ),
        )
    for p in predicted:
        if p.output_tokens_per_s is None:
            continue
        found.setdefault(
            p.release_id,
            Throughput(
                kind="predicted",
                output_tokens_per_s=p.output_tokens_per_s,
                pool=p.pool,
                job_id=p.job_id,
                input_tokens=p.input_tokens,
                output_tokens=p.output_tokens,
                concurrency=p.concurrency,
                fit=StoredFit.from_stored(p.fit),
            ),
        )
    return found


def with_throughputs(rows: Iterable[ReleaseRow], found: dict[int, Throughput]) -> None:
    """Set each row's `throughput` from `found` (by release id; None where it has none)."""
    for row in rows:
        row.throughput = found.get(row.release_id)


@dataclass
class ReleaseRow:
    """One release in a report."""

    release_id: int
    repo_id: str
    revision: str
    published_at: datetime | None
    discovered_at: datetime
    status: str  # its newest counted job's status ("" without one)
    readiness: str  # that job's readiness level
    blocking_stage: str
    ready_at: datetime | None
    open_limitations: int
    failed_stages: list[FailedStage] = field(default_factory=list)
    # Output tokens/s at full size, measured on the engine where a serve run measured it,
    # else predicted (`with_throughputs`; None: neither).
    throughput: Throughput | None = None

    @property
    def day0_basis(self) -> str:
        """What time-to-Day-0 counts from: "publication", or "discovery" without one."""
        return "publication" if self.published_at is not None else "discovery"

    @property
    def time_to_detect_s(self) -> float | None:
        if self.published_at is None:
            return None
        return (self.discovered_at - self.published_at).total_seconds()

    @property
    def time_to_day0_s(self) -> float | None:
        if self.ready_at is None:
            return None
        start = self.published_at if self.published_at is not None else self.discovered_at
        return (self.ready_at - start).total_seconds()

    @property
    def time_to_detect_h(self) -> float | None:
        return hours(self.time_to_detect_s)

    @property
    def time_to_day0_h(self) -> float | None:
        return hours(self.time_to_day0_s)

    @property
    def within_24h(self) -> bool:
        seconds = self.time_to_day0_s
        return seconds is not None and seconds <= WITHIN_S

    @property
    def blocking_title(self) -> str:
        return stage_title(self.blocking_stage) if self.blocking_stage else ""

    @property
    def basis_at(self) -> datetime:
        return self.published_at if self.published_at is not None else self.discovered_at


def release_row(facts: ReleaseFacts, newest_job: JobFacts | None) -> ReleaseRow:
    """A report row of a release, with its newest counted job's status, level and blocking
    stage (blank without one)."""
    return ReleaseRow(
        release_id=facts.release_id,
        repo_id=facts.repo_id,
        revision=facts.revision,
        published_at=facts.published_at,
        discovered_at=facts.discovered_at,
        status=newest_job.status if newest_job else "",
        readiness=newest_job.readiness if newest_job else "",
        blocking_stage=newest_job.blocking_stage if newest_job else "",
        ready_at=facts.ready_at,
        open_limitations=facts.open_limitations,
    )


def _failed_stages(attempts: Iterable[FailedAttempt]) -> list[FailedStage]:
    """One release's failed attempts (newest first) grouped by stage, newest failure first."""
    grouped: dict[str, list[FailedAttempt]] = {}
    for attempt in attempts:
        grouped.setdefault(attempt.stage, []).append(attempt)
    return [
        FailedStage(
            stage=stage,
            attempts=len(items),
            pools=tuple(sorted({item.pool for item in items})),
            error=error_excerpt(items[0].error_head, items[0].error_tail),
            failure_class=items[0].failure_class,
        )
        for stage, items in grouped.items()
    ]


# --- per pool ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolRate:
    """A pool's jobs in the report (every one), its full jobs that succeeded and failed (the
    failed ones by class: `failed_infrastructure`, `failed_release`) and its partial jobs,
    which count neither way."""

    pool: str
    jobs: int
    succeeded: int
    failed: int
    partial: int = 0
    failed_infrastructure: int = 0
    failed_release: int = 0

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed

    @property
    def success_rate_percent(self) -> float | None:
        return percent(self.succeeded, self.finished)


def pool_rates(jobs: Iterable[JobFacts], attempts: Iterable[FailedAttempt] = ()) -> list[PoolRate]:
    """Jobs per pool with the successes and failures of its full jobs (a failed one by the
    class of its newest failed attempt in `attempts`, newest first), by pool name."""
    required = full_job_stages()
    failed_class: dict[int, str] = {}
    for attempt in attempts:  # newest first
        failed_class.setdefault(attempt.job_id, attempt.failure_class)
    counts: dict[str, Counter] = {}
    for job in jobs:
        count = counts.setdefault(job.pool, Counter())
        count["jobs"] += 1
        if not is_full_job(job.stages, required):
            count["partial"] += 1
        elif job.status == JobStatus.FAILED:
            count[JobStatus.FAILED] += 1
            count[f"failed_{failed_class.get(job.job_id) or FailureClass.RELEASE}"] += 1
        else:
            count[job.status] += 1
    return [
        PoolRate(
            pool=pool,
            jobs=count["jobs"],
            succeeded=count[JobStatus.SUCCEEDED],
            failed=count[JobStatus.FAILED],
            partial=count["partial"],
            failed_infrastructure=count[f"failed_{FailureClass.INFRASTRUCTURE}"],
            failed_release=count[f"failed_{FailureClass.RELEASE}"],
        )
        for pool, count in sorted(counts.items())
    ]


# --- the report -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportSummary:
    """The report's summary figures (see the module docstring for each definition)."""

    releases_seen: int
    ready: int
    within_24h: int
    within_24h_percent: float | None
    median_time_to_day0_h: float | None
    p90_time_to_day0_h: float | None
    failures_by_stage: list[tuple[str, int]]
    pools: list[PoolRate]
    # Failed attempts by class, infrastructure then release (both always there).
    failures_by_class: list[tuple[str, int]] = field(default_factory=list)
    # The stages a full job runs (what a success needs), in the readiness levels' order.
    full_job_stages: tuple[str, ...] = ()
    # Regressions detected in the period, and the jobs they are of.
    regressions_detected: int = 0
    jobs_regressed: int = 0

    @property
    def partial_jobs(self) -> int:
        return sum(rate.partial for rate in self.pools)

    def as_dict(self) -> dict[str, Any]:
        """The figures as JSON-able data (the weekly summary's payload)."""
        return {
            "releases_seen": self.releases_seen,
            "ready": self.ready,
            "adapted_within_24h": self.within_24h,
            "adapted_within_24h_percent": self.within_24h_percent,
            "median_time_to_day0_h": self.median_time_to_day0_h,
            "p90_time_to_day0_h": self.p90_time_to_day0_h,
            "failures_by_stage": dict(self.failures_by_stage),
            "failures_by_class": dict(self.failures_by_class),
            "regressions_detected": self.regressions_detected,
            "jobs_regressed": self.jobs_regressed,
            "success_by_pool": [
                {
                    "pool": rate.pool,
                    "jobs": rate.jobs,
                    "succeeded": rate.succeeded,
                    "failed": rate.failed,
                    "failed_infrastructure": rate.failed_infrastructure,
                    "failed_release": rate.failed_release,
                    "partial": rate.partial,
                    "success_rate_percent": rate.success_rate_percent,
                }
                for rate in self.pools
            ],
        }


@dataclass(frozen=True)
class Report:
    query: ReportQuery
    rows: list[ReleaseRow]
    summary: ReportSummary


def summarize(
    rows: Sequence[ReleaseRow],
    attempts: Iterable[FailedAttempt],
    rates: list[PoolRate],
    regressions: tuple[int, int] = (0, 0),
) -> ReportSummary:
    """The summary figures of a report's rows, failed attempts and pool rates, and the
    regressions detected in its period (their count, and the jobs they are of)."""
    times = [row.time_to_day0_s for row in rows if row.time_to_day0_s is not None]
    within = sum(1 for row in rows if row.within_24h)
    attempts = list(attempts)
    causes = Counter(attempt.stage for attempt in attempts)
    classes = Counter(attempt.failure_class or FailureClass.RELEASE for attempt in attempts)
    return ReportSummary(
        releases_seen=len(rows),
        ready=len(times),
        within_24h=within,
        within_24h_percent=percent(within, len(rows)),
        median_time_to_day0_h=hours(percentile(times, 50)),
        p90_time_to_day0_h=hours(percentile(times, 90)),
        failures_by_stage=sorted(causes.items(), key=lambda item: (-item[1], item[0])),
        pools=rates,
        failures_by_class=[(value, classes[value]) for value in FailureClass.values],
        full_job_stages=tuple(
            dict.fromkeys(name for names in readiness_thresholds().values() for name in names)
        ),
        regressions_detected=regressions[0],
        jobs_regressed=regressions[1],
    )


def release_report(read: ReportRows) -> Report:
    """The report of what `selectors.reports.report_rows` read: its rows (newest discovered
    first, each with its failed stages) and summary."""
    newest: dict[int, JobFacts] = {}
    for job in read.jobs:  # newest first
        newest.setdefault(job.release_id, job)
    rows = [release_row(facts, newest.get(facts.release_id)) for facts in read.releases]
    by_release: dict[int, list[FailedAttempt]] = {}
    for attempt in read.attempts:
        by_release.setdefault(attempt.release_id, []).append(attempt)
    for row in rows:
        row.failed_stages = _failed_stages(by_release.get(row.release_id, []))
    summary = summarize(rows, read.attempts, pool_rates(read.jobs, read.attempts), read.regressions)
    return Report(query=read.query, rows=rows, summary=summary)
