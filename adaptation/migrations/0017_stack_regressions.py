"""Schema changes of the stack versions and regressions (helper B) work (none yet)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("adaptation", "0016_metrics")]

    operations = []
