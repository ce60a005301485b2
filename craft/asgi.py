"""ASGI entry point: HTTP goes to Django, websockets to the Channels consumers."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "craft.settings")

# Django must be set up before anything imports models (the routing below does); then
# Django's ASGI handler, as `get_asgi_application` makes it, with one thread hop a request.
django.setup(set_prefix=False)

from craft.http_handler import OneHopASGIHandler  # noqa: E402

django_application = OneHopASGIHandler()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from craft.live.auth import SessionAuthMiddleware  # noqa: E402
from craft.live.origins import OriginCheck  # noqa: E402
from craft.live.routing import websocket_urlpatterns  # noqa: E402
from craft.static_files import StaticFiles  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Static files answered again from memory (see the module); everything else: Django.
        "http": StaticFiles(django_application),
        # The Origin check (scheme, host and port) is the cross-site websocket hijacking
        # protection: keep it.
        "websocket": OriginCheck(SessionAuthMiddleware(URLRouter(websocket_urlpatterns))),
    }
)

from craft.cluster.lifecycle import install_in_daphne  # noqa: E402

install_in_daphne()
