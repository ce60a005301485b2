"""A frame sent through autobahn (as daphne sends every websocket frame) formats no log
arguments once `craft.live.quiet_autobahn` is installed, and still goes out whole."""

from __future__ import annotations

from unittest import mock

import autobahn.util
import pytest
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet.testing import StringTransport

import craft.asgi  # noqa: F401  (installs it, as daphne's import of the application does)
from craft.live import quiet_autobahn


@pytest.fixture
def open_protocol():
    factory = WebSocketServerFactory()
    factory.protocol = WebSocketServerProtocol
    proto = factory.buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    proto.state = proto.STATE_OPEN
    return proto, transport


def formatting_calls(proto) -> int:
    with mock.patch.object(autobahn.util, "hl", wraps=autobahn.util.hl) as hl:
        proto.sendMessage(b"a frame")
        return hl.call_count


def test_a_frame_formats_no_log_arguments_and_is_sent(open_protocol):
    proto, transport = open_protocol
    assert formatting_calls(proto) == 0
    assert transport.value().endswith(b"\x81\x07a frame")


def test_autobahn_itself_still_formats_them(open_protocol, monkeypatch):
    # If this fails, autobahn stopped formatting log arguments for every frame: the module
    # (and this test) can go.
    monkeypatch.setattr("autobahn.websocket.protocol.hltype", autobahn.util.hltype)
    monkeypatch.setattr("autobahn.websocket.protocol.hlval", autobahn.util.hlval)
    proto, _ = open_protocol
    assert formatting_calls(proto) > 0
    quiet_autobahn.install()
    assert formatting_calls(proto) == 0
