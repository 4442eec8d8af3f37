"""`python manage.py adapt PATH_OR_REPO_ID [--pool cpu] [--context N] [--concurrency N]
[--dtype D] [--options JSON] [--allow-duplicate] [--wait] [--format json]`.

Creates a manual release and an adaptation job; --context/--concurrency/--dtype are the plan
stage's options (`job.options["plan"]`, checked as `manage.py plan` checks them). --options
gives any stage's options as one JSON object keyed by stage name, e.g.
'{"stability": {"duration_s": 5}, "performance": {"max_batch_size": 8}}'; its "plan" entry is
merged with --context/--concurrency/--dtype (an option given both ways is refused). Every
stage's options are checked by the stage's `check_options` before anything is fetched; bad
input exits non-zero with a one-line reason. With --wait, follows the stages in the terminal
and exits 0 when every stage succeeds, 1 when one fails, 2 on timeout, 3 when the job is
cancelled. When the broker cannot be reached the job is still saved and its first stage queued:
the command says so in one line and, without --wait, exits 75 (EX_TEMPFAIL: try later; the
reaper sends the stage when the broker is back). While a job for the release on the pool is
pending or running, no job is made: the command names it and exits 4, unless
--allow-duplicate asks for another.
"""

from __future__ import annotations

import json
import sys
import time

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from adaptation.job_options import (
    EXAMPLE_OPTIONS,
    job_options_from_args,
    plan_options_from_args,
)
from adaptation.management.arguments import number_of
from adaptation.management.commands.plan import add_plan_option_arguments
from adaptation.models import (
    ACTIVE_STAGE_STATUSES,
    AdaptationJob,
    JobStatus,
    StageStatus,
    Trigger,
)
from adaptation.selectors.jobs import job_current_stage_runs, job_summary
from adaptation.services.errors import ServiceError
from adaptation.services.jobs import DuplicateJobError
from adaptation.services.pools import pool_get
from adaptation.services.queueing import unsent_stage_runs
from adaptation.services.releases import release_from_candidate
from adaptation.targets import TargetError, resolve_target
from engine import formatting as fmt

POLL_EVERY_S = 0.5
# --wait warns once when a stage run has sat queued this long (no worker took it).
QUEUE_WARN_S = 15.0

# Saved and queued, not yet sent: the broker is down (sysexits.h EX_TEMPFAIL).
EXIT_NOT_SENT = 75
# Refused: a job for the release on the pool has not ended (--allow-duplicate starts another).
EXIT_DUPLICATE = 4


def _queued_for_s(run) -> float | None:
    """Seconds `run` has sat queued since its `queued_at`; None when it is not queued (a
    worker took it, or it ended) or has no `queued_at`."""
    if run.status != StageStatus.QUEUED or run.queued_at is None:
        return None
    return (timezone.now() - run.queued_at).total_seconds()


class Command(BaseCommand):
    help = "Adapt one release (a mirror-style folder or a Hub repo id) on a pool."

    def add_arguments(self, parser) -> None:
        parser.add_argument("target", help="A release folder (or its config.json), or org/name.")
        parser.add_argument("--pool", default=None, help="Pool name (default: DAY0_DEFAULT_POOL).")
        parser.add_argument("--wait", action="store_true", help="Follow the job until it ends.")
        parser.add_argument(
            "--timeout",
            type=number_of("seconds", minimum=0, inclusive=False, whole=False),
            default=3600.0,
            help="Seconds --wait follows the job before giving up (default 3600).",
        )
        add_plan_option_arguments(parser)
        parser.add_argument(
            "--options",
            dest="stage_options",
            default=None,
            metavar="JSON",
            help=f"Per-stage options as a JSON object, e.g. '{EXAMPLE_OPTIONS}'.",
        )
        parser.add_argument(
            "--allow-duplicate",
            action="store_true",
            help="Start the job even while one for the release on the pool is pending or running.",
        )
        parser.add_argument("--format", choices=["text", "json"], default="text")

    def handle(self, *args, target: str, pool: str | None, wait: bool, timeout: float,
               format: str, context: str | None, concurrency: str | None, dtype: str | None,
               stage_options: str | None, allow_duplicate: bool,
               **options) -> None:  # fmt: skip
        plan = plan_options_from_args(context, concurrency, dtype)
        job_options = job_options_from_args(stage_options, plan)
        try:
            resolved = resolve_target(target)
            pool_row = pool_get(name=pool)
            job = release_from_candidate(
                candidate=resolved.candidate,
                hub_kind=resolved.spec.kind,
                hub_endpoint=resolved.endpoint,
                found_by=Trigger.MANUAL,
                pool=pool_row,
                adapt_known=True,
                options=job_options or None,
                allow_duplicate=allow_duplicate,
            )
        except DuplicateJobError as exc:
            raise CommandError(
                f"{exc} Pass --allow-duplicate to start another anyway.",
                returncode=EXIT_DUPLICATE,
            ) from exc
        except (TargetError, ServiceError) as exc:
            raise CommandError(str(exc)) from exc
        release = job.release
        text = format == "text"
        unsent = unsent_stage_runs(job)
        if unsent:
            self.stderr.write(
                f"Job {job.pk} is saved and its {unsent[0].stage} stage queued, but the broker "
                "cannot be reached: the stage is sent when it is back."
            )
        if text:
            self.stdout.write(
                f"Job {job.pk}: {release.repo_id}@{release.revision[:12]} on pool {pool_row.name} "
                f"(queue {pool_row.queue})"
            )
        if not wait:
            if not text:
                self.stdout.write(json.dumps(job_summary(job), indent=2))
            if unsent:
                sys.exit(EXIT_NOT_SENT)
            return
        job = self._follow(job, timeout=timeout, echo=text)
        if not text:
            self.stdout.write(json.dumps(job_summary(job), indent=2))
        if job.status == JobStatus.FAILED:
            sys.exit(1)
        if job.status == JobStatus.CANCELLED:
            self.stderr.write(f"Job {job.pk} was cancelled.")
            sys.exit(3)
        if job.status != JobStatus.SUCCEEDED:
            states = ", ".join(f"{r.stage} {r.status}" for r in job_current_stage_runs(job))
            hint = ""
            if any(r.status == "queued" for r in job_current_stage_runs(job)):
                hint = f"; no worker took it: is one listening on {job.pool.queue}?"
            self.stderr.write(f"Timed out after {timeout:g} s; job {job.pk}: {states}{hint}")
            sys.exit(2)

    def _follow(self, job: AdaptationJob, *, timeout: float, echo: bool) -> AdaptationJob:
        """Print each stage's status changes until the job ends (and the stages that run after
        a failure, its release notes, have run) or `timeout` passes."""
        deadline = time.monotonic() + timeout
        seen: dict[str, str] = {}
        warned_queue = False
        while True:
            job.refresh_from_db()
            runs = job_current_stage_runs(job)
            for run in runs:
                key = f"{run.stage}#{run.attempt}"
                if seen.get(key) != run.status:
                    seen[key] = run.status
                    if echo:
                        self.stdout.write(self._line(run))
                waited = _queued_for_s(run)
                if echo and not warned_queue and waited is not None and waited > QUEUE_WARN_S:
                    warned_queue = True
                    self.stdout.write(
                        f"  {run.stage} still queued after {waited:.0f} s: is a worker listening "
                        f"on {job.pool.queue}? (`make run` starts one)"
                    )
            ended = job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)
            if ended and not any(run.status in ACTIVE_STAGE_STATUSES for run in runs):
                if echo:
                    self.stdout.write(f"Job {job.pk} {job.status}.")
                return job
            if time.monotonic() > deadline:
                return job
            time.sleep(POLL_EVERY_S)

    @staticmethod
    def _line(run) -> str:
        line = f"  {run.stage:<12} {run.status}"
        if run.attempt > 1:
            line += f" (attempt {run.attempt})"
        if run.duration is not None and run.status in ("succeeded", "failed"):
            line += f" in {fmt.duration(run.duration)}"
        if run.worker_host:
            line += f" on {run.worker_host}"
        if run.error:
            line += f": {run.error.splitlines()[0]}"
        elif isinstance(run.result, dict) and run.result.get("validated") is False:
            # A stage that succeeded without validating anything says why (`distributed`).
            line += f": not validated: {str(run.result.get('reason') or '').splitlines()[0]}"
        return line
