"""`python manage.py readiness_refresh`: recompute every job's stored readiness level,
blocking stage and Day-0 time under the current `DAY0_READINESS` (run it after changing the
setting; jobs otherwise take the new thresholds at their next stage transition)."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from adaptation.services.jobs import jobs_readiness_refresh
from engine import formatting as fmt


class Command(BaseCommand):
    help = "Recompute every job's readiness, blocking stage and Day-0 time from its stages."

    def handle(self, *args, **options) -> None:
        changed = jobs_readiness_refresh()
        self.stdout.write(f"Readiness recomputed: {fmt.counted(changed, 'job')} changed.")
