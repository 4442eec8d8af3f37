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
  every engine module they import, directly or not: the typed results that judge what a
  chart draws, the formatting that words it) and of plotly's version, so an edit of a chart,
  of a rule it draws, or a plotly upgrade draws every figure anew.

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
import re
from collections.abc import Callable, Mapping, Set
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import plotly
from django.core.cache import cache
from django.core.serializers.json import DjangoJSONEncoder

# The package whose modules a chart draws with (its typed results judge what a chart draws,
# `engine.formatting` words its numbers): every one the charts import, directly or through
# each other, is part of the chart code (`chart_engine_modules`).
_ENGINE = "engine"
# How long (s) an unused figure is kept: its key never goes stale, so this only bounds the
# room figures take in a shared cache.
FIGURE_TIMEOUT_S = 7 * 24 * 3600
_MISSING = object()
# What `django.utils.html.json_script` escapes, so the text is safe inside a <script>.
_SCRIPT_ESCAPES = {ord(">"): "\\u003E", ord("<"): "\\u003C", ord("&"): "\\u0026"}

F = TypeVar("F", bound=Callable[..., Any])


def _module_path(name: str) -> Path | None:
    """The source file of module `name` (a module, or a package's `__init__`), found by its
    name alone: nothing is imported. None when there is none (`name` is no module)."""
    spec = importlib.util.find_spec(name.partition(".")[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(next(iter(spec.submodule_search_locations))).joinpath(*name.split(".")[1:])
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


# An import statement, anywhere in a module (a function's own imports too): `from X import
# names` (names in parentheses may span lines) or `import a, b.c`. Read as text, not parsed:
# a module's imports are all this needs, and parsing every module costs a second at start.
_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w., \t]+)", re.M)


def _names(listed: str) -> list[str]:
    """The names an import lists ("a, b as c" or "(a,\n b,  # why\n)"), aliases dropped."""
    listed = re.sub(r"#[^\n]*", "", listed).strip("() \t\n")
    return [part.split()[0] for part in listed.split(",") if part.strip()]


def _engine_imports(name: str, path: Path) -> set[str]:
    """The `engine` modules that module `name` (its source at `path`) imports: relative
    imports resolved, and `from a import b` counted as `a.b` where b is a module."""
    source = path.read_text()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = {module for match in _IMPORT.finditer(source) for module in _names(match[1])}
    for match in _FROM_IMPORT.finditer(source):
        base = match[1]
        if base.startswith("."):
            module = base.lstrip(".")
            parts = package.split(".")
            parts = parts[: len(parts) - (len(base) - len(module)) + 1]
            base = ".".join([*parts, *([module] if module else [])])
        found.add(base)
        found.update(f"{base}.{imported}" for imported in _names(match[2]))
    return {
        module
        for module in found
        if module.partition(".")[0] == _ENGINE and _module_path(module) is not None
    }


def _chart_modules() -> list[str]:
    import adaptation.charts as package

    return [f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)]


def chart_engine_modules() -> list[str]:
    """The engine modules the chart code draws with, sorted: every `engine` module an
    `adaptation.charts` module imports, and every one those import in turn."""
    pending, seen = _chart_modules(), set()
    while pending:
        name = pending.pop()
        path = _module_path(name)
        if path is None:
            continue
        found = _engine_imports(name, path) - seen
        seen |= found
        pending.extend(found)
    return sorted(seen)


def _code_version() -> str:
    """A digest of the chart code: the source of every `adaptation.charts` module and of the
    engine modules they draw with (`chart_engine_modules`), and plotly's version."""
    digest = hashlib.sha256(plotly.__version__.encode())
    for name in sorted([*_chart_modules(), *chart_engine_modules()]):
        digest.update(name.encode())
        digest.update(_module_path(name).read_bytes())
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
