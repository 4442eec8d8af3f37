"""The analysis's figures from the checkpoint's own tensors (its safetensors headers): the
config-derived counts beside the checkpoint's, and the checkpoint's counts per group and
dtype with what checking it against the config found. Values only; the words are the
templates' (`analysis_label.html`, `analysis_value.html`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adaptation.presenters.analysis_figures import Figure, Figures
from adaptation.presenters.figure_sources import COMPUTED, FROM_HEADERS
from engine.formatting import finite
from engine.stored import as_mapping

# The analysis's key for where its counts come from, and the value for the headers.
COUNTED_FROM = "params_counted_from"
CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class ConfigCount:
    """A config-derived figure beside the checkpoint's: its value, and the checkpoint's minus
    it (`difference`, and `relative` to it; None when the config's is 0)."""

    config: float | None
    difference: float | None
    relative: float | None


@dataclass(frozen=True)
class CheckSummary:
    """What checking the checkpoint against the config found: the class transformers built
    (`expected_from`, "" when it knows none, then `why_not`), tensors matched of those
    expected, and how many problems there are (missing, extra and wrong-shape tensors,
    layers missing or past the config's, an MTP count that differs; each is a finding)."""

    expected_from: str
    matched: int | None
    expected: int | None
    problems: int
    why_not: str = ""


def counted_from_checkpoint(result: Mapping[str, Any]) -> bool:
    """Whether the analysis's counts are the checkpoint's (its headers were read)."""
    return result.get(COUNTED_FROM) == CHECKPOINT and isinstance(result.get(CHECKPOINT), Mapping)


def config_beside(result: Mapping[str, Any], key: str) -> Figure | None:
    """The config-derived `key` ("total_params", "active_params") beside the checkpoint's, as
    the figure `config_figures.<key>`; None when the counts are the config's anyway."""
    if not counted_from_checkpoint(result):
        return None
    figures = as_mapping(as_mapping(result[CHECKPOINT].get("comparison")).get("figures"))
    compared = as_mapping(figures.get(key))
    if not compared:
        return None
    value = ConfigCount(
        config=finite(compared.get("config")),
        difference=finite(compared.get("difference")),
        relative=finite(compared.get("relative")),
    )
    return Figure(f"config_figures.{key}", value, COMPUTED, "config_count", "summary")


def _problems(check: Mapping[str, Any]) -> int:
    count = sum(int(as_mapping(check.get(k)).get("count") or 0) for k in ("missing", "extra"))
    count += int(as_mapping(check.get("wrong_shape")).get("count") or 0)
    layers = as_mapping(check.get("layers"))
    count += bool(layers.get("missing")) + bool(layers.get("extra")) + bool(check.get("mtp"))
    return count


def _nonzero_pairs(value: Any) -> dict[str, Any]:
    return {str(k): v for k, v in as_mapping(value).items() if finite(v)}


def checkpoint_figures(result: Mapping[str, Any], figures: Figures) -> list[Figure]:
    """The checkpoint's own figures ([] when its headers were not read): tensors, decoder
    layers and MTP modules held, parameters per group and per stored dtype (packed 4-bit
    values unpacked), MTP, tower and buffer parameters, quantization scale bytes, and the
    check against the config."""
    if not counted_from_checkpoint(result):
        return []
    ckpt = result[CHECKPOINT]
    check = as_mapping(result.get("checkpoint_check"))

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
        expected_from=str(check.get("expected_from") or ""),
        matched=check.get("matched_tensors"),
        expected=check.get("expected_tensors"),
        problems=_problems(check),
        why_not=str(check.get("why_no_expected") or ""),
    )
    shown.append(Figure("checkpoint_check", summary, FROM_HEADERS, "checkpoint_check", "summary"))
    return shown
