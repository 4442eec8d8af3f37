"""Each stage's section of the notes lives in its folder and is found through the registry:
every stage with a `notes` function has a section template and every section template a
stage; the `release_notes` stage walks the registry, so a new stage's section needs no edit
of it."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from django.conf import settings
from django.template import TemplateDoesNotExist, engines

from adaptation.services.release_notes import release_notes_markdown, section_template
from engine.contract import StageContext, StageDefinition
from engine.notes import NotesContext, StageState
from engine.registry import STAGES
from engine.stages.release_notes.run import build_release_notes, notes_sections, read_stages, run
from tests.engine.stages.release_notes.test_engine import H200, RELEASE
from tests.release_notes_results import full_results

SECTIONS_DIR = Path(settings.BASE_DIR) / "templates" / "release_notes" / "sections"


def test_every_stage_with_a_notes_function_has_a_section_template_and_back():
    with_notes = {stage.name for stage in STAGES if stage.notes is not None}
    templates = {path.stem for path in SECTIONS_DIR.glob("*.md")}
    assert with_notes == templates
    for name in with_notes:
        engines["markdown"].get_template(section_template(name))  # found, and it compiles
    # Each registry line names the function in the stage's own folder.
    for stage in STAGES:
        if stage.notes is not None:
            assert stage.notes == f"engine.stages.{stage.name}.notes:section"


def test_the_sections_keep_their_keys_and_the_document_its_order():
    notes = build_release_notes(release=RELEASE, pool=H200, results=full_results(), stages=STAGES)
    assert notes["order"] == [
        {"stage": "analyze", "section": "release"},
        {"stage": "plan", "section": "configuration"},
        {"stage": "distributed", "section": "distributed"},
        {"stage": "serve", "section": "serve"},
        {"stage": "performance", "section": "performance"},
        {"stage": "precision", "section": "precision"},
        {"stage": "operators", "section": "operators"},
        {"stage": "stability", "section": "stability"},
    ]
    assert list(notes["sections"]) == [
        "summary",
        *(part["section"] for part in notes["order"]),
        "full_size",
        "limitations",
        "not_validated",
        "stages",
        "blocked",
    ]
    assert "markdown" not in notes  # the app writes the document
    # The stages the notes read: every registered one before the notes stage.
    assert [s["name"] for s in notes["sections"]["stages"]] == [
        stage.name for stage in STAGES[: [s.name for s in STAGES].index("release_notes")]
    ]


def test_a_stages_notes_module_imports_no_other_stages_package():
    """What every section reads is `engine.notes`, beside `engine.findings`: a stage's notes
    module never reaches into another stage's folder (the release_notes stage's included)."""
    for stage in STAGES:
        if stage.notes is None:
            continue
        path = Path(settings.BASE_DIR) / "engine" / "stages" / stage.name / "notes.py"
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        others = {
            name
            for name in imported
            if name.startswith("engine.stages.")
            and not name.startswith(f"engine.stages.{stage.name}.")
        }
        assert not others, f"{path}: {sorted(others)}"


def extra_section(state: StageState, notes: NotesContext) -> dict:
    """A section of a stage the notes stage has never heard of; it reads the plan's."""
    return {"status": state.status, "plan_devices": notes.sections["plan"].get("devices")}


def test_a_new_stage_gets_its_section_without_an_edit_of_the_notes_stage():
    position = [s.name for s in STAGES].index("release_notes")
    extra = StageDefinition(
        name="soak",
        title="Soak",
        run="tests.nowhere:run",
        notes=f"{__name__}:extra_section",
    )
    stages = (*STAGES[:position], extra, *STAGES[position:])
    results = full_results() | {"soak": {"hours": 3}}
    notes = build_release_notes(release=RELEASE, pool=H200, results=results, stages=stages)
    # Its key defaults to its name, its place to after the placed sections.
    assert notes["sections"]["soak"] == {"status": "succeeded", "plan_devices": 1}
    assert notes["order"][-1] == {"stage": "soak", "section": "soak"}
    assert "soak" in [s["name"] for s in notes["sections"]["stages"]]
    # The app needs the stage's template before it can write the document.
    with pytest.raises(TemplateDoesNotExist, match=r"release_notes/sections/soak\.md"):
        release_notes_markdown(notes)


def test_the_notes_stage_reads_only_the_stages_before_it():
    assert read_stages(STAGES)[-1].name == "stability"
    parts = notes_sections(read_stages(STAGES))
    assert [p.stage for p in parts if p.ran_twin] == [
        "operators",
        "precision",
        "distributed",
        "serve",
        "performance",
        "stability",
    ]
    later = replace(STAGES[1], name="after_notes")
    assert "after_notes" not in [d.name for d in read_stages((*STAGES, later))]


def test_the_stage_refuses_to_run_without_the_registry():
    with pytest.raises(ValueError, match=r"StageContext\.stages"):
        run(StageContext(release=RELEASE, pool=H200, previous=full_results()))


def test_walking_the_registry_imports_neither_django_nor_torch():
    code_line = (
        "import sys; from engine.registry import STAGES; "
        "from engine.stages.release_notes.run import build_release_notes; "
        "from engine.contract import PoolSpec, ReleaseRef; "
        "notes = build_release_notes(release=ReleaseRef('h', 'e', 'a/b', 'r'), "
        "pool=PoolSpec(name='p', backend='cpu', queue='q'), results={}, stages=STAGES); "
        "assert len(notes['order']) == 8, notes['order']; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'torch', 'transformers')]; "
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code_line], check=False).returncode == 0
