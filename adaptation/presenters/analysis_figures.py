"""An analysis figure as the page shows it: the result's key for it, its value (numbers as
numbers, a long per-layer list as counts, a mapping as pairs), how the template writes it, and
where it comes from (`figure_sources`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adaptation.presenters.figure_sources import COMPUTED, FigureSources
from engine.formatting import finite

# A list of more names than this (a per-layer pattern) is shown as counts per name.
LONG_NAME_LIST = 8


@dataclass(frozen=True)
class NameCounts:
    """A long list of names (one per layer) as how often each comes, in first-seen order."""

    counts: list[tuple[str, int]]
    total: int


@dataclass(frozen=True)
class QuantizationSummary:
    """The quantization a config declares, in brief: none (`declared` False), or a method with
    its format (when it differs from the method) and bits per weight."""

    declared: bool
    method: str = ""
    format: str = ""
    bits: int | float | None = None


@dataclass(frozen=True)
class Figure:
    """One figure of the analysis.

    `key` is the result's key for it ("num_layers", "attention.kv_lora_rank"); `value` what the
    page shows (None when missing); `shape` what kind of value that is ("scalar"; "list";
    "counts": a `NameCounts`; "pairs": a mapping as (key, value) pairs; "summary": a dataclass
    of the `unit`); `unit` how the template writes it: "" a config value as it is, "count",
    "tokens", "params", "gib", "bytes_per_token" (numbers), "bytes_by_dtype" ((dtype, bytes)
    pairs, largest first), "scale_block", "modules" (an empty list reads "none"), "family",
    "quantization", "dense" (no experts); `source` where it comes from (`figure_sources`:
    "config", "computed", "index"; "" for a missing figure).
    """

    key: str
    value: Any
    source: str
    unit: str = ""
    shape: str = "scalar"

    @property
    def group(self) -> str:
        """The result's sub-mapping the figure is in ("attention", "rope", "moe",
        "quantization"), "" for a top-level figure."""
        return self.key.rpartition(".")[0]

    @property
    def title(self) -> str:
        """The key as a title, for a figure the template has no label for: "kv_lora_rank" →
        "KV LoRA rank"."""
        words = self.key.rpartition(".")[2].replace("_", " ").split()
        text = " ".join(_KEY_WORDS.get(w.lower(), w) for w in words)
        return text[:1].upper() + text[1:]


# How key words are spelled in a title.
_KEY_WORDS = {
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


def item_shown(value: Any) -> Any:
    """A value inside a list or mapping: a whole float as an int (config JSON writes 40.0)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return int(value)
    return None if value == "" else value


def shown_value(value: Any) -> tuple[Any, str]:
    """A result value as the page shows it, with its shape (see `Figure`): None when empty."""
    if value is None or value == "" or value == [] or value == {}:
        return None, "scalar"
    if isinstance(value, list):
        if len(value) > LONG_NAME_LIST and all(isinstance(v, str) for v in value):
            return NameCounts(list(Counter(value).items()), len(value)), "counts"
        return [item_shown(v) for v in value], "list"
    if isinstance(value, Mapping):
        return [(str(key), item_shown(item)) for key, item in value.items()], "pairs"
    return item_shown(value), "scalar"


_NUMBERS = {"count", "tokens", "params", "gib", "bytes_per_token"}


@dataclass(frozen=True)
class Figures:
    """Makes figures, with their sources, against the config the analysis read."""

    sources: FigureSources

    def of(self, key: str, raw: Any, unit: str = "") -> Figure:
        """The figure `key` holding `raw`: a number for the number units, else as shown."""
        if unit in _NUMBERS:
            value, shape = finite(raw), "scalar"
        else:
            value, shape = shown_value(raw)
        missing = value is None and unit != "modules"  # no modules left unquantized: "none"
        return Figure(key, value, "" if missing else self.sources.source(key, raw), unit, shape)

    def computed(self, key: str, value: Any, unit: str) -> Figure:
        """A figure the page summarises itself from the result (computed unless missing)."""
        return Figure(key, value, "" if value is None else COMPUTED, unit, "summary")
