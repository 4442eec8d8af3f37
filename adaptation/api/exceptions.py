"""The API's one error shape, for DRF's own errors and the domain's refusals alike:

    {"error": {"code": "permission_denied", "message": "...", "fields": {"pool": ["..."]}}}

`fields` is present only for input errors (code "invalid"), each field with its messages
(a nested serializer's errors as "parent.child"); a body that is not JSON is "parse_error",
one over `DATA_UPLOAD_MAX_MEMORY_SIZE` bytes "too_large" (413). `ServiceError` answers 400,
or 409 where a view raises `Conflict` for a request the resource's state refuses (cancel a
finished job, re-run while it runs, delete an endpoint that has received deliveries). A
`Conflict` may name the row in the way: its `extra` keys join the error object, as
`DuplicateJob`'s "job" ({"id", "status", "url", "page_url"}: the job that has not ended).

Errors Django answers before or after a view (no route under /api/, a bad request, a crash)
are in the same shape for paths under /api/: `day0web/urls.py` names the handlers below,
which give the site's HTML pages elsewhere."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import (
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from adaptation.services.errors import ServiceError

# Requests under this path get the API's JSON errors from Django's handlers too.
API_PATH_PREFIX = "/api/"


class Conflict(exceptions.APIException):
    """The request is valid but the resource's state refuses it now. `extra` (JSON values)
    joins the error object beside "code" and "message"."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The resource's current state does not allow this."
    default_code = "conflict"

    def __init__(
        self, detail: str | None = None, code: str | None = None, *, extra: dict | None = None
    ) -> None:
        super().__init__(detail, code)
        self.extra = extra or {}


class DuplicateJob(Conflict):
    """A job for the same release on the same pool has not ended; `extra["job"]` names it."""

    default_detail = "A job for this release on this pool has not ended."
    default_code = "duplicate_job"


class ServiceRefused(exceptions.APIException):
    """A `ServiceError` that is the request's fault: what was asked cannot be done."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "The request was refused."
    default_code = "invalid"


class PayloadTooLarge(exceptions.APIException):
    """The request's body is larger than day0 reads (`DATA_UPLOAD_MAX_MEMORY_SIZE`)."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "too_large"


class BadRequest(exceptions.APIException):
    """A request Django refused to read (too many fields, a malformed upload)."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "The request could not be read."
    default_code = "bad_request"


def too_large_message() -> str:
    """The 413's message, naming the limit (bytes)."""
    return f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes."


def _refusal(exc: SuspiciousOperation) -> exceptions.APIException:
    """What a request Django refused to read answers: 413 for a body over the limit, 400
    otherwise (Django's own message only where it names the limit the request broke)."""
    if isinstance(exc, RequestDataTooBig):
        return PayloadTooLarge(too_large_message())
    if isinstance(exc, TooManyFieldsSent | TooManyFilesSent):
        return BadRequest(str(exc))
    return BadRequest()


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


def _not_found_message(exc: Http404, context: dict[str, Any]) -> str | None:
    """Django's "No ModelRelease matches the given query." in the API's words: "No release with
    id 999." (the view's model and lookup); a 404 raised with its own words keeps them."""
    message = str(exc)
    if not message.endswith("matches the given query."):
        return message or None
    view = context.get("view")
    model = getattr(getattr(view, "queryset", None), "model", None)
    kwargs = getattr(view, "kwargs", None) or {}
    field = getattr(view, "lookup_url_kwarg", None) or getattr(view, "lookup_field", "pk")
    if model is None or field not in kwargs:
        return "Not found."
    name = "id" if field == "pk" else field
    return f"No {model._meta.verbose_name} with {name} {kwargs[field]}."


def error_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's `EXCEPTION_HANDLER`: DRF's own handling (status, `WWW-Authenticate` on 401,
    `Retry-After` on 429), then the body reshaped into the one error shape. A `ServiceError`
    that reaches here is a 400; a body over the limit (Django's `RequestDataTooBig`, raised
    when DRF reads it) a 413, another request Django refuses to read a 400. Anything else is
    left to Django (a 500, JSON under /api/: `server_error`)."""
    if isinstance(exc, ServiceError):
        exc = ServiceRefused(str(exc))
    elif isinstance(exc, SuspiciousOperation):
        exc = _refusal(exc)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound(_not_found_message(exc, context))
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
        body = {"code": _code(exc), "message": str(message), **getattr(exc, "extra", {})}
    response.data = {"error": body}
    return response


# --- Django's error handlers (handler400/403/404/500 in day0web/urls.py) ---------------------


def is_api_request(request: HttpRequest) -> bool:
    """Whether `request` is for the API (its errors are JSON)."""
    return request.path_info.startswith(API_PATH_PREFIX)


def error_response(status_code: int, code: str, message: str) -> JsonResponse:
    """A JSON response in the one error shape."""
    return JsonResponse({"error": {"code": code, "message": message}}, status=status_code)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler400: under /api/, 413 JSON for a body over the limit and 400 JSON for another
    request Django refused (read before a view ran); elsewhere Django's page."""
    if not is_api_request(request):
        return defaults.bad_request(request, exception)
    refusal = _refusal(exception) if isinstance(exception, SuspiciousOperation) else BadRequest()
    return error_response(refusal.status_code, refusal.default_code, str(refusal.detail))


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler403: JSON under /api/, the site's 403 page elsewhere."""
    if not is_api_request(request):
        return defaults.permission_denied(request, exception)
    return error_response(
        status.HTTP_403_FORBIDDEN,
        exceptions.PermissionDenied.default_code,
        str(exceptions.PermissionDenied.default_detail),
    )


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler404: JSON under /api/ (no route there: `/api/v1/nothing/`,
    `/api/v1/jobs/0.5/cancel/`), the site's 404 page elsewhere."""
    if not is_api_request(request):
        return defaults.page_not_found(request, exception)
    return error_response(
        status.HTTP_404_NOT_FOUND,
        exceptions.NotFound.default_code,
        f"No API endpoint or object at {request.path}.",
    )


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: JSON under /api/ (Django has logged the traceback), Django's page
    elsewhere."""
    if not is_api_request(request):
        return defaults.server_error(request)
    return error_response(
        status.HTTP_500_INTERNAL_SERVER_ERROR,
        "server_error",
        "day0 failed to answer this request; the error is in its log.",
    )
