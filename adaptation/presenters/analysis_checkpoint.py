"""The analysis's figures from the checkpoint's own tensors (its safetensors headers): the
config-derived counts beside the checkpoint's, and the checkpoint's counts per group and
dtype with what checking it against the config found, read through `AnalysisResult`. Values
only; the words are the templates' (`analysis_label.html`, `analysis_value.html`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adaptation.presenters.analysis_figures import Figure, Figures
from adaptation.presenters.figure_sources import COMPUTED, FROM_HEADERS
from engine.formatting import finite
from engine.stages.analyze.result import AnalysisResult, CheckpointCheck
from engine.stored import as_mapping


@dataclass(frozen=True)
class CheckSummary:
    """What checking the checkpoint against the config found (`AnalysisResult.check`): the
    class transformers built (`expected_from`, "" when it knows none, then `why_not`),
    tensors matched of those expected, and how many problems there are
    (`CheckpointCheck.problems`; each is a finding)."""

    expected_from: str
    matched: int | None
    expected: int | None
    problems: int
    why_not: str = ""


def config_beside(result: AnalysisResult, key: str) -> Figure | None:
    """The config-derived `key` ("total_params", "active_params") beside the checkpoint's, as
    the figure `config_figures.<key>` (an `analyze.result.ConfigCount`); None when the counts
    are the config's anyway."""
    value = result.config_count(key)
    if value is None:
        return None
    return Figure(f"config_figures.{key}", value, COMPUTED, "config_count", "summary")


def _nonzero_pairs(value: Any) -> dict[str, Any]:
    return {str(k): v for k, v in as_mapping(value).items() if finite(v)}


def checkpoint_figures(result: AnalysisResult, figures: Figures) -> list[Figure]:
    """The checkpoint's own figures ([] when its headers were not read): tensors, decoder
    layers and MTP modules held, parameters per group and per stored dtype (packed 4-bit
    values unpacked), MTP, tower and buffer parameters, quantization scale bytes, and the
    check against the config."""
    if not result.counted_from_checkpoint:
        return []
    ckpt = as_mapping(result.checkpoint)
    check = result.check or CheckpointCheck()

    def counted(key: str, unit: str, value: Any = None) -> Figure:
        raw = ckpt.get(key) if value is None else value
        shown = figures.of(f"checkpoint.{key}", raw, unit)
        return Figure(
            shown.key, shown.value, FROM_HEADERS if shown.source else "", unit, shown.shape
        )

    shown = [
        counted("tensor_count", "count"),
        counted("decoder_layers", "count"),
        counted("params_by_group", "params_by_key", _nonzero_pairs(ckpt.get("params_by_group"))),
        counted("params_by_dtype", "params_by_key", _nonzero_pairs(ckpt.get("params_by_dtype"))),
    ]
    for key, unit in (
        ("mtp_modules", "count"),
        ("extra_params", "params"),
        ("multimodal_tower_params", "params"),
        ("buffer_params", "params"),
        ("scale_bytes", "gib"),
        ("packed_tensors", "count"),
    ):
        if finite(ckpt.get(key)):
            shown.append(counted(key, unit))
    summary = CheckSummary(
        expected_from=check.expected_from,
        matched=check.matched_tensors,
        expected=check.expected_tensors,
        problems=check.problems,
        why_not=check.why_not,
    )
    shown.append(Figure("checkpoint_check", summary, FROM_HEADERS, "checkpoint_check", "summary"))
    return shown
