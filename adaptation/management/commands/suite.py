"""`python manage.py suite run --pool P [--suite standard] [--stages S ...] [--format json]`
and `python manage.py suite list`.

`run` starts a run of a suite on a pool (`services.suites.suite_start`, trigger manual): one
job per reference release, queued on the pool's queue, linked to the previous run of the
suite on that pool; it prints the run and its jobs and the matrix page's address (under
`DAY0_PUBLIC_URL`). `--stages`
restricts the jobs to those stages. A refusal (unknown suite, pool or stage, a disabled pool,
a suite folder that cannot be read) exits 1 with a one-line reason. When the broker cannot be
reached the run and its jobs are still saved and their first stages queued: the command says
so in one line and exits 75 (EX_TEMPFAIL; the reaper sends them when the broker is back).
The app's INFO log lines (the service's "Suite standard run 2 on cpu ...", which the
command's own output says already) are shown only with `-v 2` (`suite -v 2 run ...`);
warnings always.

`list` prints each suite of the checkout with its entries under a header line: name, family
shapes in the pages' words, folder; `--format json` gives the same with the shapes' slugs.
"""

from __future__ import annotations

import json
import logging
import sys
from contextlib import nullcontext

from django.core.management.base import BaseCommand, CommandError
from django.urls import reverse

from adaptation.management.quiet_logs import loggers_quiet_below
from adaptation.models import SuiteTrigger
from adaptation.page_links import page_url
from adaptation.services.errors import ServiceError
from adaptation.services.pools import pool_get
from adaptation.services.queueing import unsent_stage_runs
from adaptation.services.suites import suite_definition, suite_start
from adaptation.template_text import template_text
from engine.suites import STANDARD_SUITE, suite_names

# Saved and queued, not yet sent: the broker is down (sysexits.h EX_TEMPFAIL), as `adapt`.
EXIT_NOT_SENT = 75


class Command(BaseCommand):
    help = "Run a suite of reference releases on a pool (`run`), or list the suites (`list`)."

    def add_arguments(self, parser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{run,list}")
        run = actions.add_parser("run", help="Start a run of a suite on a pool.")
        run.add_argument("--pool", default=None, help="Pool name (default: DAY0_DEFAULT_POOL).")
        run.add_argument("--suite", default=STANDARD_SUITE, help="Suite name (default: standard).")
        run.add_argument(
            "--stages",
            nargs="+",
            default=None,
            metavar="STAGE",
            help="Run only these stages (default: every stage), e.g. --stages fetch analyze.",
        )
        run.add_argument("--format", choices=["text", "json"], default="text")
        listing = actions.add_parser("list", help="List the suites and their entries.")
        listing.add_argument("--format", choices=["text", "json"], default="text")

    def handle(self, *args, action: str, **options) -> None:
        if action == "list":
            self._list(text=options["format"] == "text")
            return
        # The service's INFO line repeats on stderr what the command prints on stdout.
        with (
            nullcontext()
            if options["verbosity"] >= 2
            else loggers_quiet_below(logging.WARNING, ("adaptation",))
        ):
            self._run(
                pool=options["pool"],
                suite=options["suite"],
                stages=options["stages"],
                text=options["format"] == "text",
            )

    def _run(self, *, pool: str | None, suite: str, stages: list[str] | None, text: bool) -> None:
        try:
            pool_row = pool_get(name=pool)
            run = suite_start(
                pool=pool_row, trigger=SuiteTrigger.MANUAL, suite=suite, stages=stages
            )
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        jobs = list(run.jobs.select_related("release").order_by("pk"))
        unsent = [job for job in jobs if unsent_stage_runs(job)]
        if unsent:
            self.stderr.write(
                f"Suite run {run.pk} is saved and the first stages of {len(unsent)} of its jobs "
                "queued, but the broker cannot be reached: they are sent when it is back."
            )
        if text:
            previous = f", compared with run {run.previous_id}" if run.previous_id else ""
            self.stdout.write(
                f"Suite run {run.pk}: {run.suite} on pool {pool_row.name} (queue "
                f"{pool_row.queue}), {len(jobs)} {'job' if len(jobs) == 1 else 'jobs'}{previous}"
            )
            for job in jobs:
                self.stdout.write(f"  {job.suite_entry:<26} job {job.pk:<6} {job.release.repo_id}")
            self.stdout.write(f"Matrix: {page_url(reverse('adaptation:suite_run', args=[run.pk]))}")
        else:
            summary = {
                "id": run.pk,
                "suite": run.suite,
                "pool": pool_row.name,
                "trigger": run.trigger,
                "previous": run.previous_id,
                "stack": run.stack,
                "jobs": [
                    {"entry": j.suite_entry, "job": j.pk, "repo_id": j.release.repo_id}
                    for j in jobs
                ],
            }
            self.stdout.write(json.dumps(summary, indent=2))
        if unsent:
            sys.exit(EXIT_NOT_SENT)

    def _list(self, *, text: bool) -> None:
        found = []
        for name in suite_names():
            try:
                found.append((name, suite_definition(name), None))
            except ServiceError as exc:
                found.append((name, None, str(exc)))
        if not text:
            suites = [
                {"name": name, "error": error}
                if definition is None
                else {
                    "name": name,
                    "title": definition.title,
                    "entries": [
                        {"name": e.name, "shapes": list(e.shapes), "folder": e.folder}
                        for e in definition.entries
                    ],
                }
                for name, definition, error in found
            ]
            self.stdout.write(json.dumps(suites, indent=2))
            return
        for name, definition, error in found:
            if definition is None:
                self.stdout.write(f"{name}: unusable: {error}")
                continue
            count = len(definition.entries)
            self.stdout.write(
                f"{name}: {definition.title} ({count} {'entry' if count == 1 else 'entries'})"
            )
            lines = [("entry", "family shapes", "folder")] + [
                (e.name, ", ".join(_shape_words(shape) for shape in e.shapes), e.folder)
                for e in definition.entries
            ]
            entry_width = max(len(line[0]) for line in lines)
            shapes_width = max(len(line[1]) for line in lines)
            for entry, shapes, folder in lines:
                self.stdout.write(f"  {entry:<{entry_width}}  {shapes:<{shapes_width}}  {folder}")


def _shape_words(shape: str) -> str:
    """A family shape as the pages name it ("dense-gqa": "dense GQA"), from their template
    as plain text."""
    return template_text("adaptation/suite_shape.html", {"shape": shape})
