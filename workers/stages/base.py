"""The stage contract: plain inputs in, a JSON-able result out, no Django.

A stage is a function `run(ctx: StageContext) -> dict`. The Celery task loads the rows, builds
the context, calls the stage and stores what it returns (or the error it raises) through a
service. Stages are listed, in order, in `workers.stages.registry`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Real weights load in float32 (twice the bf16 bytes) and precision holds a reference and a
# target copy: 1 GiB of checkpoint is about 4 GiB of memory and a few minutes on 2 CPU cores.
DEFAULT_REAL_WEIGHTS_MAX_BYTES = 1024**3


class StageFailed(Exception):
    """The stage ran and the release cannot pass it: a user error (bad config, unknown
    architecture). Fails the stage at once with `reason`; never retried."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StageTransientError(Exception):
    """Something outside the release failed (network, hub rate limit). The task retries with
    backoff; `retry_after_s` is a lower bound on the wait, when the cause says one."""

    def __init__(self, reason: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class ReleaseRef:
    """The release a job adapts: where it lives and at which revision."""

    hub_kind: str
    hub_endpoint: str
    repo_id: str
    revision: str


@dataclass(frozen=True)
class PoolSpec:
    """The accelerator pool whose worker runs the stage.

    `backend` is the torch device type ("cpu", "cuda", "xpu", a PrivateUse1 name) or
    "manifest" for an accelerator whose worker is not here; `device` is the torch device the
    worker uses ("cpu", "cuda:0"). `dtypes` are the serving dtypes the pool declares (torch
    names: "bfloat16", "float16", "int8", "float8_e4m3fn"). `operator_manifest` is the parsed
    manifest of supported operators and dtypes, for a "manifest" pool. `trust_remote_code_orgs`
    names the orgs whose shipped modeling code may run. `precision_thresholds` overrides the
    default thresholds per dtype ({"bfloat16": {"min_top1_agreement": 0.9, ...}}). A release
    whose checkpoint is at most `real_weights_max_bytes` (bytes, as published) and lies in a
    mirror folder is validated on its real weights at full size instead of a scaled twin.
    """

    name: str
    backend: str
    queue: str
    device: str = "cpu"
    dtypes: tuple[str, ...] = ("bfloat16", "float16")
    operator_manifest: Mapping[str, Any] | None = None
    trust_remote_code_orgs: tuple[str, ...] = ()
    precision_thresholds: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    real_weights_max_bytes: int = DEFAULT_REAL_WEIGHTS_MAX_BYTES


def _ignore(_message: str) -> None:
    return None


@dataclass(frozen=True)
class StageContext:
    """Everything a stage may read.

    `previous` maps each earlier stage's name to its stored result dict (latest attempt).
    `known_families` holds analysis dicts of earlier releases (one per model family, newest
    first) for "what is new". `log` appends a line to the stage's log excerpt.
    """

    release: ReleaseRef
    pool: PoolSpec
    previous: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    known_families: tuple[dict[str, Any], ...] = ()
    log: Callable[[str], None] = _ignore


@dataclass(frozen=True)
class StageDefinition:
    """One entry of the stage registry.

    `run` is the stage function, or its import path "package.module:function" (imported on
    first call, so that reading the registry stays cheap). `soft_time_limit_s`/`time_limit_s`
    become the Celery task's limits for this stage.
    """

    name: str
    title: str
    run: Callable[[StageContext], dict[str, Any]] | str
    description: str = ""
    soft_time_limit_s: int = 300
    time_limit_s: int = 360
    # Whether `run` reads `ctx.known_families` (it costs a query over earlier analyses).
    reads_known_families: bool = False

    def __call__(self, ctx: StageContext) -> dict[str, Any]:
        """Run the stage. Raises what the stage raises; ImportError for a bad `run` path."""
        run = self.run
        if isinstance(run, str):
            module_name, _, function = run.partition(":")
            run = getattr(importlib.import_module(module_name), function)
        return run(ctx)
