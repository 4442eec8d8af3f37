"""The hub kind fields take their choices from the table of hub kinds
(`engine.hubs.kinds.HUB_KIND_SPECS`) through callables, so a new kind is a row there and no
migration; the help texts name the kinds' variables by example. Choices and help texts live
only in Python: no stored value changes, and no SQL runs."""

from django.db import migrations, models

import engine.hubs.kinds


class Migration(migrations.Migration):
    dependencies = [("adaptation", "0017_serve_full_size_points")]

    operations = [
        migrations.AlterField(
            model_name="allowedhubendpoint",
            name="hub_kind",
            field=models.CharField(
                choices=engine.hubs.kinds.allow_list_kind_choices,
                default="huggingface",
                help_text="Which kind of hub it is: only watches of that kind may use it, and "
                "only that kind's token (such as HF_TOKEN) is sent to it.",
                max_length=32,
            ),
        ),
        migrations.AlterField(
            model_name="hubwatch",
            name="endpoint",
            field=models.CharField(
                blank=True,
                help_text="Hub URL (blank: the hub its kind's variable configures, such as "
                "HF_ENDPOINT, else the kind's public hub; otherwise one of its kind on the "
                "Allowed hub endpoints list) or a mirror folder (inside DAY0_MIRROR_ROOTS).",
                max_length=512,
            ),
        ),
        migrations.AlterField(
            model_name="hubwatch",
            name="kind",
            field=models.CharField(choices=engine.hubs.kinds.hub_kind_choices, max_length=32),
        ),
        migrations.AlterField(
            model_name="modelrelease",
            name="hub_kind",
            field=models.CharField(choices=engine.hubs.kinds.hub_kind_choices, max_length=32),
        ),
    ]
