"""Probes for process managers and load balancers.

`/healthz` answers while the process serves requests (liveness). `/readyz` answers 200 while
the worker takes new work: the database answers and the worker is not shutting down; 503
otherwise, so that a load balancer stops sending it browsers before it stops (readiness).
Both are plain HTTP (no redirect to HTTPS) and need no sign-in.
"""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from craft.turns.registry import runners


@require_GET
def alive(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "alive"})


@require_GET
def ready(request: HttpRequest) -> JsonResponse:
    if runners.closing:
        return JsonResponse({"status": "shutting down"}, status=503)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        return JsonResponse(
            {"status": f"database unavailable: {exc.__class__.__name__}"}, status=503
        )
    return JsonResponse({"status": "ready"})
