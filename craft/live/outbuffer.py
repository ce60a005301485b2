"""How many bytes a websocket has queued for its client but not sent yet (under daphne).

ASGI gives an application no way to notice a client that does not read: `send` never blocks,
and what the client does not take piles up in the server. Under daphne, a consumer's `send`
is `functools.partial(Server.handle_reply, protocol)`, and the protocol's Twisted transport
holds what the kernel has not taken yet; `unsent_bytes` reads that. Anywhere else (Channels'
test communicator, another server) it answers None and nothing is limited.
"""

from __future__ import annotations

import asyncio
from typing import Any


def unsent_bytes(send: Any) -> int | None:
    """Return how many bytes the transport behind daphne's `send` still holds for its client,
    or None when there is no Twisted transport to ask.

    Twisted has no public way to ask: a transport (`twisted.internet.abstract.FileDescriptor`)
    keeps what the kernel has not taken in `dataBuffer` from `offset` on, and what was written
    since its last attempt in a list that only its private `_tempDataLen` counts. This reads
    that private attribute (checked against Twisted 26.10.0). A Twisted without it would make
    this answer None and quietly lift the limit, so `tests/craft/live/test_outbuffer.py` drives a
    real TCP transport and fails, saying so, if the attribute goes or means something else.
    """
    protocol = next(iter(getattr(send, "args", ())), None)
    transport = getattr(protocol, "transport", None)
    if transport is None or not hasattr(transport, "_tempDataLen"):
        return None
    return len(transport.dataBuffer) - transport.offset + transport._tempDataLen


# How often a client past its limit is looked at.
LOOK_SECONDS = 0.05


async def client_keeps_up(send: Any, limit: int, stall_seconds: float) -> bool:
    """Hold on while the client behind `send` has more than `limit` bytes not read yet,
    until at most half of it is left; return False if it read nothing for `stall_seconds`
    meanwhile (it stopped reading), True otherwise.

    A client that reads, however slowly, is waited for: each time the kernel takes some of
    what waits (the client read that much), it gets `stall_seconds` again. Meanwhile nothing
    more is sent to it, so what it holds in the server stays about `limit`.
    """
    unsent = unsent_bytes(send)
    if unsent is None or unsent <= limit:
        return True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + stall_seconds
    while unsent > limit // 2:
        await asyncio.sleep(LOOK_SECONDS)
        now = unsent_bytes(send) or 0
        if now < unsent:
            deadline = loop.time() + stall_seconds
        elif loop.time() > deadline:
            return False
        unsent = now
    return True
