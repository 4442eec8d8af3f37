"""The serve stage's full-size points: a serving sweep's output tokens, the TP the engine ran at
and how it got its weights ("dummy": random weights from the config alone), so the rows of the
engine serving the full-size model tell themselves apart from the twin's and from the plan's
predictions."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("adaptation", "0016_modelscope"),
    ]

    operations = [
        migrations.AddField(
            model_name="performancepoint",
            name="load_format",
            field=models.CharField(
                blank=True,
                help_text='How the engine got its weights: "dummy" (random, from the config alone: '
                "speed and memory at full size, nothing of precision); blank: the checkpoint's.",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="performancepoint",
            name="output_len",
            field=models.PositiveIntegerField(
                blank=True, help_text="Output tokens of each request of a serving sweep.", null=True
            ),
        ),
        migrations.AddField(
            model_name="performancepoint",
            name="tp_size",
            field=models.PositiveIntegerField(
                blank=True, help_text="Tensor-parallel size the serving engine ran at.", null=True
            ),
        ),
        migrations.AlterField(
            model_name="performancepoint",
            name="model",
            field=models.CharField(
                help_text='"twin", "full-size" (predicted, or measured on an engine with dummy '
                'weights) or "release" (its real weights, measured).',
                max_length=16,
            ),
        ),
    ]
