"""The jobs a release's presenters draw (adaptation/presenters/release_jobs.py): a panel's copy
of the release lists the jobs it shows, read without a query; the release itself keeps all."""

from __future__ import annotations

import pytest

from adaptation.presenters.analysis import latest_analysis_run
from adaptation.presenters.release_jobs import release_jobs, release_showing
from adaptation.selectors.releases import release_detail
from tests.factories import make_job, make_release

pytestmark = pytest.mark.django_db


def test_a_panels_copy_draws_only_its_jobs_and_the_release_keeps_every_job(
    django_assert_num_queries,
):
    release = make_release()
    older = make_job(
        release=release, stages=("fetch", "analyze"), statuses={"analyze": "succeeded"}
    )
    newer = make_job(release=release, stages=("fetch", "analyze"), statuses={"analyze": "failed"})
    loaded = release_detail(release_id=release.pk)
    newer_loaded, older_loaded = loaded.jobs.all()  # prefetched, newest first

    with django_assert_num_queries(0):
        shown = release_showing(loaded, [older_loaded])
        assert [job.pk for job in release_jobs(shown)] == [older.pk]
        # A presenter reading the copy finds the older job's attempts, prefetched.
        run = latest_analysis_run(shown)
        assert run is not None and run.job_id == older.pk
        assert latest_analysis_run(release_showing(loaded, [newer_loaded])) is None
        # The release itself still lists every job, newest first.
        assert [job.pk for job in release_jobs(loaded)] == [newer.pk, older.pk]
        assert [job.pk for job in loaded.jobs.all()] == [newer.pk, older.pk]
