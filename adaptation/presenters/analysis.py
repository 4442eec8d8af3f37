"""The release page's analysis: the latest successful `analyze` result, read through
`AnalysisResult`, as sections of figures (each with its value, how it is written and where it
comes from), its notes, what is new against known families, and how the engine counts its
figures.

Every label, note and unit is the template's (`panels/analyze.html` and the
`analysis_*.html` partials it includes); a figure says only which it is (`key`), what it
holds and how to write it (`unit`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adaptation.models import ModelRelease, StageRun, StageStatus
from adaptation.presenters.analysis_checkpoint import checkpoint_figures, config_beside
from adaptation.presenters.analysis_figures import (
    Figure,
    Figures,
    QuantizationSummary,
    item_shown,
    shown_value,
)
from adaptation.presenters.figure_sources import COMPUTED, FigureSources
from adaptation.presenters.release_jobs import release_jobs
from engine.formatting import finite
from engine.stages.analyze.result import AnalysisResult
from engine.stages.fetch.result import FetchResult

ANALYZE_STAGE = "analyze"
# The page shows the first sections (model, size, shape) open and folds the rest.
OPEN_SECTIONS = 3


@dataclass(frozen=True)
class AnalysisSection:
    """A group of figures: "model", "size", "shape", "attention", "rope", "moe",
    "quantization" or "checkpoint" (the template titles it)."""

    kind: str
    figures: list[Figure]


@dataclass(frozen=True)
class NewAspect:
    """One way a release differs from every known family (`aspect` None when not named), its
    detail without a leading repeat of the aspect (`analyze.result.NewAspect`)."""

    aspect: str | None
    detail: str


@dataclass(frozen=True)
class Analysis:
    """The latest successful analysis of a release: its figures by section, its notes, how it
    differs from known families (`family_known` None when it did not say), how many
    multi-token-prediction modules it has (None when not counted) and how its figures are
    counted ((figure, definition) pairs)."""

    run: StageRun
    sections: list[AnalysisSection]
    notes: list[str]
    new_against_known: list[NewAspect]
    family_known: bool | None
    mtp_layers: int | None
    conventions: list[tuple[str, str]]
    # Whether the counts are the checkpoint's, read from its safetensors headers.
    from_headers: bool = False

    @property
    def open_sections(self) -> list[AnalysisSection]:
        """The sections the page shows open: the model, its size and its shape."""
        return self.sections[:OPEN_SECTIONS]

    @property
    def folded_sections(self) -> list[AnalysisSection]:
        """The sections folded under their titles (attention, position encoding, ...)."""
        return self.sections[OPEN_SECTIONS:]

    @property
    def folded_figures(self) -> int:
        """How many figures the folded sections hold."""
        return sum(len(section.figures) for section in self.folded_sections)


# Attention figures in the order shown (then any other key the result has).
_ATTENTION_KEYS = (
    "layer_pattern",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "sliding_window",
    "attention_chunk_size",
    "full_layers",
    "sliding_layers",
    "chunked_layers",
    "linear_attention_layers",
    "ssm_layers",
    "kv_cache_layers",
)
_TOKEN_SPANS = {"sliding_window", "attention_chunk_size"}
# Layer counts: a zero count is left out (no such layers).
_LAYER_COUNTS = {
    "full_layers",
    "sliding_layers",
    "chunked_layers",
    "linear_attention_layers",
    "ssm_layers",
}


def _attention(attention: Mapping[str, Any] | None, figures: Figures) -> list[Figure]:
    """Kind, then the figures the attention summary has: absent, null and zero layer counts
    are left out; the per-layer list only when there is no pattern summary."""
    if attention is None:
        return [figures.of("attention.kind", None)]
    shown = [figures.of("attention.kind", attention.get("kind"))]
    keys = [*_ATTENTION_KEYS, *(k for k in attention if k not in _ATTENTION_KEYS and k != "kind")]
    for key in keys:
        value = attention.get(key)
        if shown_value(value)[0] is None or (key in _LAYER_COUNTS and value == 0):
            continue
        if key == "layer_types" and attention.get("layer_pattern"):
            continue
        unit = "tokens" if key in _TOKEN_SPANS else ""
        shown.append(figures.of(f"attention.{key}", value, unit))
    return shown


def _rope(rope: Mapping[str, Any] | None, figures: Figures) -> list[Figure]:
    """Type, factor and theta (a dash when missing), then any other RoPE figure."""
    rope = rope or {}
    shown = [figures.of(f"rope.{key}", rope.get(key)) for key in ("type", "factor", "theta")]
    shown += [
        figures.of(f"rope.{key}", value)
        for key, value in rope.items()
        if key not in ("type", "factor", "theta") and value is not None
    ]
    return shown


_MOE_KEYS = (
    "num_experts",
    "experts_per_token",
    "num_shared_experts",
    "moe_layers",
    "dense_layers",
    "expert_intermediate_size",
    "scoring",
    "n_group",
    "topk_group",
)


def _experts(result: AnalysisResult, figures: Figures) -> list[Figure]:
    """The mixture of experts: a dash when the result does not say, "dense" when it has no
    experts, else its figures."""
    if result.is_moe is None:
        return [figures.of("moe", None)]
    moe = result.moe
    if moe is None:
        return [figures.computed("moe", True, "dense")]
    shown = [figures.of(f"moe.{key}", moe.get(key)) for key in _MOE_KEYS]
    shown += [
        figures.of(f"moe.{key}", value)
        for key, value in moe.items()
        if key not in _MOE_KEYS and shown_value(value)[0] is not None
    ]
    return shown


def _quantization_summary(result: AnalysisResult) -> QuantizationSummary | None:
    """The declared quantization in brief (None when the result does not say)."""
    if not result.says_quantization:
        return None
    quant = result.quantization
    if quant is None:
        return QuantizationSummary(declared=False)
    method = result.quantization_method
    written = quant.get("format")
    bits = finite(quant.get("bits"))
    return QuantizationSummary(
        declared=True,
        method=method or "",
        format=str(written) if written and written != method else "",
        bits=None if bits is None else item_shown(bits),
    )


# Quantization figures in the order shown (then any other key), with how each is written.
_QUANT_UNITS = {
    "method": "",
    "quant_method": "",
    "format": "",
    "bits": "",
    "weight_block_size": "scale_block",
    "group_size": "",
    "scale_format": "",
    "activation_scheme": "",
    "modules_not_converted": "modules",
    "quantized_params": "params",
    "unquantized_params": "params",
    "scale_bytes": "gib",
}


def _quantization(result: AnalysisResult, figures: Figures) -> AnalysisSection | None:
    """The quantization details, when the config declares a quantization."""
    quant = result.quantization
    if quant is None:
        return None
    shown = [
        figures.of(f"quantization.{key}", quant[key], unit)
        for key, unit in _QUANT_UNITS.items()
        if key in quant and (quant[key] is not None or key == "modules_not_converted")
    ]
    shown += [
        figures.of(f"quantization.{key}", value)
        for key, value in quant.items()
        if key not in _QUANT_UNITS and value is not None
    ]
    return AnalysisSection("quantization", shown)


def _bytes_by_dtype(by_dtype: Mapping[str, float]) -> list[tuple[str, float]] | None:
    """Weight bytes per stored dtype, largest first (None when the result has none)."""
    if not by_dtype:
        return None
    return sorted(((dtype, float(size)) for dtype, size in by_dtype.items()), key=lambda i: -i[1])


def _windowed_and_estimated(result: AnalysisResult, figures: Figures) -> list[Figure]:
    """The figures only some releases have: full-length KV at max context where sliding layers
    make it differ from the freed figure (engines that keep out-of-window KV), and how the
    parameters were counted where day0's family table did not (transformers' meta-device
    build, or an estimate with what it assumed)."""
    shown = []
    if result.kv_kept_differs:
        shown.append(
            figures.of(
                "kv_cache_bytes_at_max_context_kept",
                result.kv_cache_bytes_at_max_context_kept,
                "gib",
            )
        )
    if not result.params_from_family_table:
        shown.append(figures.of("params_source", result.params_source))
    if result.assumptions:
        shown.append(figures.of("assumptions", "; ".join(result.assumptions)))
    return shown


def analysis_sections(
    result: AnalysisResult, config: Mapping[str, Any] | None = None
) -> list[AnalysisSection]:
    """The analysis result as sections of figures; a figure the result lacks is missing.

    `config` is the `config.json` the analysis read; a figure's source is "config" only when
    that config holds it (`figure_sources.FIGURE_CONFIG_KEYS`), else "computed".
    """
    figures = Figures(FigureSources.of_config(config, from_headers=result.counted_from_checkpoint))
    of = figures.of
    family = shown_value(result.family)[0]
    by_dtype = _bytes_by_dtype(result.weight_bytes_by_dtype)
    model = [
        of("architecture", result.architecture),
        of("model_type", result.model_type),
        Figure(
            "family",
            family,
            COMPUTED if family is not None or result.family_known is False else "",
            "family",
        ),
        of("torch_dtype", result.torch_dtype),
        figures.computed("quantization_summary", _quantization_summary(result), "quantization"),
        of("tie_word_embeddings", result.tie_word_embeddings),
    ]
    size = [
        of("total_params", result.total_params, "params"),
        *filter(None, [config_beside(result, "total_params")]),
        of("active_params", result.active_params, "params"),
        *filter(None, [config_beside(result, "active_params")]),
        of("extra_params", result.extra_params, "params"),
        of("embedding_params", result.embedding_params, "params"),
        of("weight_bytes", result.weight_bytes, "gib"),
        Figure(
            "weight_bytes_by_dtype",
            by_dtype,
            ""
            if by_dtype is None
            else figures.sources.source("weight_bytes_by_dtype", result.weight_bytes_by_dtype),
            "bytes_by_dtype",
            "pairs",
        ),
        of("checkpoint_total_size_bytes", result.checkpoint_total_size_bytes, "gib"),
        of("kv_cache_bytes_per_token", result.kv_cache_bytes_per_token, "bytes_per_token"),
        of("kv_cache_bytes_at_max_context", result.kv_cache_bytes_at_max_context, "gib"),
        *_windowed_and_estimated(result, figures),
    ]
    shape = [
        of(key, getattr(result, key), "count")
        for key in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim")
    ]
    if result.has_dense_ffn_layers:
        shape.append(of("intermediate_size", result.intermediate_size, "count"))
    shape += [
        of("vocab_size", result.vocab_size, "tokens"),
        of("max_position_embeddings", result.max_position_embeddings, "tokens"),
    ]
    quantization = _quantization(result, figures)
    checkpoint = checkpoint_figures(result, figures)
    return [
        AnalysisSection("model", model),
        AnalysisSection("size", size),
        AnalysisSection("shape", shape),
        AnalysisSection("attention", _attention(result.attention, figures)),
        AnalysisSection("rope", _rope(result.rope, figures)),
        AnalysisSection("moe", _experts(result, figures)),
        *([quantization] if quantization else []),
        *([AnalysisSection("checkpoint", checkpoint)] if checkpoint else []),
    ]


def latest_analysis_run(release: ModelRelease) -> StageRun | None:
    """The most recently finished succeeded `analyze` attempt over all the release's jobs."""
    runs = [
        run
        for job in release_jobs(release)
        for run in job.stage_runs.all()
        if run.stage == ANALYZE_STAGE and run.status == StageStatus.SUCCEEDED
    ]
    if not runs:
        return None
    return max(runs, key=lambda r: (r.finished_at is not None, r.finished_at, r.job_id, r.attempt))


def analysed_config(release: ModelRelease, run: StageRun) -> Mapping[str, Any] | None:
    """The `config.json` an analysis read: the release's stored config, else the config in
    the result of the latest succeeded fetch of the analysis's job (prefetched runs)."""
    if isinstance(release.config, Mapping):
        return release.config
    fetches = [
        other
        for job in release_jobs(release)
        if job.pk == run.job_id
        for other in job.stage_runs.all()
        if other.stage == "fetch" and other.status == StageStatus.SUCCEEDED
    ]
    for fetch in sorted(fetches, key=lambda r: r.attempt, reverse=True):
        config = FetchResult.from_stored(fetch.result).config
        if config is not None:
            return config
    return None


def analysis(release: ModelRelease) -> Analysis | None:
    """The release's latest successful analysis, or None when no analysis succeeded yet."""
    run = latest_analysis_run(release)
    if run is None:
        return None
    result = AnalysisResult.from_stored(run.result)
    return Analysis(
        run=run,
        sections=analysis_sections(result, analysed_config(release, run)),
        notes=list(result.notes),
        new_against_known=[
            NewAspect(aspect.aspect, aspect.detail_without_aspect) for aspect in result.new_aspects
        ],
        family_known=result.family_known,
        mtp_layers=result.mtp_layers if isinstance(result.mtp_layers, int) else None,
        conventions=list(result.conventions.items()),
        from_headers=result.counted_from_checkpoint,
    )
