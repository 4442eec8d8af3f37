"""The suite matrix: one row per entry of a suite run (its family shapes and release), one
column per stage, each cell the latest attempt's outcome compared with the same entry's cell
in the previous run of the suite on the pool (or, for a stage that run did not run, the
newest earlier run that did). Also the short summary of each run in a page's run history.
Values only: states, classes, ids, metric keys; the template and the CSV header hold the
words (the stack's in the pools page's `partials/stack_*.html`, the regressed figures' in
`partials/regression_*.html`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from adaptation.models import AdaptationJob, Regression, StageRun, StageStatus, SuiteRun
from adaptation.presenters.pools import StackDifference, StackView, stack_differences, stack_view
from adaptation.presenters.regressions import BadgeFigure, badge_figure
from adaptation.presenters.stages import StageColumn, stage_columns
from adaptation.selectors.jobs import latest_runs_by_stage
from adaptation.selectors.regressions import metric_basis
from engine.registry import stage_names
from engine.suites import Suite

# Cell states, from the latest attempt of the stage (`regressed`: it passed, but a figure of
# it is worse than the last good runs: `adaptation.models.Regression`).
PASSED = "passed"
REGRESSED = "regressed"
FAILED = "failed"
SKIPPED = "skipped"
RUNNING = "running"
QUEUED = "queued"
PENDING = "pending"
CANCELLED = "cancelled"
NOT_RUN = "not-run"  # the job does not have this stage

_STATE_OF_STATUS = {
    StageStatus.SUCCEEDED: PASSED,
    StageStatus.FAILED: FAILED,
    StageStatus.SKIPPED: SKIPPED,
    StageStatus.RUNNING: RUNNING,
    StageStatus.QUEUED: QUEUED,
    StageStatus.PENDING: PENDING,
    StageStatus.CANCELLED: CANCELLED,
}
_GOOD = (PASSED, REGRESSED)
# A previous cell in one of these states did not run its stage: the comparison looks further
# back (`selectors.suites.suite_run_lookback_jobs`).
DID_NOT_RUN = (NOT_RUN, CANCELLED)

# How a cell compares with the previous run's ("" when it does not differ in kind, or there
# is nothing to compare with).
NEWLY_FAILING = "newly-failing"  # passed before, fails now
FIXED = "fixed"  # failed before, passes now
NEWLY_REGRESSED = "newly-regressed"  # passed cleanly before, regressed now
STILL_FAILING = "still-failing"


@dataclass(frozen=True)
class MatrixCell:
    """One stage of one entry's job. `error` is the whole first line of the failure (the
    page's tooltip shortens it, the CSV does not); `regressions` the metric keys of the
    stage's regressions (the CSV's and the API's), `regressed_figures` what each is (the
    page's). `previous_state` is the entry's cell in the previous run, or, when that run did
    not run the stage (not in its job's stages, or cancelled), in the newest earlier run of
    the suite on the pool that did; `previous_run_id` the suite run it is from. Both None
    when no run before has the entry's stage (or there is no run before)."""

    stage: str
    state: str
    failure_class: str
    attempt: int
    error: str
    regressions: tuple[str, ...]
    previous_state: str | None
    change: str
    regressed_figures: tuple[BadgeFigure, ...] = ()
    previous_run_id: int | None = None

    @property
    def ran(self) -> bool:
        return self.state != NOT_RUN


@dataclass(frozen=True)
class MatrixRow:
    """One entry of the run: its name, family shapes and what it exercises (empty when the
    suite file no longer has it), its release and job, and its cells in column order.
    `previous_job_id` is the entry's job in the previous run (None: none, `new`)."""

    entry: str
    shapes: tuple[str, ...]
    exercises: str
    release_id: int
    repo_id: str
    revision: str
    job_id: int
    job_status: str
    cells: tuple[MatrixCell, ...]
    previous_job_id: int | None

    @property
    def new(self) -> bool:
        return self.previous_job_id is None


# The cell states a summary counts, in the order it names them; `waiting` is pending, queued
# or running. Together with `other` they account for every cell.
WAITING = "waiting"
COUNTED_STATES = (PASSED, FAILED, REGRESSED, SKIPPED, WAITING, CANCELLED, NOT_RUN)
_COUNTED_AS = {PENDING: WAITING, QUEUED: WAITING, RUNNING: WAITING}


@dataclass(frozen=True)
class MatrixCounts:
    """Cells by state (`waiting`: pending, queued or running; `not_run`: the job does not
    have the stage; `other`: a status this module does not know) and by change against the
    run each is compared with (`compared_earlier`: cells compared with a run before the
    previous one, which did not run them). The states add up to `total`."""

    passed: int = 0
    failed: int = 0
    regressed: int = 0
    skipped: int = 0
    waiting: int = 0
    cancelled: int = 0
    not_run: int = 0
    other: int = 0
    newly_failing: int = 0
    fixed: int = 0
    compared_earlier: int = 0

    @property
    def total(self) -> int:
        return (
            self.passed
            + self.failed
            + self.regressed
            + self.skipped
            + self.waiting
            + self.cancelled
            + self.not_run
            + self.other
        )

    @property
    def by_state(self) -> tuple[tuple[str, int], ...]:
        """(state, cells) for each state some cell is in, in `COUNTED_STATES` order, then
        ("other", n) when some cell's state is unknown: what a summary names."""
        found = tuple(
            (state, count)
            for state in COUNTED_STATES
            if (count := getattr(self, state.replace("-", "_")))
        )
        return (*found, ("other", self.other)) if self.other else found


def _counts(cells: Iterable[MatrixCell], *, previous_run_id: int | None) -> MatrixCounts:
    by_state = dict.fromkeys(COUNTED_STATES, 0)
    other = newly_failing = fixed = earlier = 0
    for cell in cells:
        state = _COUNTED_AS.get(cell.state, cell.state)
        if state in by_state:
            by_state[state] += 1
        else:
            other += 1
        newly_failing += cell.change == NEWLY_FAILING
        fixed += cell.change == FIXED
        earlier += cell.previous_run_id is not None and cell.previous_run_id != previous_run_id
    return MatrixCounts(
        **{state.replace("-", "_"): count for state, count in by_state.items()},
        other=other,
        newly_failing=newly_failing,
        fixed=fixed,
        compared_earlier=earlier,
    )


@dataclass(frozen=True)
class SuiteMatrix:
    run: SuiteRun
    title: str
    columns: tuple[StageColumn, ...]
    rows: tuple[MatrixRow, ...]
    counts: MatrixCounts
    stack: StackView  # the pool's when the run started
    stack_changes: tuple[StackDifference, ...]  # against the previous run's
    missing_entries: tuple[str, ...]  # suite entries this run has no job for


def suite_matrix(
    *,
    run: SuiteRun,
    jobs: Sequence[AdaptationJob],
    previous_jobs: Sequence[AdaptationJob],
    suite: Suite | None,
    earlier_jobs: Sequence[AdaptationJob] = (),
) -> SuiteMatrix:
    """The matrix of `run` from its `jobs`, the previous run's `previous_jobs` and, for the
    stages that run did not run, `earlier_jobs`: jobs of runs before it, newest run first
    (`selectors.suites.suite_run_lookback_jobs`); each with stage runs and regressions
    prefetched (`selectors.suites.suite_run_jobs`). Rows follow the suite file's entry order
    (entries it no longer lists last, by name); columns the registry's stage order, limited
    to the stages some job of the run has."""
    order = {e.name: i for i, e in enumerate(suite.entries)} if suite else {}
    current = _by_entry(jobs)
    before = _by_entry(previous_jobs)
    earlier: dict[str, list[AdaptationJob]] = {}
    for job in earlier_jobs:
        earlier.setdefault(job.suite_entry, []).append(job)
    columns = tuple(stage_columns(job.stages or [] for job in current.values()))
    stages = tuple(column.name for column in columns)
    rows = []
    for name in sorted(current, key=lambda n: (order.get(n, len(order)), n)):
        job = current[name]
        previous = before.get(name)
        entry = suite.entry(name) if suite else None
        previous_states = _states(previous) if previous else {}
        cells = []
        regressions = _regressions(job)
        for stage in stages:
            state, run_ = _state(job, stage)
            previous_state = previous_states.get(stage)
            previous_run_id = previous.suite_run_id if previous_state else None
            if previous_state in (None, *DID_NOT_RUN):
                found = _earlier_state(earlier.get(name, ()), stage)
                if found is not None:
                    previous_state, previous_run_id = found
            metrics = tuple(sorted(regressions.get(stage, ())))
            cells.append(
                MatrixCell(
                    stage=stage,
                    state=state,
                    failure_class=run_.failure_class if run_ is not None else "",
                    attempt=run_.attempt if run_ is not None else 0,
                    error=_error_line(run_.error) if run_ is not None else "",
                    regressions=metrics,
                    previous_state=previous_state,
                    change=_change(previous_state, state),
                    regressed_figures=tuple(badge_figure(metric) for metric in metrics),
                    previous_run_id=previous_run_id,
                )
            )
        release = job.release
        rows.append(
            MatrixRow(
                entry=name,
                shapes=entry.shapes if entry else (),
                exercises=entry.exercises if entry else "",
                release_id=release.pk,
                repo_id=release.repo_id,
                revision=release.revision,
                job_id=job.pk,
                job_status=job.status,
                cells=tuple(cells),
                previous_job_id=previous.pk if previous else None,
            )
        )
    counts = _counts((cell for row in rows for cell in row.cells), previous_run_id=run.previous_id)
    changes = (
        tuple(stack_differences(run.previous.stack, run.stack))
        if run.previous_id and run.previous
        else ()
    )
    missing = tuple(e.name for e in suite.entries if e.name not in current) if suite else ()
    return SuiteMatrix(
        run=run,
        title=suite.title if suite else run.suite,
        columns=columns,
        rows=tuple(rows),
        counts=counts,
        stack=stack_view(run.stack),
        stack_changes=changes,
        missing_entries=missing,
    )


@dataclass(frozen=True)
class RunSummary:
    """One run in a page's list of runs: its stages when it did not run every registered
    one (column order; empty: every stage), its number of jobs and its cells by state,
    counted as its matrix counts them."""

    run: SuiteRun
    stages: tuple[StageColumn, ...]
    jobs: int
    counts: MatrixCounts


def run_summaries(
    runs: Sequence[SuiteRun], jobs: Iterable[AdaptationJob]
) -> tuple[RunSummary, ...]:
    """A summary per run of `runs` (in their order) from `jobs`, the jobs of all of them with
    stage runs and regressions prefetched (`selectors.suites.suite_runs_jobs`)."""
    by_run: dict[int, list[AdaptationJob]] = {}
    for job in jobs:
        by_run.setdefault(job.suite_run_id, []).append(job)
    every = set(stage_names())
    summaries = []
    for run in runs:
        matrix = suite_matrix(run=run, jobs=by_run.get(run.pk, ()), previous_jobs=(), suite=None)
        subset = {column.name for column in matrix.columns} < every
        summaries.append(
            RunSummary(
                run=run,
                stages=matrix.columns if subset else (),
                jobs=len(matrix.rows),
                counts=matrix.counts,
            )
        )
    return tuple(summaries)


# The CSV export: one line per cell.
CSV_COLUMNS = (
    "suite_run",
    "suite",
    "pool",
    "entry",
    "shapes",
    "repo_id",
    "revision",
    "job_id",
    "stage",
    "state",
    "failure_class",
    "attempt",
    "regressions",
    "previous_state",
    "previous_run",
    "change",
    "error",
)


def csv_rows(matrix: SuiteMatrix) -> Iterable[tuple[Any, ...]]:
    """The matrix as CSV lines in `CSV_COLUMNS` order: one per row and stage."""
    run = matrix.run
    for row in matrix.rows:
        for cell in row.cells:
            yield (
                run.pk,
                run.suite,
                run.pool.name,
                row.entry,
                " ".join(row.shapes),
                row.repo_id,
                row.revision,
                row.job_id,
                cell.stage,
                cell.state,
                cell.failure_class,
                cell.attempt or "",
                " ".join(cell.regressions),
                cell.previous_state or "",
                cell.previous_run_id or "",
                cell.change,
                cell.error,
            )


def _by_entry(jobs: Iterable[AdaptationJob]) -> dict[str, AdaptationJob]:
    """Each entry's job: the first met (the selector gives the newest first)."""
    found: dict[str, AdaptationJob] = {}
    for job in jobs:
        found.setdefault(job.suite_entry, job)
    return found


def _state(job: AdaptationJob, stage: str) -> tuple[str, StageRun | None]:
    run = latest_runs_by_stage(job).get(stage)
    if run is None:
        return NOT_RUN, None
    state = _STATE_OF_STATUS.get(run.status, run.status)
    if state == PASSED and _regressions(job).get(stage):
        state = REGRESSED
    return state, run


def _states(job: AdaptationJob) -> dict[str, str]:
    return {stage: _state(job, stage)[0] for stage in job.stages or []}


def _earlier_state(jobs: Iterable[AdaptationJob], stage: str) -> tuple[str, int] | None:
    """The state of `stage` in the first of `jobs` (newest run first) that ran it, and that
    job's suite run; None when none did."""
    for job in jobs:
        if stage in (job.stages or []):
            state = _state(job, stage)[0]
            if state not in DID_NOT_RUN:
                return state, job.suite_run_id
    return None


def _error_line(error: str) -> str:
    """The first non-empty line of a stage's error, stripped and whole."""
    return next((line.strip() for line in (error or "").splitlines() if line.strip()), "")


def _regressions(job: AdaptationJob) -> dict[str, set[str]]:
    """The job's regression metric keys by the stage they were found at."""
    found: dict[str, set[str]] = {}
    for regression in job.regressions.all():
        stage = regression_stage(regression)
        if stage:
            found.setdefault(stage, set()).add(regression.metric)
    return found


def regression_stage(regression: Regression) -> str:
    """The stage a regression was found at: its stage run's, else the one its metric key
    names (`selectors.regressions.metric_basis`)."""
    if regression.stage_run_id and regression.stage_run is not None:
        return regression.stage_run.stage
    return metric_basis(regression.metric).stage


def _change(previous: str | None, now: str) -> str:
    if previous is None:
        return ""
    if previous in _GOOD and now == FAILED:
        return NEWLY_FAILING
    if previous == FAILED and now in _GOOD:
        return FIXED
    if previous == FAILED and now == FAILED:
        return STILL_FAILING
    if previous == PASSED and now == REGRESSED:
        return NEWLY_REGRESSED
    return ""
