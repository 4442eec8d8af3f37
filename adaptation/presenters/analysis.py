"""The release page's analysis: the latest successful `analyze` result as sections of figures
(each with its value, how it is written and where it comes from), its notes, what is new
against known families, and how the engine counts its figures.

Every label, note and unit is the template's (`panels/analyze.html` and the
`analysis_*.html` partials it includes); a figure says only which it is (`key`), what it
holds and how to write it (`unit`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adaptation.models import ModelRelease, StageRun, StageStatus
from adaptation.presenters.analysis_checkpoint import (
    checkpoint_figures,
    config_beside,
    counted_from_checkpoint,
)
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
    """One way a release differs from every known family (`aspect` None when not named)."""

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


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


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


def _experts(result: Mapping[str, Any], figures: Figures) -> list[Figure]:
    """The mixture of experts: a dash when the result does not say, "dense" when it has no
    experts, else its figures."""
    if "moe" not in result:
        return [figures.of("moe", None)]
    moe = _mapping(result.get("moe"))
    if moe is None:
        return [figures.computed("moe", True, "dense")]
    shown = [figures.of(f"moe.{key}", moe.get(key)) for key in _MOE_KEYS]
    shown += [
        figures.of(f"moe.{key}", value)
        for key, value in moe.items()
        if key not in _MOE_KEYS and shown_value(value)[0] is not None
    ]
    return shown


def _has_dense_layers(result: Mapping[str, Any]) -> bool:
    """False only for a mixture of experts whose every layer is MoE (gpt-oss, Qwen3-MoE):
    its `intermediate_size` is no dense FFN's width."""
    moe = _mapping(result.get("moe"))
    if moe is None:
        return True
    return not (moe.get("dense_layers") == 0 or moe.get("dense_layer_indices") == [])


def _quantization_summary(result: Mapping[str, Any]) -> QuantizationSummary | None:
    """The declared quantization in brief (None when the result does not say)."""
    if "quantization" not in result:
        return None
    quant = result.get("quantization")
    if quant is None:
        return QuantizationSummary(declared=False)
    if not isinstance(quant, Mapping):
        return QuantizationSummary(declared=True, other=shown_value(quant)[0])
    method = quant.get("method") or quant.get("quant_method")
    written = quant.get("format")
    bits = finite(quant.get("bits"))
    return QuantizationSummary(
        declared=True,
        method=str(method or ""),
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


def _quantization(result: Mapping[str, Any], figures: Figures) -> AnalysisSection | None:
    """The quantization details, when the config declares a quantization."""
    quant = _mapping(result.get("quantization"))
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


def _bytes_by_dtype(value: Any) -> list[tuple[str, float]] | None:
    """Weight bytes per stored dtype, largest first (None when the result has none)."""
    by_dtype = _mapping(value)
    if not by_dtype:
        return None
    sizes = [(str(dtype), finite(size)) for dtype, size in by_dtype.items()]
    return sorted(sizes, key=lambda item: -(item[1] or 0.0))  # type: ignore[return-value]


def _windowed_and_estimated(result: Mapping[str, Any], figures: Figures) -> list[Figure]:
    """The figures only some releases have: full-length KV at max context where sliding layers
    make it differ from the freed figure (engines that keep out-of-window KV), and how the
    parameters were counted where day0's family table did not (transformers' meta-device
    build, or an estimate with what it assumed)."""
    shown = []
    kept = result.get("kv_cache_bytes_at_max_context_kept")
    if kept is not None and kept != result.get("kv_cache_bytes_at_max_context"):
        shown.append(figures.of("kv_cache_bytes_at_max_context_kept", kept, "gib"))
    source = result.get("params_source")
    if source and source != "family table":
        shown.append(figures.of("params_source", source))
    if result.get("assumptions"):
        shown.append(figures.of("assumptions", "; ".join(map(str, result["assumptions"]))))
    return shown


def analysis_sections(
    result: Mapping[str, Any], config: Mapping[str, Any] | None = None
) -> list[AnalysisSection]:
    """The analysis result as sections of figures; a key the result lacks is a missing figure.

    `config` is the `config.json` the analysis read; a figure's source is "config" only when
    that config holds it (`figure_sources.FIGURE_CONFIG_KEYS`), else "computed".
    """
    figures = Figures(FigureSources.of_config(config, from_headers=counted_from_checkpoint(result)))
    of = figures.of
    family = shown_value(result.get("family"))[0]
    by_dtype = _bytes_by_dtype(result.get("weight_bytes_by_dtype"))
    model = [
        of("architecture", result.get("architecture")),
        of("model_type", result.get("model_type")),
        Figure(
            "family",
            family,
            COMPUTED if family is not None or result.get("family_known") is False else "",
            "family",
        ),
        of("torch_dtype", result.get("torch_dtype")),
        figures.computed("quantization_summary", _quantization_summary(result), "quantization"),
        of("tie_word_embeddings", result.get("tie_word_embeddings")),
    ]
    size = [
        of("total_params", result.get("total_params"), "params"),
        *filter(None, [config_beside(result, "total_params")]),
        of("active_params", result.get("active_params"), "params"),
        *filter(None, [config_beside(result, "active_params")]),
        of("extra_params", result.get("extra_params"), "params"),
        of("embedding_params", result.get("embedding_params"), "params"),
        of("weight_bytes", result.get("weight_bytes"), "gib"),
        Figure(
            "weight_bytes_by_dtype",
            by_dtype,
            ""
            if by_dtype is None
            else figures.sources.source(
                "weight_bytes_by_dtype", result.get("weight_bytes_by_dtype")
            ),
            "bytes_by_dtype",
            "pairs",
        ),
        of("checkpoint_total_size_bytes", result.get("checkpoint_total_size_bytes"), "gib"),
        of("kv_cache_bytes_per_token", result.get("kv_cache_bytes_per_token"), "bytes_per_token"),
        of("kv_cache_bytes_at_max_context", result.get("kv_cache_bytes_at_max_context"), "gib"),
        *_windowed_and_estimated(result, figures),
    ]
    shape = [
        of(key, result.get(key), "count")
        for key in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim")
    ]
    if _has_dense_layers(result):
        shape.append(of("intermediate_size", result.get("intermediate_size"), "count"))
    shape += [
        of("vocab_size", result.get("vocab_size"), "tokens"),
        of("max_position_embeddings", result.get("max_position_embeddings"), "tokens"),
    ]
    quantization = _quantization(result, figures)
    checkpoint = checkpoint_figures(result, figures)
    return [
        AnalysisSection("model", model),
        AnalysisSection("size", size),
        AnalysisSection("shape", shape),
        AnalysisSection("attention", _attention(_mapping(result.get("attention")), figures)),
        AnalysisSection("rope", _rope(_mapping(result.get("rope")), figures)),
        AnalysisSection("moe", _experts(result, figures)),
        *([quantization] if quantization else []),
        *([AnalysisSection("checkpoint", checkpoint)] if checkpoint else []),
    ]


def _detail_without_aspect(aspect: str | None, detail: str) -> str:
    """The detail without a leading repeat of its aspect: aspect "RoPE type", detail
    "RoPE type not seen before: yarn" → "not seen before: yarn"; "RoPE type: yarn" → "yarn"."""
    if not aspect or not detail.lower().startswith(aspect.lower()):
        return detail
    rest = detail[len(aspect) :]
    if rest[:1].isalnum():  # "family" in "familyX": not a repeat of the aspect
        return detail
    return rest.lstrip(" :—-") or detail


def _new_aspects(value: Any) -> list[NewAspect]:
    if not isinstance(value, list):
        return []
    aspects = []
    for item in value:
        if isinstance(item, Mapping):
            aspect = str(item["aspect"]) if item.get("aspect") else None
            detail = str(item.get("detail") or "")
            aspects.append(NewAspect(aspect, _detail_without_aspect(aspect, detail)))
        elif item:
            aspects.append(NewAspect(None, str(item)))
    return aspects


def _conventions(value: Any) -> list[tuple[str, str]]:
    """How the engine counts its figures: (figure, definition) pairs."""
    conventions = _mapping(value) or {}
    return [(str(key), str(text)) for key, text in conventions.items()]


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
    mtp = result.get("mtp_layers")
    return Analysis(
        run=run,
        sections=analysis_sections(result, analysed_config(release, run)),
        notes=[str(n) for n in notes] if isinstance(notes, list) else [],
        new_against_known=_new_aspects(result.get("new_against_known")),
        family_known=family_known if isinstance(family_known, bool) else None,
        mtp_layers=mtp if isinstance(mtp, int) and not isinstance(mtp, bool) else None,
        conventions=_conventions(result.get("conventions")),
        from_headers=counted_from_checkpoint(result),
    )
