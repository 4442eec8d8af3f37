"""Readiness for the jobs that existed before it was kept, and the weekly summary event.

- Every job's `readiness`, `blocking_stage` and `ready_at` are computed from its stage runs,
  as `services.job_refresh_status` keeps them from now on. The rule is a frozen copy of
  `adaptation.readiness.readiness_from_runs` (a later change of that module must not change
  what this migration did) applied to the historical models, with the thresholds of
  `DAY0_READINESS` as configured now (the default below where the setting is missing).
- `NotificationDelivery.event` takes "report.weekly" (the managers' weekly summary).

Reversing leaves the columns as they are (their defaults say nothing more true).
"""

from django.conf import settings
from django.db import migrations, models

LEVELS = ("experimental", "functional", "complete")
DEFAULT_THRESHOLDS = {
    "experimental": ["fetch", "analyze", "plan"],
    "functional": ["operators", "precision"],
    "complete": ["performance", "stability", "release_notes"],
}
BATCH = 500


def readiness_of(stages, runs, thresholds):
    """(level, blocking stage, ready_at) of a job running `stages` from its attempts `runs`:
    a level needs its stages and those of the levels below succeeded in their latest attempt
    (stages the job does not run are not required); ready_at is when every required stage had
    first succeeded."""
    latest, first_success = {}, {}
    for run in runs:
        if run.stage not in latest or run.attempt > latest[run.stage].attempt:
            latest[run.stage] = run
        if run.status == "succeeded" and run.finished_at is not None:
            known = first_success.get(run.stage)
            if known is None or run.finished_at < known:
                first_success[run.stage] = run.finished_at
    required = [
        (
            level,
            [s for s in stages if s in thresholds.get(level, [])]
            + [s for s in thresholds.get(level, []) if s not in stages],
        )
        for level in LEVELS
    ]
    if not any(names for _, names in required):
        return "none", "", None
    reached, blocking = "none", ""
    for level, names in required:
        missing = [n for n in names if n not in latest or latest[n].status != "succeeded"]
        if missing:
            blocking = missing[0]
            break
        reached = level
    every = [name for _, names in required for name in names]
    ready_at = (
        max(first_success[name] for name in every)
        if all(name in first_success for name in every)
        else None
    )
    return reached, blocking, ready_at


def backfill(apps, schema_editor):
    AdaptationJob = apps.get_model("adaptation", "AdaptationJob")
    StageRun = apps.get_model("adaptation", "StageRun")
    configured = getattr(settings, "DAY0_READINESS", None) or DEFAULT_THRESHOLDS
    thresholds = {level: list(configured.get(level) or []) for level in LEVELS}
    ids = list(AdaptationJob.objects.order_by("pk").values_list("pk", flat=True))
    for start in range(0, len(ids), BATCH):
        chunk = ids[start : start + BATCH]
        runs = {}
        for run in StageRun.objects.filter(job_id__in=chunk).only(
            "job_id", "stage", "attempt", "status", "finished_at"
        ):
            runs.setdefault(run.job_id, []).append(run)
        jobs = list(AdaptationJob.objects.filter(pk__in=chunk).only("pk", "stages"))
        for job in jobs:
            job.readiness, job.blocking_stage, job.ready_at = readiness_of(
                list(job.stages or []), runs.get(job.pk, []), thresholds
            )
        AdaptationJob.objects.bulk_update(jobs, ["readiness", "blocking_stage", "ready_at"])


class Migration(migrations.Migration):
    dependencies = [
        ("adaptation", "0006_limitations_notes_readiness"),
    ]

    operations = [
        migrations.AlterField(
            model_name="notificationdelivery",
            name="event",
            field=models.CharField(
                choices=[
                    ("stage.failed", "Stage failed"),
                    ("job.succeeded", "Job succeeded"),
                    ("job.failed", "Job failed"),
                    ("report.weekly", "Weekly summary"),
                ],
                max_length=32,
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
    ]
