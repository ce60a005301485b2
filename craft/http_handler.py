"""Django's ASGI handler, with each request's middleware and view run in one thread hop.

Django builds its middleware chain for ASGI from the inside out: every middleware that can
run asynchronously does, and each place where an asynchronous one meets a synchronous one
(Craft's own middleware, WhiteNoise, a synchronous view) is a hop between the event loop and
the request's thread. `MiddlewareMixin` also runs each `process_request` and
`process_response` of an asynchronous middleware on the request's thread. A request to a
synchronous view made about twenty hops, each a `call_soon_threadsafe` and a wait for the
GIL: 5-6 ms of the server's CPU for `/healthz` on a 2-core machine (docs/performance.md).

Here the chain is built as under WSGI, synchronous throughout, and the whole of it runs in
one hop to the request's thread. An asynchronous view (the revert) still works: Django runs
it on the event loop from that thread. Everything else is Django's own handler: request
parsing, disconnects, streaming responses (an asynchronous iterator streams from the loop).
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase


class OneHopASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        # `get_response` is the synchronous path: the URL resolver, the chain, the closers and
        # the logging of an error answer, as `get_response_async` does them.
        response: HttpResponseBase = await sync_to_async(self.get_response, thread_sensitive=True)(
            request
        )
        return response
