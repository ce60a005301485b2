"""Static files: Django answers a path once, the same answer is sent again from memory.

Against Django's own ASGI handler, as daphne runs it (craft.asgi), with a spy between the two
that counts the requests Django saw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from channels.testing import HttpCommunicator
from django.conf import settings

from craft.http.handler import OneHopASGIHandler
from craft.http.static_files import LARGEST, VARIANTS, StaticFiles

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    # WhiteNoise's file answers are synchronous iterators, which Django reads on a thread
    # under ASGI, saying so: what the server does with them, as daphne runs it.
    pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume synchronous"),
]

CSS = "/static/craft/craft.css"
CSS_FILE = Path(settings.BASE_DIR) / "static" / "craft" / "craft.css"


class Spy:
    """An ASGI app in front of another: counts the requests it passes on."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests: list[str] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.requests.append(f"{scope['method']} {scope['path']}")
        await self.app(scope, receive, send)


def static_files() -> tuple[StaticFiles, Spy]:
    django = Spy(OneHopASGIHandler())
    return StaticFiles(django), django


async def get(app: Any, path: str, method: str = "GET", headers: Any = None) -> dict:
    """Ask `app`; return the answer's status, headers and whole body."""
    asking = HttpCommunicator(
        app, method, path, headers=[(b"host", b"testserver"), *(headers or [])]
    )
    await asking.send_input({"type": "http.request", "body": b""})
    start = await asking.receive_output(10)
    body = b""
    while True:  # (a last part may have no body: HttpCommunicator's own reading fails then)
        part = await asking.receive_output(10)
        body += part.get("body", b"")
        if not part.get("more_body", False):
            break
    await asking.wait(10)
    names = [(bytes(name), bytes(value)) for name, value in start.get("headers", [])]
    return {"status": start["status"], "headers": names, "body": body}


def header(answer: dict, name: bytes) -> bytes | None:
    return next((value for key, value in answer["headers"] if key.lower() == name), None)


async def test_django_answers_a_static_file_once_and_memory_after():
    app, django = static_files()
    first = await get(app, CSS)
    again = await get(app, CSS)
    head = await get(app, CSS, "HEAD")
    assert django.requests == [f"GET {CSS}"]
    assert first["status"] == again["status"] == head["status"] == 200
    assert first["body"] == again["body"] == CSS_FILE.read_bytes()
    assert head["body"] == b""
    # The same headers, Django's security headers and WhiteNoise's caching ones included.
    assert first["headers"] == again["headers"] == head["headers"]
    assert header(first, b"x-content-type-options") == b"nosniff"
    assert header(first, b"etag") and header(first, b"cache-control")
    assert header(first, b"content-length") == str(CSS_FILE.stat().st_size).encode()


async def test_what_django_may_answer_otherwise_goes_to_django_every_time():
    app, django = static_files()
    first = await get(app, CSS)
    etag = header(first, b"etag")
    asked = [
        (CSS, "GET", [(b"if-none-match", etag)], 304),
        (CSS, "GET", [(b"If-Modified-Since", header(first, b"last-modified"))], 304),
        (CSS, "GET", [(b"range", b"bytes=0-9")], 206),
        (CSS, "POST", None, 405),
        (f"{CSS}?v=2", "GET", None, 200),
        ("/static/craft/no-such-file.css", "GET", None, 404),
        ("/static/craft/no-such-file.css", "GET", None, 404),
        ("/static/craft/no-such-file.css", "HEAD", None, 404),
    ]
    for path, method, headers, status in asked:
        assert (await get(app, path, method, headers))["status"] == status, (path, headers)
    assert len(django.requests) == 1 + len(asked)
    ranged = await get(app, CSS, headers=[(b"range", b"bytes=0-9")])
    assert ranged["body"] == CSS_FILE.read_bytes()[:10]
    assert (await get(app, "/healthz"))["status"] == 200  # not a static file: Django's
    assert django.requests[-1] == "GET /healthz"


async def test_nothing_is_kept_in_debug(settings):
    settings.DEBUG = True  # files may change on disk while a developer's server runs
    app, django = static_files()
    for _ in range(2):
        assert (await get(app, CSS))["status"] == 200
    assert len(django.requests) == 2


class Answers:
    """An app that answers every request as told (what Django answers here keeps no
    cookie and varies with nothing but the encoding: the rest is this module's rule)."""

    def __init__(self, headers: list[tuple[bytes, bytes]], body: bytes = b"x") -> None:
        self.headers = headers
        self.body = body
        self.requests = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.requests += 1
        await send({"type": "http.response.start", "status": 200, "headers": self.headers})
        # In two parts: a kept body is the whole of them.
        half = len(self.body) // 2
        await send({"type": "http.response.body", "body": self.body[:half], "more_body": True})
        await send({"type": "http.response.body", "body": self.body[half:]})


@pytest.mark.parametrize(
    "headers, body",
    [
        ([(b"set-cookie", b"a=b")], b"x"),
        ([(b"vary", b"Cookie")], b"x"),
        ([(b"vary", b"*")], b"x"),
        ([], b"x" * (LARGEST + 1)),
    ],
)
async def test_answers_that_may_be_someone_s_own_or_are_too_large_are_not_kept(headers, body):
    inner = Answers(headers, body)
    app = StaticFiles(inner)
    for _ in range(2):
        assert (await get(app, CSS))["body"] == body
    assert inner.requests == 2


async def test_answers_that_vary_with_the_encoding_are_kept_apart_and_few():
    inner = Answers([(b"vary", b"Accept-Encoding")], b"0123456789")
    app = StaticFiles(inner)
    encodings = [f"enc{n}".encode() for n in range(VARIANTS + 2)]
    for _ in range(2):
        for encoding in encodings:
            answer = await get(app, CSS, headers=[(b"accept-encoding", encoding)])
            assert answer["body"] == b"0123456789"
    # Each kept encoding was asked of the app once; past VARIANTS, every time.
    assert inner.requests == VARIANTS + 2 * (len(encodings) - VARIANTS)
