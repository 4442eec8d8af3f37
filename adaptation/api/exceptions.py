"""The API's one error shape, for DRF's own errors and the domain's refusals alike:

    {"error": {"code": "permission_denied", "message": "...", "fields": {"pool": ["..."]}}}

`fields` is present only for input errors (code "invalid"), each field with its messages
(a nested serializer's errors as "parent.child"); a body that is not JSON is "parse_error".
`ServiceError` answers 400, or 409 where a view raises `Conflict` for a request the
resource's state refuses (cancel a finished job, re-run while it runs, delete an endpoint
that has received deliveries)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from adaptation.services.errors import ServiceError


class Conflict(exceptions.APIException):
    """The request is valid but the resource's state refuses it now."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The resource's current state does not allow this."
    default_code = "conflict"


class ServiceRefused(exceptions.APIException):
    """A `ServiceError` that is the request's fault: what was asked cannot be done."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "The request was refused."
    default_code = "invalid"


def _flatten(errors: Any, prefix: str = "") -> dict[str, list[str]]:
    """Serializer errors as {"field": ["message", ...]} ("parent.child", "items.0" for
    nested ones; "non_field_errors" for the whole input)."""
    flat: dict[str, list[str]] = {}
    if isinstance(errors, dict):
        for key, value in errors.items():
            flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(errors, list) and errors and not all(isinstance(e, str) for e in errors):
        for index, value in enumerate(errors):
            if value:
                flat.update(_flatten(value, f"{prefix}.{index}" if prefix else str(index)))
    else:
        items = errors if isinstance(errors, list) else [errors]
        flat[prefix or "non_field_errors"] = [str(item) for item in items]
    return flat


def _code(exc: exceptions.APIException) -> str:
    codes = exc.get_codes()
    return codes if isinstance(codes, str) else exc.default_code


def error_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's `EXCEPTION_HANDLER`: DRF's own handling (status, `WWW-Authenticate` on 401,
    `Retry-After` on 429), then the body reshaped into the one error shape. A `ServiceError`
    that reaches here is a 400. Anything else is left to Django (a 500)."""
    if isinstance(exc, ServiceError):
        exc = ServiceRefused(str(exc))
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or None)
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = drf_exception_handler(exc, context)
    if response is None or not isinstance(exc, exceptions.APIException):
        return response
    if isinstance(exc, exceptions.ValidationError):
        body = {
            "code": "invalid",
            "message": "The input is not valid; see fields.",
            "fields": _flatten(exc.detail),
        }
    else:
        detail = exc.detail
        message = detail if isinstance(detail, str) else str(exc.default_detail)
        body = {"code": _code(exc), "message": str(message)}
    response.data = {"error": body}
    return response
