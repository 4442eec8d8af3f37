"""The scaled twin: a release's architecture class at CPU-sized widths, seeded weights.

See `build.build_twin` for what a twin keeps and `shrink.shrink_config` for how sizes shrink.
`real.twin_for_release` loads the release's own weights at full size instead, where a mirror
folder holds them and they fit the pool's `real_weights_max_bytes`.
"""

from .build import Twin, build_twin, copy_twin_model, prompt_ids
from .real import DEFAULT_REAL_WEIGHTS_MAX_BYTES, twin_for_release
from .shrink import PROMPT_BATCH, PROMPT_TOKENS

__all__ = [
    "DEFAULT_REAL_WEIGHTS_MAX_BYTES",
    "PROMPT_BATCH",
    "PROMPT_TOKENS",
    "Twin",
    "build_twin",
    "copy_twin_model",
    "prompt_ids",
    "twin_for_release",
]
