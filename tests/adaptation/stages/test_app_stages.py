"""Each stage's app-side pieces (`adaptation/stages/<name>.py`) against the engine registry,
the templates and the functions they name: a stage missing its module, a module for no stage,
a path to no function or a template that is not there fails here, not on a release page."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.template.loader import get_template

import adaptation.charts
import adaptation.stages
from adaptation.stages import AppStage, app_stage, app_stages
from engine.registry import stage_names

TEMPLATES_DIR = Path(django_settings.BASE_DIR) / "templates"
FUNCTION_PIECES = ("presenter", "store_result", "regression_figures")


def stage_modules() -> set[str]:
    return {module.name for module in pkgutil.iter_modules(adaptation.stages.__path__)}


def test_every_registered_stage_has_its_app_module():
    missing = [name for name in stage_names() if name not in stage_modules()]
    assert not missing, f"no adaptation/stages/<name>.py for {missing}"
    assert [app.name for app in app_stages()] == stage_names()


def test_every_app_module_names_a_registered_stage():
    assert stage_modules() <= set(stage_names()), "an app module for no registered stage"
    for name in stage_modules():
        module = importlib.import_module(f"adaptation.stages.{name}")
        assert isinstance(module.STAGE, AppStage), name
        assert module.STAGE.name == name


@pytest.mark.parametrize("piece", FUNCTION_PIECES)
def test_every_function_an_app_module_names_exists(piece):
    named = [app for app in app_stages() if getattr(app, piece) is not None]
    assert named, f"no stage names a {piece}"
    for app in named:
        assert callable(app.resolved(piece)), f"{app.name}.{piece} = {getattr(app, piece)}"


def test_every_template_an_app_module_names_exists():
    for app in app_stages():
        for template in (app.panel_template, app.cell_figure_template):
            if template is not None:
                get_template(template)  # raises TemplateDoesNotExist without one


def test_every_panel_and_board_cell_template_is_named_by_its_stage():
    """A template its stage's module does not name would never be drawn."""
    for folder, piece in (("panels", "panel_template"), ("board_cells", "cell_figure_template")):
        files = sorted((TEMPLATES_DIR / "adaptation" / folder).glob("*.html"))
        assert files, folder
        for path in files:
            app = app_stage(path.stem)
            assert app is not None, f"{path} is no registered stage's"
            assert getattr(app, piece) == f"adaptation/{folder}/{path.name}"


def test_every_chart_module_an_app_module_names_exists_and_each_stage_chart_is_named():
    named = {module for app in app_stages() for module in app.charts}
    for module in named:
        importlib.import_module(module)
    stage_charts = {
        f"adaptation.charts.{module.name}"
        for module in pkgutil.iter_modules(adaptation.charts.__path__)
        if module.name in stage_names()
    }
    assert stage_charts, "no adaptation/charts/<stage>.py found"
    assert stage_charts <= named, "a stage's chart module its app module does not name"


def test_a_panel_shows_only_registered_stages():
    for app in app_stages():
        assert set(app.panel_also_shows) <= set(stage_names()) - {app.name}, app.name
    assert app_stage("operators").panel_stages == ("operators", "precision")


def test_a_registered_stage_without_its_app_module_fails_loudly(monkeypatch):
    monkeypatch.setattr(adaptation.stages, "stage_names", lambda: [*stage_names(), "quantize"])
    with pytest.raises(ImportError):
        app_stage("quantize")
    with pytest.raises(ImportError):
        app_stages()


def test_a_stage_run_of_no_registered_stage_has_no_app_pieces():
    assert app_stage("no_such_stage") is None


def test_a_module_registering_another_stage_is_refused(monkeypatch):
    from adaptation.stages import plan

    monkeypatch.setattr(plan, "STAGE", dataclasses.replace(plan.STAGE, name="distributed"))
    with pytest.raises(LookupError, match=r"plan\.py registers stage 'distributed'"):
        app_stage("plan")


def test_a_path_to_no_function_is_refused():
    app = AppStage(name="fetch", store_result="adaptation.services.stage_results:store_nothing")
    with pytest.raises(AttributeError):
        app.resolved("store_result")


@pytest.mark.parametrize(
    "pieces",
    [
        {"presenter": "adaptation.presenters.stage_panels:plan_panel"},
        {"always_drawn": True},
        {"panel_also_shows": ("precision",)},
        {"cell_figure_keys": ("counts", "missing")},
        {"cell_figure_template": "adaptation/board_cells/operators.html"},
    ],
)
def test_pieces_that_cannot_work_together_are_refused(pieces):
    with pytest.raises(ValueError, match="the operators stage"):
        AppStage(name="operators", **pieces)
