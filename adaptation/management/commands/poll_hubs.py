"""`python manage.py poll_hubs [--force]`: one polling round over the enabled watches now."""

from __future__ import annotations

import logging

from django.core.management.base import BaseCommand, CommandError

from adaptation.management.quiet_logs import loggers_quiet_below
from adaptation.services.hub_polling import hub_watches_poll
from engine import formatting as fmt

# Loggers that repeat, with the exception's class, the error the command prints for a failed
# watch (the sources' "cannot reach", the poller's "Polling ... failed", the Hugging Face
# client's retry warning). The worker keeps them; here they show at --verbosity 2 or more.
ROUND_LOGGERS = ("engine.hubs", "adaptation.services.hub_polling", "huggingface_hub")


class Command(BaseCommand):
    help = (
        "Poll every enabled hub watch once; new complete releases get a job. Watches backing "
        "off after a hub error (rate limit included) wait unless --force. A failed poll's "
        "error is printed once (-v 2 adds the log lines, with the exception); exits 1 if a "
        "poll failed."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--force", action="store_true", help="Ignore error backoff.")

    def handle(self, *args, force: bool = False, verbosity: int = 1, **options) -> None:
        if verbosity >= 2:
            outcomes = hub_watches_poll(due_only=False, force=force)
        else:
            with loggers_quiet_below(logging.ERROR, ROUND_LOGGERS):
                outcomes = hub_watches_poll(due_only=False, force=force)
        if not outcomes:
            self.stdout.write("No enabled hub watches.")
        failed = 0
        for outcome in outcomes:
            if outcome.skipped_until:
                self.stdout.write(
                    f"{outcome.watch}: backing off after an error until "
                    f"{outcome.skipped_until:%Y-%m-%d %H:%M:%S} UTC (use --force)"
                )
                continue
            if outcome.error:
                failed += 1
                self.stderr.write(f"{outcome.watch}: poll failed: {outcome.error}")
                continue
            self.stdout.write(
                f"{outcome.watch}: {fmt.counted(len(outcome.new_releases), 'new release')}"
            )
            for name in outcome.new_releases:
                self.stdout.write(f"  new {name}")
            for line in outcome.incomplete:
                self.stdout.write(f"  not complete yet: {line}")
        if failed:
            # The errors are printed above; this only sets the exit status (1).
            polled = sum(1 for outcome in outcomes if not outcome.skipped_until)
            raise CommandError(
                f"{failed} of {fmt.counted(polled, 'polled watch', 'polled watches')} failed."
            )
