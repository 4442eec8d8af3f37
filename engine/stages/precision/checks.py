"""The checks the precision stage's judge applies, importable without torch (the precision
package's `__init__` loads the stage, and so torch): the web process reads them to explain a
failed dtype in its known-limitation note.

Each check is (metric, threshold key, "max" | "min", how the stage's reason names it).
"""

from __future__ import annotations

CHECKS = (
    ("relative_logit_error", "max_relative_logit_error", "max", "relative logit error"),
    (
        "max_relative_logit_error",
        "max_row_relative_logit_error",
        "max",
        "worst row's relative logit error",
    ),
    ("cosine_similarity", "min_cosine_similarity", "min", "cosine similarity"),
    ("top1_agreement", "min_top1_agreement", "min", "top-1 agreement"),
    ("kl_divergence", "max_kl_divergence", "max", "KL divergence"),
    ("mean_abs_error", "max_mean_abs_error", "max", "mean absolute error"),
)
