"""Each stage's known-limitation rules are found through its registry entry: every
`engine/stages/<name>/findings.py` is named by the entry of stage `<name>` (so a new stage's
findings cannot be left out of the sync), the dispatch reads the registry alone, and the
engine's title/key lengths and severities are the `KnownLimitation` columns'."""

from __future__ import annotations

import importlib
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import engine
from adaptation.models import KnownLimitation, Severity
from engine import findings as shared
from engine import registry
from engine.contract import resolve_callable
from engine.findings import Finding
from engine.registry import STAGES, STAGES_WITH_FINDINGS, findings_for_stage, unjudged_keys

STAGES_DIR = Path(engine.__file__).parent / "stages"


def stages_with_a_findings_module() -> set[str]:
    return {path.parent.name for path in STAGES_DIR.glob("*/findings.py")}


def test_every_findings_module_is_named_by_its_stages_registry_entry():
    folders = stages_with_a_findings_module()
    # the eight stages whose results raise notes today, at least (the glob is not empty)
    assert folders >= {
        "analyze", "operators", "precision", "plan", "distributed", "serve", "performance",
        "stability",
    }  # fmt: skip
    assert set(STAGES_WITH_FINDINGS) == folders
    assert list(STAGES_WITH_FINDINGS) == [s.name for s in STAGES if s.name in folders]
    for stage in STAGES:
        if stage.name in folders:
            assert stage.findings == f"engine.stages.{stage.name}.findings:findings"
            assert callable(resolve_callable(stage.findings))
        else:
            assert stage.findings is None, stage.name


def test_a_findings_module_with_unjudged_keys_is_named_for_them_too():
    for stage in STAGES:
        if stage.findings is None:
            assert stage.unjudged_keys is None, stage.name
            continue
        module = importlib.import_module(f"engine.stages.{stage.name}.findings")
        if hasattr(module, "unjudged_keys"):
            assert stage.unjudged_keys == f"engine.stages.{stage.name}.findings:unjudged_keys"
        else:
            assert stage.unjudged_keys is None, stage.name
    assert unjudged_keys("distributed", {"inject": "wrong-shard"}) == {
        "distributed:not-validated",
        "distributed:mismatch",
        "distributed:rank-failed",
        "distributed:ep-not-validated",
    }
    assert unjudged_keys("plan", {"fits": False}) == frozenset()
    assert unjudged_keys("no-such-stage", {}) == frozenset()


def test_a_new_stage_is_dispatched_from_its_registry_entry_alone(monkeypatch):
    seen = {}

    def rules(result, *, pool, analysis=None):
        seen["analysis"] = analysis
        note = Finding(key="novel:x", title="t", body="b", severity=shared.MINOR)
        return [note, replace(note, title="a duplicate key is dropped")]

    novel = replace(STAGES[0], name="novel", findings=rules)
    monkeypatch.setitem(registry._BY_NAME, "novel", novel)

    found = findings_for_stage("novel", {"x": 1}, pool="cpu", analysis={"a": 1})
    assert [(f.key, f.title) for f in found] == [("novel:x", "t")]
    assert seen["analysis"] is None  # it does not read the analysis unless its entry says so

    monkeypatch.setitem(registry._BY_NAME, "novel", replace(novel, findings_read_analysis=True))
    findings_for_stage("novel", {"x": 1}, pool="cpu", analysis={"a": 1})
    assert seen["analysis"] == {"a": 1}

    assert findings_for_stage("novel", None, pool="cpu") is None  # no result: nothing to judge
    assert findings_for_stage("no-such-stage", {"x": 1}, pool="cpu") is None


def test_titles_keys_and_severities_fit_the_known_limitation_columns():
    assert KnownLimitation._meta.get_field("title").max_length == shared.TITLE_MAX_CHARS
    assert KnownLimitation._meta.get_field("key").max_length == shared.KEY_MAX_CHARS
    assert tuple(Severity.values) == shared.SEVERITIES
    long = shared.cut_title("word " * 100)
    assert len(long) == shared.TITLE_MAX_CHARS and long.endswith("…")
    assert len(shared.cut_key("k" * 500)) == shared.KEY_MAX_CHARS


def test_judging_results_does_not_load_torch():
    code = (
        "import sys; from engine.registry import STAGES_WITH_FINDINGS, findings_for_stage; "
        "[findings_for_stage(name, {}, pool='cpu') for name in STAGES_WITH_FINDINGS]; "
        "print(len(STAGES_WITH_FINDINGS), 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "8 False"
