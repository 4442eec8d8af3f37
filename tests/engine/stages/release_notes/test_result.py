"""The release_notes stage's typed result (`engine/stages/release_notes/result.py`): what the
stage writes, and the row once the app wrote the document and its summary line, read back
unchanged; a stored row of any shape reads without raising; the sections come in the
document's order."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from engine.contract import PoolSpec, ReleaseRef
from engine.registry import STAGES
from engine.stages.release_notes.result import NotesPart, ReleaseNotesResult
from engine.stages.release_notes.run import NOTES_FORMAT, build_release_notes
from tests.release_notes_results import REPO_ID, full_results

RELEASE = ReleaseRef("huggingface", "https://huggingface.co", REPO_ID, "6cee5e8")
POOL = PoolSpec(name="h200x8", backend="cuda", queue="pool.h200x8", device="cuda:0")


@pytest.fixture(scope="module")
def written() -> dict:
    """The stage's result for gpt-oss-20b with every stage passing, as stored (JSON)."""
    notes = build_release_notes(release=RELEASE, pool=POOL, results=full_results(), stages=STAGES)
    return json.loads(json.dumps(notes))


def test_what_the_stage_writes_reads_back_unchanged(written):
    result = ReleaseNotesResult.from_stored(written)

    assert result.to_dict() == written
    assert result.format == NOTES_FORMAT and result.has_notes
    assert result.markdown is None and result.summary_line is None


def test_the_row_the_app_writes_reads_back_unchanged(written):
    stored = ReleaseNotesResult.from_stored(written).written("# Release notes\n", "Fits one node")

    result = ReleaseNotesResult.from_stored(stored)

    assert stored == written | {"markdown": "# Release notes\n", "summary": "Fits one node"}
    assert result.to_dict() == stored
    assert result.markdown == "# Release notes\n" and result.summary_line == "Fits one node"


def test_the_sections_in_the_document_s_order(written):
    result = ReleaseNotesResult.from_stored(written)

    assert [part.stage for part, _ in result.ordered] == [p["stage"] for p in written["order"]]
    # the analysis's section, "release", opens the document
    first, section = result.ordered[0]
    assert first == NotesPart("analyze", "release") and section["repo_id"] == REPO_ID
    assert result.summary == written["sections"]["summary"]
    assert result.blocked is None


def test_a_section_the_notes_lack_reads_empty():
    result = ReleaseNotesResult.from_stored(
        {
            "sections": {"summary": {"open_limitations": 0}},
            "order": [{"stage": "plan", "section": "plan"}],
        }
    )

    assert result.ordered == [(NotesPart("plan", "plan"), {})]
    assert result.summary == {"open_limitations": 0}


@pytest.mark.parametrize(
    "row",
    [
        None,
        [],
        "notes",
        {},
        {"sections": [], "order": {}},
        {"sections": {"summary": "written"}, "order": [None, {"stage": 3}]},
        {"format": "3", "markdown": 1, "summary": {"plan": None}},
        {"sections": {"blocked": "fetch"}, "order": "release"},
    ],
)
def test_a_stored_row_of_any_shape_reads_without_raising(row):
    result = ReleaseNotesResult.from_stored(row)

    assert isinstance(result.summary, Mapping)
    assert result.blocked is None
    assert result.has_notes == (result.sections is not None and result.order is not None)
    assert all(isinstance(part.stage, str) for part, _ in result.ordered)
    assert ReleaseNotesResult.from_stored(result.to_dict()) == result
