"""The Redis channel layer, with every message authenticated.

With several server processes, Channels' messages (the event doorbell, forwarded prompts,
"this account signed out") go through Redis. Whoever can write to that Redis could otherwise
put words in any user's mouth: a `websocket.receive` pushed into another user's socket
channel is handled as if that user had typed it. Agents are kept away from Redis by the
network rule, and as a second line:

* every message is encrypted and authenticated with Fernet (channels_redis's
  `symmetric_encryption_keys`), with keys derived from `DJANGO_SECRET_KEY` (and
  `DJANGO_SECRET_KEY_FALLBACKS`, so a key rotation keeps the workers talking) in the
  settings, a secret agents never see;
* a message that does not authenticate is dropped and logged here, instead of raising into
  whichever consumer happened to be reading (which would close an innocent socket);
* consumers act only on the message types Craft sends through the layer, and take
  `websocket.*` messages only from their own socket (`craft.live.consumer`).

Its connections to Redis come from a pool that waits for a free one: redis-py's default pool
fails a call with "Too many connections" past 100, which a few hundred sessions' doorbells
at once reached (each sent to its session's group).

A send and a group send do what channels_redis does, in fewer round trips to Redis (each is
on the path of every forwarded prompt and every doorbell): a send is one script instead of
four commands in a row, a group send one pipelined read of the group and one script instead
of four. A receive is the blocking pop alone: channels_redis also copies each popped message
to a backup queue and removes it again (three more round trips, one of them before the
message is handed over), which guards only the copy's own wait; nothing else can interrupt
a receive between the pop and the hand-over. And one pop takes every message waiting, up to
`RECEIVE_BATCH` (Redis 7's BZMPOP; one at a time on older servers): a process's channels
share one key, so a forwarded prompt's reply, its doorbell and a status notice that arrive
together are one round trip, not three in a row. The pop runs as a task of its own: a
receive cancelled while it waits (its socket closed) leaves what the pop brings to the next
receive, where channels_redis could lose the message whose answer was on its way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable
from typing import Any

from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer
from cryptography.fernet import InvalidToken
from django.core.exceptions import ImproperlyConfigured
from redis.asyncio import BlockingConnectionPool
from redis.exceptions import ResponseError

logger = logging.getLogger(__name__)

POOL_SIZE = 100  # connections to Redis per server process, as redis-py's default pool
POOL_WAIT_SECONDS = 20.0
RECEIVE_BATCH = 64  # messages taken from Redis by one pop, at most

# channels_redis's send in one step: drop expired messages, refuse past capacity, add, expire.
# KEYS: the channel's key. ARGV: expired before, capacity, message, now, expiry. 1 if full.
SEND = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
if redis.call('ZCOUNT', KEYS[1], '-inf', '+inf') >= tonumber(ARGV[2]) then
    return 1
end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 0
"""
# The same for each channel key of a group (channels_redis's group_send, with its expiry
# pass folded in). ARGV: the messages, the capacities, expired before, now, expiry. Returns
# how many channels were over capacity.
GROUP_SEND = """
local n = #KEYS
local over = 0
for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, ARGV[2 * n + 1])
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[n + i]) then
        redis.call('ZADD', KEYS[i], ARGV[2 * n + 2], ARGV[i])
        redis.call('EXPIRE', KEYS[i], ARGV[2 * n + 3])
    else
        over = over + 1
    end
end
return over
"""


class SignedRedisChannelLayer(RedisChannelLayer):
    """channels_redis's layer that insists on encryption and drops what fails to decrypt."""

    def __init__(self, *args: Any, symmetric_encryption_keys: Any = None, **kwargs: Any) -> None:
        if not symmetric_encryption_keys:
            raise ImproperlyConfigured(
                "the Redis channel layer needs symmetric_encryption_keys: without them anyone "
                "who can write to Redis can act as any user"
            )
        super().__init__(*args, symmetric_encryption_keys=symmetric_encryption_keys, **kwargs)
        self.dropped = 0
        self._scripts: dict[str, Any] = {}
        # Messages popped from a channel key and not handed over yet (oldest first), and
        # the pop under way. Only the receive that holds channels_redis's lock for the key
        # starts a pop or takes from them.
        self._popped: dict[str, deque[bytes]] = {}
        self._pops: dict[str, asyncio.Future[None]] = {}
        self._batch_pop = True  # until Redis says it has no BZMPOP (before 7.0)

    def create_pool(self, index: int) -> Any:
        host = dict(self.hosts[index])
        address = host.pop("address", None)
        if address is None:
            return super().create_pool(index)  # Sentinel: channels_redis's own pool
        host.setdefault("max_connections", POOL_SIZE)
        # A call waits up to `timeout` seconds for a connection, then fails.
        host.setdefault("timeout", POOL_WAIT_SECONDS)
        return BlockingConnectionPool.from_url(address, **host)

    def _run(self, index: int, source: str, keys: list[Any], args: list[Any]) -> Awaitable[Any]:
        """Run a script on a connection by its hash (EVALSHA), loading it if Redis lacks it."""
        connection = self.connection(index)
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = connection.register_script(source)
        return script(keys=keys, args=args, client=connection)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        assert isinstance(message, dict), "message is not a dict"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        assert "__asgi_channel__" not in message
        non_local = channel
        if "!" in channel:  # a process's channel: one key for all of them, named inside
            message = {**message, "__asgi_channel__": channel}
            non_local = self.non_local_name(channel)
            index = self.consistent_hash(channel)
        else:
            index = next(self._send_index_generator)
        now = time.time()
        full = await self._run(
            index, SEND, [self.prefix + non_local],
            [int(now) - int(self.expiry), self.get_capacity(channel), self.serialize(message),
             now, int(self.expiry)],
        )  # fmt: skip
        if full:
            raise ChannelFull()

    async def _brpop_with_clean(
        self,
        index: int,
        channel: str,
        timeout: float,  # noqa: ASYNC109 (channels_redis's name)
    ) -> Any:
        """Hand over the channel key's next message; None if none came within `timeout`."""
        if not self._popped.get(channel):
            pop = self._pops.get(channel)
            if pop is None or pop.done() or pop.get_loop() is not asyncio.get_running_loop():
                pop = self._pops[channel] = asyncio.ensure_future(
                    self._pop(index, channel, timeout)
                )
                # A failure with no receive left to take it is the next pop's to meet.
                pop.add_done_callback(lambda done: done.cancelled() or done.exception())
            await asyncio.shield(pop)  # cancelled here, the pop still lands in `_popped`
        popped = self._popped.get(channel)
        return popped.popleft() if popped else None

    async def _pop(self, index: int, channel: str, block: float) -> None:
        """Pop what waits on the key into `_popped`, blocking in Redis up to `block` s."""
        connection = self.connection(index)
        if self._batch_pop:
            try:
                result = await connection.bzmpop(block, 1, [channel], min=True, count=RECEIVE_BATCH)
            except ResponseError as exc:
                if "unknown command" not in str(exc).lower():
                    raise
                self._batch_pop = False
            else:
                if result is not None:
                    self._popped.setdefault(channel, deque()).extend(m for m, _ in result[1])
                return
        result = await connection.bzpopmin(channel, timeout=block)
        if result is not None:
            self._popped.setdefault(channel, deque()).append(result[1])

    async def _clean_receive_backup(self, index: int, channel: str) -> None:
        return None  # nothing was backed up

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        await self._group_send(group, message, elsewhere=False)

    async def group_send_elsewhere(self, group: str, message: dict[str, Any]) -> None:
        """Send to the group's channels of other processes only: the event log's doorbell,
        which this process's own sockets have already heard of from memory."""
        await self._group_send(group, message, elsewhere=True)

    async def group_send_elsewhere_many(self, sends: list[tuple[str, dict[str, Any]]]) -> None:
        """`group_send_elsewhere` for many groups at once (the doorbells of one commit of
        many sessions): every group's channels are read in one pipelined round trip per
        Redis, and only the groups with channels in other processes are sent to. One round
        trip per group made a worker streaming hundreds of sessions spend most of its
        doorbells reading groups where only its own sockets are."""
        now = time.time()
        by_index: dict[int, list[tuple[str, dict[str, Any]]]] = {}
        for group, message in sends:
            assert self.require_valid_group_name(group), "Group name not valid"
            by_index.setdefault(self.consistent_hash(group), []).append((group, message))
        for index, items in by_index.items():
            members = await self._members(index, [group for group, _ in items], now)
            await asyncio.gather(
                *(
                    self._send_to(group, elsewhere, message, now)
                    for (group, message), channels in zip(items, members, strict=True)
                    if (elsewhere := self._elsewhere(channels))
                )
            )

    async def _group_send(self, group: str, message: dict[str, Any], *, elsewhere: bool) -> None:
        assert self.require_valid_group_name(group), "Group name not valid"
        now = time.time()
        (channels,) = await self._members(self.consistent_hash(group), [group], now)
        await self._send_to(
            group, self._elsewhere(channels) if elsewhere else channels, message, now
        )

    async def _members(self, index: int, groups: list[str], now: float) -> list[list[str]]:
        """The channels of each group (its expired members dropped), in one round trip."""
        async with self.connection(index).pipeline(transaction=False) as pipe:
            for group in groups:
                key = self._group_key(group)
                pipe.zremrangebyscore(key, min=0, max=int(now) - self.group_expiry)
                pipe.zrange(key, 0, -1)
            replies = await pipe.execute()
        return [[member.decode("utf8") for member in members] for members in replies[1::2]]

    def _elsewhere(self, channels: list[str]) -> list[str]:
        mine = f".{self.client_prefix}!"
        return [channel for channel in channels if mine not in channel]

    async def _send_to(
        self, group: str, channels: list[str], message: dict[str, Any], now: float
    ) -> None:
        by_index, messages, capacities = self._map_channel_keys_to_connection(channels, message)
        for index, keys in by_index.items():
            over = await self._run(
                index, GROUP_SEND, keys,
                [*(messages[k] for k in keys), *(capacities[k] for k in keys),
                 int(now) - int(self.expiry), now, int(self.expiry)],
            )  # fmt: skip
            if over:
                logger.info(
                    "%s of %s channels over capacity in group %s", over, len(channels), group
                )

    async def receive_single(self, channel: str) -> tuple[Any, dict[str, Any]]:
        # The message is off the queue before it is decoded: a forged one is skipped, and
        # the next one read.
        while True:
            try:
                return await super().receive_single(channel)
            except InvalidToken:
                self.dropped += 1
                logger.warning(
                    "dropped a channel-layer message on %s that is not signed with this "
                    "server's key (%d so far): something other than Craft writes to its Redis",
                    channel,
                    self.dropped,
                )


async def group_send_elsewhere_many(layer: Any, sends: list[tuple[str, dict[str, Any]]]) -> None:
    """`group_send_elsewhere` of many groups, together where the layer can."""
    send_many = getattr(layer, "group_send_elsewhere_many", None)
    if send_many is not None:
        await send_many(sends)
        return
    for group, message in sends:
        await group_send_elsewhere(layer, group, message)


async def group_send_elsewhere(layer: Any, group: str, message: dict[str, Any]) -> None:
    """Send to the group's channels in other processes: what this process's own sockets
    were told from memory. Layers that cannot tell processes apart send to all of them (the
    sockets ignore their own process's messages by their `origin`)."""
    send = getattr(layer, "group_send_elsewhere", layer.group_send)
    await send(group, message)
