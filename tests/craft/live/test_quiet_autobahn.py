"""A frame sent through autobahn (as daphne sends every websocket frame) and a socket's
connection format no log arguments once `craft.live.quiet_autobahn` is installed; the frame
still goes out whole, and a debug log line still shows what it showed."""

from __future__ import annotations

import pprint
from unittest import mock

import autobahn.util
import autobahn.websocket.protocol as protocol
import pytest
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet.testing import StringTransport

import craft.asgi  # noqa: F401  (installs it, as daphne's import of the application does)
from craft.live import quiet_autobahn


def connected():
    factory = WebSocketServerFactory()
    factory.protocol = WebSocketServerProtocol
    proto = factory.buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    return proto, transport


@pytest.fixture
def open_protocol():
    proto, transport = connected()
    proto.state = proto.STATE_OPEN
    return proto, transport


def formatting_calls(proto) -> int:
    with mock.patch.object(autobahn.util, "hl", wraps=autobahn.util.hl) as hl:
        proto.sendMessage(b"a frame")
        return hl.call_count


def pretty_prints_on_connecting() -> int:
    with mock.patch.object(pprint.PrettyPrinter, "pformat", autospec=True) as pformat:
        pformat.return_value = ""
        connected()
        return pformat.call_count


def test_a_frame_formats_no_log_arguments_and_is_sent(open_protocol):
    proto, transport = open_protocol
    assert formatting_calls(proto) == 0
    assert transport.value().endswith(b"\x81\x07a frame")


def test_a_connection_pretty_prints_nothing():
    assert pretty_prints_on_connecting() == 0


def test_autobahn_itself_still_formats_them(open_protocol, monkeypatch):
    # If this fails, autobahn stopped formatting log arguments for every frame and every
    # connection: the module (and this test) can go.
    monkeypatch.setattr(protocol, "hltype", autobahn.util.hltype)
    monkeypatch.setattr(protocol, "hlval", autobahn.util.hlval)
    monkeypatch.setattr(protocol, "pformat", pprint.pformat)
    proto, _ = open_protocol
    assert formatting_calls(proto) > 0
    assert pretty_prints_on_connecting() > 0
    quiet_autobahn.install()
    assert formatting_calls(proto) == 0
    assert pretty_prints_on_connecting() == 0


def test_a_debug_line_still_shows_the_options_and_timings_still_print():
    options = [("autoPingInterval", 0, "WebSocketServerFactory")]
    assert str(protocol.pformat(options)) == pprint.pformat(options)
    timings = protocol.Timings()
    timings.track("onOpen")
    assert str(timings).startswith("{'onOpen':")
