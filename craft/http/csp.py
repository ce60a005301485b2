"""A strict Content-Security-Policy on every HTML page: only Craft's own files run or style it.

The pages load their scripts and styles from /static/ (the vendored libraries included) and
have no inline script, event handler attribute or style attribute, so the policy allows
neither inline code nor `eval`: text an agent or another user managed to slip into a page
could not run. htmx is told not to insert its own <style> element (templates/base.html);
scripts may still set an element's style through the DOM, which a policy does not govern.
The same policy serves Django's admin, whose pages have no inline code either. Only Django's
debug error pages (`DJANGO_DEBUG` on, status 400 and up) have inline code: they go without.

Django 5.2 has no policy of its own and the header is a few words; the only part that varies
is the websocket origin, added to `connect-src` per request because browsers differ on
whether 'self' covers ws: and wss:. With previews on, `frame-src` allows the preview origin
(every session's and port's, as one wildcard source) and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse

from craft.preview.origin import preview_origin

HEADER = "Content-Security-Policy"
DIRECTIVES = (
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    # No data: or blob: images: attached images are listed by name, never previewed.
    "img-src 'self'",
    "font-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "frame-ancestors 'none'",
    "form-action 'self'",
)


def policy(request: HttpRequest) -> str:
    """Return the policy for a page served in answer to `request`."""
    connect = "connect-src 'self'"
    try:
        host = request.get_host()
    except DisallowedHost:
        pass  # an error page for a host Craft does not serve: 'self' is enough there
    else:
        connect += f" {'wss' if request.is_secure() else 'ws'}://{host}"
    origin = preview_origin()
    if origin is None:
        return "; ".join((*DIRECTIVES, connect))
    # The Preview tab frames an app of the sandbox, on the preview origin only.
    return "; ".join((*DIRECTIVES, connect, f"frame-src {origin.frame_source()}"))


class ContentSecurityPolicyMiddleware:
    """Add the policy to every HTML response that does not set one of its own."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if HEADER in response or not response.get("Content-Type", "").startswith("text/html"):
            return response
        if settings.DEBUG and response.status_code >= 400:
            return response  # Django's technical error pages are inline styles and scripts
        response[HEADER] = policy(request)
        return response
