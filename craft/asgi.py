"""ASGI entry point: HTTP goes to Django, websockets to the Channels consumers, preview hosts
to the preview."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "craft.settings")

# Django must be set up before anything imports models (the routing below does); then
# Django's ASGI handler, as `get_asgi_application` makes it, with one thread hop a request.
django.setup(set_prefix=False)

from craft.http.handler import OneHopASGIHandler  # noqa: E402

django_application = OneHopASGIHandler()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from craft.http.static_files import StaticFiles  # noqa: E402
from craft.live.auth import SessionAuthMiddleware  # noqa: E402
from craft.live.origins import OriginCheck  # noqa: E402
from craft.live.routing import websocket_urlpatterns  # noqa: E402
from craft.preview.proxy import PreviewDispatch  # noqa: E402

# Requests and websockets to a preview host (CRAFT_PREVIEW_ORIGIN) go to the preview, never to
# Craft; Craft's own never to the preview (craft/preview/proxy.py).
application = PreviewDispatch(
    ProtocolTypeRouter(
        {
            # Static files answered again from memory (see the module); everything else: Django.
            "http": StaticFiles(django_application),
            # The Origin check (scheme, host and port) is the cross-site websocket hijacking
            # protection: keep it.
            "websocket": OriginCheck(SessionAuthMiddleware(URLRouter(websocket_urlpatterns))),
        }
    )
)

from craft.lifecycle import install_in_daphne  # noqa: E402
from craft.live import quiet_autobahn  # noqa: E402

install_in_daphne()
quiet_autobahn.install()

# The cyclic garbage collector held the GIL for a third of daphne's busy time with 400
# sessions streaming (py-spy --native: `gc_collect_main`), scanning the same long-lived
# objects again and again. What start-up made is never garbage: it is frozen out of every
# collection. The young generation is collected every 50,000 allocations rather than 700,
# and the whole heap after 100 collections of the middle one rather than 10: nearly all of
# a streamed chunk's objects are freed by their reference counts before either.
import gc  # noqa: E402

GC_THRESHOLDS = (50_000, 20, 100)
gc.freeze()
gc.set_threshold(*GC_THRESHOLDS)
