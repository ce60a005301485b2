"""Direct links between workers: a forwarded command, its reply, and the events it causes.

A command forwarded through the channel layer (`craft.cluster.forwarding`) crosses Redis
twice: to the owner, and back as the doorbell of the events it caused
(docs/history/performance-diary.md, "Forwarding over a direct link between workers",
traced where that time goes). So each worker also listens on a TCP port of its own
(`CRAFT_PEER_HOST`, `CRAFT_PEER_PORT`) and publishes the address in its `Worker` row. A worker
forwarding a command opens a connection to the owner's address once, keeps it, and sends:

* `follow` (before the first command of a session): from then on, the owner also pushes the
  session's committed batches on this connection (`events`: seqs and frames, as the
  doorbell carries them), and this worker hands them to its sockets of that session.
* `command`: carried out by the owner as one that came through the channel layer; it answers
  with `reply` on the same connection.
* `unfollow`: this worker has no socket on that session any longer (said when an `events`
  for it arrives).

The links are only a faster path. The Redis doorbell is still rung for every batch (the
sockets drop what they already sent, by seq), so a link that breaks, or pushes a batch
without its frames because the connection is backed up, loses nothing. A command that could
not be sent (no address, the connection refused) goes through the channel layer; one that
was sent and got no reply is handled as one the channel layer lost (the forwarder asks the
owner again).

Every frame is serialised and encrypted as a message on the Redis channel layer is (msgpack,
then Fernet with keys derived from the secret key, and the layer's expiry): a connection
whose frame does not decrypt is closed at once. Agents do not reach the port at all: local
agents are kept off every address of this machine (`sandboxes.backends.firewall`), pods by
their NetworkPolicy. Without an encrypting channel layer (the in-memory one: one worker)
there is nothing to forward and no link.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from channels.layers import get_channel_layer
from cryptography.fernet import InvalidToken
from django.conf import settings

from craft.live import delivery

logger = logging.getLogger(__name__)

HEADER = struct.Struct("!I")  # each frame: its length, then the encrypted message
MAX_FRAME_BYTES = 16 * 1024 * 1024
# A connection holding more than this unsent pushes batches without their frames (the
# sockets read them from the database instead), rather than buffering without end.
PUSH_BUFFER_BYTES = 1024 * 1024
CONNECT_SECONDS = 2.0
# A connection to this worker's port must have sent a whole frame that decrypts by then: the
# other workers send one at once, and whatever else connects is not left holding a socket.
FIRST_FRAME_SECONDS = 5.0

# Carries out a forwarded command (session, the command on the wire); returns the reply's
# fields (`craft.cluster.forwarding` wires it in).
CommandHandler = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


class LinkClosed(Exception):
    """The connection to the owner closed before its reply came."""


class Link:
    """One connection between two workers, used the same way from both ends."""

    def __init__(
        self, links: PeerLinks, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.links = links
        self.reader = reader
        self.writer = writer
        self.name = str(writer.get_extra_info("peername"))
        self.closed = False
        self._replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._requests = 0
        self.following: set[UUID] = set()  # sessions whose events this end asked for
        self._pushing: dict[UUID, _Pusher] = {}  # sessions whose events this end pushes
        self._handling: set[asyncio.Task[None]] = set()

    def send(self, message: dict[str, Any]) -> None:
        if self.closed:
            raise LinkClosed(self.name)
        data = self.links.layer.serialize(message)
        self.writer.write(HEADER.pack(len(data)) + data)

    @property
    def backed_up(self) -> bool:
        return self.writer.transport.get_write_buffer_size() > PUSH_BUFFER_BYTES

    async def request(self, session_id: UUID, wire: dict[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        """Send a command; return the owner's reply (None without one within `timeout`)."""
        if session_id not in self.following:
            self.following.add(session_id)
            self.send({"type": "follow", "session": str(session_id)})
        self._requests += 1
        request = str(self._requests)
        future = asyncio.get_running_loop().create_future()
        self._replies[request] = future
        try:
            self.send(
                {"type": "command", "request": request, "session": str(session_id), "command": wire}
            )
            return await asyncio.wait_for(future, timeout)
        except (TimeoutError, LinkClosed):
            return None
        finally:
            self._replies.pop(request, None)

    async def serve(self, first_frame_seconds: float | None = None) -> None:
        """Read and act on the other end's frames until the connection ends (or its first
        frame takes longer than `first_frame_seconds`)."""
        try:
            while True:
                try:
                    async with asyncio.timeout(first_frame_seconds):
                        (size,) = HEADER.unpack(await self.reader.readexactly(HEADER.size))
                        if size > MAX_FRAME_BYTES:
                            logger.warning(
                                "peer %s sent a frame of %d bytes; closing", self.name, size
                            )
                            return
                        data = await self.reader.readexactly(size)
                except TimeoutError:
                    logger.warning("peer %s sent no whole frame in time; closing", self.name)
                    return
                try:
                    message = self.links.layer.deserialize(data)
                except InvalidToken:
                    logger.warning(
                        "peer %s sent a frame not signed with this server's key; closing",
                        self.name,
                    )
                    return
                if not self._act(message):
                    logger.warning("peer %s sent a message Craft does not send; closing", self.name)
                    return
                first_frame_seconds = None
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:
            logger.exception("peer link %s failed", self.name)
        finally:
            self.close()

    def _act(self, message: Any) -> bool:
        if not isinstance(message, dict):
            return False
        kind = message.get("type")
        try:
            if kind == "reply":
                future = self._replies.pop(str(message["request"]), None)
                if future is not None and not future.done():
                    future.set_result(message)
            elif kind == "events":
                self._events(message)
            elif kind == "command":
                task = asyncio.get_running_loop().create_task(self._command(message))
                self._handling.add(task)
                task.add_done_callback(self._handling.discard)
            elif kind == "follow":
                session_id = UUID(message["session"])
                if session_id not in self._pushing:
                    self._pushing[session_id] = _Pusher(self, session_id)
                    delivery.follow(session_id, self._pushing[session_id])
            elif kind == "unfollow":
                session_id = UUID(message["session"])
                pusher = self._pushing.pop(session_id, None)
                if pusher is not None:
                    delivery.unfollow(session_id, pusher)
            else:
                return False
        except (KeyError, TypeError, ValueError):
            return False
        return True

    def _events(self, message: dict[str, Any]) -> None:
        session_id = UUID(message["session"])
        first, last = int(message["first_seq"]), int(message["last_seq"])
        frames = message.get("frames")
        if frames is not None and not (
            isinstance(frames, list) and all(isinstance(frame, str) for frame in frames)
        ):
            raise TypeError("frames must be a list of strings")
        if not delivery.hub().followers.of(session_id):
            # No socket here follows it any longer: stop the pushes.
            self.following.discard(session_id)
            with contextlib.suppress(LinkClosed):
                self.send({"type": "unfollow", "session": str(session_id)})
            return
        delivery.hub().deliver([(session_id, first, last, frames)])

    async def _command(self, message: dict[str, Any]) -> None:
        assert self.links.on_command is not None
        reply = await self.links.on_command(str(message["session"]), message["command"])
        with contextlib.suppress(LinkClosed):
            self.send({"type": "reply", "request": message["request"], **reply})

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for session_id, pusher in self._pushing.items():
            delivery.unfollow(session_id, pusher)
        self._pushing.clear()
        for future in self._replies.values():
            if not future.done():
                future.set_exception(LinkClosed(self.name))
        self.writer.close()
        self.links.forget(self)


class _Pusher:
    """Follows a session on the owner's side of a link: pushes its batches to the other end."""

    def __init__(self, link: Link, session_id: UUID) -> None:
        self.link = link
        self.session = str(session_id)

    def deliver(self, first_seq: int, last_seq: int, frames: list[str] | None) -> None:
        if self.link.closed:
            return
        message: dict[str, Any] = {
            "type": "events", "session": self.session, "first_seq": first_seq,
            "last_seq": last_seq,
        }  # fmt: skip
        if delivery.carried(frames) and not self.link.backed_up:
            message["frames"] = frames
        self.link.send(message)


class PeerLinks:
    """This worker's links: the port it listens on, and its connections to other workers."""

    def __init__(self) -> None:
        self.address = ""  # host:port, once listening
        self.on_command: CommandHandler | None = None
        self.layer: Any = None
        self._server: asyncio.Server | None = None
        self._starting: asyncio.Future[str] | None = None
        self._links: dict[str, Link] = {}  # connections this worker opened, by address
        self._opening: dict[str, asyncio.Future[Link]] = {}
        self._accepted: set[Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        """Listen, if the settings and the channel layer allow; return the address or ""."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._listen())
        return await asyncio.shield(self._starting)

    async def _listen(self) -> str:
        layer = get_channel_layer()
        host = settings.CRAFT_PEER_HOST
        if not host or getattr(getattr(layer, "_serializer", None), "crypter", None) is None:
            return ""
        self.layer = layer  # links it opens work even if it cannot listen
        try:
            self._server = await asyncio.start_server(self._accept, host, settings.CRAFT_PEER_PORT)
        except OSError as exc:
            logger.error(
                "cannot listen for other workers on %s port %s (%s): their commands for this "
                "worker's sessions go through the channel layer",
                host, settings.CRAFT_PEER_PORT, exc,
            )  # fmt: skip
            return ""
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return self.address

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in [*self._links.values(), *self._accepted]:
            link.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = Link(self, reader, writer)
        self._accepted.add(link)
        await link.serve(FIRST_FRAME_SECONDS)

    def forget(self, link: Link) -> None:
        self._accepted.discard(link)
        for address, known in list(self._links.items()):
            if known is link:
                del self._links[address]

    async def link_to(self, address: str) -> Link | None:
        """Return the open link to a worker's address (opened now if need be); None if it
        cannot be reached."""
        if self.layer is None:
            return None
        link = self._links.get(address)
        if link is not None and not link.closed:
            return link
        opening = self._opening.get(address)
        if opening is None:
            opening = self._opening[address] = asyncio.ensure_future(self._open(address))
            opening.add_done_callback(lambda done: self._forget_opening(address, done))
        try:
            return await asyncio.shield(opening)
        except (OSError, TimeoutError) as exc:
            logger.warning("cannot reach worker at %s: %s", address, exc)
            return None

    def _forget_opening(self, address: str, done: asyncio.Future[Link]) -> None:
        if self._opening.get(address) is done:
            del self._opening[address]
        if not done.cancelled():
            done.exception()  # retrieved: each waiting forwarder has met it already

    async def _open(self, address: str) -> Link:
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port)), CONNECT_SECONDS
        )
        link = self._links[address] = Link(self, reader, writer)
        task = asyncio.get_running_loop().create_task(link.serve())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return link


links = PeerLinks()
