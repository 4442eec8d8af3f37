"""`python manage.py poll_hubs [--force]`: one polling round over the enabled watches now."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from adaptation.services.hub_polling import hub_watches_poll
from engine import formatting as fmt


class Command(BaseCommand):
    help = (
        "Poll every enabled hub watch once; new complete releases get a job. Watches backing "
        "off after a hub error (rate limit included) wait unless --force. Exits 1 if a poll failed."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--force", action="store_true", help="Ignore error backoff.")

    def handle(self, *args, force: bool = False, **options) -> None:
        outcomes = hub_watches_poll(due_only=False, force=force)
        if not outcomes:
            self.stdout.write("No enabled hub watches.")
        failed = []
        for outcome in outcomes:
            if outcome.skipped_until:
                self.stdout.write(
                    f"{outcome.watch}: backing off after an error until "
                    f"{outcome.skipped_until:%Y-%m-%d %H:%M:%S} UTC (use --force)"
                )
                continue
            if outcome.error:
                failed.append(f"{outcome.watch}: {outcome.error}")
                continue
            self.stdout.write(
                f"{outcome.watch}: {fmt.counted(len(outcome.new_releases), 'new release')}"
            )
            for name in outcome.new_releases:
                self.stdout.write(f"  new {name}")
            for line in outcome.incomplete:
                self.stdout.write(f"  not complete yet: {line}")
        if failed:
            raise CommandError("; ".join(failed))
