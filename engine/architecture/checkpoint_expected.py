"""The tensors a config implies, as its checkpoint would name them: transformers builds the
config's model on the meta device (shapes only, no memory) and its state dict is taken as
`save_pretrained` writes it (tied weights dropped, transformers' weight conversions reverted
to the checkpoint's own names and layout: per-expert tensors, not the fused ones it
computes with).

The class is the config's `architectures[0]` where transformers has it (the class the
checkpoint was saved from), else transformers' auto classes for its model type; the config
class is the model type's, else that architecture's (Kimi-K2's `kimi_k2` is a
`DeepseekV3Config`). `quantization_config` and `auto_map` are dropped: no release code runs
and the shapes are the unquantized ones. A model type transformers does not know gives None
(the caller then checks only layer counts).

The build is bounded (`meta_bounds.bounded_build`): past its module count or time the caller
checks layer counts only. transformers and torch are imported on the
first call only.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .checkpoint_names import strip_wrappers
from .meta_bounds import bounded_build, config_kwargs, short_message


class ExpectedBuildError(Exception):
    """transformers could not build the config (the message says why)."""


@dataclass(frozen=True)
class ExpectedTensors:
    """The tensors a config implies. `shapes`: {checkpoint name: shape}; `buffers`: names
    that are persistent buffers in transformers; `ignore_unexpected`/`ignore_missing`:
    transformers' own patterns for checkpoint tensors it skips or does not need
    (`_keys_to_ignore_on_load_*`); `canonical`: a name in the form both sides are compared
    in once exact names differ (transformers' load-time renamings, then wrapper prefixes
    stripped); `class_name`: the class built; `build_s`: seconds the build took."""

    class_name: str
    shapes: Mapping[str, tuple[int, ...]]
    buffers: frozenset[str]
    ignore_unexpected: tuple[str, ...]
    ignore_missing: tuple[str, ...]
    canonical: Callable[[str], str]
    build_s: float

    def is_buffer(self, name: str, shape: tuple[int, ...]) -> bool:
        """Whether checkpoint tensor `name` of `shape` is a persistent buffer in transformers
        (matched by its exact name, else by its load-time form; only a tensor of a buffer's
        shape is put in that form)."""
        if name in self.buffers:
            return True
        return shape in self._buffer_shapes and self.canonical(name) in self._buffer_forms

    @functools.cached_property
    def _buffer_forms(self) -> frozenset[str]:
        return frozenset(self.canonical(name) for name in self.buffers)

    @functools.cached_property
    def _buffer_shapes(self) -> frozenset[tuple[int, ...]]:
        return frozenset(self.shapes[name] for name in self.buffers)


def _model_class(transformers: Any, config: Mapping[str, Any]) -> Any:
    from transformers import PreTrainedModel

    architectures = config.get("architectures")
    name = architectures[0] if isinstance(architectures, list) and architectures else None
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    return cls if isinstance(cls, type) and issubclass(cls, PreTrainedModel) else None


def _config_object(transformers: Any, config: Mapping[str, Any], model_class: Any) -> Any | None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    kwargs = config_kwargs(config)
    if isinstance(model_type, str) and model_type in CONFIG_MAPPING:
        return transformers.AutoConfig.for_model(model_type, **kwargs)
    if model_class is not None and getattr(model_class, "config_class", None) is not None:
        return model_class.config_class(**kwargs)
    return None


def expected_tensors(config: Mapping[str, Any]) -> ExpectedTensors | None:
    """The tensors `config` implies (cached per config), or None when transformers knows
    neither its model type nor its architecture. Raises `ExpectedBuildError` when
    transformers refuses the config or the build goes past its bounds."""
    return _expected(json.dumps(config, sort_keys=True, default=str))


@functools.lru_cache(maxsize=8)
def _expected(config_json: str) -> ExpectedTensors | None:
    import torch
    import transformers
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        WeightRenaming,
        apply_renamings,
        revert_weight_conversion,
    )
    from transformers.modeling_utils import remove_tied_weights_from_state_dict
    from transformers.utils import logging

    config = json.loads(config_json)
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        model_class = _model_class(transformers, config)
        try:
            cfg = _config_object(transformers, config, model_class)
        except Exception as err:  # the config class's own validation: any exception type
            raise ExpectedBuildError(
                f"transformers' config class refused it: {short_message(err)}"
            ) from err
        if cfg is None:
            return None
        start = time.perf_counter()
        with bounded_build(ExpectedBuildError), torch.device("meta"):
            model = _build(transformers, cfg, model_class)
        state = remove_tied_weights_from_state_dict(model.state_dict(), model)
        buffer_names = {name for name, _ in model.named_buffers()} & set(state)
        reverted = revert_weight_conversion(model, state)
        renamings = [
            t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)
        ]
    except ExpectedBuildError:
        raise
    except Exception as err:  # a class that cannot build this config: any exception type
        raise ExpectedBuildError(f"transformers could not build it: {short_message(err)}") from err
    finally:
        logging.set_verbosity(level)
    shapes = {name: tuple(int(d) for d in t.shape) for name, t in reverted.items()}

    def canonical(name: str) -> str:
        # Wrappers first (a renaming may need its name to start where transformers' own
        # keys start), transformers' load-time renamings, then wrappers again.
        stripped = strip_wrappers(name)
        try:
            renamed = apply_renamings(stripped, renamings)
        except Exception:  # a renaming that cannot apply to this name: keep it
            renamed = stripped
        return strip_wrappers(renamed)

    # The reversal may rename a buffer (DeepSeek-V4 `mlp.gate.tid2eid` is stored as
    # `ffn.gate.tid2eid`): a reverted name is a buffer when its load-time form is one.
    # (Only names of a buffer's shape are put in that form: a renaming costs ~20 us a name.)
    model_buffers = {strip_wrappers(name) for name in buffer_names}
    buffer_shapes = {tuple(int(d) for d in state[name].shape) for name in buffer_names}
    buffers = frozenset(
        n
        for n, shape in shapes.items()
        if n in buffer_names or (shape in buffer_shapes and canonical(n) in model_buffers)
    )

    return ExpectedTensors(
        class_name=type(model).__name__,
        shapes=shapes,
        buffers=buffers,
        ignore_unexpected=tuple(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ()),
        ignore_missing=tuple(getattr(model, "_keys_to_ignore_on_load_missing", None) or ()),
        canonical=canonical,
        build_s=time.perf_counter() - start,
    )


def _build(transformers: Any, cfg: Any, model_class: Any) -> Any:
    errors: list[str] = []
    if model_class is not None:
        try:
            return model_class._from_config(cfg)
        except ExpectedBuildError:
            raise
        except Exception as err:  # try the auto classes
            errors.append(f"{model_class.__name__}: {short_message(err)}")
    for auto in (
        transformers.AutoModelForCausalLM,
        transformers.AutoModelForImageTextToText,
        transformers.AutoModel,
    ):
        try:
            return auto.from_config(cfg, trust_remote_code=False)
        except ExpectedBuildError:
            raise
        except Exception as err:  # an auto class without this config: try the next one
            errors.append(f"{auto.__name__}: {short_message(err)}")
    raise ExpectedBuildError("; ".join(errors))


def matches_any(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether `name` matches one of transformers' `_keys_to_ignore_*` regexes."""
    for pattern in patterns:
        try:
            if re.search(pattern, name):
                return True
        except re.error:
            continue
    return False
