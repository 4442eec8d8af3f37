"""The Celery request of the `day0.run_stage` task (`Task.Request`), which lives in the
worker's main process: where the worker learns that the pool child running a stage died.

A child SIGKILLed (by an operator, by the kernel's OOM killer) or killed at the hard time limit
cannot record anything itself. Celery's main process sees it as `WorkerLostError` ("Worker
exited prematurely: signal 9 (SIGKILL) Job: 5.") or `TimeLimitExceeded` and calls the
request's `on_failure`; `StageRequest.on_failure` records it on the stage run first, through
the services, then lets Celery do what it does (reject the message back to the queue:
`reject_on_worker_lost`; the claim's takeover rules make that copy harmless):

- a lost child: the attempt ends "worker-lost", "killed by signal 9 (SIGKILL)", or "out of
  memory (cgroup limit): ..." when the cgroup's OOM-kill count grew since the attempt started
  (`workers.cgroup`); the run is queued again at once with a new message, or failed once
  `DAY0_STAGE_MAX_ATTEMPTS` attempts were lost (`stage_run_lost`);
- the hard time limit: the attempt ends "time-limit" and the stage fails (running it again
  would hit the limit again).

Only the attempt of that very child (worker node name and pid) is touched, and a problem here
is logged, never raised: Celery's own handling must go on.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from billiard.common import human_status
from billiard.einfo import ExceptionWithTraceback
from celery.exceptions import TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request
from django.db import connection

from adaptation.models import AttemptEnd, Culprit, StageRun
from adaptation.services.stage_runs import (
    attempt_current,
    attempt_number,
    stage_run_fail,
    stage_run_lost,
    stage_run_lost_reason,
)
from workers.cgroup import oom_kill_count

logger = logging.getLogger(__name__)

_SIGNAL = re.compile(r"signal (\d+) \((SIG\w+)\)")
_EXIT_CODE = re.compile(r"exitcode (-?\d+)")


def lost_child_reason(
    message: str, *, oom_kills_at_start: int | None, oom_kills_now: int | None
) -> str:
    """Why a pool child died, from Celery's `WorkerLostError` message and the cgroup's
    OOM-kill count when its attempt started and now: "killed by signal 9 (SIGKILL)" (or "its
    process exited with code 1"), prefixed "out of memory (cgroup limit): " with the counts
    when the count grew meanwhile."""
    signal = _SIGNAL.search(message)
    code = _EXIT_CODE.search(message)
    if signal:
        how = f"killed by signal {signal.group(1)} ({signal.group(2)})"
    elif code:
        how = f"its process exited with code {code.group(1)}"
    else:
        how = message.strip() or "its process was lost"
    grew = (
        oom_kills_at_start is not None
        and oom_kills_now is not None
        and oom_kills_now > oom_kills_at_start
    )
    if grew:
        return (
            f"out of memory (cgroup limit): {how}; the cgroup's oom_kill count went from "
            f"{oom_kills_at_start} to {oom_kills_now}"
        )
    return how


class StageRequest(Request):
    """`Request` of `day0.run_stage`: records a killed child's attempt before Celery handles
    the failure (module docstring)."""

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False):
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        try:
            if isinstance(exc, WorkerLostError):
                self.record_lost_child(str(exc))
            elif isinstance(exc, SystemExit) and not (
                self._already_cancelled or self._already_revoked
            ):
                # Billiard may report the child's exit before it is gone: a lost child too.
                self.record_lost_child(f"Worker exited prematurely: {human_status(exc.code or 0)}.")
            elif isinstance(exc, TimeLimitExceeded):
                self.record_time_limit(exc.args[0] if exc.args else self.time_limits[0])
        except Exception:
            logger.exception("Could not record how task %s[%s] ended", self.name, self.id)
        finally:
            if not connection.in_atomic_block:
                connection.close()  # the main process keeps no database connection
        return super().on_failure(
            exc_info, send_failed_event=send_failed_event, return_ok=return_ok
        )

    def _stage_run(self) -> tuple[StageRun, dict[str, Any]] | None:
        """The stage run of this request and its current attempt, when that attempt is the
        one this request's child runs (this worker node, the child's pid) and still open."""
        try:
            stage_run_id = int(self.args[0])
        except (IndexError, TypeError, ValueError):
            return None
        run = StageRun.objects.select_related("job").filter(pk=stage_run_id).first()
        current = attempt_current(run) if run is not None else None
        if (
            current is None
            or current.get("ended")
            or self.worker_pid is None
            or current.get("pid") != self.worker_pid
            or current.get("worker_host") != self.hostname
        ):
            return None
        return run, current

    def record_lost_child(self, message: str) -> str:
        """The child running this request's stage died (`message`: Celery's): its attempt
        ends "worker-lost" and the run is queued again or failed (`stage_run_lost`). Returns
        what was done: "requeued", "failed" or "" (not this child's attempt)."""
        found = self._stage_run()
        if found is None:
            self._correct_taken_over(message)
            return ""
        run, current = found
        reason = lost_child_reason(
            message,
            oom_kills_at_start=current.get("oom_kills_at_start"),
            oom_kills_now=oom_kill_count(),
        )
        outcome = stage_run_lost(
            stage_run_id=run.pk, reason=reason, worker_host=self.hostname, pid=self.worker_pid
        )
        logger.warning(
            "Stage run %s (%s): the pool child %s was lost, %s: %s",
            run.pk,
            run.stage,
            self.worker_pid,
            outcome or "nothing to record",
            reason,
        )
        return outcome

    def _correct_taken_over(self, message: str) -> None:
        """A neighbouring pool process may have taken the run over (the child's pid was gone)
        before this main process saw the child die: give that attempt the signal as its
        reason (`stage_run_lost_reason`)."""
        try:
            stage_run_id = int(self.args[0])
        except (IndexError, TypeError, ValueError):
            return
        run = StageRun.objects.filter(pk=stage_run_id).only("attempts").first()
        if self.worker_pid is None or run is None:
            return
        entry = next(
            (a for a in run.attempts or [] if a.get("pid") == self.worker_pid),
            {},
        )
        reason = lost_child_reason(
            message,
            oom_kills_at_start=entry.get("oom_kills_at_start"),
            oom_kills_now=oom_kill_count(),
        )
        if stage_run_lost_reason(
            stage_run_id=stage_run_id, worker_host=self.hostname, pid=self.worker_pid, reason=reason
        ):
            logger.warning("Stage run %s: a lost attempt's reason is now %s", stage_run_id, reason)

    def record_time_limit(self, limit_s: float | None) -> bool:
        """The child running this request's stage was killed at the hard time limit: its
        attempt ends "time-limit" (culprit: the infrastructure) and the stage fails."""
        found = self._stage_run()
        if found is None:
            return False
        run, _ = found
        limit = f" of {limit_s:g} s" if isinstance(limit_s, int | float) else ""
        return stage_run_fail(
            stage_run=run,
            error=f"{run.stage} ran past its hard time limit{limit} and was killed.",
            log=run.log,
            attempt=attempt_number(run),
            ended=AttemptEnd.TIME_LIMIT,
            culprit=Culprit.INFRASTRUCTURE,
        )
