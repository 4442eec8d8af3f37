"""`python manage.py release_report RELEASE [--format md|html] [--pool NAME]
[--notes-version N] [--output FILE] [--regenerate [--job ID]]`: print a release's notes with
people's additions.

RELEASE is a release id or "org/name[@revision]" (a revision or its first 7+ characters;
without one, the repo's newest release). The pool defaults to the one with the release's
newest notes; the version to the latest. `md` is the Markdown document, `html` the printable
page (it prints cleanly to PDF from a browser). `--regenerate` first writes a new version
from the release's newest finished job on the pool (`--job ID`: that finished job, on its
pool), from whatever its stages found: a job that stopped before its `release_notes` stage
still gets notes.

Exit status: 0 with the notes; 1 with a one-line reason when the release, the pool or the
notes do not exist (it says how to get them).
"""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from adaptation.models import AcceleratorPool, AdaptationJob, JobStatus
from adaptation.presenters.release_notes import release_notes_document, render_notes_html
from adaptation.selectors.release_notes import (
    NotesError,
    release_notes_additions,
    release_notes_get,
    release_notes_pools,
    release_resolve,
)
from adaptation.services.release_notes import release_notes_regenerate


class Command(BaseCommand):
    help = "Print a release's notes (with people's additions) as Markdown or printable HTML."

    def add_arguments(self, parser) -> None:
        parser.add_argument("release", help='A release id, or "org/name[@revision]".')
        parser.add_argument("--format", choices=("md", "html"), default="md")
        parser.add_argument("--pool", help="The pool (default: the one with the newest notes).")
        parser.add_argument(
            "--notes-version", type=int, dest="notes_version", help="Default: the latest."
        )
        parser.add_argument("--output", help="Write to this file instead of standard output.")
        parser.add_argument(
            "--regenerate",
            action="store_true",
            help="First write a new version from the newest finished job on the pool.",
        )
        parser.add_argument(
            "--job",
            type=int,
            help="With --regenerate: write from this finished job of the release instead "
            "(its pool is the notes' pool).",
        )

    def handle(self, *args, **options) -> None:
        try:
            release = release_resolve(options["release"])
        except NotesError as exc:
            raise CommandError(str(exc)) from exc
        if options["job"] is not None and not options["regenerate"]:
            raise CommandError("--job chooses the job --regenerate writes from: add --regenerate.")
        job = self._job(release, options["job"]) if options["job"] is not None else None
        if job is not None:
            pool = job.pool
        else:
            pool = self._pool(release, options["pool"], regenerate=options["regenerate"])
        if options["regenerate"]:
            self._regenerate(release, pool, job)
        notes = release_notes_get(release=release, pool=pool, version=options["notes_version"])
        if notes is None:
            if options["notes_version"] is not None:
                raise CommandError(
                    f"{release.repo_id} has no version {options['notes_version']} of its notes "
                    f"on pool {pool.name}."
                )
            raise CommandError(self._no_notes(release, pool))
        additions = release_notes_additions(release=release, pool=pool)
        text = (
            release_notes_document(notes, additions)
            if options["format"] == "md"
            else render_notes_html(notes, additions)
        )
        if options["output"]:
            path = Path(options["output"])
            try:
                path.write_text(text, encoding="utf-8")
            except OSError as exc:
                raise CommandError(f"Cannot write {path}: {exc.strerror or exc}.") from exc
            self.stderr.write(
                f"Wrote version {notes.version} of the notes of {release.repo_id} on pool "
                f"{pool.name} to {path}."
            )
        else:
            self.stdout.write(text, ending="" if text.endswith("\n") else "\n")

    def _pool(self, release, name: str | None, *, regenerate: bool) -> AcceleratorPool:
        """The pool named, or the one with the release's newest notes (with `regenerate`,
        else that of its newest job). Raises `CommandError` saying why there is none."""
        if name:
            pool = AcceleratorPool.objects.filter(name=name).first()
            if pool is None:
                known = ", ".join(AcceleratorPool.objects.values_list("name", flat=True))
                raise CommandError(f"No pool {name!r}; pools: {known or 'none'}.")
            return pool
        pools = release_notes_pools(release)
        if pools:
            return pools[0]
        newest = release.jobs.select_related("pool").order_by("-created_at", "-id").first()
        if newest is not None and regenerate:
            return newest.pool
        raise CommandError(self._no_notes(release, newest.pool if newest else None))

    @staticmethod
    def _job(release, job_id: int) -> AdaptationJob:
        """The release's finished job `job_id`. Raises `CommandError` saying why not."""
        job = AdaptationJob.objects.filter(pk=job_id, release=release).select_related("pool")
        found = job.first()
        if found is None:
            raise CommandError(f"{release.repo_id} has no job {job_id}.")
        if found.status in (JobStatus.PENDING, JobStatus.RUNNING):
            raise CommandError(f"Job {job_id} has not finished ({found.status}).")
        return found

    def _regenerate(self, release, pool: AcceleratorPool, job: AdaptationJob | None) -> None:
        job = job or (
            AdaptationJob.objects.filter(release=release, pool=pool)
            .exclude(status__in=(JobStatus.PENDING, JobStatus.RUNNING))
            .order_by("-created_at", "-id")
            .first()
        )
        if job is None:
            raise CommandError(
                f"{release.repo_id} has no finished job on pool {pool.name} to write notes "
                f"from: run one (manage.py adapt {release.repo_id} --pool {pool.name} --wait)."
            )
        notes = release_notes_regenerate(job=job)
        self.stderr.write(
            f"Wrote version {notes.version} from job {job.pk}'s stages "
            f"({', '.join(job.stages)}; --job ID writes from another)."
        )

    @staticmethod
    def _no_notes(release, pool: AcceleratorPool | None) -> str:
        where = f" on pool {pool.name}" if pool else ""
        jobs = release.jobs.all()
        if not jobs.exists():
            return (
                f"{release.repo_id} (release {release.pk}) has no release notes{where}: it has "
                f"no job yet; run one (manage.py adapt {release.repo_id} --wait)."
            )
        return (
            f"{release.repo_id} (release {release.pk}) has no release notes{where}: its job "
            "has not reached the release_notes stage (still running, or an earlier stage "
            "failed). Re-run the failed stage, or write notes from what the job found with "
            "--regenerate."
        )
