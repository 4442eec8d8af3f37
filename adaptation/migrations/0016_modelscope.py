"""Schema changes of the ModelScope hub kind: an allow-list entry says which kind of hub it is
(existing entries are Hugging Face hubs), and a watch's help texts name ModelScope's settings."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("adaptation", "0015_issue20_suites_stacks_regressions_counters")]

    operations = [
        migrations.AddField(
            model_name="allowedhubendpoint",
            name="hub_kind",
            field=models.CharField(
                choices=[("huggingface", "Hugging Face Hub"), ("modelscope", "ModelScope")],
                default="huggingface",
                help_text="Which kind of hub it is: only watches of that kind may use it, and "
                "only that kind's token (HF_TOKEN or MODELSCOPE_API_TOKEN) is sent to it.",
                max_length=32,
            ),
        ),
        migrations.AlterField(
            model_name="hubwatch",
            name="author",
            field=models.CharField(
                blank=True,
                help_text="Org or user (ModelScope: organization) to list.",
                max_length=128,
            ),
        ),
        migrations.AlterField(
            model_name="hubwatch",
            name="endpoint",
            field=models.CharField(
                blank=True,
                help_text="Hub URL (blank: HF_ENDPOINT or huggingface.co, MODELSCOPE_ENDPOINT "
                "or modelscope.cn; otherwise one of its kind on the Allowed hub endpoints list) "
                "or a mirror folder (inside DAY0_MIRROR_ROOTS).",
                max_length=512,
            ),
        ),
    ]
