"""A job cancelled before its later stages began (a suite run stopped, say) does not hide what
an older job decided for them: the board's cell keeps the older job's "Skipped"."""

from __future__ import annotations

import pytest
from django.utils import timezone

from adaptation.models import JobStatus, StageStatus
from adaptation.presenters.board import board
from adaptation.selectors.board import board_releases
from tests.factories import make_job, make_release

pytestmark = pytest.mark.django_db

STAGES = ("fetch", "analyze", "plan", "release_notes")


def test_a_job_cancelled_before_a_stage_began_leaves_the_older_skip_on_the_board():
    release = make_release()
    older = make_job(
        release=release,
        stages=STAGES,
        status=JobStatus.FAILED,
        statuses={
            "fetch": StageStatus.SUCCEEDED,
            "analyze": StageStatus.SUCCEEDED,
            "plan": StageStatus.FAILED,
            "release_notes": StageStatus.SUCCEEDED,
        },
    )
    newer = make_job(
        release=release,
        stages=STAGES,
        status=JobStatus.CANCELLED,
        statuses={
            "fetch": StageStatus.SUCCEEDED,
            "analyze": StageStatus.CANCELLED,
            "plan": StageStatus.CANCELLED,
            "release_notes": StageStatus.CANCELLED,
        },
    )
    # The older job skipped a stage the newer one holds but never began.
    older.stage_runs.filter(stage="release_notes").update(status=StageStatus.SKIPPED)

    [row] = board(board_releases(), now=timezone.now()).rows
    cells = {cell.stage: cell.entries[0] for cell in row.cells if cell.entries}
    assert (cells["fetch"].job_id, cells["fetch"].status) == (newer.pk, "succeeded")
    assert (cells["analyze"].job_id, cells["analyze"].status) == (older.pk, "succeeded")
    assert (cells["plan"].job_id, cells["plan"].status) == (older.pk, "failed")
    assert (cells["release_notes"].job_id, cells["release_notes"].status) == (older.pk, "skipped")
