"""The release page's stage panels: one per registered stage whose app module names a panel
template, in registry order (`engine.registry`).

A stage's panel is drawn by the template its `AppStage.panel_template` names
(`adaptation/stages/<stage>.py`; "adaptation/panels/<stage>.html"). The release page includes
each (`{% for panel in panels %}{% include panel.template %}`), and its live partial includes
them again with `oob`, so that a poll swaps each panel by its id. The template finds `panel`
in its context: the stage's `name` and `title`, and `values`, what the stage's
`AppStage.presenter` returns (`adaptation.presenters.stage_panels`). A stage with a template
and no presenter gets a `StagePanel` (each job's latest attempt of the stage with its stored
result), so a new stage's panel needs its template only; one that shows more (charts, figures
shaped from its result, rows of its own) names its presenter in its app module.

The page draws the newest job's panels in full, not every job's: per pool and stage the newest
job that ran the stage (`shown_jobs`), or the one job `?job=` names; a presenter sees only
those jobs, reading `release_jobs(page.release)` (`presenters.release_jobs`: the release copy
`release_showing` makes lists them), and the other jobs fold into the job history
(`presenters.job_timeline.job_history`).

A presenter is handed the `ReleasePage`: the release with its jobs and their stage attempts
prefetched, and what the view read for every panel. Those that need more reads (the plan's
start on its pool, the performance points) make them through `adaptation.selectors`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from adaptation.models import AcceleratorPool, AdaptationJob, JobStatus, ModelRelease, StageRun
from adaptation.presenters.day0_clock import newest_job_per_stage
from adaptation.presenters.release_jobs import release_jobs, release_showing
from adaptation.presenters.stages import StageColumn
from adaptation.selectors.jobs import latest_runs_by_stage
from adaptation.selectors.release_notes import NotesSummary
from adaptation.stages import AppStage, app_stage, app_stages
from engine.registry import get_stage
from engine.stored import as_mapping


@dataclass(frozen=True)
class ReleasePage:
    """What each panel presenter is handed: the release (its jobs, newest first, with their
    stage attempts prefetched: `selectors.releases.release_detail`), the page's query string
    (a chart view, `?perf_x=`), the pools no live worker serves (by id: their queued stages
    say they wait for one) and the release's latest notes per pool (the job panel links them
    too)."""

    release: ModelRelease
    params: Mapping[str, Any] = field(default_factory=dict)
    pools_without_worker: Mapping[int, AcceleratorPool] = field(default_factory=dict)
    release_notes: list[NotesSummary] = field(default_factory=list)
    shown: ShownJobs | None = None


@dataclass(frozen=True)
class ShownJobs:
    """Which jobs the release page draws in full: per stage, the jobs whose panel it shows
    (`by_stage`), and the jobs whose stage timeline it shows (`timelines`, newest first); the
    other jobs fold into the job history. `selected`: the job the URL asked for (`?job=`),
    None for the default (per pool, the newest job that ran each stage, and every running
    job)."""

    by_stage: Mapping[str, list[AdaptationJob]]
    timelines: list[AdaptationJob]
    selected: AdaptationJob | None = None

    def jobs_for(self, stage: str) -> list[AdaptationJob]:
        return list(self.by_stage.get(stage, []))

    @property
    def jobs(self) -> list[AdaptationJob]:
        """Every job the page draws in full (a panel or a timeline), each once."""
        every = [*self.timelines, *(job for jobs in self.by_stage.values() for job in jobs)]
        return list({job.pk: job for job in every}.values())


def shown_jobs(release: ModelRelease, *, job_id: int | None = None) -> ShownJobs:
    """The jobs the page draws in full (jobs prefetched newest first): the one `job_id` names
    when it is the release's, else per pool and stage the newest job that ran the stage
    (`newest_job_per_stage`: a newer partial job never hides an older full one) and every
    job still pending or running."""
    jobs = list(release.jobs.all())
    selected = next((job for job in jobs if job.pk == job_id), None)
    if selected is not None:
        names = set(selected.stages or []) | set(latest_runs_by_stage(selected))
        return ShownJobs(
            by_stage={name: [selected] for name in names}, timelines=[selected], selected=selected
        )
    by_pool: dict[int, list[AdaptationJob]] = {}
    for job in jobs:
        by_pool.setdefault(job.pool_id, []).append(job)
    by_stage: dict[str, list[AdaptationJob]] = {}
    chosen: set[int] = set()
    for pool_jobs in by_pool.values():
        for name, owner in newest_job_per_stage(pool_jobs).items():
            by_stage.setdefault(name, []).append(owner)
            chosen.add(owner.pk)
    chosen |= {job.pk for job in jobs if job.status in (JobStatus.PENDING, JobStatus.RUNNING)}
    order = {job.pk: index for index, job in enumerate(jobs)}
    for owners in by_stage.values():
        owners.sort(key=lambda job: order[job.pk])
    return ShownJobs(by_stage=by_stage, timelines=[job for job in jobs if job.pk in chosen])


@dataclass(frozen=True)
class JobStageRun:
    """A job's latest attempt of a stage, and that attempt's stored result ({} without one)."""

    job: AdaptationJob
    run: StageRun
    result: Mapping[str, Any]


@dataclass(frozen=True)
class StagePanel:
    """The values of a panel whose stage has no presenter: each job's latest attempt of the
    stage, newest job first (jobs without one left out)."""

    runs: list[JobStageRun]

    @property
    def latest(self) -> JobStageRun | None:
        """The newest job's attempt, or None when no job ran the stage."""
        return self.runs[0] if self.runs else None


@dataclass(frozen=True)
class Panel:
    """One stage's panel: its registry `name` and `title`, its `template` and its `values`."""

    name: str
    title: str
    template: str
    values: Any


def stage_panel(page: ReleasePage, stage: str) -> StagePanel:
    """The generic values of `stage`'s panel: each job's latest attempt with its result."""
    runs = []
    for job in release_jobs(page.release):
        run = latest_runs_by_stage(job).get(stage)
        if run is not None:
            runs.append(JobStageRun(job=job, run=run, result=as_mapping(run.result)))
    return StagePanel(runs=runs)


def panel_template(stage: str) -> str:
    """The name of `stage`'s panel template (its `AppStage.panel_template`). Raises
    `LookupError` for a stage without a panel."""
    app = app_stage(stage)
    if app is None or app.panel_template is None:
        raise LookupError(f"the {stage!r} stage has no panel")
    return app.panel_template


def panel_stages() -> list[str]:
    """The registered stages that have a panel, in registry order."""
    return [app.name for app in app_stages() if app.panel_template is not None]


def held_stages(page: ReleasePage) -> set[str]:
    """The stages any of the release's jobs holds (prefetched jobs)."""
    return {name for job in page.release.jobs.all() for name in job.stages or []}


def drawn(app: AppStage, held: set[str]) -> bool:
    """Whether `app`'s panel is drawn: always before the first job; after, when a job holds
    a stage it shows (`AppStage.panel_stages`) or it is `always_drawn`."""
    return not held or app.always_drawn or not held.isdisjoint(app.panel_stages)


def panel_gaps(page: ReleasePage) -> list[StageColumn]:
    """The stages with a panel that none of the release's jobs holds (registry order): the
    page names them in one line instead of a "not run yet" panel each."""
    held = held_stages(page)
    return [
        StageColumn(name=app.name, title=get_stage(app.name).title)
        for app in app_stages()
        if app.panel_template is not None and not drawn(app, held)
    ]


def panel_jobs(shown: ShownJobs, app: AppStage) -> list[AdaptationJob]:
    """The jobs `app`'s panel draws: those shown for each stage it shows
    (`AppStage.panel_stages`), each once, newest first."""
    jobs = {job.pk: job for name in app.panel_stages for job in shown.jobs_for(name)}
    return sorted(jobs.values(), key=lambda job: (job.created_at, job.pk), reverse=True)


def release_panels(page: ReleasePage) -> list[Panel]:
    """The release page's stage panels, in registry order: each stage with a panel template,
    with the values of its presenter (`AppStage.presenter`), else of `stage_panel`. A stage
    that none of the release's jobs holds has no panel (`drawn`; `panel_gaps` names them)."""
    held = held_stages(page)
    panels = []
    for app in app_stages():
        if app.panel_template is None or not drawn(app, held):
            continue
        present = app.resolved("presenter")
        # Each stage's panel reads only the jobs the page shows for it (`ShownJobs`).
        seen = (
            page
            if page.shown is None
            else replace(page, release=release_showing(page.release, panel_jobs(page.shown, app)))
        )
        values = present(seen) if present is not None else stage_panel(seen, app.name)
        panels.append(
            Panel(
                name=app.name,
                title=get_stage(app.name).title,
                template=app.panel_template,
                values=values,
            )
        )
    return panels
