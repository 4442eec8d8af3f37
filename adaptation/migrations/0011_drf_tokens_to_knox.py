"""API tokens move from DRF's authtoken (keys stored in the clear) to django-rest-knox
(digests). Each DRF key is hashed the way knox hashes a presented key (`knox.crypto.hash_token`)
and stored as a knox token of the same user, so every existing key goes on working, unexpired;
then the clear keys are deleted from `authtoken_token`. A database that never had DRF's
table (a new install) has nothing to move. Not reversible: the keys are gone."""

from django.db import migrations


def drf_tokens_to_knox(apps, schema_editor):
    from datetime import UTC

    from django.utils import timezone
    from knox.crypto import hash_token
    from knox.settings import CONSTANTS

    connection = schema_editor.connection
    if "authtoken_token" not in connection.introspection.table_names():
        return
    AuthToken = apps.get_model("knox", "AuthToken")
    key_column = connection.ops.quote_name("key")  # a keyword in some SQL dialects
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {key_column}, user_id, created FROM authtoken_token")
        rows = cursor.fetchall()
    for key, user_id, created in rows:
        digest = hash_token(key)
        AuthToken.objects.update_or_create(
            digest=digest,
            defaults={
                "token_key": key[: CONSTANTS.TOKEN_KEY_LENGTH],
                "user_id": user_id,
                "expiry": None,
            },
        )
        # `created` is auto_now_add: set the DRF token's own date afterwards (SQLite's raw
        # rows hold naive UTC).
        if timezone.is_naive(created):
            created = timezone.make_aware(created, UTC)
        AuthToken.objects.filter(digest=digest).update(created=created)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM authtoken_token")


class Migration(migrations.Migration):
    dependencies = [
        ("adaptation", "0010_stage_run_failure_class"),
        ("knox", "0009_extend_authtoken_field"),
    ]

    operations = [migrations.RunPython(drf_tokens_to_knox, migrations.RunPython.noop)]
