"""The API's parsers: DRF's, except that JSON nested too deeply for Python to read
(`[[[[…]]]]` a hundred thousand deep) is a 400 `parse_error` in the one error shape, not a
`RecursionError` and a 500, and that a multipart body over `DATA_UPLOAD_MAX_MEMORY_SIZE`
bytes is refused before it is read (a 413, `exceptions.error_handler`).

DRF reads JSON and form bodies through Django's `request.body`, which raises
`RequestDataTooBig` over that limit itself; a multipart body it streams to Django's
multipart parser, which limits only the fields, not the files."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    """DRF's `JSONParser`, refusing over-deep nesting as malformed JSON (`ParseError`)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply.") from None


class MultiPartParser(parsers.MultiPartParser):
    """DRF's `MultiPartParser`, refusing a body declared larger than
    `DATA_UPLOAD_MAX_MEMORY_SIZE` bytes (`RequestDataTooBig`) before reading any of it."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        meta = parser_context["request"].META
        try:
            declared = int(meta.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0  # Django reads no body it cannot size
        if limit is not None and declared > limit:
            raise RequestDataTooBig("Request body exceeded settings.DATA_UPLOAD_MAX_MEMORY_SIZE.")
        return super().parse(stream, media_type, parser_context)
