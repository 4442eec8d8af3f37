"""The pools' serving engine and the serve stage's points.

- `AcceleratorPool.engine` (the serve stage's engine, docs/stages/serve.md) and
  `engine_allow_private_network`; the `cpu` pool migration 0002 made gets the CPU build of
  vLLM when it names no engine yet (a frozen copy of the value below: a later change of the
  default must not change what this migration did).
- `PerformancePoint.engine`, `engine_version` and `concurrency` for the serving engine's load
  sweep; `model`'s help text names "release" (the real weights, as the performance stage
  stores them).

Reversing leaves the cpu pool's engine as it is (the column goes with the field).
"""

from django.db import migrations, models

CPU_POOL_ENGINE = {"kind": "vllm", "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "memory_fraction": 0.1}


def cpu_pool_engine(apps, schema_editor):
    AcceleratorPool = apps.get_model("adaptation", "AcceleratorPool")
    pool = AcceleratorPool.objects.filter(name="cpu").first()
    if pool is not None and not pool.engine:
        pool.engine = CPU_POOL_ENGINE
        pool.save(update_fields=["engine"])


class Migration(migrations.Migration):

    dependencies = [
        ('adaptation', '0007_backfill_readiness'),
    ]

    operations = [
        migrations.AddField(
            model_name='acceleratorpool',
            name='engine',
            field=models.JSONField(blank=True, default=dict, help_text='The serving engine the serve stage launches or attaches to: {"kind": "vllm", "env": {...}, "flags": [...], "memory_fraction": 0.1}, or {"kind": "openai", "base_url": ..., "api_key_env": ..., "model": ...}; {}: none, the stage does not run (docs/stages/serve.md).'),
        ),
        migrations.AddField(
            model_name='acceleratorpool',
            name='engine_allow_private_network',
            field=models.BooleanField(default=False, help_text="Let an openai engine's base_url resolve to a private or loopback address (an admin's decision: it lets the worker reach the internal network)."),
        ),
        migrations.AddField(
            model_name='performancepoint',
            name='concurrency',
            field=models.PositiveIntegerField(blank=True, help_text="Concurrent requests of a serving engine's sweep level.", null=True),
        ),
        migrations.AddField(
            model_name='performancepoint',
            name='engine',
            field=models.CharField(blank=True, help_text='The serving engine that measured it ("vllm"); blank: in process.', max_length=32),
        ),
        migrations.AddField(
            model_name='performancepoint',
            name='engine_version',
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AlterField(
            model_name='performancepoint',
            name='model',
            field=models.CharField(help_text='"twin", "full-size" (predicted) or "release" (its real weights, measured).', max_length=16),
        ),
        migrations.RunPython(cpu_pool_engine, migrations.RunPython.noop),
    ]
