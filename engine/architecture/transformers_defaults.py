"""A family's config defaults, read from the installed transformers' config class on first use.

transformers' config class for a model type (`configuration_<type>.py`) holds the values a
model gets for the keys its `config.json` leaves out: the class's field defaults (its
`__init__` signature), the RoPE parameters its `__post_init__` fills in (`default_theta`,
`partial_rotary_factor`, a default scaling such as gpt-oss' YaRN), and its `attribute_map`
(other spellings of the same key). Importing transformers takes seconds (it imports torch), so
nothing here imports it until a default is first asked for, and each class is read once per
process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# Keys whose class value is not a default a config.json could hold (RoPE is read apart).
_NOT_DEFAULTS = frozenset({"rope_parameters", "rope_scaling", "layer_types", "mlp_layer_types"})


@dataclass(frozen=True)
class FamilyDefaults(Mapping[str, Any]):
    """Defaults of one model type, keyed as transformers stores them (`attribute_map` targets).

    Look-ups accept every spelling transformers accepts: `defaults["num_local_experts"]` reads
    Kimi Linear's `num_experts`. `class_name` is None when the installed transformers
    (`transformers_version`) has no config class for the model type: a family newer than it,
    whose only defaults are its own overrides.
    """

    model_type: str
    transformers_version: str
    class_name: str | None
    values: Mapping[str, Any] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)

    @property
    def known(self) -> bool:
        """Whether the installed transformers has a config class for the model type."""
        return self.class_name is not None

    @property
    def source(self) -> str:
        """Where the values come from, e.g. "transformers 5.24.0 LlamaConfig"."""
        return f"transformers {self.transformers_version} {self.class_name or '(no class)'}"

    def __getitem__(self, key: str) -> Any:
        return self.values[self.aliases.get(key, key)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def spellings(self, key: str) -> tuple[str, ...]:
        """The other names transformers reads `key` under (its `attribute_map`), `key` excluded."""
        stored = self.aliases.get(key, key)
        names = {stored, *(alias for alias, target in self.aliases.items() if target == stored)}
        return tuple(sorted(names - {key}))

    def with_overrides(self, overrides: Mapping[str, Any]) -> FamilyDefaults:
        """These defaults with `overrides` (a family's values the class does not give) on top."""
        if not overrides:
            return self
        values = dict(self.values)
        for key, value in overrides.items():
            values[self.aliases.get(key, key)] = value
        return dataclasses.replace(self, values=MappingProxyType(values))


@functools.cache
def class_defaults(model_type: str) -> FamilyDefaults:
    """The defaults transformers' config class for `model_type` applies (read once, cached).

    A multimodal class (Gemma 3, Llama 4) gives its `text_config` class's defaults. Returns
    `known=False` and no values when the installed transformers has no such model type.
    """
    import transformers
    from transformers import CONFIG_MAPPING

    version = transformers.__version__
    if model_type not in CONFIG_MAPPING:
        return FamilyDefaults(model_type=model_type, transformers_version=version, class_name=None)
    cls = _text_config_class(CONFIG_MAPPING[model_type])
    aliases = dict(getattr(cls, "attribute_map", None) or {})
    values = _field_defaults(cls, aliases)
    values.update(_rope_defaults(cls))
    return FamilyDefaults(
        model_type=model_type,
        transformers_version=version,
        class_name=cls.__name__,
        values=MappingProxyType(values),
        aliases=MappingProxyType(aliases),
    )


def _text_config_class(cls: type) -> type:
    """The class of a multimodal config's `text_config`, else `cls` itself."""
    from transformers import CONFIG_MAPPING, PreTrainedConfig

    spec = (getattr(cls, "sub_configs_defaults", None) or {}).get("text_config")
    if spec is None:
        return cls
    text_cls = getattr(spec, "config_class", spec)
    if isinstance(text_cls, type) and issubclass(text_cls, PreTrainedConfig):
        return text_cls
    # AutoConfig with a default model type; the lazy CONFIG_MAPPING loads a class on [] only.
    text_type = getattr(spec, "model_type", None)
    if text_type in CONFIG_MAPPING:
        return CONFIG_MAPPING[text_type]
    return cls


def _field_defaults(cls: type, aliases: Mapping[str, str]) -> dict[str, Any]:
    """The class's declared field defaults (its `__init__` defaults), without the base class's.

    A field that defaults to None is left out: the class derives it in `__post_init__` from
    other values (Llama's `head_dim` = hidden_size / heads), so the default instance's value
    would be wrong for any other size.
    """
    from transformers import PreTrainedConfig

    base = {f.name for f in dataclasses.fields(PreTrainedConfig)}
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in base or f.name in _NOT_DEFAULTS:
            continue
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue
        if value is not None and _json_like(value):
            values[aliases.get(f.name, f.name)] = value
    return values


def _json_like(value: Any) -> bool:
    if isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(_json_like(item) for item in value)
    return False


def _rope_defaults(cls: type) -> dict[str, Any]:
    """`rope_theta`, `partial_rotary_factor` and the default scaling of the class's default
    instance (set in `__post_init__`, not declared as fields).

    Per-layer-type RoPE (Gemma 3, OLMo 3): the full-attention layers' theta, and the sliding
    layers' as `rope_local_base_freq` where it differs (the key Gemma 3 configs spell it with).
    A flat dict of a type other than "default" is kept whole as `rope_parameters` (gpt-oss
    YaRN, Apertus llama3): the scaling transformers applies when a config names none.
    """
    try:
        with _quiet_transformers():
            instance = cls()
    except Exception:  # a class that cannot be built without arguments: its declared theta
        theta = getattr(cls, "default_theta", None)
        return {"rope_theta": float(theta)} if isinstance(theta, int | float) else {}
    params = getattr(instance, "rope_parameters", None)
    if not isinstance(params, Mapping):
        return {}  # no RoPE (Jamba, Kimi Linear's NoPE MLA)
    out: dict[str, Any] = {}
    full, local = params.get("full_attention"), params.get("sliding_attention")
    if isinstance(full, Mapping):
        params = full
        if isinstance(local, Mapping) and local.get("rope_theta") != full.get("rope_theta"):
            out["rope_local_base_freq"] = local.get("rope_theta")
    elif params.get("rope_type", "default") != "default":
        out["rope_parameters"] = dict(params)
    if params.get("rope_theta") is not None:
        out["rope_theta"] = params["rope_theta"]
    # 1.0 (RoPE over all of head_dim) is what an absent key means (Phi-3 sets it explicitly).
    if params.get("partial_rotary_factor") not in (None, 1.0):
        out["partial_rotary_factor"] = params["partial_rotary_factor"]
    return {k: v for k, v in out.items() if v is not None}


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' logger while a default instance is built: its checks warn about
    default token ids that a default config never uses (Arcee's bos_token_id 128000)."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)
