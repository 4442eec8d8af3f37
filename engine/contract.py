"""The stage contract: plain inputs in, a JSON-able result out, no Django.

A stage is a function `run(ctx: StageContext) -> dict`. The Celery task loads the rows, builds
the context, calls the stage and stores what it returns (or the error it raises) through a
service. Stages are listed, in order, in `engine.registry`.
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
    architecture). Fails the stage at once with `reason`; never retried. `result` (a
    JSON-able dict, or None) is what the stage found before failing (precision's metrics,
    the plan's suggestions); the runner stores it on the failed run."""

    def __init__(self, reason: str, *, result: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.result = result


class StageTransientError(Exception):
    """Something outside the release failed (network, hub rate limit). The task retries with
    backoff; `retry_after_s` is a lower bound on the wait, when the cause says one."""

    def __init__(self, reason: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class StageCancelled(BaseException):
    """The stage's run was cancelled (or taken away by the reaper) while it ran: the stage
    stops at its next check of `StageContext.cancelled` and nothing it did is stored.

    A BaseException, as `asyncio.CancelledError` is since Python 3.8, so that the stages'
    `except Exception` around a model's own failures cannot swallow it."""


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

    The pool's layout, for the plan: `accelerator` is its catalog kind ("h100"; "" = none
    set, which a "cpu" backend reads as "cpu", the machine its worker runs on);
    `devices_per_node` (None = the catalog's figure for the kind) x `nodes` devices;
    `intra_node_bandwidth_bytes_per_s`/`inter_node_bandwidth_bytes_per_s` (bytes/s per
    direction; None = the catalog's). `accelerator_entry` is the kind's entry in the catalog
    file's format when an admin's `AcceleratorKind` row defines it (it replaces the shipped
    file's entry), else None.

    `engine` is the pool's serving engine as `engine.stages.serve.options.engine_settings`
    returns it ({} for none; a launched kind's `python` filled in from the worker's
    `DAY0_ENGINE_PYTHON` when the pool names none): what the `serve` stage launches or
    attaches to.
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
    accelerator: str = ""
    devices_per_node: int | None = None
    nodes: int = 1
    intra_node_bandwidth_bytes_per_s: float | None = None
    inter_node_bandwidth_bytes_per_s: float | None = None
    accelerator_entry: Mapping[str, Any] | None = None
    engine: Mapping[str, Any] = field(default_factory=dict)


def _ignore(_message: str) -> None:
    return None


def never_cancelled() -> bool:
    """The `cancelled` of a run nobody can cancel (the engine called directly)."""
    return False


def raise_if_cancelled(cancelled: Callable[[], bool]) -> None:
    """Raise `StageCancelled` when `cancelled()` says the run was cancelled. Long stages call
    it between steps (each performance point, each stability step)."""
    if cancelled():
        raise StageCancelled("the stage run was cancelled while it ran")


@dataclass(frozen=True)
class StageContext:
    """Everything a stage may read.

    `previous` maps each earlier stage's name to its stored result dict (latest attempt).
    `known_families` holds analysis dicts of earlier releases (one per model family, newest
    first) for "what is new". `log` appends a line to the stage's log excerpt.
    `options` are the job's options for this stage (`AdaptationJob.options[<stage name>]`,
    e.g. the plan's {"context_tokens": 8192, "concurrency": 16, "dtype": "fp8"}); empty
    for the stage's defaults. `calibration` is the pool's running calibration
    (`adaptation.selectors.pool_calibration`: the median efficiency of the scaled twins'
    measured speed over the roofline's prediction in the pool's last performance runs, and
    the device figures they measured), filled for a stage with `reads_pool_calibration`;
    None otherwise. `limitations` are the release's open known limitations on the job's pool
    or on every pool (plain dicts: "title", "body" (Markdown), "severity", "status", "stage",
    "pool" (its name, None for every pool)), most severe first, filled for a stage with
    `reads_limitations`; empty otherwise. `stages` are the registry's stage definitions in
    job order (`engine.registry.STAGES`, which the runner passes: a stage cannot import the
    registry that lists it); the `release_notes` stage walks them for each stage's notes
    section. `cancelled` says whether the run was cancelled while it ran (the runner's
    heartbeat finds it no longer running); long stages check it between steps through
    `raise_if_cancelled`. `states` says how each of the job's other stages ended
    ({stage: {"status", "error", "result", "failure_class"}}: a failed run's `result` is what
    it kept, its `failure_class` "infrastructure" or "release"), filled for a stage that
    `runs_after_failure`; None otherwise.
    """

    release: ReleaseRef
    pool: PoolSpec
    previous: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    known_families: tuple[dict[str, Any], ...] = ()
    log: Callable[[str], None] = _ignore
    options: Mapping[str, Any] = field(default_factory=dict)
    calibration: Mapping[str, Any] | None = None
    limitations: tuple[dict[str, Any], ...] = ()
    stages: tuple[StageDefinition, ...] = ()
    cancelled: Callable[[], bool] = never_cancelled
    # The Celery soft time limit this attempt runs under (s; None: no limit known, the engine
    # called directly): work the stage hands to a child process must end before it.
    soft_time_limit_s: float | None = None
    states: Mapping[str, Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class StageDefinition:
    """One entry of the stage registry.

    `run` is the stage function, or its import path "package.module:function" (imported on
    first call, so that reading the registry stays cheap). `soft_time_limit_s`/`time_limit_s`
    become the Celery task's limits for this stage, unless `limits_for_options` (same forms)
    computes them from the job's options for the stage: a function of those options returning
    (soft, hard) seconds (the stability stage's follow its `duration_s`); `time_limits_s`
    says which apply. `check_options` (same forms) checks and normalises a job's options for
    the stage (`AdaptationJob.options[name]`), raising `ValueError` with the reason; a stage
    without one takes no options. `reads_pool_calibration`: the runner fills
    `StageContext.calibration` with the pool's running calibration (a query);
    `reads_limitations`: it fills `StageContext.limitations` with the release's open known
    limitations on the job's pool (a query). `runs_after_failure`: when an earlier stage of
    the job fails, this one is queued all the same (the others are skipped) and the runner
    fills `StageContext.states` (a query): the release notes say what blocked.

    `findings` (same forms) is the stage's known-limitation rules: a function
    `(result, *, pool) -> list[Finding] | None` (`engine.findings.Finding`) of a stored
    result and the pool's name, None when the result holds nothing to judge;
    `engine.registry.findings_for_stage` calls it, and the app syncs the stage's notes with
    what it returns. `findings_read_analysis`: it also takes `analysis=`, the release's
    newest `analyze` result (a query; the plan's capped-context note needs it).
    `unjudged_keys` (same forms) is a function `(result) -> frozenset[str]` naming the keys
    of the stage's notes a result neither finds nor rules out (a run that could not check
    them), which the sync then leaves as they are; None: a result judges every note of the
    stage. `notes` (same forms) is its section of the release notes: a function returning
    the section's data from the stage's state. All live in the stage's folder
    (`findings.py`, `notes.py`); None: the stage has none.
    """

    name: str
    title: str
    run: Callable[[StageContext], dict[str, Any]] | str
    description: str = ""
    # The stages whose results `run` cannot do without (`ctx.previous`): a job's stage list
    # must hold them (`engine.registry.stage_list_check`).
    needs: tuple[str, ...] = ()
    soft_time_limit_s: int = 300
    time_limit_s: int = 360
    # Whether `run` reads `ctx.known_families` (it costs a query over earlier analyses).
    reads_known_families: bool = False
    check_options: Callable[[Any], dict[str, Any]] | str | None = None
    limits_for_options: Callable[[Any], tuple[int, int]] | str | None = None
    reads_pool_calibration: bool = False
    # Whether `run` reads `ctx.limitations` (the release's open known limitations: a query).
    reads_limitations: bool = False
    findings: Callable[..., Any] | str | None = None
    # Whether `findings` takes the release's analysis (a query for the app).
    findings_read_analysis: bool = False
    unjudged_keys: Callable[[Any], frozenset[str]] | str | None = None
    notes: Callable[..., Any] | str | None = None
    # Whether the stage runs when an earlier one failed (and reads `ctx.states`).
    runs_after_failure: bool = False

    def __call__(self, ctx: StageContext) -> dict[str, Any]:
        """Run the stage. Raises what the stage raises; ImportError for a bad `run` path."""
        return resolve_callable(self.run)(ctx)

    def checked_options(self, options: Any) -> dict[str, Any]:
        """A job's options for this stage, checked and normalised ({} for None or {}).
        Raises `ValueError` with the reason (a stage without `check_options` takes none)."""
        if self.check_options is None:
            if options:
                raise ValueError(f"the {self.name} stage takes no options, got {options!r}")
            return {}
        return resolve_callable(self.check_options)(options)

    def time_limits_s(self, options: Any = None) -> tuple[int, int]:
        """(soft, hard) time limits in seconds for a run with the job's `options` for this
        stage: `limits_for_options(options)` where the stage has one, else
        (`soft_time_limit_s`, `time_limit_s`). Options it refuses (`ValueError`) get the
        fixed limits: the stage itself then fails at once naming the option."""
        if self.limits_for_options is not None:
            try:
                soft, hard = resolve_callable(self.limits_for_options)(options or {})
            except ValueError:
                return self.soft_time_limit_s, self.time_limit_s
            return int(soft), int(hard)
        return self.soft_time_limit_s, self.time_limit_s


def resolve_callable(target: Callable[..., Any] | str) -> Callable[..., Any]:
    """`target`, or the function its import path "package.module:function" names."""
    if isinstance(target, str):
        module_name, _, function = target.partition(":")
        return getattr(importlib.import_module(module_name), function)
    return target
