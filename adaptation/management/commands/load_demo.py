"""`python manage.py load_demo`: a watch on the demo hub mirror shipped in `demo/hub/` and a
login for the board, so `make run` shows real releases on a machine with no network."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from adaptation.models import HubKind, HubWatch
from adaptation.services import pool_get

DEMO_USERNAME = "demo"
DEMO_PASSWORD = "day0-demo"


class Command(BaseCommand):
    help = "Create the demo hub watch (demo/hub mirror folder) and the demo login."

    def handle(self, *args, **options) -> None:
        watch, created = HubWatch.objects.update_or_create(
            name="demo-hub",
            defaults={
                "kind": HubKind.MIRROR,
                "endpoint": str(settings.DAY0_DEMO_HUB_DIR),
                "pool": pool_get(name="cpu"),
                "poll_interval_s": 60,
                "enabled": True,
            },
        )
        user_model = get_user_model()
        user, _ = user_model.objects.get_or_create(
            username=DEMO_USERNAME, defaults={"is_staff": True, "is_superuser": True}
        )
        user.set_password(DEMO_PASSWORD)
        user.save()
        verb = "Created" if created else "Updated"
        self.stdout.write(f"{verb} watch {watch.name!r} on {watch.endpoint}")
        self.stdout.write(f"Login: {DEMO_USERNAME} / {DEMO_PASSWORD}")
