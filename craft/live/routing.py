from channels.security.websocket import WebsocketDenier
from django.urls import path, re_path

from craft.live.consumer import SessionConsumer
from craft.live.status_consumer import StatusConsumer
from craft.live.terminal import TerminalConsumer

websocket_urlpatterns = [
    path("ws/sessions/<uuid:session_id>/", SessionConsumer.as_asgi()),
    path("ws/sessions/<uuid:session_id>/terminals/", TerminalConsumer.as_asgi()),
    path("ws/status/", StatusConsumer.as_asgi()),
    # Any other path is refused during the handshake (daphne answers 403), where the router
    # would raise for a route it does not know (daphne answered 500).
    re_path(r"", WebsocketDenier.as_asgi()),
]
