"""Filters for the Markdown templates (`templates/release_notes/`, the "markdown" engine,
autoescape off): every string a result carries goes through `md` or `md_code`
(`engine.markdown`), so it renders literally; numbers go through `day0_format`.

The few formats here exist nowhere else: a split's notation ("TP 8 · PP 1 · EP 8 · DP 1"),
a memory slope in bytes per step and a signed drift.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django import template

from engine import formatting, markdown
from engine.stages.release_notes.run import SEVERITY_ORDER

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
def parallel_split(split: Any) -> str:
    """A plan's split as the notes write it: "TP 8 · PP 1 · EP 8 · DP 1"; "—" for none."""
    if not split or not isinstance(split, Mapping):
        return formatting.MISSING
    return " · ".join(f"{key.upper()} {split.get(key)}" for key in ("tp", "pp", "ep", "dp"))


@register.filter
def validated_split(split: Any) -> str:
    """The split the distributed stage ran: "TP 2", "TP 2 · EP 2" (EP only above 1)."""
    split = split if isinstance(split, Mapping) else {}
    ep = split.get("ep")
    return f"TP {split.get('tp')}" + (f" · EP {ep}" if isinstance(ep, int) and ep > 1 else "")


@register.filter
def bytes_per_step(value: Any) -> str:
    """A memory slope (bytes per step), whole bytes: 123456.7 → "123,457 bytes/step"."""
    number = formatting.finite(value)
    return formatting.MISSING if number is None else f"{number:,.0f} bytes/step"


@register.filter
def signed_percent(value: Any) -> str:
    """A fraction as a signed percentage with one decimal: 0.012 → "+1.2%"."""
    number = formatting.finite(value)
    return formatting.MISSING if number is None else f"{number:+.1%}"


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
