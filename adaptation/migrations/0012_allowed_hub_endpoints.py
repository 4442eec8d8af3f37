"""The admin-managed allow-list of Hugging Face hubs (`AllowedHubEndpoint`) that watches may
poll besides `HF_ENDPOINT`, and the watch endpoint's help text naming it and the mirror roots.

Existing watches are not changed: one on an endpoint the rules now refuse is refused at its
next poll, with the reason on the watch. Reversing drops the table.
"""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('adaptation', '0011_drf_tokens_to_knox'),
    ]

    operations = [
        migrations.CreateModel(
            name='AllowedHubEndpoint',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('url', models.CharField(help_text="The hub's base URL, http(s) with a host, without credentials, query or fragment, e.g. https://hub.example.com.", max_length=512, unique=True)),
                ('allow_private_network', models.BooleanField(default=False, help_text="Allow it even when it resolves to a private or loopback address (an admin's decision: the worker and its HF_TOKEN then reach the internal network).")),
                ('note', models.CharField(blank=True, help_text='What this hub is.', max_length=256)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                'verbose_name': 'allowed hub endpoint',
                'ordering': ['url'],
            },
        ),
        migrations.AlterField(
            model_name='hubwatch',
            name='endpoint',
            field=models.CharField(blank=True, help_text='Hub URL (blank: HF_ENDPOINT or huggingface.co; otherwise one on the Allowed hub endpoints list) or a mirror folder (inside DAY0_MIRROR_ROOTS).', max_length=512),
        ),
    ]
