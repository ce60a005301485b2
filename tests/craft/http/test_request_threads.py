"""The threads HTTP requests run on (craft.http.handler): kept for the next request, never lent
while a request that went away still runs on them, and at most REQUESTS_AT_ONCE requests in
their middleware and view at once (a slow upload and a response that streams hold no place).

The requests go to the real handler in this process (`craft.asgi.django_application`), with the
app's URLs and two of this module's: a view that waits to be let go, and a response that
streams until it is let go."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.core.signals import request_finished, request_started
from django.http import HttpResponse, StreamingHttpResponse
from django.urls import include, path

from craft.asgi import django_application
from craft.http import handler as http_handler
from craft.http.handler import RequestThreads

pytestmark = pytest.mark.django_db(transaction=True)


class Held:
    """What this module's views wait for, and how many entered the blocking one."""

    entered = 0
    lock = threading.Lock()
    two_in = threading.Event()  # two entered the blocking view
    go = threading.Event()
    stream_go: asyncio.Event | None = None


def blocked(request):
    with Held.lock:
        Held.entered += 1
        if Held.entered == 2:
            Held.two_in.set()
    Held.go.wait(60)
    return HttpResponse("let go")


def streamed(request):
    async def parts():
        yield b"first part"
        assert Held.stream_go is not None
        await Held.stream_go.wait()
        yield b"last part"

    return StreamingHttpResponse(parts())


urlpatterns = [
    path("_test/blocked/", blocked),
    path("_test/streamed/", streamed),
    path("", include("craft.urls")),
]


@pytest.fixture
def places(settings, monkeypatch):
    """Two places; the URLs above; what the views wait for, fresh."""
    settings.ROOT_URLCONF = __name__
    monkeypatch.setattr(http_handler, "REQUESTS_AT_ONCE", 2)
    Held.entered, Held.two_in, Held.go = 0, threading.Event(), threading.Event()
    Held.stream_go = None
    yield
    Held.go.set()


def scope_of(path: str, method: str = "GET") -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"localhost")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip


class Request:
    """One request to the handler: what it sent back, and its body held back if asked."""

    def __init__(self, path: str, *, body_held: bool = False) -> None:
        self.sent: list[dict] = []
        self.body_given = asyncio.Event()
        self.first_part = asyncio.Event()
        self.disconnect = asyncio.Event()
        self._body_held = body_held
        self.task = asyncio.ensure_future(
            django_application(scope_of(path), self._receive, self._send)
        )

    async def _receive(self) -> dict:
        if not self.body_given.is_set():
            self.body_given.set()
            return {"type": "http.request", "body": b"", "more_body": self._body_held}
        await self.disconnect.wait()  # the rest of the body never comes
        return {"type": "http.disconnect"}

    async def _send(self, message: dict) -> None:
        self.sent.append(message)
        if message.get("body"):
            self.first_part.set()


def test_requests_past_the_limit_wait_their_turn_before_their_view(places, monkeypatch):
    taking, took = [], []
    three_taking = asyncio.Event()
    take = http_handler.Place.take

    async def counted(place):
        taking.append(place)
        if len(taking) == 3:
            three_taking.set()
        await take(place)
        took.append(place)

    monkeypatch.setattr(http_handler.Place, "take", counted)

    async def three() -> None:
        requests = [Request("/_test/blocked/") for _ in range(3)]
        await asyncio.wait_for(three_taking.wait(), 60)
        assert await asyncio.to_thread(Held.two_in.wait, 60)
        assert len(took) == 2 and Held.entered == 2, "the third waits for a place"
        Held.go.set()
        await asyncio.wait_for(asyncio.gather(*(r.task for r in requests)), 60)
        assert [r.sent[0]["status"] for r in requests] == [200] * 3
        assert Held.entered == 3

    asyncio.run(three())


def test_a_request_whose_body_is_still_coming_holds_no_place(places, monkeypatch):
    monkeypatch.setattr(http_handler, "REQUESTS_AT_ONCE", 1)

    async def upload_and_health() -> None:
        upload = Request("/healthz", body_held=True)  # its body's end never comes
        await upload.body_given.wait()
        health = Request("/healthz")
        await asyncio.wait_for(health.task, 60)
        assert health.sent[0]["status"] == 200
        upload.disconnect.set()
        await asyncio.wait_for(upload.task, 60)

    asyncio.run(upload_and_health())


def test_a_streaming_response_gives_its_place_back_when_it_starts(places, monkeypatch):
    monkeypatch.setattr(http_handler, "REQUESTS_AT_ONCE", 1)

    async def stream_and_health() -> None:
        Held.stream_go = asyncio.Event()
        stream = Request("/_test/streamed/")
        await asyncio.wait_for(stream.first_part.wait(), 60)
        health = Request("/healthz")
        await asyncio.wait_for(health.task, 60)
        assert health.sent[0]["status"] == 200
        Held.stream_go.set()
        await asyncio.wait_for(stream.task, 60)
        assert b"".join(m.get("body", b"") for m in stream.sent) == b"first partlast part"

    asyncio.run(stream_and_health())


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
