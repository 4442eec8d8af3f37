"""Figures built once (`adaptation.charts.cache`): a chart's figure is read from the cache for
inputs it has drawn, and built anew for any other input, for a chart code change, and never
from a model instance."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.core.cache import cache

from adaptation.charts import cache as figure_cache
from adaptation.charts import stability as stability_charts
from adaptation.models import StageRun
from engine.stages.stability.result import StabilitySample
from tests.factories import make_job

SAMPLES = [
    StabilitySample(step=step, memory_bytes=1_000_000 + 4096 * step, elapsed_s=step / 100)
    for step in range(1, 41)
]
MEMORY = {
    "warmup_steps": 5,
    "slope_bytes_per_step": 4096.0,
    "threshold_bytes_per_step": 65536.0,
    "memory_kind": "process_rss",
}


@pytest.fixture(autouse=True)
def empty_cache():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def memory_chart():
    """`charts.stability.memory` cached as the module caches it, counting its builds."""
    builds: list[int] = []

    def memory(*args, **kwargs):
        builds.append(1)
        return stability_charts.memory.uncached(*args, **kwargs)

    chart = figure_cache.cached_figure(memory)
    chart.builds = builds
    return chart


def test_a_figure_is_built_once_for_the_same_inputs(memory_chart):
    first = memory_chart(SAMPLES, **MEMORY)
    second = memory_chart(list(SAMPLES), **dict(MEMORY))

    assert len(memory_chart.builds) == 1
    assert second == first
    assert first["data"], "a real figure, with traces"


def test_each_caller_gets_its_own_copy(memory_chart):
    first = memory_chart(SAMPLES, **MEMORY)
    first["layout"]["title"] = "changed by a caller"

    again = memory_chart(SAMPLES, **MEMORY)
    assert again["layout"]["title"] != "changed by a caller"


def test_other_inputs_draw_another_figure(memory_chart):
    leak = memory_chart(SAMPLES, **MEMORY)
    steeper = [replace(s, memory_bytes=s.memory_bytes + 65536 * s.step) for s in SAMPLES]
    changed = memory_chart(steeper, **(MEMORY | {"slope_bytes_per_step": 69632.0}))

    assert len(memory_chart.builds) == 2
    assert changed["data"][0]["y"] != leak["data"][0]["y"]


def test_nothing_to_draw_is_kept_too(memory_chart):
    assert memory_chart([], **MEMORY) is None
    assert memory_chart([], **MEMORY) is None
    assert len(memory_chart.builds) == 1


def test_the_key_holds_the_chart_code_version(monkeypatch):
    before = figure_cache.figure_key("charts.x", (SAMPLES,), MEMORY)
    monkeypatch.setattr(figure_cache, "CHART_CODE_VERSION", "edited")
    after = figure_cache.figure_key("charts.x", (SAMPLES,), MEMORY)

    assert before != after
    assert ":edited:" in after


def test_the_chart_code_version_follows_plotly(monkeypatch):
    version = figure_cache._code_version()
    assert version == figure_cache.CHART_CODE_VERSION
    # Another plotly draws differently: its version is part of the digest.
    monkeypatch.setattr(figure_cache.plotly, "__version__", "0.0-other")
    assert figure_cache._code_version() != version


def test_the_chart_code_holds_every_engine_module_a_chart_draws_with():
    """A typed result's judgement (what a chart marks as the knee, a leak, a failed level)
    and the formatting of its words are chart code: editing one draws the figures anew."""
    import importlib
    import inspect

    modules = set(figure_cache.chart_engine_modules())
    for name in (
        "engine.formatting",
        "engine.stored",
        "engine.stages.serve.result",
        "engine.stages.serve.full_size_result",
        "engine.stages.performance.result",
        "engine.stages.stability.result",
        "engine.stages.plan.result",
        "engine.stages.distributed.result",
    ):
        assert name in modules, name
    # Whatever a chart module holds of the engine, its module is part of the chart code.
    for chart in figure_cache._chart_modules():
        for value in vars(importlib.import_module(chart)).values():
            owner = inspect.getmodule(value)
            if owner is not None and owner.__name__.startswith("engine."):
                assert owner.__name__ in modules, (chart, owner.__name__)


def test_a_modules_engine_imports_are_read_in_every_form(tmp_path):
    source = tmp_path / "chart.py"
    source.write_text(
        "import engine.units, json\n"
        "from engine import formatting as fmt\n"
        "from .command import (\n    CommandChange,  # the diff\n    command_changes,\n)\n"
        "from ..plan.result import Split\n"
        "def lazy():\n    from engine.stored import text\n"
        "from django.db import models\n"
    )
    assert figure_cache._engine_imports("engine.stages.serve.chart", source) == {
        "engine",
        "engine.units",
        "engine.formatting",
        "engine.stages.serve.command",
        "engine.stages.plan.result",
        "engine.stored",
    }


def test_the_chart_code_version_follows_a_typed_result(monkeypatch):
    """An edit of a result module a chart draws through gives another version."""
    version = figure_cache._code_version()
    path = figure_cache._module_path("engine.stages.serve.result")
    edited = path.read_bytes() + b"\n# edited\n"
    real = figure_cache._module_path

    class Edited(type(path)):
        def read_bytes(self) -> bytes:
            return edited

    monkeypatch.setattr(
        figure_cache,
        "_module_path",
        lambda name: Edited(path) if name == "engine.stages.serve.result" else real(name),
    )
    assert figure_cache._code_version() != version


@pytest.mark.django_db
def test_a_model_instance_is_no_input():
    run = StageRun.objects.get(job=make_job(), stage="fetch")

    with pytest.raises(TypeError, match="StageRun"):
        figure_cache.figure_key("charts.x", (run,), {})


def test_the_release_page_charts_are_cached():
    from adaptation.charts import performance, plan, precision, serve

    for chart in (
        performance.curves,
        plan.memory_per_device,
        plan.decode_curve,
        plan.prefill_curve,
        plan.scaling_curve,
        precision.drift_figure,
        serve.sweep,
        serve.engine_metrics,
        stability_charts.memory,
        stability_charts.step_time,
    ):
        assert hasattr(chart, "uncached"), chart.__name__


def test_a_cached_figure_is_embedded_as_json_script_writes_it(memory_chart):
    from django.utils.html import json_script

    from adaptation.templatetags.day0_charts import figure_script

    built = memory_chart(SAMPLES, **MEMORY)  # built now
    cached = memory_chart(SAMPLES, **MEMORY)  # read back
    expected = json_script(dict(built), "stability-memory-figure")

    assert isinstance(cached, figure_cache.EmbeddedFigure)
    assert figure_script(built, "stability-memory-figure") == expected
    assert figure_script(cached, "stability-memory-figure") == expected
    # A plain figure (one no cache made) is written by json_script itself.
    assert figure_script(dict(cached), "stability-memory-figure") == expected
    # What a page could not hold inside <script> is escaped.
    figure = dict(cached) | {"layout": {"title": "</script><b>&"}}
    assert "</script><b>" not in figure_script(figure_cache.EmbeddedFigure.of(figure), "x")
