"""The Markdown templates (`templates/release_notes/`, the "markdown" engine): read line by
line (a line of tags leaves nothing behind), never HTML-escaped (strings are escaped for
Markdown by the `notes_markdown` filters), ".md" names only; and the filters' formats."""

from __future__ import annotations

import pytest
from django.template import TemplateDoesNotExist, engines

from adaptation.markdown_templates import trim_tag_lines
from adaptation.templatetags import day0_format, notes_markdown
from engine.notes import CALIBRATED_FULL, MEASURED_FULL, MEASURED_TWIN, PREDICTED_FULL


def test_a_line_holding_only_tags_leaves_nothing_behind():
    source = (
        "{% load notes_markdown %}\n"
        "# Title\n"
        "  {% if a %}  {# why #}\n"
        "- {{ a }}\n"
        "{% endif %}\n"
        "\n"
        "text {% if b %}b{% endif %}\n"
    )
    assert trim_tag_lines(source) == (
        "{% load notes_markdown %}# Title\n{% if a %}{# why #}- {{ a }}\n{% endif %}\n"
        "text {% if b %}b{% endif %}\n"
    )
    template = engines["markdown"].from_string(trim_tag_lines(source))
    assert template.render({"a": "<x> & *y*", "b": 0}) == "# Title\n- <x> & *y*\n\ntext \n"


def test_the_markdown_engine_escapes_for_markdown_not_html():
    template = engines["markdown"].from_string("{% load notes_markdown %}{{ s|md }} {{ s }}")
    assert template.render({"s": "<b>&"}) == "\\<b\\>\\& <b>&"
    with pytest.raises(TemplateDoesNotExist):  # HTML templates are not this engine's
        engines["markdown"].get_template("adaptation/release_notes.html")


def test_the_notes_formats_are_the_pages_filters():
    """Splits, slopes and drifts in the notes are written by `engine.formatting`, the filters
    every page uses (`day0_format`), not by a second set."""
    filters = day0_format.register.filters
    assert filters["bytes_per_step"](123456.7) == "123,457 bytes/step"
    assert filters["signed_percent"](-0.034) == "-3.4%"
    assert filters["signed_percent"](None) == filters["bytes_per_step"]("x") == "—"
    assert filters["split"]({"tp": 8, "pp": 1, "ep": 8, "dp": 1}) == "TP8 PP1 EP8 DP1"
    assert filters["split"](None) == "—"
    assert filters["validated_split"]({"tp": 2, "ep": 2}) == "TP=2 EP=2"
    assert filters["validated_split"]({"tp": 2, "ep": 1}) == "TP=2"
    for name in ("split", "validated_split", "bytes_per_step", "signed_percent"):
        assert name not in notes_markdown.register.filters


def test_the_notes_filters_write_their_formats():
    assert notes_markdown.md_indent("a\n\n  b\n") == "  a\n\n    b"
    assert notes_markdown.full_stop("done.") == "done." and notes_markdown.full_stop("") == "."
    assert notes_markdown.is_finite(0.0) and not notes_markdown.is_finite(float("nan"))
    groups = notes_markdown.by_severity(
        [{"severity": s} for s in ("major", "weird", "blocker", "odd", "major")]
    )
    assert [(g["severity"], len(g["limitations"])) for g in groups] == [
        ("blocker", 1),
        ("major", 2),
        (None, 2),
    ]


@pytest.mark.parametrize(
    ("key", "words"),
    [
        (MEASURED_TWIN, "measured (twin)"),
        (MEASURED_FULL, "measured (full-size, real weights)"),
        (PREDICTED_FULL, "predicted (full-size)"),
        (CALIBRATED_FULL, "calibrated prediction (full-size)"),
        ("a *new* label", "a \\*new\\* label"),  # a key not worded: as it is, escaped
    ],
)
def test_a_figures_label_is_worded_by_its_template_on_one_line(key, words):
    """The sections store a label's key (`engine.notes`); `label.md` words it, inline."""
    template = engines["markdown"].from_string(
        '{% load day0_text %}| **{% words "release_notes/label.md" with label=key %}** |\n'
    )
    assert template.render({"key": key}) == f"| **{words}** |\n"


def test_every_kind_of_item_not_validated_has_its_sentence():
    """One line per item the engine can return (`engine/stages/release_notes/not_validated.py`
    lists the kinds; a kind the template does not know would be left out)."""
    split = {"tp": 2, "ep": 1, "processes": 2, "backend": "gloo", "device_type": "cpu"}
    plan = {"tp": 1, "pp": 1, "ep": 8, "dp": 8}
    items = [
        {"kind": "stage_not_run", "stage": "stability"},
        {"kind": "stage_not_succeeded", "stage": "plan", "status": "failed", "reason": "x;"},
        {"kind": "twin", "stages": ["operators"], "twin": None},
        *(
            {
                "kind": "multi_device",
                "outcome": outcome,
                "devices": devices,
                "plan_split": plan,
                "split": split,
                "reason": "",
            }
            for outcome in ("passed", "failed", "not_validated", "not_run")
            for devices in (1, 8)
        ),
        {"kind": "expert_parallelism", "reason": "no ep plan."},
        {"kind": "serving_dtype", "dtype": "fp8", "dtype_label": None, "checked": []},
        {"kind": "full_size_speed", "predicted": True},
        {"kind": "full_size_speed", "predicted": False},
        {"kind": "context", "prompt_tokens": 128, "context_tokens": 32768},
        {"kind": "skipped_dtype", "stage": "precision", "dtype": "int8", "reason": "no"},
        {"kind": "skipped_dtype", "stage": "performance", "dtype": "int8", "reason": "no"},
        {"kind": "stability_duration", "duration_s": 20.0},
    ]
    written = engines["markdown"].get_template("release_notes/not_validated.md")
    lines = written.render({"section": items}).splitlines()
    assert lines[:2] == ["## What was not validated", ""]
    assert len(lines[2:]) == len(items)
    assert len(set(lines[2:])) == len(items)  # each its own sentence
    assert all(line.startswith("- ") and line.endswith(".") for line in lines[2:])
    assert "- `stability`: not run in this job." in lines
    assert "- `plan`: failed: x." in lines
    assert "- The serving dtype fp8 was not checked by `precision` (checked: none)." in lines
