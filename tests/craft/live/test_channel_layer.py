"""Craft's Redis channel layer keeps channels_redis's guarantees in fewer round trips.

Every test runs against channels_redis's own layer too: the same outcome from both shows the
shorter send, group send and receive (`craft.live.channel_layer`) change nothing a caller
can see. Real Redis; each test has a key prefix of its own.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer
from redis.exceptions import ResponseError

from craft.live.channel_layer import SignedRedisChannelLayer
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.asyncio

KEYS = ["test-channel-layer-key-0123456789"]


@pytest.fixture(params=[SignedRedisChannelLayer, RedisChannelLayer], ids=["craft", "upstream"])
def make_layer(request):
    prefix = f"test-layer-{uuid.uuid4().hex[:8]}"

    def make(**config):
        return request.param(
            hosts=[{"address": REDIS_URL, "socket_timeout": 30}],
            prefix=prefix,
            symmetric_encryption_keys=KEYS,
            **config,
        )

    return make  # each test flushes its prefix's keys at its end


async def receive_all(layer, channel, count):
    return [await asyncio.wait_for(layer.receive(channel), 10) for _ in range(count)]


async def test_sends_arrive_once_each_and_in_order(make_layer):
    sender, receiver = make_layer(), make_layer()
    first, second = await receiver.new_channel(), await receiver.new_channel()
    for n in range(50):
        await sender.send(first if n % 2 else second, {"type": "test.message", "n": n})
    assert [m["n"] for m in await receive_all(receiver, first, 25)] == list(range(1, 50, 2))
    assert [m["n"] for m in await receive_all(receiver, second, 25)] == list(range(0, 50, 2))
    await receiver.flush()


async def test_a_group_send_reaches_each_member_once_across_processes(make_layer):
    sender, here, there = make_layer(), make_layer(), make_layer()
    members = [await here.new_channel(), await here.new_channel(), await there.new_channel()]
    for channel in members:
        await sender.group_add("g", channel)
    for n in range(10):
        await sender.group_send("g", {"type": "test.message", "n": n})
    for channel in members:
        layer = there if channel == members[2] else here
        assert [m["n"] for m in await receive_all(layer, channel, 10)] == list(range(10))
    await sender.group_discard("g", members[0])
    await sender.group_send("g", {"type": "test.message", "n": "after"})
    assert (await receive_all(here, members[1], 1))[0]["n"] == "after"
    assert (await receive_all(there, members[2], 1))[0]["n"] == "after"
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(here.receive(members[0]), 0.5)
    await sender.flush()


async def test_a_full_channel_refuses_a_send_and_is_skipped_by_a_group_send(make_layer):
    sender, receiver = make_layer(capacity=3), make_layer(capacity=3)
    full, free = await receiver.new_channel(), await receiver.new_channel()
    for n in range(3):
        await sender.send(full, {"type": "test.message", "n": n})
    with pytest.raises(ChannelFull):
        await sender.send(full, {"type": "test.message", "n": 3})
    # Channels of one process share a key, so their capacity is shared: another process's.
    other = make_layer(capacity=3)
    elsewhere = await other.new_channel()
    for channel in (full, elsewhere):
        await sender.group_add("g", channel)
    await sender.group_send("g", {"type": "test.message", "n": "group"})
    assert [m["n"] for m in await receive_all(receiver, full, 3)] == [0, 1, 2]
    assert (await receive_all(other, elsewhere, 1))[0]["n"] == "group"
    await sender.send(free, {"type": "test.message", "n": "room again"})
    assert (await receive_all(receiver, free, 1))[0]["n"] == "room again"
    await sender.flush()


async def test_an_expired_message_is_dropped(make_layer):
    sender, receiver, member = make_layer(expiry=1), make_layer(expiry=1), make_layer(expiry=1)
    channel, in_group = await receiver.new_channel(), await member.new_channel()
    await sender.group_add("g", in_group)
    await sender.send(channel, {"type": "test.message", "n": "stale"})
    await sender.group_send("g", {"type": "test.message", "n": "stale"})
    await asyncio.sleep(2.1)  # the messages' age passes the expiry (not a timed assertion)
    await sender.send(channel, {"type": "test.message", "n": "fresh"})
    await sender.group_send("g", {"type": "test.message", "n": "fresh"})
    assert (await receive_all(receiver, channel, 1))[0]["n"] == "fresh"
    assert (await receive_all(member, in_group, 1))[0]["n"] == "fresh"
    await sender.flush()


async def test_a_cancelled_receive_loses_no_later_message(make_layer):
    sender, receiver = make_layer(), make_layer()
    channel = await receiver.new_channel()
    waiting = asyncio.ensure_future(receiver.receive(channel))
    await asyncio.sleep(0.2)  # it is blocked in Redis now
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await sender.send(channel, {"type": "test.message", "n": "after the cancel"})
    assert (await receive_all(receiver, channel, 1))[0]["n"] == "after the cancel"
    await sender.flush()


def two_processes() -> tuple[SignedRedisChannelLayer, SignedRedisChannelLayer]:
    """Craft's layer as two server processes have it: one Redis, one prefix."""
    prefix = f"test-layer-{uuid.uuid4().hex[:8]}"
    return tuple(  # type: ignore[return-value]
        SignedRedisChannelLayer(
            hosts=[{"address": REDIS_URL}], prefix=prefix, symmetric_encryption_keys=KEYS
        )
        for _ in range(2)
    )


async def test_a_doorbell_skips_the_channels_of_the_process_that_rings_it():
    """The event log's doorbell goes to other processes only: the ringing process's sockets
    heard of the events from memory (`craft.live.delivery`)."""
    here, there = two_processes()
    mine, theirs = await here.new_channel(), await there.new_channel()
    for channel in (mine, theirs):
        await here.group_add("session", channel)
    await here.group_send_elsewhere("session", {"type": "events.available", "n": 1})
    await here.group_send("session", {"type": "events.available", "n": 2})
    assert [m["n"] for m in await receive_all(there, theirs, 2)] == [1, 2]
    assert [m["n"] for m in await receive_all(here, mine, 1)] == [2]  # not the first
    await here.flush()


async def test_one_commits_doorbells_reach_only_the_other_processes_of_each_group():
    """The doorbells of one commit of many sessions go out together: each reaches the
    channels of its own group in other processes, and a group with only the ringing
    process's channels gets nothing."""
    here, there = two_processes()
    mine = [await here.new_channel() for _ in range(30)]
    theirs = {n: await there.new_channel() for n in range(30) if n % 3 == 0}
    for n in range(30):
        await here.group_add(f"session-{n}", mine[n])
        if n in theirs:
            await here.group_add(f"session-{n}", theirs[n])
    await here.group_send_elsewhere_many(
        [(f"session-{n}", {"type": "events.available", "n": n}) for n in range(30)]
    )
    for n, channel in theirs.items():
        assert [m["n"] for m in await receive_all(there, channel, 1)] == [n]
    await here.group_send("session-1", {"type": "events.available", "n": "after"})
    assert [m["n"] for m in await receive_all(here, mine[1], 1)] == ["after"]  # nothing before
    for n in theirs:
        await here.group_send(f"session-{n}", {"type": "events.available", "n": "after"})
        assert [m["n"] for m in await receive_all(there, theirs[n], 1)] == ["after"]
    await here.flush()


class BeforeRedis7(SignedRedisChannelLayer):
    """The layer against a Redis without BZMPOP (before 7.0): every other command is real."""

    def connection(self, index):
        real = super().connection(index)

        class Connection:
            def __getattr__(self, name):
                return getattr(real, name)

            async def bzmpop(self, *args, **kwargs):
                raise ResponseError("ERR unknown command 'BZMPOP', with args beginning with: ")

        return Connection()


async def test_messages_waiting_together_arrive_in_order_with_or_without_batch_pops():
    prefix = f"test-layer-{uuid.uuid4().hex[:8]}"
    config = {"hosts": [{"address": REDIS_URL}], "prefix": prefix,
              "symmetric_encryption_keys": KEYS}  # fmt: skip
    for receiver in (SignedRedisChannelLayer(**config), BeforeRedis7(**config)):
        sender = SignedRedisChannelLayer(**config)
        channels = [await receiver.new_channel() for _ in range(3)]
        for n in range(90):  # more than one pop takes (the key holds 100 at most)
            await sender.send(channels[n % 3], {"type": "test.message", "n": n})
        for i, channel in enumerate(channels):
            got = [m["n"] for m in await receive_all(receiver, channel, len(range(i, 90, 3)))]
            assert got == list(range(i, 90, 3))
        await sender.flush()


class SlowAnswers(SignedRedisChannelLayer):
    """The layer with every pop's answer reaching it a moment after Redis gave it."""

    answered: asyncio.Event

    def connection(self, index):
        real, layer = super().connection(index), self

        class Connection:
            def __getattr__(self, name):
                return getattr(real, name)

            async def bzmpop(self, *args, **kwargs):
                result = await real.bzmpop(*args, **kwargs)
                if result is not None:
                    layer.answered.set()
                    await asyncio.sleep(0.2)  # the answer on its way
                return result

        return Connection()


async def test_a_receive_cancelled_while_its_messages_are_on_the_way_loses_none():
    """A socket that closes while its receive holds the process's pop (channels_redis
    shares one pop among the process's channels) must not take other sockets' messages
    with it."""
    config = {"hosts": [{"address": REDIS_URL}], "prefix": f"test-layer-{uuid.uuid4().hex[:8]}",
              "symmetric_encryption_keys": KEYS}  # fmt: skip
    receiver, sender = SlowAnswers(**config), SignedRedisChannelLayer(**config)
    receiver.answered = asyncio.Event()
    closing, staying = await receiver.new_channel(), await receiver.new_channel()
    waiting = asyncio.ensure_future(receiver.receive(closing))
    await asyncio.sleep(0.1)  # it holds the pop now
    for n in range(3):
        await sender.send(staying, {"type": "test.message", "n": n})
    await receiver.answered.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert [m["n"] for m in await receive_all(receiver, staying, 3)] == [0, 1, 2]
    await sender.flush()
