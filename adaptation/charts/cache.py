"""Figures built once: a chart function's figure JSON kept in Django's cache.

Building a plotly figure costs tens of milliseconds (plotly validates every property it is
given), and a release page draws about ten, so a page view would spend most of its time
rebuilding figures it drew on the last view. `cached_figure` wraps a chart function: the
figure is built on its first call for given inputs and read from the cache after that.

The key holds everything the figure depends on, so a cached figure is never stale:
- the chart function's name;
- a digest of the inputs it is handed (canonical JSON: a stage run's stored result changes,
  or a page asks for another view, and the key is another key);
- `CHART_CODE_VERSION`, a digest of the chart code (every module of `adaptation.charts` and
  the engine modules they format with) and of plotly's version, so an edit of a chart or a
  plotly upgrade draws every figure anew.

Only the figure (plotly JSON, or None for "nothing to draw") is cached, never page state,
with the same figure as text ready to embed in a page's `<script type="application/json">`
(`EmbeddedFigure.script_json`), so that a page view does not serialise it again. The cache is
Django's default (`DAY0_CACHE_URL`: a per-process memory cache when blank, Redis shared by
every process otherwise); a lost entry is only built again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import pkgutil
from collections.abc import Callable, Mapping, Set
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import plotly
from django.core.cache import cache
from django.core.serializers.json import DjangoJSONEncoder

# Engine modules whose code shapes a figure's words or numbers (the charts import them; a
# stage's typed result judges what a chart draws, a stop's cause say).
_ENGINE_MODULES = (
    "engine.formatting",
    "engine.units",
    "engine.stages.performance.result",
    "engine.stages.stability.result",
)
# How long (s) an unused figure is kept: its key never goes stale, so this only bounds the
# room figures take in a shared cache.
FIGURE_TIMEOUT_S = 7 * 24 * 3600
_MISSING = object()
# What `django.utils.html.json_script` escapes, so the text is safe inside a <script>.
_SCRIPT_ESCAPES = {ord(">"): "\\u003E", ord("<"): "\\u003C", ord("&"): "\\u0026"}

F = TypeVar("F", bound=Callable[..., Any])


def _code_version() -> str:
    """A digest of the chart code: the source of every `adaptation.charts` module, of
    `_ENGINE_MODULES`, and plotly's version."""
    import adaptation.charts as package

    names = [f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)]
    digest = hashlib.sha256(plotly.__version__.encode())
    for name in sorted([*names, *_ENGINE_MODULES]):
        origin = importlib.util.find_spec(name).origin
        digest.update(name.encode())
        digest.update(Path(origin).read_bytes())
    return digest.hexdigest()[:16]


CHART_CODE_VERSION = _code_version()


def _plain(value: Any) -> Any:
    """`value` as JSON for the key (`json.dumps`'s `default`). Raises TypeError for a value
    that has no canonical JSON form (a model instance, say): a chart's inputs must be data."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Set):
        return sorted(value, key=repr)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(
        f"a cached figure's input must be JSON-like data, not {type(value).__name__}: "
        "hand the chart the values it draws"
    )


class EmbeddedFigure(dict):
    """A figure (plotly JSON as a dict) with `script_json`: the same figure as the text
    `django.utils.html.json_script` would write inside its <script>, made once with it."""

    script_json: str

    @classmethod
    def of(cls, figure: dict[str, Any], script_json: str | None = None) -> EmbeddedFigure:
        embedded = cls(figure)
        embedded.script_json = script_json if script_json is not None else script_text(figure)
        return embedded


def script_text(figure: dict[str, Any]) -> str:
    """`figure` as JSON text safe inside a <script> element (as `json_script` writes it)."""
    return json.dumps(figure, cls=DjangoJSONEncoder).translate(_SCRIPT_ESCAPES)


def figure_key(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The cache key of chart `name` drawn from `args` and `kwargs` (see the module's
    docstring). Raises TypeError when an input is not JSON-like data."""
    payload = json.dumps([args, kwargs], sort_keys=True, default=_plain, separators=(",", ":"))
    digest = hashlib.sha256(payload.encode()).hexdigest()
    return f"day0:figure:{CHART_CODE_VERSION}:{name}:{digest}"


def cached_figure(build: F) -> F:
    """`build` (a chart function returning figure JSON or None) with its figures kept in the
    cache by `figure_key`, returned as `EmbeddedFigure`s. Every call returns its own copy (the
    cache hands out copies), so a caller may change the figure it gets; its `script_json` is
    the figure as built."""
    name = f"{build.__module__}.{build.__qualname__}"

    @functools.wraps(build)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = figure_key(name, args, kwargs)
        stored = cache.get(key, _MISSING)
        if stored is not _MISSING:
            figure, text = stored["figure"], stored["json"]
            return None if figure is None else EmbeddedFigure.of(figure, text)
        figure = build(*args, **kwargs)
        text = None if figure is None else script_text(figure)
        # Wrapped, so that "nothing to draw" (None) is kept too.
        cache.set(key, {"figure": figure, "json": text}, timeout=FIGURE_TIMEOUT_S)
        return None if figure is None else EmbeddedFigure.of(figure, text)

    wrapper.uncached = build  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
