"""Filters for the Markdown templates (`templates/release_notes/`, the "markdown" engine,
autoescape off): every string a result carries goes through `md` or `md_code`
(`engine.markdown`), so it renders literally; numbers and splits go through `day0_format`
(`engine.formatting`, the one set of writers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django import template

from engine import formatting, markdown
from engine.findings import SEVERITIES as SEVERITY_ORDER

register = template.Library()


@register.filter
def md(value: Any) -> str:
    """`value` as one line of Markdown text that renders literally (`engine.markdown.text`)."""
    return markdown.text(value)


@register.filter
def md_code(value: Any) -> str:
    """`value` as an inline code span (`engine.markdown.code`)."""
    return markdown.code(value)


@register.filter
def md_code_block(value: Any, info: str = "") -> str:
    """`value` as a fenced code block with the info string `info` ("sh")."""
    return markdown.code_block(str(value), str(info))


@register.filter
def md_indent(value: Any) -> str:
    """Markdown `value` (stripped) indented by two spaces, to sit inside a list item; blank
    lines stay empty."""
    lines = str(value).strip().splitlines()
    return "\n".join("  " + line if line.strip() else "" for line in lines)


@register.filter
def rstrip(value: Any, chars: str) -> str:
    """`value` without the trailing `chars` (a reason's own "." before the sentence's)."""
    return str(value).rstrip(chars)


@register.filter
def full_stop(value: Any) -> str:
    """`value` ending with a full stop: one added unless it has one."""
    text = str(value)
    return text if text.endswith(".") else text + "."


@register.filter
def exit_status(code: Any) -> str:
    """How a process ended, from its exit code (`engine.formatting.exit_status`): -9 → "was
    killed by SIGKILL", None → "ended with no exit status recorded"."""
    return formatting.exit_status(code)


@register.filter
def is_finite(value: Any) -> bool:
    """Whether `value` is a finite number (`engine.formatting.finite`; 0 is one)."""
    return formatting.finite(value) is not None


@register.filter
def by_severity(limitations: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The limitations in groups [{"severity", "limitations"}], most severe first
    (`SEVERITY_ORDER`), then one group (severity None) of any other severity; empty groups
    left out, each group in the order given."""
    groups = []
    for severity in [*SEVERITY_ORDER, None]:
        group = [
            item
            for item in limitations or ()
            if item.get("severity") == severity
            or (severity is None and item.get("severity") not in SEVERITY_ORDER)
        ]
        if group:
            groups.append({"severity": severity, "limitations": group})
    return groups
