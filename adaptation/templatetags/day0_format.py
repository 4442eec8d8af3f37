"""Filters that write day0's numbers with their units, the same way on every page.

Each filter is a formatter of `engine.formatting` (the one set of number, unit and duration
writers, shared with the notes and the commands): a missing or non-numeric value becomes an
em dash, so a template never shows "None" or crashes on a key a stage did not fill.
"""

from __future__ import annotations

from typing import Any

from django import template

from engine import formatting

register = template.Library()

register.filter("params", formatting.params_words)
register.filter("params_short", formatting.params)
register.filter("gib", formatting.gib)
register.filter("mib", formatting.mib)
register.filter("bytes_per_token", formatting.bytes_per_token)
register.filter("count", formatting.count)
register.filter("duration", formatting.duration)
register.filter("hours_duration", formatting.hours_duration)
register.filter("ms", formatting.ms)
register.filter("rate", formatting.rate)
register.filter("tokens_per_s", formatting.tokens_per_s)
register.filter("seconds", formatting.seconds)
register.filter("scientific", formatting.scientific)
register.filter("percent", formatting.percent)
register.filter("signed_percent", formatting.signed_percent)
register.filter("bytes_per_step", formatting.bytes_per_step)
register.filter("gb_per_s", formatting.gb_per_s)
register.filter("tflops", formatting.tflops)
register.filter("split", formatting.split)
register.filter("validated_split", formatting.validated_split)
register.filter("plain", formatting.plain)
register.filter("sig", formatting.sig)


@register.filter
def dash(value: Any) -> Any:
    """The value itself, or an em dash when it is None or an empty string."""
    if value is None or value == "":
        return formatting.MISSING
    return value


@register.filter
def short_revision(value: Any) -> str:
    """The first 12 characters of a revision (a commit hash is unambiguous at that length)."""
    if not value:
        return formatting.MISSING
    return str(value)[:12]
