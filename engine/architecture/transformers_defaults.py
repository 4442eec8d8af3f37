"""A family's config defaults, read from the installed transformers' config class on first use.

transformers' config class for a model type (`configuration_<type>.py`) holds the values a
model gets for the keys its `config.json` leaves out: the class's field defaults (its
`__init__` signature), the RoPE parameters its `__post_init__` fills in (`default_theta`,
`partial_rotary_factor`, a default scaling such as gpt-oss' YaRN), and its `attribute_map`
(other spellings of the same key). Importing transformers takes seconds (it imports torch), so
nothing here imports it until a default is first asked for, and each class is read once per
process.

What a class gave is also kept on disk, in `<DAY0_VAR_DIR>/architecture/` (`engine.paths`), in
one JSON file per installed transformers version (read from its package metadata, without
importing it): a later process, `manage.py analyze` included, reads the defaults from there and
never imports transformers. Installing another version starts a new file; a file written by
other code of this module, or one that cannot be read or written, is ignored (the classes are
read again).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from engine.paths import var_dir

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
    """The defaults transformers' config class for `model_type` applies (read once per process,
    and kept on disk per transformers version: `_disk_cache`).

    A multimodal class (Gemma 3, Llama 4) gives its `text_config` class's defaults. Returns
    `known=False` and no values when the installed transformers has no such model type.
    """
    version = installed_transformers_version()
    if version is not None:
        stored = _disk_cache(version).get(model_type)
        if stored is not None:
            return stored
    defaults = _read_class_defaults(model_type)
    if version is not None:
        _disk_cache_add(version, defaults)
    return defaults


def installed_transformers_version() -> str | None:
    """The installed transformers' version from its package metadata (without importing it),
    or None when it is not installed. The `transformers-<version>.dist-info` folder beside the
    package is read first: `importlib.metadata` costs more than the analysis."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.origin:
        return None
    found = list(Path(spec.origin).parent.parent.glob("transformers-*.dist-info"))
    if len(found) == 1:
        return found[0].name.removeprefix("transformers-").removesuffix(".dist-info")
    from importlib import metadata

    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


# -- the on-disk cache -------------------------------------------------------------------------


@functools.cache
def _reader_digest() -> str:
    """A digest of this module's code: a file written by another way of reading the classes
    (a changed `_field_defaults`, say) is not read."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def defaults_cache_path(version: str) -> Path:
    """The cache file of transformers `version`'s defaults."""
    return var_dir("architecture", f"transformers-{version}-defaults.json")


def _encode(value: Any) -> Any:
    """A JSON value keeping tuples apart from lists (a class's tuple default stays a tuple)."""
    if isinstance(value, tuple):
        return {"tuple": [_encode(item) for item in value]}
    if isinstance(value, list):
        return [_encode(item) for item in value]
    if isinstance(value, Mapping):
        return {"dict": {key: _encode(item) for key, item in value.items()}}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if "tuple" in value:
            return tuple(_decode(item) for item in value["tuple"])
        return {key: _decode(item) for key, item in value["dict"].items()}
    if isinstance(value, list):
        return [_decode(item) for item in value]
    return value


def _to_entry(defaults: FamilyDefaults) -> dict[str, Any]:
    return {
        "transformers_version": defaults.transformers_version,
        "class_name": defaults.class_name,
        "values": _encode(dict(defaults.values)),
        "aliases": dict(defaults.aliases),
    }


def _from_entry(model_type: str, entry: Mapping[str, Any]) -> FamilyDefaults:
    return FamilyDefaults(
        model_type=model_type,
        transformers_version=entry["transformers_version"],
        class_name=entry["class_name"],
        values=MappingProxyType(_decode(entry["values"])),
        aliases=MappingProxyType(dict(entry["aliases"])),
    )


@functools.cache
def _disk_cache(version: str) -> dict[str, FamilyDefaults]:
    """The defaults kept for transformers `version`, by model type (read once per process);
    empty when there is no file or it cannot be read."""
    try:
        data = json.loads(defaults_cache_path(version).read_text())
        if data.get("reader") != _reader_digest():
            return {}
        return {name: _from_entry(name, entry) for name, entry in data["types"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _disk_cache_add(version: str, defaults: FamilyDefaults) -> None:
    """Keep `defaults` in `version`'s file (written whole, atomically). Values that would not
    read back equal (not JSON) are not kept; a file that cannot be written is left alone."""
    entry = _to_entry(defaults)
    try:
        if _from_entry(defaults.model_type, json.loads(json.dumps(entry))) != defaults:
            return
    except (TypeError, ValueError):
        return
    cached = _disk_cache(version)
    cached[defaults.model_type] = defaults
    path = defaults_cache_path(version)
    data = {
        "reader": _reader_digest(),
        "transformers_version": version,
        "types": {name: _to_entry(item) for name, item in sorted(cached.items())},
    }
    tmp = ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".defaults-", suffix=".json")
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


# -- reading transformers' classes -------------------------------------------------------------


def _read_class_defaults(model_type: str) -> FamilyDefaults:
    """`class_defaults` read from the installed transformers (imports it)."""
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
