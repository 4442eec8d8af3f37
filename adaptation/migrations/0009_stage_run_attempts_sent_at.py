"""A stage run's attempts and when its message was sent.

- `StageRun.attempts`: one entry per time a worker ran the row (a lost attempt is retried on the
  same row, docs/operations.md#lost-work-and-retries); rows from before start with none.
- `StageRun.sent_at`: when the run's message was last handed to the broker (empty: not sent).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('adaptation', '0008_pool_engine_serve_points'),
    ]

    operations = [
        migrations.AddField(
            model_name='stagerun',
            name='attempts',
            field=models.JSONField(blank=True, default=list, help_text='One entry per time a worker ran this row (a lost or transient one is retried on the same row), oldest first: {"n", "worker_host", "pid", "started_at", "ended_at", "ended" (succeeded, failed, worker-lost, time-limit, transient, cancelled; null while it runs), "reason", "culprit" (infrastructure, release or null), "oom_kills_at_start"}.'),
        ),
        migrations.AddField(
            model_name='stagerun',
            name='sent_at',
            field=models.DateTimeField(blank=True, help_text="When the run's message was last handed to the broker; empty: not sent (or sending failed).", null=True),
        ),
    ]
