"""Whose fault a stage's failure is, and the words a manager reads for it.

Every failed stage run is classified (`StageRun.failure_class`, docs/limitations.md "Failure
classes"):

- **infrastructure**: a time limit (soft or hard), a lost worker, the host out of memory
  (`MemoryError`, torch's out-of-memory on the host), the broker, hub or network unavailable (a
  transient error given up, an `OSError` of the network), a serving engine that did not start
  for a host reason (the serve stage's `failure.culprit`), and a day0 error (an unexpected
  exception in day0's own code, not the release's fault either);
- **release**: the stage's own `StageFailed` (its config, an unsupported feature, precision,
  no fit, an engine that refuses the architecture).

Only a release failure raises known limitations. The error stored for an infrastructure cause
reads as words ("ran past its time budget of 180 s"); an exception's class name and traceback
go to the run's log only.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from adaptation.models import FailureClass
from engine.stored import StageFailure

# Class names of the exceptions a time limit raises in a worker (Celery's soft limit; billiard's
# hard one), matched by name in the texts a stage wrote of what it caught.
TIME_LIMIT_NAMES = ("SoftTimeLimitExceeded", "TimeLimitExceeded")
# The host (not the device the release was measured on) ran out of memory.
HOST_MEMORY_NAMES = ("MemoryError",)
# What a stage's text says when it caught an infrastructure cause and carried on to fail.
_INFRA_MARKS = (*TIME_LIMIT_NAMES, *HOST_MEMORY_NAMES)

# The words for an unexpected exception in day0's own code (its traceback in the log).
DAY0_ERROR = "day0 error"


@dataclass(frozen=True)
class Classified:
    """A failure's class and the words stored as the run's error."""

    failure_class: str
    error: str


def time_budget_error(stage: str, limit_s: float | None) -> str:
    """The error of a stage stopped by its (soft) time limit."""
    budget = f" of {limit_s:g} s" if isinstance(limit_s, int | float) and limit_s else ""
    return (
        f"{stage} ran past its time budget{budget} and was stopped: the host was too slow or "
        "too busy for it, not a fault of the release."
    )


def _texts(reason: str, result: Any) -> Iterable[str]:
    yield reason
    if not isinstance(result, dict):
        return
    for error in result.get("errors") or ():
        if isinstance(error, dict):
            yield str(error.get("error") or "")
    for message in result.get("error_messages") or ():  # the stability stage's
        yield str(message)
    if isinstance(result.get("error"), str):
        yield result["error"]


def mentions_time_limit(reason: str, result: Any = None) -> bool:
    """Whether the stage's reason or its result's errors name a time limit it caught (the
    performance sweep records what the twin raised, the soft limit included)."""
    return any(name in text for text in _texts(reason, result) for name in TIME_LIMIT_NAMES)


def mentions_host_memory(reason: str, result: Any = None) -> bool:
    """Whether the stage's reason or its result's errors name the host out of memory."""
    return any(
        f"{name}:" in text or text.strip() == name or f"{name}(" in text
        for text in _texts(reason, result)
        for name in HOST_MEMORY_NAMES
    )


def result_culprit(result: Any) -> str | None:
    """Whom a stage's own failure blames where its result says (its `failure`, read as every
    stage's is: `engine.stored.StageFailure`); None otherwise, or for a culprit that is no
    failure class."""
    failure = StageFailure.of(result)
    culprit = failure.culprit if failure is not None else None
    return culprit if culprit in FailureClass.values else None


def classify_stage_failed(
    *, stage: str, reason: str, result: Any, limit_s: float | None, ran_s: float | None
) -> Classified:
    """A stage's own `StageFailed` (`reason`, what it measured `result`): the release's fault,
    unless it stopped for an infrastructure cause it caught and carried on with:

    - it ran at least its soft time limit (`ran_s` >= `limit_s`: Celery's signal fired while it
      ran), or its texts name a time limit: the time budget's words;
    - its texts name the host out of memory: infrastructure, the reason kept;
    - its result's `failure.culprit` says whose fault (the serve stage's launch failures)."""
    ran_out = (
        isinstance(limit_s, int | float)
        and limit_s > 0
        and isinstance(ran_s, int | float)
        and ran_s >= limit_s
    )
    if ran_out or mentions_time_limit(reason, result):
        return Classified(FailureClass.INFRASTRUCTURE, time_budget_error(stage, limit_s))
    if mentions_host_memory(reason, result):
        return Classified(
            FailureClass.INFRASTRUCTURE,
            f"{stage} stopped: the host ran out of memory ({_without_names(reason)}).",
        )
    culprit = result_culprit(result)
    return Classified(culprit or FailureClass.RELEASE, reason)


def _without_names(text: str) -> str:
    for name in (*_INFRA_MARKS, "OutOfMemoryError"):
        text = text.replace(f"{name}: ", "").replace(f"{name}()", "").replace(name, "")
    return text.strip(" ;:,") or "no detail"


def _is_network(exc: BaseException) -> bool:
    return isinstance(
        exc, ConnectionError | TimeoutError | socket.gaierror | socket.herror | socket.timeout
    )


def classify_exception(*, stage: str, exc: BaseException) -> Classified:
    """An exception no stage turned into a `StageFailed`: the host out of memory, the network
    unavailable, or else a day0 error. Always the infrastructure's side (never the release's);
    the words name no exception class."""
    name = type(exc).__name__
    message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    if isinstance(exc, MemoryError) or name == "OutOfMemoryError" or _allocator_oom(exc):
        return Classified(
            FailureClass.INFRASTRUCTURE,
            f"{stage} stopped: the host ran out of memory"
            + (f" ({message})" if message else "")
            + ".",
        )
    if _is_network(exc) or (isinstance(exc, OSError) and _network_errno(exc)):
        return Classified(
            FailureClass.INFRASTRUCTURE,
            f"{stage} stopped: the network was unavailable"
            + (f" ({message})" if message else "")
            + ".",
        )
    return Classified(
        FailureClass.INFRASTRUCTURE,
        f"{DAY0_ERROR}: {stage} stopped on an unexpected error in day0"
        + (f" ({message})" if message else "")
        + "; not a fault of the release. The details are in the stage's log.",
    )


_OOM_TEXTS = ("can't allocate memory", "out of memory", "cannot allocate memory")


def _allocator_oom(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _OOM_TEXTS)


# errno values of an unreachable network or peer (Linux and BSD share these names).
_NETWORK_ERRNOS = (
    "ECONNREFUSED",
    "ECONNRESET",
    "ECONNABORTED",
    "EHOSTUNREACH",
    "ENETUNREACH",
    "ENETDOWN",
    "ETIMEDOUT",
    "EPIPE",
)


def _network_errno(exc: OSError) -> bool:
    import errno

    return exc.errno in {getattr(errno, name) for name in _NETWORK_ERRNOS if hasattr(errno, name)}
