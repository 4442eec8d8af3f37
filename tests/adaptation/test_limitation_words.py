"""A known limitation's words are rendered when it is shown (`adaptation.limitation_words`):
a stage's note stores its template's name and data, and the release page, the API and the
release notes word it from the template as it reads now; people's notes and notes stored
before templates keep their own words. The templates (`templates/limitations/`) escape every
string from a result for Markdown, and the filters and tags they use write what they say."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.template import engines
from django.test import override_settings

from adaptation.limitation_words import TEMPLATE_FOLDER, render_words, template_path
from adaptation.markdown_templates import trim_tag_lines
from adaptation.models import AcceleratorPool, KnownLimitation, StageRun
from adaptation.selectors.release_notes import notes_limitations
from adaptation.services import limitations
from adaptation.services.stage_runs import stage_run_claim, stage_run_fail
from engine.findings import Finding
from tests import dom
from tests.factories import make_job, make_release
from tests.limitation_twins import DEEPSEEK, analysis_of

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "templates" / TEMPLATE_FOLDER
NO_FIT = "Needs more devices than pool h200-half has: 8 x h200 would fit, the pool has 4"
# The plan's no-fit note worded another way, as a reworded template would say it.
REWORDED_NO_FIT = """{% load day0_format notes_markdown %}
Pool {{ pool }} is too small: {{ fit_devices }} x {{ kind }} devices would fit

On {{ pool|md_code }} only {{ have|count }} devices are there.
"""


def _no_fit_job():
    """A DeepSeek-V3 job whose plan failed on a pool of 4 H200s: its `plan:no-fit` note is
    raised from the plan's stored result."""
    from engine.catalog import load_catalog
    from engine.stages.plan.errors import NoFittingPlan
    from engine.stages.plan.layout import PoolLayout
    from engine.stages.plan.planner import plan_release
    from engine.stages.plan.run import no_fit_result

    analysis = analysis_of(DEEPSEEK)
    pool = AcceleratorPool.objects.create(
        name="h200-half", backend="cuda", queue="pool.h200-half", accelerator="h200"
    )
    job = make_job(
        pool=pool,
        stages=("fetch", "analyze", "plan"),
        statuses={"fetch": "succeeded", "analyze": "succeeded", "plan": "queued"},
        results={"analyze": analysis},
    )
    catalog = load_catalog()
    half = PoolLayout(accelerator="h200", devices_per_node=4, nodes=1)
    with pytest.raises(NoFittingPlan) as err:
        plan_release(analysis, half, catalog=catalog)
    result = no_fit_result(err.value, analysis, half, catalog, {}, release="DeepSeek-V3")
    run = StageRun.objects.get(job=job, stage="plan")
    claimed = stage_run_claim(stage_run_id=run.pk, worker_host="worker-1")
    stage_run_fail(stage_run=claimed, error=str(err.value), result=result)
    return job


def _reworded(folder: Path, name: str, text: str) -> override_settings:
    """Settings under which template `name` (of `templates/limitations/`) reads `text`: a
    folder ahead of the project's in the Markdown engine's folders holds the reworded one."""
    path = folder / TEMPLATE_FOLDER / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    templates = [dict(engine) for engine in settings.TEMPLATES]
    markdown = next(engine for engine in templates if engine.get("NAME") == "markdown")
    markdown["DIRS"] = [folder, *markdown["DIRS"]]
    return override_settings(TEMPLATES=templates)


# --- stored notes, worded when shown -------------------------------------------------------------


@pytest.mark.django_db
def test_a_reworded_template_changes_a_stored_note_without_rerunning_its_stage(
    client, cast, tmp_path
):
    job = _no_fit_job()
    note = KnownLimitation.objects.get(release=job.release, key="plan:no-fit")
    assert (note.template, note.template_data["fit_devices"], note.template_data["have"]) == (
        "plan/no-fit",
        8,
        4,
    )
    assert note.shown_title == note.title == NO_FIT  # the last sync's rendering is stored too
    runs, updated_at = StageRun.objects.filter(job=job).count(), note.updated_at

    with _reworded(tmp_path, "plan/no-fit", REWORDED_NO_FIT):
        note = KnownLimitation.objects.get(pk=note.pk)
        assert note.shown_title == "Pool h200-half is too small: 8 x h200 devices would fit"
        assert note.shown_body == "On `h200-half` only 4 devices are there."

        client.force_login(cast.mona)
        page = client.get(f"/releases/{job.release_id}/").content.decode()
        assert dom.text(page, f"#limitation-{note.pk} .limitation-title") == (
            "Pool h200-half is too small: 8 x h200 devices would fit"
        )
        assert "only 4 devices are there" in dom.text(page, f"#limitation-{note.pk}")

        api = cast.api("mona").get(f"/api/v1/releases/{job.release_id}/").json()
        (shown,) = [n for n in api["limitations"] if n["key"] == "plan:no-fit"]
        assert shown["title"] == "Pool h200-half is too small: 8 x h200 devices would fit"
        assert shown["body"] == "On `h200-half` only 4 devices are there."

        (listed,) = notes_limitations(release=job.release, pool=job.pool)
        assert listed["title"] == "Pool h200-half is too small: 8 x h200 devices would fit"

    # nothing re-ran and nothing was written: the stored row is as the stage left it
    stored = KnownLimitation.objects.get(pk=note.pk)
    assert StageRun.objects.filter(job=job).count() == runs
    assert (stored.title, stored.updated_at) == (NO_FIT, updated_at)
    assert stored.shown_title == NO_FIT  # the project's own template again


@pytest.mark.django_db
def test_a_sync_after_a_rewording_refreshes_the_stored_words_without_calling_it_an_update(
    tmp_path,
):
    job = _no_fit_job()
    note = KnownLimitation.objects.get(release=job.release, key="plan:no-fit")
    run = StageRun.objects.get(job=job, stage="plan")

    with _reworded(tmp_path, "plan/no-fit", REWORDED_NO_FIT):
        outcome = limitations.limitations_sync_for_stage(stage_run=run)

    assert outcome is not None and outcome.updated == [] and outcome.raised == []
    stored = KnownLimitation.objects.get(pk=note.pk)
    assert stored.title == "Pool h200-half is too small: 8 x h200 devices would fit"
    assert stored.updated_at == note.updated_at


@pytest.mark.django_db
def test_notes_stored_before_templates_and_peoples_notes_keep_their_own_words(cast):
    release = make_release()
    older = KnownLimitation.objects.create(
        release=release,
        key="plan:no-fit",
        stage="plan",
        title="Needs more devices (as worded then)",
        body="Stored **then**.",
        severity="blocker",
    )
    own = limitations.limitation_create(
        release=release, author=cast.eli, title="Needs firmware 1.3", body="Older firmware hangs."
    )

    assert (older.shown_title, older.shown_body) == (
        "Needs more devices (as worded then)",
        "Stored **then**.",
    )
    assert (own.template, own.shown_title, own.shown_body) == (
        "",
        "Needs firmware 1.3",
        "Older firmware hangs.",
    )


@pytest.mark.django_db
def test_a_note_whose_template_is_gone_shows_the_words_stored_with_it(caplog):
    note = KnownLimitation.objects.create(
        release=make_release(),
        key="plan:no-fit",
        stage="plan",
        title="Needs 8 devices",
        body="As rendered at the last sync.",
        template="plan/no-such-template",
        template_data={"pool": "cpu"},
        severity="blocker",
    )

    with caplog.at_level(logging.WARNING, logger="adaptation.limitation_words"):
        assert (note.shown_title, note.shown_body) == (
            "Needs 8 devices",
            "As rendered at the last sync.",
        )
    assert "limitations/plan/no-such-template.md is missing" in caplog.text


def test_a_finding_with_neither_a_template_nor_words_is_refused():
    with pytest.raises(ValueError, match="neither a template nor a title"):
        Finding(key="plan:no-fit", severity="blocker")


def test_a_findings_data_is_plain_json():
    finding = Finding(
        key="plan:x",
        severity="info",
        template="plan/no-fit",
        data={"split": (1, 2), "error": float("nan"), 3: {"nested": (float("inf"),)}},
    )
    assert finding.data == {"split": [1, 2], "error": None, "3": {"nested": [None]}}


# --- the templates -------------------------------------------------------------------------------

# Filters whose output is safe Markdown whatever the value: they escape it (`md`, `md_code`,
# `md_codes`, `md_code_block`, `sentence`), write a number or a split, or a word of the
# template's own (`pluralize`).
ESCAPING = {
    "md",
    "md_code",
    "md_codes",
    "md_code_block",
    "sentence",
    "count",
    "counted",
    "signed_count",
    "gib",
    "bytes_per_step",
    "sig",
    "scientific",
    "percent",
    "signed_percent",
    "split",
    "validated_split",
    "exit_status",
    "pluralize",
}
# Filters that keep an escaped value safe: `default` only puts the template's own words in.
KEEPS_ESCAPED = {"default"}
MARKDOWN_ESCAPES = {"md", "md_code", "md_codes", "md_code_block", "sentence"}
_COMMENT = re.compile(r"\{% comment %\}.*?\{% endcomment %\}|\{#.*?#\}", re.S)
_OUTPUT = re.compile(r"\{\{(.*?)\}\}")


def _filters(expression: str) -> list[str]:
    return [part.split(":")[0].strip() for part in expression.split("|")[1:]]


def _escaped(expression: str) -> bool:
    filters = _filters(expression)
    last = max((i for i, name in enumerate(filters) if name in ESCAPING), default=None)
    return last is not None and all(name in KEEPS_ESCAPED for name in filters[last + 1 :])


def _parts(path: Path) -> tuple[str, str]:
    """A template's title (its first paragraph; none for a partial, "_name.md") and body, as
    written, comments left out."""
    source = _COMMENT.sub("", path.read_text())
    if path.name.startswith("_"):
        return "", source
    title, _, body = source.strip().partition("\n\n")
    return title, body


def _templates() -> list[Path]:
    return sorted(TEMPLATES.rglob("*.md"))


def test_every_template_escapes_what_its_body_writes_and_keeps_its_title_plain():
    assert len(_templates()) >= 20
    for path in _templates():
        title, body = _parts(path)
        for expression in _OUTPUT.findall(body):
            assert _escaped(expression), f"{path.relative_to(ROOT)}: {{{{{expression}}}}}"
        for expression in _OUTPUT.findall(title):
            assert not set(_filters(expression)) & MARKDOWN_ESCAPES, (
                f"{path.relative_to(ROOT)}: the title is plain text: {{{{{expression}}}}}"
            )


def test_every_template_a_finding_names_is_there():
    named = set()
    for path in (ROOT / "engine" / "stages").rglob("*findings.py"):
        named |= set(re.findall(r'template="([^"{}]+)"', path.read_text()))
    # the analysis's checkpoint notes name theirs by kind: "analyze/checkpoint-{kind}"
    named |= {
        f"analyze/checkpoint-{kind}"
        for kind in ("count", "missing", "shape", "extra", "layers", "mtp", "duplicates", "index")
    }
    assert {"plan/no-fit", "operators/missing", "distributed/mismatch", "analyze/mtp"} <= named
    for name in sorted(named):
        assert (ROOT / "templates" / template_path(name)).is_file(), name


def test_a_hostile_name_in_a_result_renders_inert_in_the_body_and_as_is_in_the_title():
    from adaptation.safe_markdown import render_markdown

    hostile = "[x](javascript:alert(1)) *<b>"
    words = render_words(
        "operators/missing",
        {
            "name": "aten::evil",
            "pool": "cpu",
            "feature": hostile,
            "via": hostile,
            "dtypes": [hostile],
            "lacking": [],
            "dtype_gap": False,
            "host_only": False,
            "device": "cpu",
            "dtype": "bfloat16",
            "checked_against": hostile,
            "calls": 3,
        },
    )
    assert words.title == f"aten::evil is missing on pool cpu ({hostile})"
    html = render_markdown(words.body)
    assert "href" not in html and "<b>" not in html and "<em>" not in html
    assert "[x](javascript:alert(1)) *&lt;b&gt;" in html


# --- what the templates are written with ---------------------------------------------------------


def _render(source: str, **context) -> str:
    return engines["markdown"].from_string(trim_tag_lines(source)).render(context)


def test_a_line_that_opens_and_closes_with_tags_keeps_its_words():
    assert trim_tag_lines("{% if a %}\nx\n{% endif %}\n") == "{% if a %}x\n{% endif %}"
    assert trim_tag_lines("{% if a %}words{% endif %}\n") == "{% if a %}words{% endif %}\n"


def test_paragraph_puts_its_lines_on_one_and_joined_keeps_only_the_clauses_there():
    source = (
        "{% load limitation_markdown %}\n"
        "{% paragraph %}\n"
        "A sentence written\n"
        "over lines:\n"
        '{% joined ", " %}\n'
        "{% if a %}first{% endif %}\n"
        "{% if b %}second{% endif %}\n"
        "{% if c %}third{% endif %}\n"
        "{% endjoined %}.\n"
        "{% endparagraph %}\n"
        "Next line.\n"
    )
    assert _render(source, a=True, b=False, c=True) == (
        "A sentence written over lines: first, third.\nNext line.\n"
    )
    assert _render(source, a=False, b=True, c=False) == (
        "A sentence written over lines: second.\nNext line.\n"
    )


def test_the_filters_write_counts_signs_and_escaped_names():
    source = (
        "{% load limitation_markdown %}"
        '{{ n|counted:"tensor" }}; {{ d|signed_count }}; {{ names|md_codes }}; '
        "{{ reason|gist }}; {{ reason|sentence }}; {{ group|spaced }}"
    )
    assert _render(
        source, n=3, d=16384, names=["a_b", "c`d"], reason="no plan: it lacks *x*.", group="lm_head"
    ) == ("3 tensors; +16,384; `a_b`, ``c`d``; no plan; no plan: it lacks \\*x\\*.; lm head")
