"""The jobs of a release that its presenters draw.

`selectors.releases.release_detail` prefetches every job of a release, newest first, with
their stage attempts. The release page draws only some of them in each stage's panel
(`presenters.panels.ShownJobs`): `release_showing` hands that panel's presenter a copy of the
release carrying those jobs as a plain list attribute, `drawn_jobs` (as `Prefetch(to_attr=...)`
keeps prefetched rows: an attribute of ours, not Django's prefetch cache), and every presenter
reads a release's jobs through `release_jobs`: that list where it is set, else every
prefetched job.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from adaptation.models import AdaptationJob, ModelRelease

# The attribute of a release copy that lists the jobs a panel draws.
DRAWN_JOBS = "drawn_jobs"


def release_showing(release: ModelRelease, jobs: Iterable[AdaptationJob]) -> ModelRelease:
    """A copy of `release` whose presenters draw only `jobs` (their prefetched stage attempts
    and the release's other prefetched rows kept); `release` itself is left as it is."""
    shown = copy.copy(release)
    setattr(shown, DRAWN_JOBS, list(jobs))
    return shown


def release_jobs(release: ModelRelease) -> list[AdaptationJob]:
    """The jobs of `release` to draw, newest first: those `release_showing` chose, else every
    job prefetched with it (`release.jobs.all()`; a query when they were not prefetched)."""
    drawn = getattr(release, DRAWN_JOBS, None)
    return list(release.jobs.all()) if drawn is None else list(drawn)
