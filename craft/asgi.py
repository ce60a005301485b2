"""ASGI entry point: HTTP goes to Django, websockets to the Channels consumers."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "craft.settings")

# Django must be set up before anything imports models (the routing below does).
django_application = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from craft.live.auth import SessionAuthMiddleware  # noqa: E402
from craft.live.origins import OriginCheck  # noqa: E402
from craft.live.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_application,
        # The Origin check (scheme, host and port) is the cross-site websocket hijacking
        # protection: keep it.
        "websocket": OriginCheck(SessionAuthMiddleware(URLRouter(websocket_urlpatterns))),
    }
)

from craft.cluster.lifecycle import install_in_daphne  # noqa: E402

install_in_daphne()
