"""Every error under /api/ has the documented JSON shape, whoever produced it.

The API's views answer their own errors as `{"error": {"code", "message"}}`, but Django
answers others before a view runs, as HTML: an unknown path or a session id that is not a
UUID (404), a method the view does not take (405), a failed CSRF check (403), an oversized
body (`RequestDataTooBig`, 400) and any crash (500). `ApiErrorMiddleware` gives those the
same shape, and refuses an oversized body with 413 before anything reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.csrf import csrf_failure as django_csrf_failure

API_PREFIX = "/api/"
CODES = {
    HTTPStatus.BAD_REQUEST: "bad_request",
    HTTPStatus.UNAUTHORIZED: "unauthenticated",
    HTTPStatus.FORBIDDEN: "forbidden",
    HTTPStatus.NOT_FOUND: "not_found",
    HTTPStatus.METHOD_NOT_ALLOWED: "method_not_allowed",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "too_large",
    HTTPStatus.INTERNAL_SERVER_ERROR: "internal_error",
}


def error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def too_large() -> JsonResponse:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return error(413, "too_large", f"the request body is larger than {limit} bytes")


class ApiErrorMiddleware:
    """Answer errors under /api/ as JSON; refuse bodies over DATA_UPLOAD_MAX_MEMORY_SIZE."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        if _declared_length(request) > (settings.DATA_UPLOAD_MAX_MEMORY_SIZE or float("inf")):
            return too_large()
        response = self.get_response(request)
        if response.status_code < 400 or response.get("Content-Type") == "application/json":
            return response
        status = HTTPStatus(response.status_code)
        code = CODES.get(status, status.phrase.lower().replace(" ", "_"))
        replaced = error(status, code, _message(request, status))
        if "Allow" in response:
            replaced["Allow"] = response["Allow"]
        return replaced


def _declared_length(request: HttpRequest) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


def _message(request: HttpRequest, status: HTTPStatus) -> str:
    if status == HTTPStatus.NOT_FOUND:
        return f"nothing at {request.path}"
    if status == HTTPStatus.METHOD_NOT_ALLOWED:
        return f"{request.method} is not allowed here"
    return status.phrase.lower()


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """Answer a failed CSRF check: JSON under /api/, Django's page elsewhere."""
    if request.path.startswith(API_PREFIX):
        return error(403, "csrf_failed", f"CSRF check failed: {reason}")
    return django_csrf_failure(request, reason)
