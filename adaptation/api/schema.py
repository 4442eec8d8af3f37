"""OpenAPI schema additions: the one error shape (`exceptions.error_handler`) as the
`Error` component, and the error answers every operation can give, so a client (and the
schema test) knows every body the API sends."""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": 'Machine-readable: "invalid", "parse_error" (a body '
                    'that is not JSON), "not_authenticated", "authentication_failed", '
                    '"permission_denied", "not_found", "conflict", "too_large", "throttled", '
                    "...",
                },
                "message": {"type": "string", "description": "For the person reading it."},
                "fields": {
                    "type": "object",
                    "additionalProperties": {"type": "array", "items": {"type": "string"}},
                    "description": "Input errors per field (input errors only).",
                },
            },
            "required": ["code", "message"],
        }
    },
    "required": ["error"],
}

_ERRORS = {
    "400": "Invalid input, filter or request (see error.fields).",
    "401": "No valid credentials (WWW-Authenticate: Token).",
    "403": "Signed in without the permission this needs.",
    "404": "No such object (or, for a list, no such page).",
    "429": "Too many requests (see Retry-After).",
}
# Operations that take a body can also answer this.
_BODY_TOO_LARGE = ("413", "The body is larger than DATA_UPLOAD_MAX_MEMORY_SIZE bytes.")


def add_error_responses(result: dict[str, Any], **_: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the `Error` component, and 400/401/403/429 (and
    404 for paths with an id and paginated lists, 409 where declared) answered with it on
    every operation."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    ref = {"$ref": "#/components/schemas/Error"}
    for path, operations in result.get("paths", {}).items():
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            paged = any(p.get("name") == "page" for p in operation.get("parameters", []))
            for code, description in _ERRORS.items():
                if code == "404" and "{" not in path and not paged:
                    continue
                responses.setdefault(code, {"description": description})
            if "requestBody" in operation:
                responses.setdefault(_BODY_TOO_LARGE[0], {"description": _BODY_TOO_LARGE[1]})
            for code, response in responses.items():
                if code.startswith(("4", "5")):
                    response["content"] = {"application/json": {"schema": ref}}
    return result
