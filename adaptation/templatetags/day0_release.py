"""The release page's filters for what it writes a great many times.

`{{ figure|analysis_label }}`: the label of an analysis figure, as
`partials/analysis_label.html` words it.

The label is a function of the figure's key, group and title only, and the partial is a long
chain of `{% elif %}` (one per known key): rendered for each of a release's ~60 figures on
every view it cost more than the rest of the analysis panel. Each distinct (key, group, title)
is rendered once per process and remembered; the words stay in the template.

`{{ value|perf_value:unit }}`: a performance figure in its table column's unit, through the
one set of writers (`engine.formatting`), for the hundreds of cells of the points table.
"""

from __future__ import annotations

import functools
from typing import Any

from django import template
from django.template.loader import get_template
from django.utils.safestring import SafeString, mark_safe

from engine import formatting

register = template.Library()

LABEL_TEMPLATE = "adaptation/partials/analysis_label.html"


@functools.lru_cache(maxsize=2048)
def _label(key: str, group: str, title: str) -> SafeString:
    text = get_template(LABEL_TEMPLATE).render(
        {"figure": {"key": key, "group": group, "title": title}}
    )
    # Written a branch per line: its words on one line (as `{% words %}` renders them).
    # The template escaped what it wrote: the joined text is safe as it is.
    return mark_safe("".join(line.strip() for line in text.splitlines()))


@register.filter
def analysis_label(figure: Any) -> SafeString:
    """The figure's label (escaped by the template that writes it)."""
    return _label(str(figure.key), str(figure.group or ""), str(figure.title or ""))


# The writer of each unit a points-table column draws in (`presenters.performance_points`).
_PERF_WRITERS = {
    "ms": formatting.ms,
    "tokens/s": formatting.tokens_per_s,
    "MiB": formatting.mib,
    "%": formatting.percent,
}


@register.filter
def perf_value(value: Any, unit: str) -> str:
    """A performance figure (`value`; seconds for "ms", bytes for "MiB", a fraction for "%")
    written in `unit`; another unit after four significant digits; the em dash when
    missing."""
    if value is None:
        return formatting.MISSING
    writer = _PERF_WRITERS.get(unit)
    if writer is not None:
        return writer(value)
    text = formatting.sig(value, 4)
    return f"{text} {unit}" if unit else text
