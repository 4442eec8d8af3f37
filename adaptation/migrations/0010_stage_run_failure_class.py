"""Whose fault a failed stage run is: `StageRun.failure_class` ("infrastructure", "release", or
blank for a run that did not fail).

The failed runs from before are classified from what they kept, with a frozen copy of the rule
(a later change of `adaptation.services.failure_classes` must not change what this did):
infrastructure when their last attempt's culprit or their result's `failure.culprit` says so,
or their error is a time limit, lost attempts, a transient error given up, the host out of
memory or a crash's traceback (a day0 error); release otherwise.

Reversing drops the column.
"""

from django.db import migrations, models

BATCH = 500
INFRA_MARKS = (
    "SoftTimeLimitExceeded",
    "TimeLimitExceeded",
    "ran past its",
    "Lost on ",
    "gave up after",
    "MemoryError",
    "OutOfMemoryError",
    "Traceback (most recent call last)",
)


def failure_class_of(run):
    attempts = run.attempts or []
    if attempts and isinstance(attempts[-1], dict):
        culprit = attempts[-1].get("culprit")
        if culprit in ("infrastructure", "release"):
            return culprit
    failure = run.result.get("failure") if isinstance(run.result, dict) else None
    if isinstance(failure, dict) and failure.get("culprit") in ("infrastructure", "release"):
        return failure["culprit"]
    error = run.error or ""
    errors = run.result.get("errors") if isinstance(run.result, dict) else None
    texts = [error] + [str(e.get("error") or "") for e in errors or [] if isinstance(e, dict)]
    if any(mark in text for text in texts for mark in INFRA_MARKS):
        return "infrastructure"
    return "release"


def classify(apps, schema_editor):
    StageRun = apps.get_model("adaptation", "StageRun")
    failed = StageRun.objects.filter(status="failed").only("pk", "attempts", "result", "error")
    changed = []
    for run in failed.iterator(chunk_size=BATCH):
        run.failure_class = failure_class_of(run)
        changed.append(run)
        if len(changed) >= BATCH:
            StageRun.objects.bulk_update(changed, ["failure_class"])
            changed = []
    if changed:
        StageRun.objects.bulk_update(changed, ["failure_class"])


class Migration(migrations.Migration):

    dependencies = [
        ("adaptation", "0009_stage_run_attempts_sent_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="stagerun",
            name="failure_class",
            field=models.CharField(
                blank=True,
                choices=[("infrastructure", "Infrastructure"), ("release", "Release")],
                default="",
                help_text="Whose fault a failed run is: infrastructure (time limit, lost worker, "
                "host out of memory, broker/hub/network unavailable, engine did not start for "
                "a host reason, a day0 error) or release (config, unsupported feature, "
                "precision, no fit, engine refuses the architecture); blank unless failed.",
                max_length=16,
            ),
        ),
        migrations.RunPython(classify, migrations.RunPython.noop),
    ]
