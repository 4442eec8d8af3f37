"""Shape domain rows into what the pages show, so templates only lay out ready values.

Nothing here queries the database beyond the rows (and prefetched relations) it is handed;
the views read through `adaptation.selectors` and pass the results in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from adaptation.models import (
    ACTIVE_STAGE_STATUSES,
    AcceleratorPool,
    AdaptationJob,
    JobStatus,
    ModelRelease,
    StageRun,
    StageStatus,
)
from adaptation.readiness import JobReadiness, readiness_from_runs, top_limitation
from adaptation.selectors.jobs import latest_runs_by_stage
from engine.architecture.config_reader import KEY_ALIASES
from engine.architecture.moe import EXPERT_COUNT_KEYS, SHARED_COUNT_KEYS, TOP_K_KEYS
from engine.formatting import MISSING, bytes_per_token, count, gib, params_words
from engine.registry import get_stage, stage_names

ANALYZE_STAGE = "analyze"
FROM_CONFIG = "read from config"
COMPUTED = "computed from config"
FROM_INDEX = "as published in the index"


# --- stages ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageColumn:
    """One stage as a board column: its registry name and its title."""

    name: str
    title: str


def stage_title(name: str) -> str:
    """The registry title of a stage, or its name for a stage no longer registered."""
    try:
        return get_stage(name).title
    except LookupError:
        return name


def stage_columns(stage_lists: Iterable[Iterable[str]]) -> list[StageColumn]:
    """The union of the given jobs' stages: registered ones in registry order, then any
    unregistered ones in the order first seen."""
    seen: list[str] = []
    for names in stage_lists:
        for name in names:
            if name not in seen:
                seen.append(name)
    registered = [name for name in stage_names() if name in seen]
    others = [name for name in seen if name not in registered]
    return [StageColumn(name=name, title=stage_title(name)) for name in registered + others]


def is_active(run: StageRun) -> bool:
    """Whether the run is queued or running."""
    return run.status in ACTIVE_STAGE_STATUSES


def waiting_label(pool: AcceleratorPool | None) -> str:
    """What a queued stage says when no live worker serves its pool ("" when one does, i.e.
    `pool` is None): its job waits visibly instead of looking merely queued."""
    if pool is None:
        return ""
    return f"waiting: no live worker for pool {pool.name} (queue {pool.queue})"


# --- board ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolReadiness:
    """A release on one pool: the readiness of its latest job there (`adaptation.readiness`),
    the stage blocking the next level, the most severe open limitation that applies there
    (None when none), and when the release was first ready on the pool."""

    pool_id: int
    pool_name: str
    job: AdaptationJob
    level: JobReadiness
    top_limitation: Any
    ready_at: datetime | None

    @property
    def blocking_title(self) -> str:
        """The blocking stage's title ("" when nothing blocks)."""
        return stage_title(self.level.blocking_stage) if self.level.blocking_stage else ""


def pool_readiness(
    jobs: Iterable[AdaptationJob], *, limitations: Iterable[Any] = ()
) -> list[PoolReadiness]:
    """Per pool the release's jobs ran on (by pool name), its readiness: jobs newest first
    with their stage runs and pool prefetched; `limitations` the release's open ones."""
    limitations = list(limitations)
    by_pool: dict[int, list[AdaptationJob]] = {}
    for job in jobs:
        by_pool.setdefault(job.pool_id, []).append(job)
    rows = []
    for pool_id, pool_jobs in by_pool.items():
        latest = pool_jobs[0]
        times = [at for at in (job_ready_at(job) for job in pool_jobs) if at is not None]
        rows.append(
            PoolReadiness(
                pool_id=pool_id,
                pool_name=latest.pool.name,
                job=latest,
                level=job_readiness(latest),
                top_limitation=top_limitation(limitations, pool_id=pool_id),
                ready_at=min(times) if times else None,
            )
        )
    return sorted(rows, key=lambda row: row.pool_name)


@dataclass(frozen=True)
class Day0Clock:
    """How long a release has been public and, once adapted, how long that took.

    `ready_at` is the first time the release was adapted: the earliest Day 0 of its jobs
    (`adaptation.readiness`: when every stage the `complete` level requires had passed). It
    never moves later, so re-runs and manual re-adapts cannot make the clock worse.
    `time_to_detect` is discovered - published; `ready_after` (time-to-Day-0) runs from the
    hub's publication time to `ready_at`, or from discovery when the hub gave none
    (`day0_basis` says which: "publication" or "discovery"). `since_published` runs from
    publication to now (None without one). `newest_job_state` says what the newest job is
    doing now when it is not a success ("pending", "running", "failed"), so the board can show
    a re-run beside the first readiness. `pools`: the readiness per pool.
    """

    published_at: datetime | None
    since_published: timedelta | None
    ready_at: datetime | None
    ready_after: timedelta | None
    newest_job_state: str
    discovered_at: datetime | None = None
    time_to_detect: timedelta | None = None
    day0_basis: str = ""
    pools: tuple[PoolReadiness, ...] = ()

    @property
    def ready(self) -> bool:
        """Whether the release was adapted at least once."""
        return self.ready_at is not None


def job_readiness(job: AdaptationJob) -> JobReadiness:
    """The job's readiness from its prefetched stage runs (`adaptation.readiness`)."""
    return readiness_from_runs(stages=job.stages or [], runs=job.stage_runs.all())


def job_ready_at(job: AdaptationJob) -> datetime | None:
    """When `job` was first ready (prefetched runs), or None: per required stage its earliest
    succeeded attempt, the latest of those (`adaptation.readiness`). A later re-run of a stage
    keeps the earlier success, so the time never moves."""
    return job_readiness(job).ready_at


def release_ready_at(jobs: Iterable[AdaptationJob]) -> datetime | None:
    """The first time any of the release's jobs was ready (Day-0 readiness), or None."""
    times = [at for at in (job_ready_at(job) for job in jobs) if at is not None]
    return min(times) if times else None


def day0_basis(release: ModelRelease) -> tuple[datetime, str]:
    """Where the release's time-to-Day-0 runs from: its publication time when the hub gave
    one ("publication"), else its discovery ("discovery")."""
    if release.published_at is not None:
        return release.published_at, "publication"
    return release.discovered_at, "discovery"


def _job_state(job: AdaptationJob | None) -> str:
    """What the newest job is doing ("pending", "running", "failed"), or "" when it
    succeeded or there is none."""
    if job is None or job.status == JobStatus.SUCCEEDED:
        return ""
    return str(job.status)


def day0_clock(
    release: ModelRelease,
    jobs: Iterable[AdaptationJob],
    *,
    now: datetime,
    limitations: Iterable[Any] = (),
) -> Day0Clock:
    """The release's Day-0 clock at `now`, from its jobs (newest first, runs and pools
    prefetched) and its open `limitations`."""
    jobs = list(jobs)
    pools = pool_readiness(jobs, limitations=limitations)
    times = [row.ready_at for row in pools if row.ready_at is not None]
    ready_at = min(times) if times else None
    published = release.published_at
    basis_at, basis = day0_basis(release)
    return Day0Clock(
        published_at=published,
        since_published=now - published if published is not None else None,
        ready_at=ready_at,
        ready_after=ready_at - basis_at if ready_at else None,
        newest_job_state=_job_state(jobs[0] if jobs else None),
        discovered_at=release.discovered_at,
        time_to_detect=release.time_to_detect,
        day0_basis=basis,
        pools=tuple(pools),
    )


@dataclass(frozen=True)
class ClockEvent:
    """One moment of a release's Day-0 timeline: what happened, when, on which pool ("" for
    the release itself), and how long after the clock's start (publication, else discovery)."""

    label: str
    at: datetime
    after: timedelta
    pool: str = ""
    status: str = ""
    anchor: str = ""


def day0_timeline(release: ModelRelease, clock: Day0Clock) -> list[ClockEvent]:
    """The release's Day-0 timeline, oldest first: published (when known), discovered, and per
    pool (its latest job) the job's start, each stage's latest attempt finished, and its
    Day 0; then the release's first Day 0. Jobs come from `clock.pools`, runs prefetched."""
    start, _ = day0_basis(release)
    events: list[ClockEvent] = []

    def add(label: str, at: datetime | None, **fields: str) -> None:
        if at is not None:
            events.append(ClockEvent(label=label, at=at, after=at - start, **fields))

    add("Published on the hub", release.published_at)
    add("Discovered", release.discovered_at)
    for row in clock.pools:
        job = row.job
        add(f"Job {job.pk} started", job.started_at, pool=row.pool_name, anchor=f"job-{job.pk}")
        latest = latest_runs_by_stage(job)
        for name in job.stages:
            run = latest.get(name)
            if run is None or run.finished_at is None:
                continue
            add(
                f"{stage_title(name)} {run.get_status_display().lower()}",
                run.finished_at,
                pool=row.pool_name,
                status=run.status,
                anchor=f"job-{job.pk}-stage-{name}",
            )
        add("Ready on the pool (Day 0)", row.ready_at, pool=row.pool_name, status="ready")
    events.sort(key=lambda event: event.at)
    return events


@dataclass(frozen=True)
class StageCell:
    """The latest attempt of one stage of a release's newest job, as a board cell."""

    stage: str
    status: str
    status_label: str
    duration: timedelta | None
    attempt: int
    error_summary: str
    finding: str = ""


def stage_cell(run: StageRun, *, idle_pool: AcceleratorPool | None = None) -> StageCell:
    """A board cell from a stage run; the error's first line becomes the cell's tooltip. A
    queued run whose pool has no live worker (`idle_pool`) says it waits for one."""
    error_line = run.error.strip().splitlines()[0] if run.error.strip() else ""
    counts = (run.result or {}).get("counts") or {} if run.stage == "operators" else {}
    missing = counts.get("missing") or 0
    return StageCell(
        finding=f"{missing} operator(s) missing" if missing else "",
        stage=run.stage,
        status=run.status,
        status_label=(run.status == StageStatus.QUEUED and waiting_label(idle_pool))
        or run.get_status_display(),
        duration=run.duration,
        attempt=run.attempt,
        error_summary=error_line,
    )


@dataclass(frozen=True)
class BoardRow:
    """One release on the board: its newest job, one cell per column, and its clock."""

    release: ModelRelease
    job: AdaptationJob | None
    cells: list[StageCell | None]
    clock: Day0Clock


@dataclass(frozen=True)
class Board:
    """The release board: stage columns and release rows, newest release first."""

    columns: list[StageColumn]
    rows: list[BoardRow]


def board(
    releases: Iterable[ModelRelease],
    *,
    now: datetime,
    pools_without_worker: Mapping[int, AcceleratorPool] | None = None,
) -> Board:
    """Build the board from releases whose jobs and stage runs are prefetched (newest job
    first, as `selectors.releases_for_board` returns them, with `open_limitations`: the clock
    shows each pool's most severe). `pools_without_worker` (by id,
    `selectors.workers.pools_without_live_worker`) marks queued stages of those pools as waiting."""
    idle = pools_without_worker or {}
    with_jobs = [(release, list(release.jobs.all())) for release in releases]
    columns = stage_columns(jobs[0].stages for _, jobs in with_jobs if jobs)
    rows = []
    for release, jobs in with_jobs:
        job = jobs[0] if jobs else None
        latest = latest_runs_by_stage(job) if job is not None else {}
        idle_pool = idle.get(job.pool_id) if job is not None else None
        cells = [
            stage_cell(latest[column.name], idle_pool=idle_pool) if column.name in latest else None
            for column in columns
        ]
        clock = day0_clock(
            release, jobs, now=now, limitations=getattr(release, "open_limitations", ())
        )
        rows.append(BoardRow(release=release, job=job, cells=cells, clock=clock))
    return Board(columns=columns, rows=rows)


# --- release page: stage timeline -----------------------------------------------------------


@dataclass(frozen=True)
class StageTimeline:
    """Every attempt of one stage of a job, oldest first, and whether it may be re-run."""

    name: str
    title: str
    attempts: list[StageRun]
    can_rerun: bool
    waiting_label: str = ""  # shown for its queued attempt when no live worker serves the pool


@dataclass(frozen=True)
class JobTimeline:
    """One job of a release with its stages in run order."""

    job: AdaptationJob
    stages: list[StageTimeline]
    active: bool


def job_timeline(job: AdaptationJob, *, idle_pool: AcceleratorPool | None = None) -> JobTimeline:
    """A job's timeline from its prefetched stage runs; `idle_pool`: its pool, when no live
    worker serves it (queued attempts then say they wait for one)."""
    by_stage: dict[str, list[StageRun]] = {}
    for run in sorted(job.stage_runs.all(), key=lambda r: (r.position, r.attempt)):
        by_stage.setdefault(run.stage, []).append(run)
    latest = latest_runs_by_stage(job)
    active = any(is_active(run) for run in latest.values())
    order = list(job.stages) + [name for name in by_stage if name not in job.stages]
    stages = [
        StageTimeline(
            name=name,
            title=stage_title(name),
            attempts=by_stage.get(name, []),
            can_rerun=not active and name in job.stages,
            waiting_label=waiting_label(idle_pool),
        )
        for name in order
    ]
    return JobTimeline(job=job, stages=stages, active=active)


def job_timelines(
    release: ModelRelease, *, pools_without_worker: Mapping[int, AcceleratorPool] | None = None
) -> list[JobTimeline]:
    """Timelines of the release's jobs, newest job first (jobs prefetched in that order).
    `pools_without_worker` (by id) marks queued attempts of those pools as waiting."""
    idle = pools_without_worker or {}
    return [job_timeline(job, idle_pool=idle.get(job.pool_id)) for job in release.jobs.all()]


# --- release page: analysis -----------------------------------------------------------------


@dataclass(frozen=True)
class AnalysisRow:
    """One figure of the analysis: what it is, its value with units, where it comes from."""

    label: str
    value: str
    source: str
    note: str = ""


@dataclass(frozen=True)
class AnalysisSection:
    """A titled group of analysis rows."""

    title: str
    rows: list[AnalysisRow]


@dataclass(frozen=True)
class NewAspect:
    """One way a release differs from every known family."""

    aspect: str
    detail: str


@dataclass(frozen=True)
class Analysis:
    """The latest successful analysis of a release, ready to lay out."""

    run: StageRun
    sections: list[AnalysisSection]
    notes: list[str]
    new_against_known: list[NewAspect]
    family_known: bool | None
    conventions: list[tuple[str, str]]


def latest_analysis_run(release: ModelRelease) -> StageRun | None:
    """The most recently finished succeeded `analyze` attempt over all the release's jobs."""
    runs = [
        run
        for job in release.jobs.all()
        for run in job.stage_runs.all()
        if run.stage == ANALYZE_STAGE and run.status == StageStatus.SUCCEEDED
    ]
    if not runs:
        return None
    return max(runs, key=lambda r: (r.finished_at is not None, r.finished_at, r.job_id, r.attempt))


def _text(value: Any) -> str:
    """A plain value as text: em dash when missing, yes/no for booleans."""
    if value is None or value == "" or value == [] or value == {}:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return _list_text(value)
    if isinstance(value, dict):
        return ", ".join(f"{key}: {_text(item)}" for key, item in value.items()) or MISSING
    return str(value)


def _list_text(values: list[Any]) -> str:
    """A list compactly: repeated strings (a per-layer pattern) as counts, else joined."""
    if len(values) > 8 and all(isinstance(v, str) for v in values):
        counts = Counter(values)
        summary = ", ".join(f"{name} x {n}" for name, n in counts.items())
        return f"{summary} ({len(values)} layers)"
    return ", ".join(_text(v) for v in values)


def _label(key: str) -> str:
    """A result key as a label: "kv_lora_rank" → "KV LoRA rank"."""
    words = key.replace("_", " ").split()
    known = {
        "kv": "KV",
        "q": "Q",
        "qk": "QK",
        "lora": "LoRA",
        "rope": "RoPE",
        "nope": "NoPE",
        "mla": "MLA",
        "moe": "MoE",
        "ffn": "FFN",
        "fp8": "FP8",
        "dim": "dim",
    }
    text = " ".join(known.get(w.lower(), w) for w in words)
    return text[:1].upper() + text[1:]


def _dict(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _family_text(result: Mapping[str, Any]) -> str:
    family = _text(result.get("family"))
    if result.get("family_known") is False:
        return f"{family} — not a known family" if family != MISSING else "not a known family"
    return family


def _tokens(value: Any) -> str:
    text = count(value)
    return text if text == MISSING else f"{text} tokens"


# --- where each figure comes from -----------------------------------------------------------

# The config key(s) each analysis figure is read from, as dotted paths into `config.json`
# (a number indexes a list); a figure is "read from config" only when the config itself holds
# one of these keys with the value shown. An empty tuple marks a figure the engine always
# computes (counts, summaries, layer patterns). Figures not listed fall back to the key of
# the same name (`attention.X`, `moe.X`: `X`; `rope.X`: `rope_scaling.X`; `quantization.X`:
# `quantization_config.X`), which is safe because the value must match too. Alternative
# spellings come from the engine's own readers (`KEY_ALIASES`, the MoE key lists), so a
# spelling the engine learns is recognised here too.
_ROPE_DICTS = ("rope_scaling", "rope_parameters", "rope_parameters.full_attention")
_QUANT_DICTS = ("quantization_config", "compression_config")


def _in_dicts(dicts: tuple[str, ...], *keys: str) -> tuple[str, ...]:
    return tuple(f"{prefix}.{key}" for key in keys for prefix in dicts)


def _spellings(key: str) -> tuple[str, ...]:
    """A standard config key and the aliases the engine's config reader accepts for it."""
    return (key, *KEY_ALIASES.get(key, ()))


FIGURE_CONFIG_KEYS: Mapping[str, tuple[str, ...]] = {
    # model
    "architecture": ("architectures.0",),
    "model_type": ("model_type",),
    "family": (),
    "torch_dtype": ("torch_dtype", "dtype"),
    "quantization_summary": (),
    "tie_word_embeddings": ("tie_word_embeddings",),
    # shape
    "num_layers": _spellings("num_hidden_layers"),
    "hidden_size": _spellings("hidden_size"),
    "num_attention_heads": _spellings("num_attention_heads"),
    "num_kv_heads": _spellings("num_key_value_heads"),
    "head_dim": ("head_dim",),
    "intermediate_size": _spellings("intermediate_size"),
    "vocab_size": _spellings("vocab_size"),
    "max_position_embeddings": _spellings("max_position_embeddings"),
    # attention
    "attention.kind": (),
    "attention.layer_pattern": (),
    "attention.full_layers": (),
    "attention.sliding_layers": (),
    "attention.chunked_layers": (),
    "attention.linear_attention_layers": (),
    "attention.ssm_layers": (),
    "attention.kv_cache_layers": (),
    "attention.layer_types": ("layer_types",),
    # position encoding
    "rope.type": _in_dicts(_ROPE_DICTS, "rope_type", "type"),
    "rope.factor": _in_dicts(_ROPE_DICTS, "factor"),
    "rope.theta": ("rope_theta", *_in_dicts(_ROPE_DICTS, "rope_theta")),
    "rope.partial_rotary_factor": (
        "partial_rotary_factor",
        *_in_dicts(_ROPE_DICTS, "partial_rotary_factor"),
    ),
    "rope.local_theta": ("rope_local_base_freq",),
    # experts
    "moe.num_experts": EXPERT_COUNT_KEYS,
    "moe.experts_per_token": TOP_K_KEYS,
    "moe.num_shared_experts": SHARED_COUNT_KEYS,
    "moe.moe_layers": (),
    "moe.dense_layers": (),
    "moe.dense_layer_indices": (),
    "moe.expert_intermediate_size": ("moe_intermediate_size", *_spellings("intermediate_size")),
    "moe.shared_expert_intermediate_size": ("shared_expert_intermediate_size",),
    "moe.dense_intermediate_size": ("intermediate_size_mlp", *_spellings("intermediate_size")),
    "moe.scoring": ("scoring_func",),
    # quantization
    "quantization.method": _in_dicts(_QUANT_DICTS, "quant_method"),
    "quantization.format": _in_dicts(_QUANT_DICTS, "fmt", "format", "bnb_4bit_quant_type"),
    "quantization.bits": _in_dicts(_QUANT_DICTS, "bits", "w_bit"),
    "quantization.group_size": _in_dicts(_QUANT_DICTS, "group_size", "q_group_size"),
    "quantization.modules_not_converted": _in_dicts(
        _QUANT_DICTS, "modules_to_not_convert", "modules_not_converted", "ignore"
    ),
    "quantization.quantized_params": (),
    "quantization.unquantized_params": (),
    "quantization.scale_bytes": (),
    "quantization.scale_format": (),
    # size and memory: all computed, except the checkpoint size (see FIGURE_SOURCES)
    "total_params": (),
    "active_params": (),
    "extra_params": (),
    "embedding_params": (),
    "weight_bytes": (),
    "weight_bytes_by_dtype": (),
    "kv_cache_bytes_per_token": (),
    "kv_cache_bytes_at_max_context": (),
}
# Figures whose source is neither the config nor the engine's arithmetic.
FIGURE_SOURCES: Mapping[str, str] = {"checkpoint_total_size_bytes": FROM_INDEX}

_DEFAULT_PREFIXES: Mapping[str, tuple[str, ...]] = {
    "attention": ("",),
    "moe": ("",),
    "rope": tuple(f"{name}." for name in _ROPE_DICTS),
    "quantization": tuple(f"{name}." for name in _QUANT_DICTS),
}


def figure_config_keys(figure: str) -> tuple[str, ...]:
    """The config paths `figure` may be read from (see `FIGURE_CONFIG_KEYS`)."""
    if figure in FIGURE_CONFIG_KEYS:
        return FIGURE_CONFIG_KEYS[figure]
    section, _, key = figure.rpartition(".")
    if not section:
        return (figure,)
    return tuple(prefix + key for prefix in _DEFAULT_PREFIXES.get(section, ()))


_ABSENT = object()


def _dig(config: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path ("rope_scaling.factor", "architectures.0"), or _ABSENT."""
    value: Any = config
    for part in path.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _ABSENT
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values: 10000 and 10000.0 are the same, True and 1 are not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@dataclass(frozen=True)
class FigureSources:
    """Says where each figure comes from, against the config the analysis read.

    A multimodal config is searched in its `text_config` first (the text model the engine
    analyses), then at its top level (quantization, dtype and architectures live there).
    """

    scopes: tuple[Mapping[str, Any], ...]

    @classmethod
    def of_config(cls, config: Any) -> FigureSources:
        if not isinstance(config, Mapping):
            return cls(scopes=())
        text = config.get("text_config")
        return cls(scopes=(text, config) if isinstance(text, Mapping) else (config,))

    def source(self, figure: str, value: Any) -> str:
        """ "read from config" when the config holds one of the figure's keys with `value`,
        the fixed source of an index figure, else "computed from config"."""
        if figure in FIGURE_SOURCES:
            return FIGURE_SOURCES[figure]
        for path in figure_config_keys(figure):
            for scope in self.scopes:
                found = _dig(scope, path)
                if found is not _ABSENT and found is not None and _same(found, value):
                    return FROM_CONFIG
        return COMPUTED

    def row(
        self, label: str, figure: str, value: Any, show: Any = None, *, note: str = ""
    ) -> AnalysisRow:
        """A row showing `value` through `show` (default `_text`); a missing value ("—") gets
        no source."""
        text = (show or _text)(value)
        source = "" if text == MISSING else self.source(figure, value)
        return AnalysisRow(label, text, source, note=note)

    def computed(self, label: str, text: str, *, note: str = "") -> AnalysisRow:
        """A row whose text the page composes itself (a summary)."""
        return AnalysisRow(label, text, "" if text == MISSING else COMPUTED, note=note)


# --- release page: analysis tables ----------------------------------------------------------

_ATTENTION_FIELDS = (
    ("layer_pattern", "Layer pattern"),
    ("q_lora_rank", "MLA Q LoRA rank"),
    ("kv_lora_rank", "MLA KV LoRA rank"),
    ("qk_nope_head_dim", "MLA QK head dim without RoPE"),
    ("qk_rope_head_dim", "MLA QK RoPE head dim"),
    ("v_head_dim", "MLA V head dim"),
    ("sliding_window", "Sliding window"),
    ("attention_chunk_size", "Attention chunk"),
    ("full_layers", "Full-attention layers"),
    ("sliding_layers", "Sliding-window layers"),
    ("chunked_layers", "Chunked-attention layers"),
    ("linear_attention_layers", "Linear-attention layers"),
    ("ssm_layers", "State-space (Mamba) layers"),
    ("kv_cache_layers", "Layers with a KV cache"),
)
_TOKEN_SPANS = {"sliding_window", "attention_chunk_size"}
_LAYER_COUNTS = {
    "full_layers",
    "sliding_layers",
    "chunked_layers",
    "linear_attention_layers",
    "ssm_layers",
}


def _is_empty(value: Any) -> bool:
    return value is None or value == [] or value == {}


def _attention_rows(
    attention: Mapping[str, Any] | None, sources: FigureSources
) -> list[AnalysisRow]:
    """Kind, then the figures the attention summary has: absent, null and zero layer counts
    are left out; the per-layer list is shown only when there is no pattern summary."""
    if attention is None:
        return [sources.row("Attention kind", "attention.kind", None)]
    rows = [sources.row("Attention kind", "attention.kind", attention.get("kind"))]
    labels = dict(_ATTENTION_FIELDS)
    keys = [key for key, _ in _ATTENTION_FIELDS] + [
        key for key in attention if key not in labels and key != "kind"
    ]
    for key in keys:
        value = attention.get(key)
        if _is_empty(value) or (key in _LAYER_COUNTS and value == 0):
            continue
        if key == "layer_types" and attention.get("layer_pattern"):
            continue
        show = _tokens if key in _TOKEN_SPANS else _text
        rows.append(sources.row(labels.get(key) or _label(key), f"attention.{key}", value, show))
    return rows


def _rope_rows(rope: Mapping[str, Any] | None, sources: FigureSources) -> list[AnalysisRow]:
    rope = rope or {}
    rows = [
        sources.row("RoPE type", "rope.type", rope.get("type")),
        sources.row("RoPE factor", "rope.factor", rope.get("factor")),
        sources.row("RoPE theta", "rope.theta", rope.get("theta")),
    ]
    for key, value in rope.items():
        if key not in ("type", "factor", "theta") and value is not None:
            rows.append(sources.row(f"RoPE {_label(key).lower()}", f"rope.{key}", value))
    return rows


_MOE_FIELDS = (
    ("num_experts", "Routed experts"),
    ("experts_per_token", "Experts per token"),
    ("num_shared_experts", "Shared experts"),
    ("moe_layers", "MoE layers"),
    ("dense_layers", "Dense layers"),
    ("expert_intermediate_size", "Expert FFN size"),
    ("scoring", "Router scoring"),
    ("n_group", "Expert groups"),
    ("topk_group", "Groups per token"),
)


def _moe_rows(result: Mapping[str, Any], sources: FigureSources) -> list[AnalysisRow]:
    if "moe" not in result:
        return [sources.computed("Mixture of experts", MISSING)]
    moe = _dict(result.get("moe"))
    if moe is None:
        return [sources.computed("Mixture of experts", "dense (no experts)")]
    rows = [sources.row(label, f"moe.{key}", moe.get(key)) for key, label in _MOE_FIELDS]
    known = {key for key, _ in _MOE_FIELDS}
    rows += [
        sources.row(_label(key), f"moe.{key}", value)
        for key, value in moe.items()
        if key not in known and not _is_empty(value)
    ]
    return rows


def _has_dense_layers(result: Mapping[str, Any]) -> bool:
    """False only for a mixture of experts whose every layer is MoE (gpt-oss, Qwen3-MoE):
    its `intermediate_size` is no dense FFN's width."""
    moe = _dict(result.get("moe"))
    if moe is None:
        return True
    dense = moe.get("dense_layers")
    return not (dense == 0 or moe.get("dense_layer_indices") == [])


def _quantization_summary(result: Mapping[str, Any]) -> str:
    """Quantization in a few words: "fp8 (e4m3, 8-bit)", or that the config declares none."""
    if "quantization" not in result:
        return MISSING
    quant = result.get("quantization")
    if quant is None:
        return "none declared (weights in their stored dtype)"
    if not isinstance(quant, Mapping):
        return _text(quant)
    method = quant.get("method") or quant.get("quant_method")
    details = [str(quant["format"])] if quant.get("format") and quant["format"] != method else []
    if isinstance(quant.get("bits"), int | float) and not isinstance(quant.get("bits"), bool):
        details.append(f"{quant['bits']:g}-bit")
    text = str(method) if method else "declared"
    return f"{text} ({', '.join(details)})" if details else text


_QUANT_FIELDS: tuple[tuple[str, str, Any], ...] = (
    ("method", "Method", _text),
    ("quant_method", "Method", _text),
    ("format", "Format", _text),
    ("bits", "Bits per weight", _text),
    (
        "weight_block_size",
        "Scale block",
        lambda v: " x ".join(_text(x) for x in v) if isinstance(v, list) else _text(v),
    ),
    ("group_size", "Scale group size", _text),
    ("scale_format", "Scale format", _text),
    ("activation_scheme", "Activation scheme", _text),
    ("modules_not_converted", "Modules not quantized", lambda v: _text(v) if v else "none"),
    ("quantized_params", "Quantized params", params_words),
    ("unquantized_params", "Unquantized params", params_words),
    ("scale_bytes", "Scale bytes", gib),
)


def _quantization_section(
    result: Mapping[str, Any], sources: FigureSources
) -> AnalysisSection | None:
    """The quantization details, when the config declares a quantization."""
    quant = _dict(result.get("quantization"))
    if quant is None:
        return None
    known = {key for key, _, _ in _QUANT_FIELDS}
    rows = [
        sources.row(label, f"quantization.{key}", quant[key], show)
        for key, label, show in _QUANT_FIELDS
        if key in quant and (quant[key] is not None or key == "modules_not_converted")
    ]
    rows += [
        sources.row(_label(key), f"quantization.{key}", value)
        for key, value in quant.items()
        if key not in known and value is not None
    ]
    return AnalysisSection("Quantization", rows)


def _bytes_by_dtype(value: Any) -> str:
    """Weight bytes per stored dtype, largest first: "F8_E4M3: 633.8 GiB, BF16: 7.3 GiB"."""
    by_dtype = _dict(value)
    if not by_dtype:
        return MISSING
    ordered = sorted(by_dtype.items(), key=lambda item: -(_number_or_zero(item[1])))
    return ", ".join(f"{dtype}: {gib(size)}" for dtype, size in ordered)


def _number_or_zero(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


MTP = "multi-token prediction (MTP)"


def _extra_params_note(result: Mapping[str, Any]) -> str:
    mtp = result.get("mtp_layers")
    if isinstance(mtp, int) and not isinstance(mtp, bool):
        return f"{MTP} modules: {mtp}; not in total params"
    return f"{MTP} modules; not in total params"


def analysis_sections(
    result: Mapping[str, Any], config: Mapping[str, Any] | None = None
) -> list[AnalysisSection]:
    """The analysis result as titled tables; any missing key shows as an em dash.

    `config` is the `config.json` the analysis read; a figure is labelled "read from config"
    only when that config holds it (see `FIGURE_CONFIG_KEYS`), else "computed from config".
    """
    src = FigureSources.of_config(config)
    shape = [
        src.row("Layers", "num_layers", result.get("num_layers"), count),
        src.row("Hidden size", "hidden_size", result.get("hidden_size"), count),
        src.row("Attention heads", "num_attention_heads", result.get("num_attention_heads"), count),
        src.row("KV heads", "num_kv_heads", result.get("num_kv_heads"), count),
        src.row("Head dim", "head_dim", result.get("head_dim"), count),
    ]
    if _has_dense_layers(result):
        shape.append(
            src.row("Dense FFN size", "intermediate_size", result.get("intermediate_size"), count)
        )
    shape += [
        src.row("Vocabulary", "vocab_size", result.get("vocab_size"), _tokens),
        src.row(
            "Max context",
            "max_position_embeddings",
            result.get("max_position_embeddings"),
            _tokens,
        ),
    ]
    model = AnalysisSection(
        "Model",
        [
            src.row("Architecture", "architecture", result.get("architecture")),
            src.row("Model type", "model_type", result.get("model_type")),
            src.computed("Family", _family_text(result)),
            src.row("Stored dtype", "torch_dtype", result.get("torch_dtype")),
            src.computed("Quantization", _quantization_summary(result)),
            src.row(
                "Tied input/output embeddings",
                "tie_word_embeddings",
                result.get("tie_word_embeddings"),
            ),
        ],
    )
    size = AnalysisSection(
        "Size and memory",
        [
            src.row("Total params", "total_params", result.get("total_params"), params_words),
            src.row(
                "Active params",
                "active_params",
                result.get("active_params"),
                params_words,
                note="per token, excluding the input embedding",
            ),
            src.row(
                "Extra params",
                "extra_params",
                result.get("extra_params"),
                params_words,
                note=_extra_params_note(result),
            ),
            src.row(
                "Embedding params", "embedding_params", result.get("embedding_params"), params_words
            ),
            src.row("Weight bytes", "weight_bytes", result.get("weight_bytes"), gib),
            src.row(
                "Weight bytes by dtype",
                "weight_bytes_by_dtype",
                result.get("weight_bytes_by_dtype"),
                _bytes_by_dtype,
            ),
            src.row(
                "Checkpoint size",
                "checkpoint_total_size_bytes",
                result.get("checkpoint_total_size_bytes"),
                gib,
            ),
            src.row(
                "KV cache per token",
                "kv_cache_bytes_per_token",
                result.get("kv_cache_bytes_per_token"),
                bytes_per_token,
            ),
            src.row(
                "KV cache at max context",
                "kv_cache_bytes_at_max_context",
                result.get("kv_cache_bytes_at_max_context"),
                gib,
                note="one sequence of max context length",
            ),
        ],
    )
    quantization = _quantization_section(result, src)
    return [
        model,
        size,
        AnalysisSection("Shape", shape),
        AnalysisSection("Attention", _attention_rows(_dict(result.get("attention")), src)),
        AnalysisSection("Position encoding", _rope_rows(_dict(result.get("rope")), src)),
        AnalysisSection("Experts", _moe_rows(result, src)),
        *([quantization] if quantization else []),
    ]


def _detail_without_aspect(aspect: str, detail: str) -> str:
    """The detail without a leading repeat of its aspect label: aspect "RoPE type", detail
    "RoPE type not seen before: yarn" → "not seen before: yarn"; "RoPE type: yarn" → "yarn"."""
    if aspect == MISSING or not detail.lower().startswith(aspect.lower()):
        return detail
    rest = detail[len(aspect) :]
    if rest[:1].isalnum():  # "family" in "familyX": not a repeat of the label
        return detail
    rest = rest.lstrip(" :—-")
    return rest or detail


def _new_aspects(value: Any) -> list[NewAspect]:
    if not isinstance(value, list):
        return []
    aspects = []
    for item in value:
        if isinstance(item, Mapping):
            aspect = _text(item.get("aspect"))
            detail = _detail_without_aspect(aspect, _text(item.get("detail")))
            aspects.append(NewAspect(aspect=aspect, detail=detail))
        elif item:
            aspects.append(NewAspect(aspect=MISSING, detail=str(item)))
    return aspects


def _conventions(value: Any) -> list[tuple[str, str]]:
    """How the engine counts its figures: (figure, definition) pairs."""
    conventions = _dict(value)
    if conventions is None:
        return []
    return [(str(key), _text(text)) for key, text in conventions.items()]


def analysed_config(release: ModelRelease, run: StageRun) -> Mapping[str, Any] | None:
    """The `config.json` an analysis read: the release's stored config, else the config in
    the result of the latest succeeded fetch of the analysis's job (prefetched runs)."""
    if isinstance(release.config, Mapping):
        return release.config
    fetches = [
        other
        for job in release.jobs.all()
        if job.pk == run.job_id
        for other in job.stage_runs.all()
        if other.stage == "fetch" and other.status == StageStatus.SUCCEEDED
    ]
    for fetch in sorted(fetches, key=lambda r: r.attempt, reverse=True):
        config = fetch.result.get("config") if isinstance(fetch.result, Mapping) else None
        if isinstance(config, Mapping):
            return config
    return None


def analysis(release: ModelRelease) -> Analysis | None:
    """The release's latest successful analysis, or None when no analysis succeeded yet."""
    run = latest_analysis_run(release)
    if run is None:
        return None
    result = run.result if isinstance(run.result, Mapping) else {}
    notes = result.get("notes")
    family_known = result.get("family_known")
    return Analysis(
        run=run,
        sections=analysis_sections(result, analysed_config(release, run)),
        notes=[str(n) for n in notes] if isinstance(notes, list) else [],
        new_against_known=_new_aspects(result.get("new_against_known")),
        family_known=family_known if isinstance(family_known, bool) else None,
        conventions=_conventions(result.get("conventions")),
    )


def release_is_active(release: ModelRelease) -> bool:
    """Whether any job of the release has a stage queued or running (prefetched runs)."""
    return any(
        is_active(run) for job in release.jobs.all() for run in latest_runs_by_stage(job).values()
    )
