"""Calling `manage.py plan` from a test: its JSON answer, or its one-line refusal."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError


def plan_json(*args: str) -> dict:
    """`manage.py plan ARGS --format json`, parsed."""
    out = io.StringIO()
    call_command("plan", *args, "--format", "json", stdout=out)
    return json.loads(out.getvalue())


def plan_refused(*args: str) -> tuple[CommandError, str]:
    """The `CommandError` `manage.py plan ARGS` exits with (its message one line) and what it
    printed before."""
    out = io.StringIO()
    with pytest.raises(CommandError) as err:
        call_command("plan", *args, stdout=out)
    assert "\n" not in str(err.value)
    return err.value, out.getvalue()
