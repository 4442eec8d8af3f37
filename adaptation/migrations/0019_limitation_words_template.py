"""A known limitation a stage raised names the template that words it and keeps the data
those words need, so its words are rendered whenever it is shown (`adaptation.limitation_words`).
Rows stored before keep no template and show their stored title and body, as people's notes
do."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("adaptation", "0018_hub_kind_choices_from_table"),
    ]

    operations = [
        migrations.AddField(
            model_name="knownlimitation",
            name="template",
            field=models.CharField(
                blank=True,
                help_text="For notes a stage raised: the template that words it "
                "(templates/limitations/<name>.md), rendered whenever the note is shown.",
                max_length=200,
            ),
        ),
        migrations.AddField(
            model_name="knownlimitation",
            name="template_data",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="The figures and names the template's words need.",
            ),
        ),
    ]
