"""The API's JSON parser: DRF's, except that JSON nested too deeply for Python to read
(`[[[[…]]]]` a hundred thousand deep) is a 400 `parse_error` in the one error shape, not a
`RecursionError` and a 500."""

from __future__ import annotations

from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    """DRF's `JSONParser`, refusing over-deep nesting as malformed JSON (`ParseError`)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply.") from None
