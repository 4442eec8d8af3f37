"""Schema changes of the ModelScope hub kind (helper D) work (none yet)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("adaptation", "0018_suite")]

    operations = []
