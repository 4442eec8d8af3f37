"""The one error the architecture analysis raises."""

from __future__ import annotations


class AnalysisError(ValueError):
    """The config cannot be analysed: required keys are missing or a value is invalid.

    The message is one line that names the offending keys, so it can be shown to the user as
    the reason the `analyze` stage failed.
    """
