"""Job options as people type them: the `adapt` and `plan` commands' --context,
--concurrency, --dtype and --options, and the release page's "Adapt on pool…" form
(`adaptation.adapt_forms`). One set of checks, each refusal a one-line `CommandError` naming
the flag; every stage's own check runs through `engine.registry.job_options_check`."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError

from engine.registry import job_options_check
from engine.stages.plan.errors import PlanInputError
from engine.stages.plan.options import plan_options

EXAMPLE_OPTIONS = '{"stability": {"duration_s": 5}, "performance": {"max_batch_size": 8}}'


def positive_int(option: str, text: str | None, *, limit: int) -> int | None:
    """`text` as an integer from 1 to `limit`; None when not given. Raises `CommandError`."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise CommandError(f"{option} must be a whole number, got {text!r}") from None
    if value < 1:
        raise CommandError(f"{option} must be at least 1, got {value}")
    if value > limit:
        raise CommandError(f"{option} = {value:,} is implausibly large (limit {limit:,})")
    return value


def plan_options_from_args(
    context: str | None, concurrency: str | None, dtype: str | None
) -> dict[str, Any]:
    """The plan options given as --context, --concurrency and --dtype, checked by
    `engine.stages.plan.plan_options` (the check a job's options get); unset ones are left
    out. Raises `CommandError` with a one-line reason."""
    try:
        return plan_options(
            {
                "context_tokens": positive_int("--context", context, limit=10**12),
                "concurrency": positive_int("--concurrency", concurrency, limit=10**12),
                "dtype": dtype,
            }
        )
    except PlanInputError as exc:
        raise CommandError(" ".join(str(exc).split())) from exc


def job_options_from_args(text: str | None, plan: dict[str, Any]) -> dict[str, Any]:
    """The job's per-stage options: --options (a JSON object keyed by stage name) with the
    plan options of --context/--concurrency/--dtype merged into its "plan" entry, checked by
    each stage's `check_options` (`services.job_options_check`). Raises `CommandError` with a
    one-line reason for malformed JSON, a value that is not an object, an option given both
    ways, or options a stage refuses."""
    options: dict[str, Any] = {}
    if text is not None:
        try:
            options = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CommandError(
                f"--options is not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})"
            ) from None
        if not isinstance(options, dict) or not all(
            isinstance(value, dict) for value in options.values()
        ):
            raise CommandError(
                "--options must be a JSON object mapping stage names to objects of their "
                f"options, e.g. '{EXAMPLE_OPTIONS}'"
            )
    if plan:
        given = dict(options.get("plan") or {})
        both = sorted(set(given) & set(plan))
        if both:
            raise CommandError(
                f"plan {'option' if len(both) == 1 else 'options'} {', '.join(both)} given both in "
                "--options and as --context/--concurrency/--dtype; give each once"
            )
        options["plan"] = given | plan
    try:
        return job_options_check(options=options or None)
    except ValueError as exc:
        raise CommandError(" ".join(str(exc).split())) from exc
