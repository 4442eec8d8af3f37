"""Schema changes of the stack versions (helper C) work (none yet)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("adaptation", "0019_modelscope")]

    operations = []
