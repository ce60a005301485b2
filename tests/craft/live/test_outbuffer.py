"""`unsent_bytes` against a real Twisted TCP transport, the kind daphne gives each websocket.

`craft/live/outbuffer.py` reads Twisted's private `FileDescriptor._tempDataLen`: these tests fail,
naming it, if a Twisted upgrade takes it away or changes what it counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import time
from collections.abc import Iterator

import pytest
from twisted.internet import tcp
from twisted.internet.protocol import Protocol
from twisted.internet.testing import MemoryReactor

from craft.live.outbuffer import client_keeps_up, unsent_bytes

SIZE = 2 * 1024 * 1024


@pytest.fixture
def connection() -> Iterator[tuple[tcp.Server, socket.socket]]:
    """A server-side Twisted TCP transport on loopback (driven by hand, no reactor running)
    and the client socket at the other end, with kernel buffers far smaller than SIZE."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, peer = listener.accept()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    accepted.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    client.setblocking(False)
    protocol = Protocol()
    transport = tcp.Server(accepted, protocol, peer, None, 0, MemoryReactor())
    protocol.makeConnection(transport)
    yield transport, client
    client.close()
    transport.socket.close()


def daphne_send(transport: tcp.Server) -> functools.partial:
    """Return a `send` shaped like daphne's: `partial(Server.handle_reply, protocol)`."""
    return functools.partial(lambda protocol, message: None, transport.protocol)


def read_available(client: socket.socket) -> int:
    received = 0
    while True:
        try:
            chunk = client.recv(1 << 20)
        except BlockingIOError:
            return received
        if not chunk:
            return received
        received += len(chunk)


def test_twisted_transports_still_count_unwritten_data_in_temp_data_len(connection):
    transport, _ = connection
    assert hasattr(transport, "_tempDataLen"), (
        "twisted.internet.abstract.FileDescriptor has no `_tempDataLen` any more (checked "
        "against Twisted 26.10.0): craft/live/outbuffer.py can no longer see what a websocket has "
        "not sent, and the per-socket buffer limit is off. Find what replaced it."
    )
    transport.write(b"x" * 1000)
    assert transport._tempDataLen == 1000, "`_tempDataLen` no longer counts what write() took"


def test_unsent_bytes_follows_what_the_kernel_takes_until_all_is_sent(connection):
    transport, client = connection
    send = daphne_send(transport)
    assert unsent_bytes(send) == 0
    transport.write(b"x" * SIZE)  # held until the reactor says the socket is writable
    assert unsent_bytes(send) == SIZE

    transport.doWrite()  # the kernel takes what fits in its small buffers
    after_one_write = unsent_bytes(send)
    assert after_one_write is not None and 0 < after_one_write < SIZE

    received = 0
    deadline = time.monotonic() + 30
    while unsent := unsent_bytes(send):
        assert time.monotonic() < deadline, f"the transport stopped sending with {unsent} left"
        received += read_available(client)
        transport.doWrite()
        assert (unsent_bytes(send) or 0) <= unsent
    client.settimeout(10)
    while received < SIZE:
        chunk = client.recv(1 << 20)
        assert chunk, "the connection closed before everything arrived"
        received += len(chunk)
    assert received == SIZE
    assert unsent_bytes(send) == 0


def test_a_send_that_is_not_daphnes_answers_none():
    assert unsent_bytes(lambda message: None) is None
    assert unsent_bytes(functools.partial(lambda protocol, message: None, object())) is None


STALL = 1.0


async def reading(transport: tcp.Server, client: socket.socket, every: float) -> None:
    """Play the reactor and a slow client: every `every` s the client reads at most 64 KiB
    (about what loopback's receive window opens by) and the transport hands the kernel what
    fits."""
    while True:
        await asyncio.sleep(every)
        with contextlib.suppress(BlockingIOError):
            client.recv(64 * 1024)
        transport.doWrite()


def test_a_client_that_reads_slowly_is_waited_for_and_one_that_stops_is_not(connection):
    """Past its limit, a client that reads 64 KiB every 0.4 s, and so needs several stall
    times to take half of what waits, is waited for; one that reads nothing is not."""
    transport, client = connection
    send = daphne_send(transport)
    transport.write(b"x" * SIZE)
    transport.doWrite()  # the kernel takes what fits in its buffers
    waiting = unsent_bytes(send)
    assert waiting
    limit = waiting - 1  # just past it: half of it must be read

    async def slow_reader() -> tuple[bool, float]:
        began = time.monotonic()
        reader = asyncio.ensure_future(reading(transport, client, 0.4))
        try:
            kept_up = await client_keeps_up(send, limit, STALL)
        finally:
            reader.cancel()
        return kept_up, time.monotonic() - began

    kept_up, took = asyncio.run(slow_reader())
    assert kept_up, f"a client that read every 0.4 s was dropped after {took:.1f} s"
    assert took > 2 * STALL, f"{took:.1f} s: it should have needed several stall times"
    assert (unsent_bytes(send) or 0) <= limit // 2

    async def stopped_reader() -> tuple[bool, float]:
        began = time.monotonic()
        kept_up = await client_keeps_up(send, limit, STALL)
        return kept_up, time.monotonic() - began

    transport.write(b"x" * SIZE)  # and nothing reads it
    kept_up, took = asyncio.run(stopped_reader())
    assert not kept_up
    assert STALL <= took < STALL + 1
