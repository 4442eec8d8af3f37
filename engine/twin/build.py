"""Build a scaled twin: the release's own architecture class at CPU-sized widths.

`build_twin(config)` resolves the class (transformers' own, or the release's shipped modeling
code when the caller allows it: see `engine.remote_code.sandbox`), shrinks the config with
`shrink.shrink_config`, and instantiates the model with the class's own weight initialisation
under a forked, seeded RNG (`torch.random.fork_rng`), so the same config and seed give the same
weights on every run and the caller's global RNG state is left as it was. The invariants are
checked on the built class's config (`config.to_dict()`), and a twin over
`shrink.TWIN_MAX_PARAMETERS` is refused before its weights are allocated.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from engine.architecture import AnalysisError, analyze_config
from engine.architecture.config_reader import KEY_ALIASES, unwrap_text_config
from engine.architecture.rope import TRANSFORMERS_ROPE_TYPES
from engine.contract import StageFailed

from .shrink import (
    CPU_TWIN,
    PROMPT_BATCH,
    PROMPT_TOKENS,
    TWIN_MAX_PARAMETERS,
    TwinSizes,
    invariants,
    shrink_config,
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


def transformers_class_for(
    model_type: str | None, architectures: list[str]
) -> tuple[Any, Any, str]:
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
    parallel_degree: int = 1,
    sizes: TwinSizes = CPU_TWIN,
) -> Twin:
    """A scaled twin of the release whose `config.json` is `config`.

    The description is {"architecture", "model_type", "class", "config_class", "code_source"
    ("transformers" | "remote"), "class_found_by", "weights", "weights_source" ("seeded"),
    "parameters", "sizes": [{"key", "original", "twin", "why"}], "invariants": [{"name",
    "original", "twin", "kept"}], "dropped": [{"key", "original", "why"}], "notes": [...],
    "prompt": {"batch", "tokens"}}.

    `parallel_degree` > 1 shapes the twin for a TP/EP split of that degree, `sizes` picks its
    widths and parameter cap (see `shrink.shrink_config`). Raises `StageFailed` when the
    config cannot be analysed, when transformers rejects the config or the twin (naming the
    error), or when transformers lacks the architecture and remote code is not allowed
    (naming the org).
    """
    # transformers' config classes rewrite nested dicts they are given (rope_scaling) in place:
    # the caller's config (a stage's stored fetch result) must stay as it was.
    config = copy.deepcopy(config)
    try:
        original = analyze_config(config).to_dict()
    except AnalysisError as err:
        raise StageFailed(f"config cannot be analysed for a twin: {err}") from err
    raw, _note = unwrap_text_config(config)
    model_type = raw.get("model_type")
    architectures = list(raw.get("architectures") or [])
    arch = architectures[0] if architectures else model_type
    notes: list[str] = []

    model_cls, config_cls, found_by = transformers_class_for(model_type, architectures)
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
    rope_type = original["rope"].get("type")
    if code_source == "transformers" and rope_type not in TRANSFORMERS_ROPE_TYPES:
        raise StageFailed(
            f"RoPE type {rope_type!r} (rope_scaling/rope_parameters) is not one transformers "
            f"implements ({', '.join(sorted(TRANSFORMERS_ROPE_TYPES))}): {model_cls.__name__} "
            "cannot compute its rotary embedding; only the release's own modeling code can"
        )

    plan = shrink_config(
        raw,
        original,
        keep_auto_map=code_source == "remote",
        parallel_degree=parallel_degree,
        sizes=sizes,
    )
    try:
        twin_config = config_cls(**_config_kwargs(plan.config))
        twin_config._attn_implementation = None
        check_parameter_cap(model_cls, twin_config, raw, arch, cap=sizes.max_parameters)
        with torch.random.fork_rng(devices=[]):
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

    # The invariants are checked on what was built: the class's own config, as it serialises,
    # less keys the shrink added that the class does not declare (stored, never read).
    twin_dict, ignored = built_config_dict(config_cls, twin_config, raw)
    if ignored:
        notes.append(f"{config_cls.__name__} ignores keys the shrink set: {', '.join(ignored)}")
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

    parameters = sum(p.numel() for p in model.parameters())
    cap = sizes.max_parameters or TWIN_MAX_PARAMETERS
    if parameters > cap:  # a class the meta-device pre-check could not build
        raise StageFailed(
            f"the twin of {arch} has {parameters:,} parameters, over the cap of {cap:,}"
        )
    init_range = getattr(twin_config, "initializer_range", None)
    input_ids = prompt_ids(twin_config.vocab_size, seed, getattr(twin_config, "pad_token_id", None))
    description = {
        "architecture": arch,
        "model_type": model_type,
        "class": model_cls.__name__,
        "config_class": config_cls.__name__,
        "code_source": code_source,
        "class_found_by": found_by,
        "weights": (
            f"seeded (torch.manual_seed({seed}) in a forked RNG) with the class's own "
            f"initialisation (initializer_range {init_range}); the "
            "release's weights are not loaded"
        ),
        "weights_source": "seeded",
        "parameters": parameters,
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


def built_config_dict(
    config_cls: Any, twin_config: Any, raw: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """(the built config's `to_dict()` as the class reads it, keys dropped from it).

    transformers stores unknown kwargs as attributes, so a key the shrink wrote under a name
    the class never reads (`num_key_value_heads` for Falcon, which reads `num_kv_heads`) would
    make the analysis see a size the model does not have. Dropped: keys neither in the release's
    config nor in the class's defaults (`config_cls().to_dict()`), and a spelling of a size
    (`KEY_ALIASES`) the release does not use whose value disagrees with the release's own;
    only the latter when the class has no defaults to compare with.
    """
    built = {k: v for k, v in twin_config.to_dict().items() if k not in ("auto_map", "dtype")}
    try:
        declared = set(config_cls().to_dict()) | set(getattr(config_cls, "attribute_map", {}))
        ignored = {k for k in built if k not in raw and k not in declared}
    except Exception:  # a config class that needs arguments: no defaults to compare with
        ignored = set()
    # A size under two spellings that disagree (the shrink wrote the standard name, the class
    # derives it from the release's own spelling, as transformers 5.25's Falcon derives
    # `num_key_value_heads` from `num_kv_heads`): the class reads the release's spelling.
    for key, aliases in KEY_ALIASES.items():
        own = [name for name in (key, *aliases) if name in raw and name in built]
        if own:
            ignored |= {
                name
                for name in (key, *aliases)
                if name in built and name not in raw and built[name] != built[own[0]]
            }
    return {k: v for k, v in built.items() if k not in ignored}, sorted(ignored)


# Integer config keys that are not widths: never reported as "left unshrunk".
_NOT_WIDTHS = ("position", "token_id", "window", "seq", "rope", "original_max")


def check_parameter_cap(
    model_cls: Any, twin_config: Any, raw: Mapping[str, Any], arch: str, *, cap: int | None = None
) -> None:
    """Refuse a twin over `cap` (default `TWIN_MAX_PARAMETERS`) parameters before allocating
    its weights.

    Counts parameters on torch's "meta" device (shapes only, no memory). Raises `StageFailed`
    naming the size-like integer keys (>= 64) the built config still holds at their release
    value and the largest tensors. A class that cannot be built on "meta" is not pre-checked
    here; `build_twin` counts its parameters after building and applies the same cap.
    """
    try:
        with torch.device("meta"):
            meta = model_cls(twin_config)
    except Exception:  # remote code or a class that reads tensor values in __init__
        return
    shapes = sorted(
        ((name, tuple(p.shape)) for name, p in meta.named_parameters()),
        key=lambda item: -math.prod(item[1]),
    )
    total = sum(math.prod(shape) for _name, shape in shapes)
    cap = cap or TWIN_MAX_PARAMETERS
    if total <= cap:
        return
    built = twin_config.to_dict()
    unshrunk = sorted(
        f"{key}={value}"
        for key, value in built.items()
        if isinstance(value, int)
        and not isinstance(value, bool)
        and value >= 64
        and raw.get(key) == value
        and not any(part in key for part in _NOT_WIDTHS)
    )
    largest = ", ".join(f"{name} {list(shape)}" for name, shape in shapes[:3])
    raise StageFailed(
        f"the twin of {arch} would have {total:,} parameters, over the cap of "
        f"{cap:,} (the twin's parameter cap): config keys left at their release "
        f"size: {', '.join(unshrunk) or 'none found'}; largest tensors: {largest}"
    )


def copy_twin_model(twin: Twin) -> torch.nn.Module:
    """A deep copy of the twin's model (same weights), for a target that is moved or cast."""
    return copy.deepcopy(twin.model)
