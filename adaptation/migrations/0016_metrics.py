"""Schema changes of the metrics (helper A) work (none yet)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("adaptation", "0015_issue20_suites_stacks_regressions_counters")]

    operations = []
