"""The threads HTTP requests run on (craft.http_handler): kept for the next request, and never
lent while a request that went away still runs on them."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.core.signals import request_finished, request_started

from craft.asgi import django_application
from craft.http_handler import RequestThreads

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_thread_is_lent_again_only_once_what_it_was_given_has_run():
    threads = RequestThreads(keep=4)
    first = threads.borrow()
    started, release, ran = threading.Event(), threading.Event(), threading.Event()
    view = first.submit(lambda: (started.set(), release.wait(60)))
    # Called after the thread's own bookkeeping of the view (callbacks run in order).
    view.add_done_callback(lambda _: ran.set())
    assert started.wait(60)
    threads.give_back(first)  # its request ended (the client went away); its view still runs
    second = threads.borrow()
    assert second is not first, "a busy thread is not lent"
    release.set()
    assert ran.wait(60)
    assert threads.borrow() is first, "an idle thread is kept and lent again"
    for executor in (first, second):
        executor.shutdown()


def test_each_request_runs_on_one_thread_and_the_next_one_reuses_it():
    seen: list[tuple[str, int, str]] = []

    def started(**kwargs):
        seen.append(("started", threading.get_ident(), threading.current_thread().name))

    def finished(**kwargs):
        seen.append(("finished", threading.get_ident(), threading.current_thread().name))

    async def get(path: str) -> int:
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "headers": [(b"host", b"localhost")],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
        }  # fmt: skip
        sent: list[dict] = []
        body = asyncio.Event()

        async def receive() -> dict:
            if not body.is_set():
                body.set()
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Event().wait()  # no disconnect
            return {}

        async def send(message: dict) -> None:
            sent.append(message)

        await django_application(scope, receive, send)
        return sent[0]["status"]

    async def twice() -> list[int]:
        return [await get("/healthz"), await get("/healthz")]

    request_started.connect(started)
    request_finished.connect(finished)
    try:
        assert asyncio.run(twice()) == [200, 200]
    finally:
        request_started.disconnect(started)
        request_finished.disconnect(finished)
    assert [what for what, _, _ in seen] == ["started", "finished"] * 2
    assert len({ident for _, ident, _ in seen}) == 1, seen
    assert all(name.startswith("craft-http") for _, _, name in seen), seen
