"""`python manage.py load_demo`: a watch on the demo hub mirror shipped in `demo/hub/` and a
login for the board, so `make run` shows real releases on a machine with no network."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from adaptation.services.hub_polling import demo_hub_install

DEMO_USERNAME = "demo"
DEMO_PASSWORD = "day0-demo"


class Command(BaseCommand):
    help = "Create the demo hub watch (demo/hub mirror folder) and the demo login."

    def handle(self, *args, **options) -> None:
        watch = demo_hub_install(
            hub_dir=str(settings.DAY0_DEMO_HUB_DIR), username=DEMO_USERNAME, password=DEMO_PASSWORD
        )
        self.stdout.write(f"Watch {watch.name!r} on {watch.endpoint}")
        self.stdout.write(f"Login: {DEMO_USERNAME} / {DEMO_PASSWORD} (unless changed since)")
