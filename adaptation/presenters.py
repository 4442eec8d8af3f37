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
    AdaptationJob,
    JobStatus,
    ModelRelease,
    StageRun,
    StageStatus,
)
from adaptation.selectors import latest_runs_by_stage
from adaptation.templatetags.day0_format import (
    MISSING,
    bytes_per_token,
    count,
    gib,
    params,
)
from workers.stages.registry import get_stage, stage_names

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


# --- board ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Day0Clock:
    """How long a release has been public and, once adapted, how long that took.

    `since_published` runs from the hub's publication time to now; `ready_after` runs from
    publication to the finish of the release's newest job, only when that job succeeded.
    Both are None when the hub gave no publication time.
    """

    published_at: datetime | None
    since_published: timedelta | None
    ready_after: timedelta | None


def day0_clock(release: ModelRelease, job: AdaptationJob | None, *, now: datetime) -> Day0Clock:
    """The release's Day-0 clock at `now`."""
    published = release.published_at
    if published is None:
        return Day0Clock(published_at=None, since_published=None, ready_after=None)
    ready_after = None
    if job is not None and job.status == JobStatus.SUCCEEDED and job.finished_at is not None:
        ready_after = job.finished_at - published
    return Day0Clock(
        published_at=published, since_published=now - published, ready_after=ready_after
    )


@dataclass(frozen=True)
class StageCell:
    """The latest attempt of one stage of a release's newest job, as a board cell."""

    stage: str
    status: str
    status_label: str
    duration: timedelta | None
    attempt: int
    error_summary: str


def stage_cell(run: StageRun) -> StageCell:
    """A board cell from a stage run; the error's first line becomes the cell's tooltip."""
    error_line = run.error.strip().splitlines()[0] if run.error.strip() else ""
    return StageCell(
        stage=run.stage,
        status=run.status,
        status_label=run.get_status_display(),
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


def board(releases: Iterable[ModelRelease], *, now: datetime) -> Board:
    """Build the board from releases whose jobs and stage runs are prefetched (newest job
    first, as `selectors.releases_for_board` returns them)."""
    newest: list[tuple[ModelRelease, AdaptationJob | None]] = []
    for release in releases:
        jobs = list(release.jobs.all())
        newest.append((release, jobs[0] if jobs else None))
    columns = stage_columns(job.stages for _, job in newest if job is not None)
    rows = []
    for release, job in newest:
        latest = latest_runs_by_stage(job) if job is not None else {}
        cells = [
            stage_cell(latest[column.name]) if column.name in latest else None for column in columns
        ]
        rows.append(
            BoardRow(release=release, job=job, cells=cells, clock=day0_clock(release, job, now=now))
        )
    return Board(columns=columns, rows=rows)


# --- release page: stage timeline -----------------------------------------------------------


@dataclass(frozen=True)
class StageTimeline:
    """Every attempt of one stage of a job, oldest first, and whether it may be re-run."""

    name: str
    title: str
    attempts: list[StageRun]
    can_rerun: bool


@dataclass(frozen=True)
class JobTimeline:
    """One job of a release with its stages in run order."""

    job: AdaptationJob
    stages: list[StageTimeline]
    active: bool


def job_timeline(job: AdaptationJob) -> JobTimeline:
    """A job's timeline from its prefetched stage runs."""
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
        )
        for name in order
    ]
    return JobTimeline(job=job, stages=stages, active=active)


def job_timelines(release: ModelRelease) -> list[JobTimeline]:
    """Timelines of the release's jobs, newest job first (jobs prefetched in that order)."""
    return [job_timeline(job) for job in release.jobs.all()]


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


def _attention_rows(attention: Mapping[str, Any] | None) -> list[AnalysisRow]:
    """Kind, then the figures the attention summary has: absent, null and zero layer counts
    are left out; the per-layer list is shown only when there is no pattern summary."""
    if attention is None:
        return [AnalysisRow("Attention kind", MISSING, FROM_CONFIG)]
    rows = [AnalysisRow("Attention kind", _text(attention.get("kind")), FROM_CONFIG)]
    labels = dict(_ATTENTION_FIELDS)
    keys = [key for key, _ in _ATTENTION_FIELDS] + [
        key for key in attention if key not in labels and key != "kind"
    ]
    for key in keys:
        value = attention.get(key)
        if value is None or (key in _LAYER_COUNTS and value == 0):
            continue
        if key == "layer_types" and attention.get("layer_pattern"):
            continue
        text = _tokens(value) if key in _TOKEN_SPANS else _text(value)
        rows.append(AnalysisRow(labels.get(key) or _label(key), text, FROM_CONFIG))
    return rows


def _rope_rows(rope: Mapping[str, Any] | None) -> list[AnalysisRow]:
    rope = rope or {}
    rows = [
        AnalysisRow("RoPE type", _text(rope.get("type")), FROM_CONFIG),
        AnalysisRow("RoPE factor", _text(rope.get("factor")), FROM_CONFIG),
        AnalysisRow("RoPE theta", _text(rope.get("theta")), FROM_CONFIG),
    ]
    for key, value in rope.items():
        if key not in ("type", "factor", "theta") and value is not None:
            rows.append(AnalysisRow(f"RoPE {_label(key).lower()}", _text(value), FROM_CONFIG))
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


def _moe_rows(result: Mapping[str, Any]) -> list[AnalysisRow]:
    if "moe" not in result:
        return [AnalysisRow("Mixture of experts", MISSING, FROM_CONFIG)]
    moe = _dict(result.get("moe"))
    if moe is None:
        return [AnalysisRow("Mixture of experts", "dense (no experts)", FROM_CONFIG)]
    rows = [AnalysisRow(label, _text(moe.get(key)), FROM_CONFIG) for key, label in _MOE_FIELDS]
    known = {key for key, _ in _MOE_FIELDS}
    rows += [
        AnalysisRow(_label(key), _text(value), FROM_CONFIG)
        for key, value in moe.items()
        if key not in known and value is not None
    ]
    return rows


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
    ("quantized_params", "Quantized params", params),
    ("unquantized_params", "Unquantized params", params),
    ("scale_bytes", "Scale bytes", gib),
)


def _quantization_section(result: Mapping[str, Any]) -> AnalysisSection | None:
    """The quantization details, when the config declares a quantization."""
    quant = _dict(result.get("quantization"))
    if quant is None:
        return None
    known = {key for key, _, _ in _QUANT_FIELDS}
    rows = [
        AnalysisRow(
            label,
            show(quant[key]),
            COMPUTED
            if key in ("quantized_params", "unquantized_params", "scale_bytes")
            else FROM_CONFIG,
        )
        for key, label, show in _QUANT_FIELDS
        if key in quant and (quant[key] is not None or key == "modules_not_converted")
    ]
    rows += [
        AnalysisRow(_label(key), _text(value), FROM_CONFIG)
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


def _extra_params_note(result: Mapping[str, Any]) -> str:
    mtp = result.get("mtp_layers")
    if isinstance(mtp, int) and not isinstance(mtp, bool):
        return f"multi-token prediction (MTP) modules: {mtp}; not in total params"
    return "multi-token prediction (MTP) modules; not in total params"


def analysis_sections(result: Mapping[str, Any]) -> list[AnalysisSection]:
    """The analysis result as titled tables; any missing key shows as an em dash."""
    sections = [
        AnalysisSection(
            "Model",
            [
                AnalysisRow("Architecture", _text(result.get("architecture")), FROM_CONFIG),
                AnalysisRow("Model type", _text(result.get("model_type")), FROM_CONFIG),
                AnalysisRow("Family", _family_text(result), COMPUTED),
                AnalysisRow("Stored dtype", _text(result.get("torch_dtype")), FROM_CONFIG),
                AnalysisRow("Quantization", _quantization_summary(result), FROM_CONFIG),
                AnalysisRow(
                    "Tied input/output embeddings",
                    _text(result.get("tie_word_embeddings")),
                    FROM_CONFIG,
                ),
            ],
        ),
        AnalysisSection(
            "Shape",
            [
                AnalysisRow("Layers", count(result.get("num_layers")), FROM_CONFIG),
                AnalysisRow("Hidden size", count(result.get("hidden_size")), FROM_CONFIG),
                AnalysisRow(
                    "Attention heads", count(result.get("num_attention_heads")), FROM_CONFIG
                ),
                AnalysisRow("KV heads", count(result.get("num_kv_heads")), FROM_CONFIG),
                AnalysisRow("Head dim", count(result.get("head_dim")), FROM_CONFIG),
                AnalysisRow("Dense FFN size", count(result.get("intermediate_size")), FROM_CONFIG),
                AnalysisRow("Vocabulary", _tokens(result.get("vocab_size")), FROM_CONFIG),
                AnalysisRow(
                    "Max context", _tokens(result.get("max_position_embeddings")), FROM_CONFIG
                ),
            ],
        ),
        AnalysisSection("Attention", _attention_rows(_dict(result.get("attention")))),
        AnalysisSection("Position encoding", _rope_rows(_dict(result.get("rope")))),
        AnalysisSection("Experts", _moe_rows(result)),
        AnalysisSection(
            "Size and memory",
            [
                AnalysisRow("Total params", params(result.get("total_params")), COMPUTED),
                AnalysisRow(
                    "Active params",
                    params(result.get("active_params")),
                    COMPUTED,
                    note="per token, excluding the input embedding",
                ),
                AnalysisRow(
                    "Extra params",
                    params(result.get("extra_params")),
                    COMPUTED,
                    note=_extra_params_note(result),
                ),
                AnalysisRow("Embedding params", params(result.get("embedding_params")), COMPUTED),
                AnalysisRow("Weight bytes", gib(result.get("weight_bytes")), COMPUTED),
                AnalysisRow(
                    "Weight bytes by dtype",
                    _bytes_by_dtype(result.get("weight_bytes_by_dtype")),
                    COMPUTED,
                ),
                AnalysisRow(
                    "Checkpoint size",
                    gib(result.get("checkpoint_total_size_bytes")),
                    FROM_INDEX,
                ),
                AnalysisRow(
                    "KV cache per token",
                    bytes_per_token(result.get("kv_cache_bytes_per_token")),
                    COMPUTED,
                ),
                AnalysisRow(
                    "KV cache at max context",
                    gib(result.get("kv_cache_bytes_at_max_context")),
                    COMPUTED,
                    note="one sequence of max context length",
                ),
            ],
        ),
    ]
    model, *structure, size = sections
    quantization = _quantization_section(result)
    return [model, size, *structure, *([quantization] if quantization else [])]


def _new_aspects(value: Any) -> list[NewAspect]:
    if not isinstance(value, list):
        return []
    aspects = []
    for item in value:
        if isinstance(item, Mapping):
            aspects.append(
                NewAspect(aspect=_text(item.get("aspect")), detail=_text(item.get("detail")))
            )
        elif item:
            aspects.append(NewAspect(aspect=MISSING, detail=str(item)))
    return aspects


def _conventions(value: Any) -> list[tuple[str, str]]:
    """How the engine counts its figures: (figure, definition) pairs."""
    conventions = _dict(value)
    if conventions is None:
        return []
    return [(str(key), _text(text)) for key, text in conventions.items()]


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
        sections=analysis_sections(result),
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
