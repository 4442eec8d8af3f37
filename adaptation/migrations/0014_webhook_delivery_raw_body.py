"""`WebhookDelivery.body` holds the raw body as bytes (a binary column), so a delivery is
stored whatever its bytes: PostgreSQL text columns refuse NUL characters, and invalid UTF-8
was replaced before.

The column is not converted in place (PostgreSQL's text-to-bytea cast reads backslashes as
escapes, and JSON bodies are full of them): a binary column is added, the stored text copied
into it as UTF-8, the text column dropped and the new one renamed. Reversing copies the bytes
back as text (invalid UTF-8 replaced, NUL as the six characters \\u0000).
"""

from django.db import migrations, models

BATCH = 500


def text_to_bytes(apps, schema_editor):
    Delivery = apps.get_model("adaptation", "WebhookDelivery")
    rows = Delivery.objects.exclude(body="").only("pk", "body")
    changed = []
    for row in rows.iterator(chunk_size=BATCH):
        row.body_bytes = row.body.encode("utf-8", errors="backslashreplace")
        changed.append(row)
        if len(changed) >= BATCH:
            Delivery.objects.bulk_update(changed, ["body_bytes"])
            changed = []
    if changed:
        Delivery.objects.bulk_update(changed, ["body_bytes"])


def bytes_to_text(apps, schema_editor):
    Delivery = apps.get_model("adaptation", "WebhookDelivery")
    changed = []
    for row in Delivery.objects.only("pk", "body_bytes").iterator(chunk_size=BATCH):
        raw = bytes(row.body_bytes or b"")
        if not raw:
            continue
        row.body = raw.decode("utf-8", errors="replace").replace("\x00", "\\u0000")
        changed.append(row)
        if len(changed) >= BATCH:
            Delivery.objects.bulk_update(changed, ["body"])
            changed = []
    if changed:
        Delivery.objects.bulk_update(changed, ["body"])


class Migration(migrations.Migration):
    dependencies = [
        ("adaptation", "0013_limitation_status_changes"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookdelivery",
            name="body_bytes",
            field=models.BinaryField(blank=True, default=b""),
        ),
        migrations.RunPython(text_to_bytes, bytes_to_text),
        migrations.RemoveField(model_name="webhookdelivery", name="body"),
        migrations.RenameField(
            model_name="webhookdelivery", old_name="body_bytes", new_name="body"
        ),
    ]
