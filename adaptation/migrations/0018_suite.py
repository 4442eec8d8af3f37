"""Schema changes of the standard suite (helper C) work (none yet)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("adaptation", "0017_regressions")]

    operations = []
