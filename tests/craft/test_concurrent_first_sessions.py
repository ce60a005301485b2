"""New users opening their first sessions all at once: one sandbox each, every request served.

A real daphne process, the real database, 50 requests released together from 50 threads:
each user's sandbox is provisioned once, in the background, and all their sessions are in it.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.contrib.auth import get_user_model

from craft.models import Session
from sandboxes.models import Sandbox

from ..server import Daphne, api_request
from .wsclient import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

USERS, REQUESTS_EACH = 10, 5


def test_new_users_opening_sessions_in_parallel_all_succeed_with_one_sandbox_each(tmp_path):
    users = [
        get_user_model().objects.create_user(f"newcomer{i}", password="x") for i in range(USERS)
    ]
    cookies = {u.pk: session_cookie(u) for u in users}
    server = Daphne(tmp_path).start()
    try:
        barrier = threading.Barrier(USERS * REQUESTS_EACH)
        answers: list[tuple[int, int, dict]] = []

        def open_one(user, n: int) -> None:
            barrier.wait()
            status, body = api_request(
                server.url, cookies[user.pk], "POST", "/api/sessions/", {"title": f"try {n}"}
            )
            answers.append((user.pk, status, body))

        threads = [
            threading.Thread(target=open_one, args=(user, n))
            for user in users
            for n in range(REQUESTS_EACH)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        # The answers come at once; each sandbox is provisioned in the background.
        deadline = time.monotonic() + 60
        while Sandbox.objects.filter(owner__in=users, status=Sandbox.Status.PROVISIONING):
            assert time.monotonic() < deadline, "sandboxes still provisioning"
            time.sleep(0.1)
    finally:
        server.stop()

    failures = [(status, body) for _, status, body in answers if status != 201]
    assert failures == [], f"{len(failures)} of {len(answers)} failed: {failures[:3]}"
    assert len(answers) == USERS * REQUESTS_EACH
    for user in users:
        sandboxes = Sandbox.objects.filter(owner=user)
        assert [s.status for s in sandboxes] == [Sandbox.Status.RUNNING]
        sessions = Session.objects.filter(owner=user)
        assert sessions.count() == REQUESTS_EACH
        assert {s.sandbox_id for s in sessions} == {sandboxes[0].pk}
        assert {body["sandbox"] for pk, _, body in answers if pk == user.pk} == {
            str(sandboxes[0].pk)
        }
