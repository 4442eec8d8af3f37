"""Build a scaled twin: the release's own architecture class at CPU-sized widths.

`build_twin(config)` resolves the class (transformers' own, or the release's shipped modeling
code when the caller allows it: see `workers.stages.remote_code`), shrinks the config with
`shrink.shrink_config`, seeds torch and instantiates the model with the class's own weight
initialisation, so the same config and seed give the same weights on every run.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from workers.stages.architecture import AnalysisError, analyze_config
from workers.stages.architecture.config_reader import unwrap_text_config
from workers.stages.base import StageFailed

from .shrink import PROMPT_BATCH, PROMPT_TOKENS, invariants, shrink_config

# Config values copied unchanged into the twin that decide a code path; each is listed in the
# description's invariants with its value (norm epsilon, activation, biases, RoPE theta, ...).
COPIED_KEYS = (
    "hidden_act",
    "rms_norm_eps",
    "layer_norm_eps",
    "attention_bias",
    "mlp_bias",
    "rope_theta",
    "partial_rotary_factor",
    "swiglu_limit",
    "scoring_func",
    "norm_topk_prob",
    "routed_scaling_factor",
    "decoder_sparse_step",
    "moe_layer_freq",
    "tie_word_embeddings",
    "use_qk_norm",
)


@dataclass
class Twin:
    """A scaled twin ready to run.

    `model` is in eval mode, float32, on the CPU. `config` is the shrunk transformers config.
    `description` is JSON-able (see `build_twin`). `input_ids` is a LongTensor
    [PROMPT_BATCH, PROMPT_TOKENS] of fixed prompt token ids (seeded, within the vocabulary,
    never the pad id). `analysis` is `analyze_config` of the twin's config (its layer types
    index the twin's layers) with the release's `hidden_act` added.
    """

    model: torch.nn.Module
    config: Any
    description: dict[str, Any]
    input_ids: torch.Tensor
    analysis: dict[str, Any] | None = None


def _transformers_class(model_type: str | None, architectures: list[str]) -> tuple[Any, Any, str]:
    """(model class, config class, how it was found) from transformers, or (None, None, "").

    The class named in `architectures` wins (so `kimi_k2` configs naming
    `DeepseekV3ForCausalLM` get that class); else `AutoModelForCausalLM`'s class for the
    `model_type`.
    """
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    for arch in architectures:
        cls = getattr(transformers, arch, None)
        if isinstance(cls, type) and getattr(cls, "config_class", None) is not None:
            return cls, cls.config_class, f"architectures names {arch}"
    if model_type and model_type in CONFIG_MAPPING:
        name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
        cls = getattr(transformers, name, None) if name else None
        if cls is not None:
            return cls, cls.config_class, f"model_type {model_type} maps to {name}"
    return None, None, ""


def _remote_classes(raw: Mapping[str, Any], remote_code_dir: str) -> tuple[Any, Any]:
    """Model and config classes from the release's shipped modeling files in `remote_code_dir`.

    Uses the `auto_map` entries (`AutoModelForCausalLM`, `AutoConfig`) as transformers does for
    `trust_remote_code=True`. Call only inside the sandboxed child (remote_code.py).
    """
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    auto_map = raw.get("auto_map") or {}
    model_ref = auto_map.get("AutoModelForCausalLM") or auto_map.get("AutoModel")
    config_ref = auto_map.get("AutoConfig")
    if not model_ref or not config_ref:
        raise StageFailed(
            "the release's auto_map names no AutoModelForCausalLM and AutoConfig classes"
        )
    model_cls = get_class_from_dynamic_module(model_ref, remote_code_dir, trust_remote_code=True)
    config_cls = get_class_from_dynamic_module(config_ref, remote_code_dir, trust_remote_code=True)
    return model_cls, config_cls


def _config_kwargs(cfg: Mapping[str, Any]) -> dict[str, Any]:
    kwargs = {k: v for k, v in cfg.items() if k not in ("model_type", "transformers_version")}
    kwargs["dtype"] = "float32"
    return kwargs


def prompt_ids(vocab_size: int, seed: int, pad_token_id: int | None = None) -> torch.Tensor:
    """Fixed prompt token ids [PROMPT_BATCH, PROMPT_TOKENS] in [3, vocab) avoiding the pad id."""
    gen = torch.Generator().manual_seed(seed + 1)
    high = vocab_size - 1 if pad_token_id == vocab_size - 1 else vocab_size
    return torch.randint(3, high, (PROMPT_BATCH, PROMPT_TOKENS), generator=gen)


def build_twin(
    config: dict,
    *,
    seed: int = 0,
    allow_remote_code: bool = False,
    remote_code_dir: str | None = None,
    org: str | None = None,
) -> Twin:
    """A scaled twin of the release whose `config.json` is `config`.

    The description is {"architecture", "model_type", "class", "config_class", "code_source"
    ("transformers" | "remote"), "class_found_by", "weights", "weights_source" ("seeded"),
    "parameters", "sizes": [{"key", "original", "twin", "why"}], "invariants": [{"name",
    "original", "twin", "kept"}], "dropped": [{"key", "original", "why"}], "notes": [...],
    "prompt": {"batch", "tokens"}}.

    Raises `StageFailed` when the config cannot be analysed, when transformers rejects the
    config or the twin (naming the error), or when transformers lacks the architecture and
    remote code is not allowed (naming the org).
    """
    try:
        original = analyze_config(config).to_dict()
    except AnalysisError as err:
        raise StageFailed(f"config cannot be analysed for a twin: {err}") from err
    raw, _note = unwrap_text_config(config)
    model_type = raw.get("model_type")
    architectures = list(raw.get("architectures") or [])
    arch = architectures[0] if architectures else model_type
    notes: list[str] = []

    model_cls, config_cls, found_by = _transformers_class(model_type, architectures)
    code_source = "transformers"
    if model_cls is None:
        who = org or "this release's org"
        if not allow_remote_code or remote_code_dir is None:
            if raw.get("auto_map"):
                raise StageFailed(
                    f"transformers has no {arch}; its shipped modeling code is not allowed for "
                    f"org {who} (trust_remote_code is off): add the org to the pool's "
                    "trust_remote_code_orgs to run it in a sandboxed process"
                )
            raise StageFailed(
                f"transformers has no {arch} (model_type {model_type!r}) and the release ships no "
                "modeling code (no auto_map)"
            )
        model_cls, config_cls = _remote_classes(raw, remote_code_dir)
        code_source = "remote"
        found_by = f"auto_map of the release ({model_cls.__module__}.{model_cls.__name__})"
    elif model_type and getattr(config_cls, "model_type", model_type) != model_type:
        notes.append(
            f"model_type {model_type!r} is not a transformers model type; built as "
            f"{model_cls.__name__} ({found_by})"
        )

    # transformers validates the original config first: a config it rejects fails here.
    try:
        config_cls(
            **_config_kwargs(
                {k: v for k, v in raw.items() if k not in ("auto_map", "quantization_config")}
            )
        )
    except Exception as exc:  # transformers raises ValueError, TypeError, KeyError...
        raise StageFailed(
            "transformers rejects the config for "
            f"{config_cls.__name__}: {type(exc).__name__}: {exc}"
        ) from exc

    plan = shrink_config(raw, original, keep_auto_map=code_source == "remote")
    try:
        twin_config = config_cls(**_config_kwargs(plan.config))
        twin_config._attn_implementation = None
        torch.manual_seed(seed)
        model = model_cls(twin_config)
    except (StageFailed, MemoryError):
        raise
    except Exception as exc:
        if "can't allocate memory" in str(exc):  # torch's allocator: out of (address) space
            raise MemoryError(str(exc)) from exc
        raise StageFailed(
            f"transformers rejects the twin of {arch} "
            f"({model_cls.__name__}): {type(exc).__name__}: {exc}"
        ) from exc
    model = model.float().eval()

    twin_dict = {k: v for k, v in plan.config.items() if k != "auto_map"}
    try:
        twin_analysis = analyze_config(twin_dict).to_dict()
    except AnalysisError as err:  # the shrink produced a config the analysis refuses
        raise StageFailed(f"the twin config of {arch} is inconsistent: {err}") from err
    kept = invariants(original, twin_analysis, plan.layer_plan)
    for key in (
        "hidden_act",
        "rms_norm_eps",
        "attention_bias",
        "mlp_bias",
        "rope_theta",
        "swiglu_limit",
        "tie_word_embeddings",
    ):
        if key in raw:
            value = getattr(twin_config, key, plan.config.get(key))
            kept.append(
                {"name": key, "original": raw[key], "twin": value, "kept": value == raw[key]}
            )
    sinks = any(name.endswith("sinks") for name, _ in model.named_parameters())
    if sinks or model_type == "gpt_oss":
        kept.append({"name": "attention sinks", "original": True, "twin": sinks, "kept": sinks})

    input_ids = prompt_ids(twin_config.vocab_size, seed, getattr(twin_config, "pad_token_id", None))
    description = {
        "architecture": arch,
        "model_type": model_type,
        "class": model_cls.__name__,
        "config_class": config_cls.__name__,
        "code_source": code_source,
        "class_found_by": found_by,
        "weights": (
            f"seeded (torch.manual_seed({seed})) with the class's own initialisation "
            f"(initializer_range {getattr(twin_config, 'initializer_range', None)}); the "
            "release's weights are not loaded"
        ),
        "weights_source": "seeded",
        "parameters": sum(p.numel() for p in model.parameters()),
        "sizes": plan.sizes,
        "invariants": kept,
        "dropped": plan.dropped,
        "notes": notes + plan.notes,
        "prompt": {
            "batch": int(input_ids.shape[0]),
            "tokens": int(input_ids.shape[1]),
            "seed": seed + 1,
        },
    }
    twin_analysis["hidden_act"] = raw.get("hidden_act")
    return Twin(
        model=model,
        config=twin_config,
        description=description,
        input_ids=input_ids,
        analysis=twin_analysis,
    )


def copy_twin_model(twin: Twin) -> torch.nn.Module:
    """A deep copy of the twin's model (same weights), for a target that is moved or cast."""
    return copy.deepcopy(twin.model)
