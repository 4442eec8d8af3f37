"""Schema changes of the regressions (helper B) work (none yet)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("adaptation", "0016_metrics")]

    operations = []
