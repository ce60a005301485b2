"""An agent that reaches the channel layer's Redis cannot act as another user.

The attack, end to end: one user's hostile agent (a sandbox user on the local backend) finds
another user's session socket in Redis and pushes into its channel a forged
`websocket.receive` carrying a prompt, and a forged `events.available` doorbell carrying 100
fake events. The victim's socket is real (Channels' consumer, Redis as its layer).

1. By default the agent cannot even connect to Redis (the sandbox network rule).
2. With that rule lifted (`CRAFT_SANDBOX_NETWORK=open`), the layer drops both messages: they
   are not signed with the server's key. The victim sees nothing, the socket stays open.
3. The control: with a plain, unsigned channels_redis layer the fake events do reach the page,
   which shows the attack aims right; even then the forged `websocket.receive` is dropped,
   because a consumer takes those only from its own socket.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from channels.layers import channel_layers

from craft.models import Event
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import append_events
from sandboxes import services
from tests.conftest import REDIS_URL
from tests.ready import open_ready_session
from tests.sandboxes.hostile import ask, contain, needs_root

from ..wsclient import open_socket, receive_until, session_cookie

REDIS_ADDRESS = REDIS_URL.removeprefix("redis://")  # host:port/db

pytestmark = [needs_root, pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def use_layer(settings, backend: str, **config) -> None:
    # The read timeout as in the settings: above channels_redis's 5 s blocking pop.
    hosts = [{"address": REDIS_URL, "socket_timeout": 30}]
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": backend, "CONFIG": {"hosts": hosts, **config}}
    }
    channel_layers.backends.clear()


SIGNED = "craft.live.channel_layer.SignedRedisChannelLayer"
PLAIN = "channels_redis.core.RedisChannelLayer"


@pytest.mark.parametrize(
    ("network", "layer", "outcome"),
    [
        ("isolated", SIGNED, "refused at the network"),
        ("open", SIGNED, "dropped by the layer"),
        ("open", PLAIN, "fake events shown, prompt dropped by the consumer"),
    ],
)
async def test_an_agent_cannot_inject_into_another_users_socket_through_redis(
    settings, machine, owner, stranger, caplog, network, layer, outcome
):
    contain(settings, "on")
    settings.CRAFT_SANDBOX_NETWORK = network
    use_layer(
        settings,
        layer,
        **({"symmetric_encryption_keys": ["test-layer-key"]} if layer == SIGNED else {}),
    )
    victim_session = await db_sync_to_async(open_ready_session)(owner, "victim")
    await db_sync_to_async(append_events)(victim_session.pk, [("agent_message_chunk", {"n": 1})])
    comm, _ = await open_socket(victim_session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    await receive_until(comm, lambda f: f.get("seq") == 1)

    attacker_session = await db_sync_to_async(open_ready_session)(stranger, "attacker")
    agent = await db_sync_to_async(services.connect_agent)(
        attacker_session.sandbox, attacker_session.pk
    )
    caplog.set_level(logging.WARNING)
    command = f"redis-inject {REDIS_ADDRESS} {victim_session.pk} probe write:/tmp/forged"
    result = await asyncio.to_thread(ask, agent, command)

    if outcome == "refused at the network":
        assert result == {"error": "ECONNREFUSED"}
    else:
        assert result == {"channels": 1}  # it reached Redis and found the victim's socket
    await db_sync_to_async(append_events)(victim_session.pk, [("agent_message_chunk", {"n": 2})])
    if outcome == "fake events shown, prompt dropped by the consumer":
        # The page shows the fake events, and takes them for the log's (it misses the real
        # event 2 after them): what signing prevents.
        await receive_until(
            comm, lambda f: f.get("data", {}).get("content", {}).get("text") == "forged event"
        )
        assert "dropped a 'websocket.receive' message from the channel layer" in caplog.text
    else:
        # Nothing forged arrives; the real log goes on, and the socket with it.
        frames = await receive_until(comm, lambda f: f.get("data") == {"n": 2})
        assert [f["seq"] for f in frames] == [2]
    if outcome == "dropped by the layer":
        # Both forgeries are dropped as the consumer reads its channel, which may be after
        # the real event: wait for the second.
        deadline = asyncio.get_running_loop().time() + 30
        while "not signed with this server's key (2 so far)" not in caplog.text:
            assert asyncio.get_running_loop().time() < deadline, caplog.text[-2000:]
            await asyncio.sleep(0.05)
    kinds = await db_sync_to_async(
        lambda: list(Event.objects.filter(session=victim_session).values_list("kind", flat=True))
    )()
    assert kinds == ["agent_message_chunk", "agent_message_chunk"]  # no forged prompt stored
    await comm.disconnect()
    channel_layers.backends.clear()
