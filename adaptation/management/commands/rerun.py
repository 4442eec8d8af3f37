"""`python manage.py rerun JOB STAGE`: run a stage again, and the stages after it."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from adaptation.models import AdaptationJob
from adaptation.services.errors import ServiceError
from adaptation.services.jobs import job_rerun_stage


class Command(BaseCommand):
    help = "Re-run STAGE of JOB and every later stage; earlier attempts are kept."

    def add_arguments(self, parser) -> None:
        parser.add_argument("job", type=int)
        parser.add_argument("stage")

    def handle(self, *args, job: int, stage: str, **options) -> None:
        try:
            row = AdaptationJob.objects.get(pk=job)
        except AdaptationJob.DoesNotExist:
            raise CommandError(f"No job {job}.") from None
        try:
            run = job_rerun_stage(job=row, stage=stage)
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"Queued {run.stage} attempt {run.attempt} of job {job} on {row.pool.queue}."
        )
