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
"""

from __future__ import annotations

import logging
from typing import Any

from channels_redis.core import RedisChannelLayer
from cryptography.fernet import InvalidToken
from django.core.exceptions import ImproperlyConfigured
from redis.asyncio import BlockingConnectionPool

logger = logging.getLogger(__name__)

POOL_SIZE = 100  # connections to Redis per server process, as redis-py's default pool
POOL_WAIT_SECONDS = 20.0


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

    def create_pool(self, index: int) -> Any:
        host = dict(self.hosts[index])
        address = host.pop("address", None)
        if address is None:
            return super().create_pool(index)  # Sentinel: channels_redis's own pool
        host.setdefault("max_connections", POOL_SIZE)
        # A call waits up to `timeout` seconds for a connection, then fails.
        host.setdefault("timeout", POOL_WAIT_SECONDS)
        return BlockingConnectionPool.from_url(address, **host)

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
