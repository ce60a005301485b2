"""Test hooks for the browser tests, on only with CRAFT_TEST_HOOKS=1.

A browser test runs daphne in another process, so it cannot patch code there; these small
switches let it make session loads fail or slow, count them, and drop websockets the way a
flaky network would. The URLs exist only when the setting is on.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from uuid import UUID

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .live import session_group

_lock = threading.Lock()
_state = {"fail_loads": 0, "load_delay": 0.0}
_loads: Counter[str] = Counter()


def before_load(session_id: UUID) -> HttpResponse | None:
    """Count a session load; delay or fail it as the hooks say (None: carry on)."""
    if not settings.CRAFT_TEST_HOOKS:
        return None
    with _lock:
        _loads[str(session_id)] += 1
        delay = float(_state["load_delay"])
        fail = _state["fail_loads"] > 0
        if fail:
            _state["fail_loads"] -= 1
    if delay:
        time.sleep(delay)
    if fail:
        return JsonResponse(
            {"error": {"code": "test_failure", "message": "load failed (test hook)"}}, status=503
        )
    return None


@csrf_exempt
@require_POST
def configure(request: HttpRequest) -> HttpResponse:
    with _lock:
        if "fail_loads" in request.POST:
            _state["fail_loads"] = int(request.POST["fail_loads"])
        if "load_delay" in request.POST:
            _state["load_delay"] = float(request.POST["load_delay"])
        if request.POST.get("reset"):
            _state.update(fail_loads=0, load_delay=0.0)
            _loads.clear()
    return JsonResponse({**_state, "loads": dict(_loads)})


def loads(request: HttpRequest) -> HttpResponse:
    with _lock:
        return JsonResponse({"loads": dict(_loads)})


@csrf_exempt
@require_POST
def drop_sockets(request: HttpRequest, session_id: UUID) -> HttpResponse:
    async_to_sync(get_channel_layer().group_send)(session_group(session_id), {"type": "test.drop"})
    return JsonResponse({"dropped": str(session_id)})


urlpatterns = [
    path("test-hooks/configure/", configure),
    path("test-hooks/loads/", loads),
    path("test-hooks/drop/<uuid:session_id>/", drop_sockets),
]
