"""The local `cpu` pool exists from the start: every worker host has a CPU."""

from django.db import migrations


def create_cpu_pool(apps, schema_editor):
    AcceleratorPool = apps.get_model("adaptation", "AcceleratorPool")
    AcceleratorPool.objects.get_or_create(
        name="cpu",
        defaults={
            "backend": "cpu",
            "queue": "pool.cpu",
            "description": "The CPUs of the host running the pool.cpu worker.",
        },
    )


class Migration(migrations.Migration):
    dependencies = [("adaptation", "0001_initial")]
    operations = [migrations.RunPython(create_cpu_pool, migrations.RunPython.noop)]
