"""The scaled twin: a release's architecture class at CPU-sized widths, seeded weights.

See `build.build_twin` for what a twin keeps and `shrink.shrink_config` for how sizes shrink.
"""

from .build import Twin, build_twin, copy_twin_model, prompt_ids
from .shrink import PROMPT_BATCH, PROMPT_TOKENS

__all__ = ["PROMPT_BATCH", "PROMPT_TOKENS", "Twin", "build_twin", "copy_twin_model", "prompt_ids"]
