"""The suite matrix: one row per entry of a suite run (its family shapes and release), one
column per stage, each cell the latest attempt's outcome compared with the same entry's cell
in the previous run of the suite on the pool. Values only: states, classes, ids, metric
keys; the template and the CSV header hold the words (the stack's in the pools page's
`partials/stack_*.html`, the regressed figures' in `partials/regression_*.html`)."""

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
from engine.markdown import first_line
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

# How a cell compares with the previous run's ("" when it does not differ in kind, or there
# is nothing to compare with).
NEWLY_FAILING = "newly-failing"  # passed before, fails now
FIXED = "fixed"  # failed before, passes now
NEWLY_REGRESSED = "newly-regressed"  # passed cleanly before, regressed now
STILL_FAILING = "still-failing"


@dataclass(frozen=True)
class MatrixCell:
    """One stage of one entry's job. `error` is the first line of the failure; `regressions`
    the metric keys of the stage's regressions (the CSV's and the API's), `regressed_figures`
    what each is (the page's); `previous_state` None when the previous run has no job for the
    entry (or there is no previous run)."""

    stage: str
    state: str
    failure_class: str
    attempt: int
    error: str
    regressions: tuple[str, ...]
    previous_state: str | None
    change: str
    regressed_figures: tuple[BadgeFigure, ...] = ()

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


@dataclass(frozen=True)
class MatrixCounts:
    """Cells by state (`waiting`: pending, queued or running) and by change against the
    previous run."""

    passed: int = 0
    failed: int = 0
    regressed: int = 0
    skipped: int = 0
    waiting: int = 0
    newly_failing: int = 0
    fixed: int = 0


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
) -> SuiteMatrix:
    """The matrix of `run` from its `jobs` and the previous run's `previous_jobs` (each with
    stage runs and regressions prefetched: `selectors.suites.suite_run_jobs`). Rows follow
    the suite file's entry order (entries it no longer lists last, by name); columns the
    registry's stage order, limited to the stages some job of the run has."""
    order = {e.name: i for i, e in enumerate(suite.entries)} if suite else {}
    current = _by_entry(jobs)
    before = _by_entry(previous_jobs)
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
            previous_state = previous_states.get(stage) if previous else None
            metrics = tuple(sorted(regressions.get(stage, ())))
            cells.append(
                MatrixCell(
                    stage=stage,
                    state=state,
                    failure_class=run_.failure_class if run_ is not None else "",
                    attempt=run_.attempt if run_ is not None else 0,
                    error=first_line(run_.error) if run_ is not None else "",
                    regressions=metrics,
                    previous_state=previous_state,
                    change=_change(previous_state, state),
                    regressed_figures=tuple(badge_figure(metric) for metric in metrics),
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
    cells = [cell for row in rows for cell in row.cells]
    counts = MatrixCounts(
        passed=sum(c.state == PASSED for c in cells),
        failed=sum(c.state == FAILED for c in cells),
        regressed=sum(c.state == REGRESSED for c in cells),
        skipped=sum(c.state == SKIPPED for c in cells),
        waiting=sum(c.state in (PENDING, QUEUED, RUNNING) for c in cells),
        newly_failing=sum(c.change == NEWLY_FAILING for c in cells),
        fixed=sum(c.change == FIXED for c in cells),
    )
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
