"""The analyze stage's result, typed: what `run.run` returns (`ArchitectureAnalysis.to_dict()`,
corrected by the checkpoint's own tensors where its headers were read, plus
`new_against_known`) read back, and every judgement made of it.

`AnalysisResult.from_stored(mapping)` reads a stored row whatever version of the stage wrote
it: a missing key reads as None or empty, a value of the wrong type is ignored
(`engine.stored`), and it never raises. The stored release (its architecture and family), the
release page's analysis, the API, the release notes' section and the known families a new
release is compared against ask it, never the raw dict. What is judged of an analysis is
judged here once: the family's name, the attention kind, the experts and whether any layer
keeps a dense FFN, whether the counts are the checkpoint's, what is new against the known
families, the checkpoint's problems against the config.

The attention, RoPE, MoE and quantization summaries, the checkpoint's counts and the config's
figures stay mappings as stored: the page lists whatever figures they hold. Params are element
counts, sizes bytes, context lengths tokens. Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.architecture.checkpoint_analysis import CHECKPOINT
from engine.architecture.rope import TRANSFORMERS_ROPE_TYPES
from engine.formatting import finite
from engine.stages.fetch.result import NameList
from engine.stored import as_count, as_list, as_mapping, flag, text, whole_number

# How the parameters were counted where the analysis says nothing else (`params_source`),
# and by transformers' meta-device build.
FAMILY_TABLE = "family table"
TRANSFORMERS_BUILD = "transformers meta-device build"

# The result's figures that are numbers (counts, bytes, tokens): read with `as_count`.
_NUMBERS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "vocab_size",
    "intermediate_size",
    "total_params",
    "active_params",
    "active_params_including_embedding",
    "extra_params",
    "embedding_params",
    "router_score_bias_params",
    "mtp_layers",
    "weight_bytes",
    "checkpoint_total_size_bytes",
    "kv_cache_bytes_per_token",
    "kv_cache_bytes_at_max_context",
    "kv_cache_bytes_at_max_context_kept",
    "max_position_embeddings",
    "multimodal_tower_params",
)
# Its words: a string, or None.
_WORDS = ("architecture", "model_type", "family", "torch_dtype", "params_source")
# Its yes/no figures: a bool, or None.
_FLAGS = ("family_known", "tie_word_embeddings", "estimated")
# Its summaries kept as stored mappings (None where the row holds none).
_SUMMARIES = (
    "attention",
    "rope",
    "moe",
    "quantization",
    "kv_cache_windowed",
    "config_figures",
    CHECKPOINT,
    "checkpoint_check",
)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(item) for item in as_list(value))


def _counts(value: Any) -> dict[str, int | float]:
    """A stored mapping of numbers by name, anything that is not a number left out."""
    return {
        str(key): number
        for key, raw in as_mapping(value).items()
        if (number := as_count(raw)) is not None
    }


def _summary(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None


def _says(result: Mapping[str, Any], key: str) -> bool:
    """Whether the row says something of `key`: a summary, or None for none (a value of
    another type says nothing)."""
    return key in result and (result[key] is None or isinstance(result[key], Mapping))


@dataclass(frozen=True)
class NewAspect:
    """One way a release differs from every known family (`novelty.compare_with_known`): the
    aspect ("family", "config keys", "attention", "MoE layout", "checkpoint quantization",
    "RoPE type"; None when the row names none) and its detail, which names the aspect again
    ("RoPE type not seen before: yarn")."""

    aspect: str | None
    detail: str

    @classmethod
    def from_stored(cls, value: Any) -> NewAspect | None:
        """An entry of a stored `new_against_known`: a mapping, or (older rows) the detail
        alone; None for an empty one."""
        if isinstance(value, Mapping):
            aspect = str(value["aspect"]) if value.get("aspect") else None
            return cls(aspect, text(value.get("detail")) if value.get("detail") else "")
        return cls(None, str(value)) if value else None

    def to_dict(self) -> dict[str, Any]:
        return {"aspect": self.aspect, "detail": self.detail}

    @property
    def line(self) -> str:
        """The entry in one line: its detail (which names its aspect), else the aspect."""
        return self.detail or (self.aspect or "")

    @property
    def detail_without_aspect(self) -> str:
        """The detail without a leading repeat of its aspect: aspect "RoPE type", detail
        "RoPE type not seen before: yarn" → "not seen before: yarn"; "RoPE type: yarn" →
        "yarn"."""
        aspect, detail = self.aspect, self.detail
        if not aspect or not detail.lower().startswith(aspect.lower()):
            return detail
        rest = detail[len(aspect) :]
        if rest[:1].isalnum():  # "family" in "familyX": not a repeat of the aspect
            return detail
        return rest.lstrip(" :—-") or detail


@dataclass(frozen=True)
class ConfigCount:
    """A config-derived figure beside the checkpoint's: the config's value, the checkpoint's
    minus it (`difference`, and `relative` to it; None when the config's is 0), and the
    checkpoint's."""

    config: float | None
    difference: float | None
    relative: float | None
    checkpoint: float | None = None


@dataclass(frozen=True)
class CountGroup:
    """A tensor group whose parameters the config and the checkpoint count differently (the
    checkpoint's minus the config's: `difference`)."""

    group: str
    config: int | None
    checkpoint: int | None
    difference: int


@dataclass(frozen=True)
class WrongShape:
    """A checkpoint tensor whose shape is not the one the config implies."""

    name: str
    expected: Any = None
    found: Any = None


@dataclass(frozen=True)
class LayerCount:
    """Decoder layers (or MTP modules) the config implies against those the checkpoint holds
    (None when no tensor name shows one), with the layer ranges missing or past the config's
    ("" when none)."""

    config: int | None
    checkpoint: int | None
    missing: str = ""
    extra: str = ""


@dataclass(frozen=True)
class CheckpointCheck:
    """The checkpoint's tensors against what the config implies
    (`checkpoint_check.check_checkpoint`): the class transformers built ("" when it knows
    none, then `why_not`), tensors expected and matched, those missing, extra or ignored by
    transformers, those of another shape (`wrong_shape_count` in all, the first few named),
    the decoder layers, the MTP modules where their counts differ, names in two files and
    the names only the index or only the headers hold."""

    expected_from: str = ""
    why_not: str = ""
    expected_tensors: int | None = None
    matched_tensors: int | None = None
    missing: NameList | None = None
    extra: NameList | None = None
    ignored_by_transformers: NameList | None = None
    wrong_shape_count: int = 0
    wrong_shape: tuple[WrongShape, ...] = ()
    layers: LayerCount | None = None
    mtp: LayerCount | None = None
    duplicates: NameList | None = None
    index_only: NameList | None = None
    headers_only: NameList | None = None

    @classmethod
    def from_stored(cls, value: Any) -> CheckpointCheck | None:
        """The check of a stored `checkpoint_check`; None when it holds no mapping."""
        if not isinstance(value, Mapping):
            return None
        wrong = as_mapping(value.get("wrong_shape"))
        mismatch = as_mapping(value.get("index_mismatch"))
        return cls(
            expected_from=text(value.get("expected_from")),
            why_not=text(value.get("why_no_expected")),
            expected_tensors=whole_number(value.get("expected_tensors")),
            matched_tensors=whole_number(value.get("matched_tensors")),
            missing=NameList.from_stored(value.get("missing")),
            extra=NameList.from_stored(value.get("extra")),
            ignored_by_transformers=NameList.from_stored(value.get("ignored_by_transformers")),
            wrong_shape_count=whole_number(wrong.get("count")) or 0,
            wrong_shape=tuple(
                WrongShape(text(t.get("name")), t.get("expected"), t.get("found"))
                for t in as_list(wrong.get("tensors"))
                if isinstance(t, Mapping)
            ),
            layers=_layer_count(value.get("layers")),
            mtp=_layer_count(value.get("mtp")),
            duplicates=NameList.from_stored(value.get("duplicates")),
            index_only=NameList.from_stored(mismatch.get("index_only")),
            headers_only=NameList.from_stored(mismatch.get("headers_only")),
        )

    @property
    def layers_differ(self) -> bool:
        """Whether decoder layers are missing from the checkpoint or past the config's."""
        return self.layers is not None and bool(self.layers.missing or self.layers.extra)

    @property
    def problems(self) -> int:
        """How many problems the check found: each missing, extra and wrong-shape tensor,
        layers missing, layers past the config's, an MTP count that differs (each is a
        finding of its own)."""
        tensors = sum(listed.count for listed in (self.missing, self.extra) if listed)
        layers = self.layers or LayerCount(None, None)
        return (
            tensors
            + self.wrong_shape_count
            + bool(layers.missing)
            + bool(layers.extra)
            + (self.mtp is not None)
        )


@dataclass(frozen=True)
class LayerKindEstimate:
    """A `layer_types` name day0 does not know, and how its layers were counted: the kind it
    was counted as (one of `layer_kinds.py`'s kinds; "" where not said) and how many layers
    carry the name."""

    name: str
    counted_as: str
    layers: int

    @classmethod
    def from_stored(cls, value: Any) -> LayerKindEstimate:
        """An entry of a stored `estimated_layer_kinds` (a mapping: `LayerKindGuess.to_dict`);
        a missing name or kind reads as the text "None", as the notes always wrote it."""
        guess = as_mapping(value)
        return cls(
            name=str(guess.get("name")),
            counted_as=str(guess.get("counted_as")),
            layers=len(as_list(guess.get("layers"))),
        )


def _layer_count(value: Any) -> LayerCount | None:
    if not isinstance(value, Mapping) or not value:
        return None
    return LayerCount(
        config=whole_number(value.get("config")),
        checkpoint=whole_number(value.get("checkpoint")),
        missing=text(value.get("missing")) if value.get("missing") else "",
        extra=text(value.get("extra")) if value.get("extra") else "",
    )


@dataclass(frozen=True)
class AnalysisResult:
    """An analysis's result (`ArchitectureAnalysis` documents the figures; None where the row
    holds none). `says_moe` / `says_quantization`: whether the row says anything of experts /
    quantization at all (`moe` None with `says_moe`: a dense model; without: not said, as a
    row without the key or with a value that is no summary).
    `params_counted_from` is "checkpoint" where the counts are the checkpoint's own
    (`checkpoint` then holds its counts and the comparison with the config's, `config_figures`
    the config-derived figures, `checkpoint_check` the check), "config" or None otherwise.
    `new_against_known`: None where the row holds no comparison."""

    architecture: str | None = None
    model_type: str | None = None
    family: str | None = None
    family_known: bool | None = None
    num_layers: int | float | None = None
    hidden_size: int | float | None = None
    num_attention_heads: int | float | None = None
    num_kv_heads: int | float | None = None
    head_dim: int | float | None = None
    vocab_size: int | float | None = None
    intermediate_size: int | float | None = None
    attention: Mapping[str, Any] | None = None
    rope: Mapping[str, Any] | None = None
    moe: Mapping[str, Any] | None = None
    says_moe: bool = True
    quantization: Mapping[str, Any] | None = None
    says_quantization: bool = True
    total_params: int | float | None = None
    active_params: int | float | None = None
    active_params_including_embedding: int | float | None = None
    extra_params: int | float | None = None
    embedding_params: int | float | None = None
    router_score_bias_params: int | float | None = None
    mtp_layers: int | float | None = None
    weight_bytes: int | float | None = None
    weight_bytes_by_dtype: Mapping[str, int | float] = field(default_factory=dict)
    checkpoint_total_size_bytes: int | float | None = None
    kv_cache_bytes_per_token: int | float | None = None
    kv_cache_bytes_at_max_context: int | float | None = None
    kv_cache_bytes_at_max_context_kept: int | float | None = None
    kv_cache_windowed: Mapping[str, Any] | None = None
    max_position_embeddings: int | float | None = None
    tie_word_embeddings: bool | None = None
    torch_dtype: str | None = None
    config_keys: tuple[str, ...] = ()
    params_source: str | None = None
    estimated: bool | None = None
    params_by_group: Mapping[str, int | float] = field(default_factory=dict)
    multimodal_tower_params: int | float | None = None
    assumptions: tuple[str, ...] = ()
    estimated_layer_kinds: tuple[Mapping[str, Any], ...] = ()
    conventions: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    params_counted_from: str | None = None
    config_figures: Mapping[str, Any] | None = None
    checkpoint: Mapping[str, Any] | None = None
    checkpoint_check: Mapping[str, Any] | None = None
    new_against_known: tuple[NewAspect, ...] | None = None

    @classmethod
    def from_stored(cls, value: Any) -> AnalysisResult:
        """The result of a stored row (`StageRun.result`), whatever version wrote it; an
        empty result for anything but a mapping. Never raises."""
        result = as_mapping(value)
        new = result.get("new_against_known")
        return cls(
            **{key: as_count(result.get(key)) for key in _NUMBERS},
            **{key: _str(result.get(key)) for key in _WORDS},
            **{key: flag(result.get(key)) for key in _FLAGS},
            **{key: _summary(result.get(key)) for key in _SUMMARIES},
            says_moe=_says(result, "moe"),
            says_quantization=_says(result, "quantization"),
            weight_bytes_by_dtype=_counts(result.get("weight_bytes_by_dtype")),
            config_keys=_strings(result.get("config_keys")),
            params_by_group=_counts(result.get("params_by_group")),
            assumptions=_strings(result.get("assumptions")),
            estimated_layer_kinds=tuple(
                dict(g)
                for g in as_list(result.get("estimated_layer_kinds"))
                if isinstance(g, Mapping)
            ),
            conventions={
                str(key): str(words) for key, words in as_mapping(result.get("conventions")).items()
            },
            notes=_strings(result.get("notes")),
            params_counted_from=_str(result.get("params_counted_from")),
            new_against_known=(
                tuple(a for a in map(NewAspect.from_stored, new) if a is not None)
                if isinstance(new, list)
                else None
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        """The result as the stage stores it: every figure of `ArchitectureAnalysis.to_dict`
        ("moe" and "quantization" where the result says them), then the checkpoint's keys
        where its headers were read and `new_against_known` where compared."""
        result: dict[str, Any] = {key: getattr(self, key) for key in (*_NUMBERS, *_WORDS, *_FLAGS)}
        result |= {
            "attention": _summary(self.attention),
            "rope": _summary(self.rope),
            "kv_cache_windowed": _summary(self.kv_cache_windowed),
            "weight_bytes_by_dtype": dict(self.weight_bytes_by_dtype),
            "config_keys": list(self.config_keys),
            "params_by_group": dict(self.params_by_group),
            "assumptions": list(self.assumptions),
            "estimated_layer_kinds": [dict(g) for g in self.estimated_layer_kinds],
            "conventions": dict(self.conventions),
            "notes": list(self.notes),
        }
        if self.says_moe:
            result["moe"] = _summary(self.moe)
        if self.says_quantization:
            result["quantization"] = _summary(self.quantization)
        if self.params_counted_from is not None:
            result["params_counted_from"] = self.params_counted_from
        for key in ("config_figures", CHECKPOINT, "checkpoint_check"):
            if getattr(self, key) is not None:
                result[key] = _summary(getattr(self, key))
        if self.new_against_known is not None:
            result["new_against_known"] = [a.to_dict() for a in self.new_against_known]
        return result

    # --- what the release is -------------------------------------------------------------

    @property
    def is_analysis(self) -> bool:
        """Whether the row holds an analysis at all (its MTP count or its RoPE summary): a
        row of another shape has nothing to judge."""
        return self.mtp_layers is not None or self.rope is not None

    @property
    def family_name(self) -> str | None:
        """The family, else the model type (a family day0 does not know is named by it)."""
        return self.family or self.model_type

    @property
    def attention_kind(self) -> str | None:
        """ "MHA", "GQA", "MQA", "MLA"... (None where the row does not say)."""
        kind = as_mapping(self.attention).get("kind")
        return None if kind is None else str(kind)

    @property
    def rope_type(self) -> str | None:
        """The RoPE type ("default", "yarn", "llama3"...; None where not said)."""
        kind = as_mapping(self.rope).get("type")
        return str(kind) if kind else None

    @property
    def rope_type_unknown(self) -> bool:
        """Whether the RoPE type is one transformers does not implement."""
        return self.rope_type is not None and self.rope_type not in TRANSFORMERS_ROPE_TYPES

    @property
    def quantization_method(self) -> str | None:
        """The checkpoint's declared quantization method ("fp8", "mxfp4"...); None when it
        declares none or the row does not say."""
        method = as_mapping(self.quantization).get("method") or as_mapping(self.quantization).get(
            "quant_method"
        )
        return str(method) if method else None

    @property
    def is_moe(self) -> bool | None:
        """Whether the model has experts; None where the row does not say."""
        if not self.says_moe:
            return None
        return self.moe is not None

    @property
    def experts_routed(self) -> int | float | None:
        """The routed experts per MoE layer (None for a dense model)."""
        return as_count(as_mapping(self.moe).get("num_experts"))

    @property
    def experts_per_token(self) -> int | float | None:
        """The routed experts each token goes through (None for a dense model)."""
        return as_count(as_mapping(self.moe).get("experts_per_token"))

    @property
    def has_dense_ffn_layers(self) -> bool:
        """False only for a mixture of experts whose every layer is MoE (gpt-oss, Qwen3-MoE):
        its `intermediate_size` is then no dense FFN's width."""
        if self.moe is None:
            return True
        return not (self.moe.get("dense_layers") == 0 or self.moe.get("dense_layer_indices") == [])

    @property
    def has_mtp(self) -> bool:
        """Whether the checkpoint holds multi-token-prediction modules."""
        return isinstance(self.mtp_layers, int) and self.mtp_layers > 0

    @property
    def layer_kind_estimates(self) -> list[LayerKindEstimate]:
        """The `layer_types` names day0 does not know, each with the kind its layers were
        counted as (its figures are estimates; `exact_params` says whether the parameter
        counts are too)."""
        return [LayerKindEstimate.from_stored(guess) for guess in self.estimated_layer_kinds]

    @property
    def ships_code_for_unknown_family(self) -> bool:
        """Whether the config names modeling code shipped with the release (`auto_map`) for
        a family day0 does not know."""
        return "auto_map" in self.config_keys and self.family_known is False

    # --- how it was counted --------------------------------------------------------------

    @property
    def counted_from_checkpoint(self) -> bool:
        """Whether the counts are the checkpoint's, read from its safetensors headers."""
        return self.params_counted_from == CHECKPOINT and self.checkpoint is not None

    @property
    def exact_params(self) -> bool:
        """Whether the parameter counts are exact whatever a layer kind was guessed as:
        transformers built the model, or the checkpoint's tensors were counted."""
        return self.params_source == TRANSFORMERS_BUILD or self.params_counted_from == CHECKPOINT

    @property
    def params_from_family_table(self) -> bool:
        """Whether the parameters were counted from day0's own module list for the family
        (the usual way; a row that does not say counts as that)."""
        return not self.params_source or self.params_source == FAMILY_TABLE

    def kv_bytes_at_context(self, tokens: int) -> float | None:
        """KV-cache bytes of one sequence of `tokens` tokens over the whole model (as
        `engine.architecture.kv_cache.kv_cache_bytes_at_context`: a sliding layer keeps at most
        its window, a chunked one its chunk, a full one every token), from the bytes per token
        spread evenly over the KV layers. None when the result lacks the bytes per token or
        the count of KV layers."""
        attention = as_mapping(self.attention)
        per_token = finite(self.kv_cache_bytes_per_token)
        layers = finite(attention.get("kv_cache_layers"))
        if not per_token or not layers:
            return None
        window = as_count(attention.get("sliding_window")) or tokens
        chunk = as_count(attention.get("attention_chunk_size")) or tokens

        def count(key: str) -> int | float:
            return as_count(attention.get(key)) or 0

        return (per_token / layers) * (
            count("full_layers") * tokens
            + count("sliding_layers") * min(tokens, window)
            + count("chunked_layers") * min(tokens, chunk)
        )

    @property
    def kv_kept_differs(self) -> bool:
        """Whether an engine keeping out-of-window KV holds more at max context than one
        freeing it (sliding or chunked layers)."""
        kept = self.kv_cache_bytes_at_max_context_kept
        return kept is not None and kept != self.kv_cache_bytes_at_max_context

    def config_count(self, key: str) -> ConfigCount | None:
        """The config-derived `key` ("total_params", "active_params") beside the checkpoint's;
        None when the counts are the config's anyway, or the comparison lacks it."""
        if not self.counted_from_checkpoint:
            return None
        compared = as_mapping(as_mapping(self._comparison.get("figures")).get(key))
        if not compared:
            return None
        return ConfigCount(
            config=finite(compared.get("config")),
            difference=finite(compared.get("difference")),
            relative=finite(compared.get("relative")),
            checkpoint=finite(compared.get("checkpoint")),
        )

    @property
    def _comparison(self) -> Mapping[str, Any]:
        return as_mapping(as_mapping(self.checkpoint).get("comparison"))

    @property
    def counts_disagree(self) -> bool:
        """Whether the config-derived total and the checkpoint's disagree beyond rounding
        (the checkpoint's is then used, and `count_groups` says where they differ)."""
        compared = as_mapping(self._comparison.get("figures")).get("total_params")
        return bool(compared) and self._comparison.get("agree", True) is False

    @property
    def count_groups(self) -> list[CountGroup]:
        """The tensor groups whose counts differ between the config and the checkpoint."""
        return [
            CountGroup(
                group=str(group),
                config=whole_number(g.get("config")),
                checkpoint=whole_number(g.get("checkpoint")),
                difference=whole_number(g.get("difference")) or 0,
            )
            for group, g in as_mapping(self._comparison.get("groups")).items()
            if isinstance(g, Mapping)
        ]

    @property
    def config_count_estimated(self) -> bool:
        """Whether the config-derived counts the checkpoint's replaced were an estimate."""
        return bool(as_mapping(self.config_figures).get("estimated"))

    @property
    def check(self) -> CheckpointCheck | None:
        """The checkpoint checked against the config; None where its headers were not read."""
        return CheckpointCheck.from_stored(self.checkpoint_check)

    # --- against the families known before -----------------------------------------------

    @property
    def new_aspects(self) -> tuple[NewAspect, ...]:
        """What this release has that the known families did not (none where not compared)."""
        return self.new_against_known or ()
