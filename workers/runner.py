"""Runs one stage attempt for a Celery task: claim the row, build the engine's plain inputs,
call the stage, store what happened through the services. The task in `workers.tasks` only
wraps this with Celery's retry and time limits."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import connection
from django.utils import timezone

from adaptation import outbound_http
from adaptation.catalog import accelerator_kind_row_entry
from adaptation.models import AcceleratorPool, AttemptEnd, Culprit, StageRun
from adaptation.selectors.calibration import pool_calibration
from adaptation.selectors.jobs import job_previous_results
from adaptation.selectors.release_notes import job_stage_states, notes_limitations
from adaptation.selectors.releases import known_family_analyses
from adaptation.services.stage_runs import (
    attempt_number,
    stage_run_attempt_end,
    stage_run_claim,
    stage_run_fail,
    stage_run_heartbeat,
    stage_run_requeue,
    stage_run_succeed,
)
from engine.contract import (
    PoolSpec,
    ReleaseRef,
    StageCancelled,
    StageContext,
    StageDefinition,
    StageFailed,
    StageTransientError,
    never_cancelled,
)
from engine.registry import STAGES, get_stage
from engine.stages.serve.options import engine_settings
from engine.units import gb_per_s_to_bytes_per_s
from workers.cgroup import oom_kill_count
from workers.failures import (
    classify_exception,
    classify_stage_failed,
    result_culprit,
    time_budget_error,
)

logger = logging.getLogger(__name__)


@dataclass
class StageOutcome:
    """What the task should do next: nothing, or retry after `retry_after_s`."""

    status: str
    retry_after_s: float | None = None
    reason: str = ""


@dataclass
class _Log:
    """The stage's log lines, time-stamped; stored (last 20,000 characters) on the run."""

    lines: list[str] = field(default_factory=list)

    def __call__(self, message: str) -> None:
        self.lines.append(f"{timezone.now():%H:%M:%S} {message}")

    def text(self, previous: str = "") -> str:
        return "\n".join([previous, *self.lines]).strip()[-20000:]


class Heartbeat:
    """Updates the run's heartbeat from a background thread while the stage runs, so the
    reaper can tell a slow stage from a dead worker.

    A beat that finds the run no longer running this attempt (`attempt`: cancelled by
    someone, or taken for lost by the reaper and queued again) sets `cancelled`: the stage sees
    it through `StageContext.cancelled` and stops at its next step. Cooperative on purpose:
    killing the pool process running the task (`revoke(terminate=True)`) can leave the
    worker's pool locks held and the worker stuck. A beat that fails (a database restart) is
    logged, its connection closed, and the next one tried on a new connection.
    """

    def __init__(self, stage_run_id: int, every_s: float, attempt: int | None = None) -> None:
        self.stage_run_id = stage_run_id
        self.every_s = every_s
        self.attempt = attempt
        self.cancelled = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="day0-heartbeat", daemon=True)

    def _beat(self) -> None:
        """Beat until stopped; a failed beat (database blip) is logged and the next one tried."""
        try:
            while not self._stop.wait(self.every_s):
                try:
                    if not stage_run_heartbeat(
                        stage_run_id=self.stage_run_id, attempt=self.attempt
                    ):
                        self.cancelled.set()
                        return
                except Exception:
                    logger.warning(
                        "Heartbeat of stage run %s failed", self.stage_run_id, exc_info=True
                    )
                    connection.close()
        finally:
            connection.close()  # the thread's own connection

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def pool_spec(pool: AcceleratorPool) -> PoolSpec:
    """The plain description of a pool the engine gets: its settings, its layout
    (bandwidths in bytes/s) and, when an admin's `AcceleratorKind` row defines the pool's
    accelerator kind, that row as a catalog entry (it replaces the shipped file's), and its
    serving engine (`pool_engine`)."""
    return PoolSpec(
        name=pool.name,
        backend=pool.backend,
        queue=pool.queue,
        device=pool.device,
        dtypes=tuple(pool.dtypes or ()),
        operator_manifest=pool.operator_manifest,
        trust_remote_code_orgs=tuple(pool.trust_remote_code_orgs or ()),
        precision_thresholds=dict(pool.precision_thresholds or {}),
        real_weights_max_bytes=pool.real_weights_max_bytes,
        accelerator=pool.accelerator,
        devices_per_node=pool.devices_per_node,
        nodes=pool.nodes,
        intra_node_bandwidth_bytes_per_s=gb_per_s_to_bytes_per_s(
            pool.intra_node_bandwidth_gb_per_s
        ),
        inter_node_bandwidth_bytes_per_s=gb_per_s_to_bytes_per_s(
            pool.inter_node_bandwidth_gb_per_s
        ),
        accelerator_entry=accelerator_kind_row_entry(pool.accelerator),
        engine=pool_engine(pool),
    )


def pool_engine(pool: AcceleratorPool) -> dict[str, Any]:
    """The pool's serving engine as the serve stage reads it (`engine_settings`: {} for
    none), with `python` the worker's `DAY0_ENGINE_PYTHON` where the pool names none (the
    engine a launched kind starts; the load generator of any kind; a worker in the engine's
    image has it set there). {} for an engine its checks refuse (saved around them):
    `serve_engine_check` fails the serve stage with the reason before it runs, and no other
    stage reads it."""
    try:
        engine = engine_settings(pool.engine)
    except ValueError:
        return {}
    # An attached endpoint's load sweep runs vLLM's benchmark module from that environment too.
    if engine and not engine.get("python"):
        engine["python"] = settings.DAY0_ENGINE_PYTHON
    return engine


# The stage that talks to a pool's serving engine (docs/stages/serve.md).
SERVE_STAGE = "serve"


def _serve_refused(reason: str) -> StageFailed:
    """The serve stage failed before it ran, by the infrastructure: `reason` in the stage's
    own failure shape (docs/stages/serve.md)."""
    return StageFailed(
        reason,
        result={
            "status": "failed",
            "passed": False,
            "failure": {
                "phase": "launch",
                "reason": reason,
                "engine_lines": [],
                "culprit": "infrastructure",
            },
        },
    )


def serve_engine_check(pool: AcceleratorPool) -> None:
    """What the worker checks of the pool's engine before the serve stage runs: that its
    checks still accept it (`engine_settings`), and for an `openai` engine where its
    `base_url` points now, through the outbound-address guard (`AcceleratorPool.
    engine_endpoint_check`: private and loopback addresses only with the admin's leave), as
    the name may resolve elsewhere than when the pool was saved. Raises `StageFailed` with
    the reason (culprit infrastructure) for a refused engine or address and
    `StageTransientError` for a name that does not resolve now."""
    try:
        engine = engine_settings(pool.engine)
    except ValueError as exc:
        raise _serve_refused(f"The pool's engine is refused: {exc}") from exc
    try:
        pool.engine_endpoint_check(engine)
    except outbound_http.OutboundBlocked as exc:
        raise _serve_refused(f"The pool's engine base_url is refused: {exc.reason}") from exc
    except outbound_http.OutboundError as exc:
        raise StageTransientError(f"The pool's engine base_url: {exc.reason}") from exc


def _stage_options(options: object, stage: str) -> Any:
    """The job's options for `stage` (`AdaptationJob.options[stage]`); {} when none. Passed
    on as stored: the stage checks them and refuses a malformed value by name."""
    value = options.get(stage) if isinstance(options, dict) else None
    return {} if value is None else value


def stage_context(
    run: StageRun,
    definition: StageDefinition,
    log: _Log,
    cancelled: Callable[[], bool] = never_cancelled,
) -> StageContext:
    """The plain inputs the engine gets for `run`; `cancelled` tells it whether the run was
    cancelled while it runs."""
    job = run.job
    release = job.release
    known = (
        known_family_analyses(exclude_release_id=release.pk)
        if definition.reads_known_families
        else []
    )
    return StageContext(
        release=ReleaseRef(
            hub_kind=release.hub_kind,
            hub_endpoint=release.hub_endpoint,
            repo_id=release.repo_id,
            revision=release.revision,
        ),
        pool=pool_spec(job.pool),
        previous=job_previous_results(job, before_position=run.position),
        known_families=tuple(known),
        log=log,
        options=_stage_options(job.options, definition.name),
        cancelled=cancelled,
        soft_time_limit_s=definition.time_limits_s(_stage_options(job.options, definition.name))[0],
        calibration=(
            pool_calibration(pool=job.pool) if definition.reads_pool_calibration else None
        ),
        limitations=(
            notes_limitations(release=release, pool=job.pool)
            if definition.reads_limitations
            else ()
        ),
        stages=STAGES,
        states=job_stage_states(job)[1] if definition.runs_after_failure else None,
    )


def execute_stage_run(
    stage_run_id: int,
    *,
    task_id: str = "",
    final_try: bool = False,
    worker_host: str | None = None,
) -> StageOutcome:
    """Claim and run one stage attempt. Never raises for a stage's own failure: the failure
    is stored on the run. A transient error asks for a retry unless `final_try`.

    `worker_host` is recorded on the run: the Celery node name ("cpu@host") of the worker
    running it, so the pools page can say what each worker runs; default the host name. The
    attempt records this process's pid and the cgroup's OOM-kill count (so that the worker's
    main process can tell later whether a kill of this process was for memory), and every
    write that ends it names it (`attempt`): a late write of an attempt taken for lost changes
    nothing.

    Every failure is classified (`workers.failures`: infrastructure or release, stored as
    `StageRun.failure_class`) and stored in words; an exception's class name and traceback go
    to the log only."""
    began = time.monotonic()
    # Celery's Django fix-up closes stale database connections around each task.
    run = stage_run_claim(
        stage_run_id=stage_run_id,
        worker_host=worker_host or socket.gethostname(),
        task_id=task_id,
        pid=os.getpid(),
        oom_kills=oom_kill_count(),
    )
    if run is None:
        logger.info("Stage run %s was not queued any more; skipping this delivery.", stage_run_id)
        return StageOutcome(status="not-claimed")
    attempt = attempt_number(run)
    log = _Log()
    again = f", its attempt {attempt} on this run" if attempt > 1 else ""
    log(
        f"started {run.stage} attempt {run.attempt} on {run.worker_host} (pid {os.getpid()}{again})"
    )
    limit_s = 0
    try:
        definition = get_stage(run.stage)
        limit_s = definition.time_limits_s(_stage_options(run.job.options, run.stage))[0]
        if definition.name == SERVE_STAGE:
            serve_engine_check(run.job.pool)
        with Heartbeat(run.pk, settings.DAY0_HEARTBEAT_EVERY_S, attempt=attempt) as heartbeat:
            result = definition(stage_context(run, definition, log, heartbeat.cancelled.is_set))
        log(f"finished {run.stage}")
        stage_run_succeed(stage_run=run, result=result, log=log.text(run.log), attempt=attempt)
    except StageCancelled:
        # The row already says cancelled (or queued again after the reaper took this attempt
        # for lost): only the attempt's end is left to record, if nobody did.
        logger.info("Stage run %s stopped: it is no longer running.", run.pk)
        stage_run_attempt_end(
            stage_run_id=run.pk,
            attempt=attempt,
            ended=AttemptEnd.CANCELLED,
            reason="stopped: the run was no longer running",
        )
        return StageOutcome(status="cancelled")
    except StageFailed as exc:
        # A stage may attach what it measured before failing (precision metrics).
        measured = getattr(exc, "result", None)
        measured = measured if isinstance(measured, dict) else None
        # A stage that caught a time limit (or the host out of memory) and carried on to fail
        # is the infrastructure's fault: its reason goes to the log, the error says why.
        verdict = classify_stage_failed(
            stage=run.stage,
            reason=exc.reason,
            result=measured,
            limit_s=limit_s,
            ran_s=time.monotonic() - began,
        )
        if verdict.error != exc.reason:
            log(f"{run.stage} failed: {exc.reason}")
        timed_out = verdict.error.startswith(f"{run.stage} ran past its time budget")
        stage_run_fail(
            stage_run=run,
            error=verdict.error,
            log=log.text(run.log),
            result=measured,
            attempt=attempt,
            ended=AttemptEnd.TIME_LIMIT if timed_out else AttemptEnd.FAILED,
            culprit=result_culprit(measured)
            or (Culprit.INFRASTRUCTURE if verdict.failure_class != Culprit.RELEASE else None),
            failure_class=verdict.failure_class,
        )
        return StageOutcome(status="failed", reason=verdict.error)
    except StageTransientError as exc:
        if final_try:
            reason = f"{exc.reason} (gave up after {run.retries + 1} tries)"
            stage_run_fail(
                stage_run=run,
                error=reason,
                log=log.text(run.log),
                attempt=attempt,
                ended=AttemptEnd.TRANSIENT,
                culprit=Culprit.INFRASTRUCTURE,
                failure_class=Culprit.INFRASTRUCTURE,
            )
            return StageOutcome(status="failed", reason=reason)
        requeued = stage_run_requeue(
            stage_run=run, reason=exc.reason, log=log.text(run.log), attempt=attempt
        )
        if not requeued:
            return StageOutcome(status="not-claimed", reason="reaped while running")
        return StageOutcome(status="retry", retry_after_s=exc.retry_after_s, reason=exc.reason)
    except SoftTimeLimitExceeded:
        reason = time_budget_error(run.stage, limit_s)
        stage_run_fail(
            stage_run=run,
            error=reason,
            log=log.text(run.log),
            attempt=attempt,
            ended=AttemptEnd.TIME_LIMIT,
            culprit=Culprit.INFRASTRUCTURE,
            failure_class=Culprit.INFRASTRUCTURE,
        )
        return StageOutcome(status="failed", reason=reason)
    except Exception as exc:  # a bug, the host out of memory, the network, an unstorable result
        logger.exception("Stage %s of job %s crashed", run.stage, run.job_id)
        verdict = classify_exception(stage=run.stage, exc=exc)
        log(f"{run.stage} crashed:\n{traceback.format_exc(limit=20)}")
        stage_run_fail(
            stage_run=run,
            error=verdict.error,
            log=log.text(run.log),
            attempt=attempt,
            culprit=Culprit.INFRASTRUCTURE,
            failure_class=verdict.failure_class,
        )
        return StageOutcome(status="failed", reason=verdict.error)
    return StageOutcome(status="succeeded")
