"""What every meta-device build of a config shares: the config keys dropped before transformers
sees it, the bound that stops a build that grows too large or too slow, and the length an
exception's message is cut to before it goes into a build error.

Both builds (`meta_build`: parameter counts for a model type day0's table lacks;
`checkpoint_expected`: the tensors a checkpoint should hold) run inside the analyze stage's
limits (60 s soft), so past these bounds the caller estimates or checks layer counts only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

# A 1T MoE registers a few thousand modules (fused experts), ~100,000 unfused; 100,000 meta
# Linear modules hold about 350 MB (measured), so the bound caps a build near 420 MB.
MAX_MODULES = 120_000
MAX_BUILD_S = 30.0

# Keys that make transformers quantize or load a release's own code; shapes do not depend on
# them. `model_type` is the config class's own, never a keyword.
_DROP_KEYS = ("quantization_config", "compression_config", "auto_map")
_SUB_CONFIGS = ("text_config", "vision_config", "audio_config")


def short_message(err: BaseException, limit: int = 200) -> str:
    """One line of at most `limit` characters from an exception's message (a library's
    message can run to kilobytes: a config dump, a traceback's worth of context)."""
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def config_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` as keywords for transformers' config class: no quantization, no `auto_map`
    (so no release code runs), no `model_type`; the same for its text/vision/audio configs."""
    kwargs = {k: v for k, v in config.items() if k not in _DROP_KEYS and k != "model_type"}
    for key in _SUB_CONFIGS:
        sub = kwargs.get(key)
        if isinstance(sub, Mapping):
            kwargs[key] = {k: v for k, v in sub.items() if k not in _DROP_KEYS}
    return kwargs


class bounded_build:
    """Within it, a module-registration hook (this thread only) raises `error` past
    `MAX_MODULES` registered modules or `MAX_BUILD_S` seconds since `start`
    (`time.perf_counter()`, default now). Raises `error(message)` from the build."""

    def __init__(self, error: type[Exception], start: float | None = None) -> None:
        self.error = error
        self.start = time.perf_counter() if start is None else start
        self.count = 0
        self.thread = threading.get_ident()
        self.handle: Any = None

    def _hook(self, module: Any, name: str, submodule: Any) -> None:
        if threading.get_ident() != self.thread:
            return None
        self.count += 1
        if self.count > MAX_MODULES:
            raise self.error(f"the model registers over {MAX_MODULES:,} modules")
        if self.count % 256 == 0 and time.perf_counter() - self.start > MAX_BUILD_S:
            raise self.error(f"the meta-device build ran past {MAX_BUILD_S:.0f} s")
        return None

    def __enter__(self) -> bounded_build:
        from torch.nn.modules.module import register_module_module_registration_hook

        self.handle = register_module_module_registration_hook(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()
