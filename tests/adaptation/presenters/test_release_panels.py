"""The release page's stage panels (`adaptation.presenters.panels`): one per stage with a
panel template, in registry order, on the page and in its live partial; a stage with a
template and no presenter renders from the generic context."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.urls import reverse

from adaptation.presenters.panels import panel_stages, panel_template
from adaptation.stages import app_stages
from adaptation.stages import fetch as fetch_stage
from engine.registry import stage_names
from tests import dom
from tests.factories import make_job, make_release

pytestmark = pytest.mark.django_db

PANELS_DIR = Path(django_settings.BASE_DIR) / "templates" / "adaptation" / "panels"


def page_url(release) -> str:
    return reverse("adaptation:release_detail", args=[release.pk])


def rendered(response) -> list[str]:
    return [t.name for t in response.templates if t.name]


def test_every_panel_template_is_a_registered_stage_and_every_presenter_has_a_template():
    """A template for no registered stage, or a presenter without its template, would never
    reach the page."""
    templates = sorted(path.stem for path in PANELS_DIR.glob("*.html"))
    assert templates, "no panel templates found"
    assert set(templates) <= set(stage_names())
    presenters = {app.name for app in app_stages() if app.presenter is not None}
    assert presenters <= set(templates)
    assert panel_stages() == [name for name in stage_names() if name in templates]


def test_every_stage_with_a_panel_template_is_on_the_release_page(logged_in_client):
    release = make_release()
    make_job(
        release=release,
        stages=stage_names(),
        statuses={"fetch": "succeeded", "analyze": "running"},
    )
    expected = [
        panel_template(name) for name in stage_names() if (PANELS_DIR / f"{name}.html").exists()
    ]

    page = logged_in_client.get(page_url(release))
    assert page.status_code == 200
    assert [panel.template for panel in page.context["panels"]] == expected
    used = rendered(page)
    assert [name for name in used if name in expected] == expected  # each once, in order

    # The live partial swaps every panel by its id.
    live = logged_in_client.get(page_url(release), HTTP_HX_REQUEST="true")
    assert live.status_code == 200
    used = rendered(live)
    assert [name for name in used if name in expected] == expected
    html = live.content.decode()
    for section in ("analysis", "validation", "plans", "distributed", "performance", "stability"):
        assert dom.attr(html, f"section#{section}", "hx-swap-oob") == "true", section


FETCH_PANEL = """\
<section id="fetch-panel"{% if oob %} hx-swap-oob="true"{% endif %}>
  <h2 id="fetch-panel-title">{{ panel.title }}</h2>
  {% include "adaptation/partials/stage_runs.html" %}
  <p id="fetch-files">{{ panel.values.latest.result.files|join:", " }}</p>
</section>
"""


@pytest.fixture
def fetch_panel_template(settings, tmp_path, monkeypatch):
    """A panel template for `fetch`, a registered stage without a presenter, found before
    the project's templates and named by its app module (`adaptation/stages/fetch.py`), as a
    new stage's module names its template."""
    folder = tmp_path / "adaptation" / "panels"
    folder.mkdir(parents=True)
    (folder / "fetch.html").write_text(FETCH_PANEL)
    templates = copy.deepcopy(settings.TEMPLATES)
    templates[0]["DIRS"] = [tmp_path, *templates[0]["DIRS"]]
    settings.TEMPLATES = templates
    monkeypatch.setattr(
        fetch_stage,
        "STAGE",
        dataclasses.replace(fetch_stage.STAGE, panel_template="adaptation/panels/fetch.html"),
    )
    return folder / "fetch.html"


def test_a_stage_with_only_a_template_renders_from_the_generic_context(
    logged_in_client, fetch_panel_template
):
    assert fetch_stage.STAGE.presenter is None
    release = make_release()
    older = make_job(release=release, statuses={"fetch": "failed"})
    newer = make_job(
        release=release,
        statuses={"fetch": "succeeded"},
        results={"fetch": {"files": ["config.json", "model.safetensors.index.json"]}},
    )

    page = logged_in_client.get(page_url(release))
    html = page.content.decode()

    assert page.status_code == 200
    assert panel_template("fetch") in rendered(page)
    assert '<h2 id="fetch-panel-title">Fetch &amp; parse</h2>' in html
    # The newest job's latest attempt and its stored result; the older job is in the history.
    runs = dom.find_all(html, 'p[class="meta stage-run"][id^="fetch-job-"]')
    assert [run["id"] for run in runs] == [f"fetch-job-{newer.pk}"]
    assert "Succeeded" in runs[0].text and "attempt 1" in runs[0].text
    assert f'id="history-job-{older.pk}"' in html
    assert '<p id="fetch-files">config.json, model.safetensors.index.json</p>' in html
    # Before the analysis: fetch comes first in the registry.
    assert html.index('id="fetch-panel"') < html.index('id="analysis"')

    live = logged_in_client.get(page_url(release), HTTP_HX_REQUEST="true").content.decode()
    assert '<section id="fetch-panel" hx-swap-oob="true">' in live
