"""The timing knobs of lost work, checked together when day0 starts.

A stage attempt whose worker is lost is found by one of three clocks: its heartbeat going stale
(`DAY0_HEARTBEAT_EVERY_S`, `DAY0_STALE_HEARTBEAT_S`, looked at every `DAY0_REAP_EVERY_S` by the
reaper), or the broker giving its unacknowledged message to another worker (Redis's
`visibility_timeout`, `DAY0_VISIBILITY_TIMEOUT_S`). `lost_work_check` refuses settings under
which a live stage would look lost, lost work would wait longer than `DAY0_RESUME_WITHIN_S`, or
the broker would hand a live long stage's message to a second worker (docs/operations.md, "Lost
work and retries").
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

# The default visibility timeout: the longest registered stage hard time limit plus this.
VISIBILITY_MARGIN_S = 300


def longest_stage_time_limit_s() -> int:
    """The longest hard time limit of the registered stages, seconds (their fixed limits:
    a stability run with a longer `duration_s` gets longer ones)."""
    from engine.registry import STAGES

    return max(stage.time_limit_s for stage in STAGES)


def default_visibility_timeout_s() -> int:
    """`DAY0_VISIBILITY_TIMEOUT_S` when unset: the longest stage hard time limit plus
    `VISIBILITY_MARGIN_S`."""
    return longest_stage_time_limit_s() + VISIBILITY_MARGIN_S


def lost_work_problems(
    *,
    heartbeat_every_s: float,
    stale_heartbeat_s: float,
    reap_every_s: float,
    resume_within_s: float,
    visibility_timeout_s: float,
    longest_time_limit_s: float,
) -> list[str]:
    """What is wrong with these knobs together, one sentence each naming the variables;
    [] when they agree:

    - the stale threshold must exceed two heartbeat periods (one late beat is no loss);
    - the stale threshold plus the reaper's period is how long lost work may wait, at most
      `DAY0_RESUME_WITHIN_S` (60 s unless raised on purpose);
    - the visibility timeout must be at least the longest stage hard time limit, so the broker
      does not hand a live stage's message to a second worker (whose claim would refuse it).
    """
    problems = []
    if stale_heartbeat_s <= 2 * heartbeat_every_s:
        problems.append(
            f"DAY0_STALE_HEARTBEAT_S={stale_heartbeat_s:g} must exceed 2 x "
            f"DAY0_HEARTBEAT_EVERY_S={heartbeat_every_s:g}: a live stage would look lost "
            "after one late heartbeat."
        )
    if stale_heartbeat_s + reap_every_s > resume_within_s:
        problems.append(
            f"DAY0_STALE_HEARTBEAT_S={stale_heartbeat_s:g} + DAY0_REAP_EVERY_S="
            f"{reap_every_s:g} is {stale_heartbeat_s + reap_every_s:g} s, longer than "
            f"DAY0_RESUME_WITHIN_S={resume_within_s:g}: lost work would wait that long "
            "(lower them, or raise DAY0_RESUME_WITHIN_S to accept slower resumes)."
        )
    if visibility_timeout_s < longest_time_limit_s:
        problems.append(
            f"DAY0_VISIBILITY_TIMEOUT_S={visibility_timeout_s:g} is below the longest stage "
            f"hard time limit ({longest_time_limit_s:g} s): the broker would hand a live "
            "stage's message to a second worker."
        )
    return problems


def lost_work_check(**knobs: float) -> None:
    """Raise `ImproperlyConfigured` listing every problem `lost_work_problems` finds."""
    problems = lost_work_problems(**knobs)
    if problems:
        raise ImproperlyConfigured(" ".join(problems))
