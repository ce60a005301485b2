"""Previews over HTTP (docs/http-api.md, "Previews"): the ports an app listens on in the
session's sandbox, and a short-lived link to one of them on the preview origin.

Only the session's owner; the link's token is made by `craft.preview.passes`, and the preview
origin itself is served by `craft.preview.proxy`.
"""

from __future__ import annotations

from urllib.parse import quote
from uuid import UUID

from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_http_methods

from craft.api.sessions import api_login_required, error, json_body
from craft.http.requests import SignedInRequest
from craft.models import Session
from craft.preview.origin import preview_origin
from craft.preview.passes import ENTRY_PATH, Pass, make_token
from sandboxes import services as sandbox_services
from sandboxes.backends import SandboxError

PREVIEWS_OFF = "Previews are off: the operator sets CRAFT_PREVIEW_ORIGIN to turn them on."


@require_http_methods(["GET", "POST"])
@api_login_required
def preview(request: SignedInRequest, session_id: UUID) -> HttpResponse:
    """GET: `{"enabled", "ports"}`, the TCP ports listening in the sandbox. POST `{"port"}`:
    `{"url"}`, the preview of that port with a token good for a minute, once."""
    session = Session.objects.one_of(request.user, session_id)
    if session is None:
        return error(404, "not_found", "no such session")
    origin = preview_origin()
    if request.method == "GET":
        if origin is None:
            return JsonResponse({"enabled": False, "ports": [], "message": PREVIEWS_OFF})
        try:
            ports = sandbox_services.preview_ports(session.sandbox)
        except sandbox_services.SandboxUnavailable as exc:
            return error(503, "sandbox_unavailable", str(exc))
        except SandboxError as exc:
            return error(502, "ports_unreadable", str(exc))
        return JsonResponse({"enabled": True, "ports": ports})
    if origin is None:
        return error(404, "previews_off", PREVIEWS_OFF)
    body = json_body(request)
    port = body.get("port") if body is not None else None
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        return error(400, "invalid", "'port' must be a TCP port number (1 to 65535)")
    craft_origin = f"{request.scheme}://{request.get_host()}"
    token = make_token(Pass(request.user.pk, session.pk, port, craft_origin))
    url = f"{origin.url(session.pk, port)}{ENTRY_PATH}?token={quote(token)}"
    return JsonResponse({"url": url, "origin": origin.url(session.pk, port)})
