"""The direct links between workers (craft.cluster.peers): a forwarded command goes to the
owner over its published address, the owner pushes the session's events back on it, and
nothing is lost when the link breaks, cannot be opened, or is spoken to without the key.

Real daphne workers sharing PostgreSQL and Redis, real demo agents. The owner's published
address is pointed at a relay run by the test, which counts the frames each way and can cut
the connection.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import pytest
from django.conf import settings

from craft.live.channel_layer import SignedRedisChannelLayer
from craft.models import Event, Lease, Worker
from craft.settings import channel_layer_keys
from tests.conftest import REDIS_URL
from tests.ready import open_ready_session

from ...server import Daphne, Socket, wait_for_log
from ..logs import log_of
from .test_workers import ask_pid, owner_pid, redis_url, workers  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)

HEADER = struct.Struct("!I")


def worker_of(server: Daphne) -> Worker | None:
    return Worker.objects.filter(pid=server.process.pid).order_by("-started_at").first()


def peer_address(server: Daphne) -> tuple[str, int]:
    """The address a worker published for its links, once it has (a deadline only for a
    worker that never does)."""
    deadline = time.monotonic() + 60
    while (worker := worker_of(server)) is None or not worker.peer:
        assert time.monotonic() < deadline, "the worker published no peer address"
        time.sleep(0.05)
    host, _, port = worker.peer.rpartition(":")
    return host, int(port)


def publish(server: Daphne, address: str) -> None:
    """Point the worker's published address elsewhere (other workers read it from here)."""
    worker = worker_of(server)
    assert worker is not None
    Worker.objects.filter(pk=worker.pk).update(peer=address)


class Relay:
    """Relays connections to a worker's link port, counting the frames each way; `cut`
    closes every connection it relays."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self.frames = {"to owner": 0, "from owner": 0}
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            owner = socket.create_connection(self.target)
            with self._lock:
                self.connections += 1
                self._open += [client, owner]
            for source, sink, way in ((client, owner, "to owner"), (owner, client, "from owner")):
                threading.Thread(target=self._pump, args=(source, sink, way), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, way: str) -> None:
        pending = b""
        try:
            while data := source.recv(65536):
                sink.sendall(data)
                pending += data
                while len(pending) >= HEADER.size:
                    (size,) = HEADER.unpack_from(pending)
                    if len(pending) < HEADER.size + size:
                        break
                    pending = pending[HEADER.size + size :]
                    with self._lock:
                        self.frames[way] += 1
        except OSError:
            pass
        finally:
            for end in (source, sink):
                end.close()

    def cut(self) -> None:
        with self._lock:
            for end in self._open:
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._open.clear()

    def close(self) -> None:
        self.listener.close()
        self.cut()


@pytest.fixture
def relay():
    made: list[Relay] = []

    def make(target: tuple[str, int]) -> Relay:
        made.append(Relay(target))
        return made[-1]

    yield make
    for each in made:
        each.close()


def owned_by_first(workers, owner, title):  # noqa: F811 (the fixture, passed on)
    """Two workers; the session's agent runs in the first, whose client asked `pid` once."""
    session = open_ready_session(owner, title)
    first, second = workers(2)
    sock = Socket(first, owner, session.pk)
    sock.send({"type": "resume", "after": 0})
    pid = ask_pid(sock, "on the owner")
    sock.close()
    assert owner_pid(session) == first.process.pid
    return session, first, second, pid


def test_a_forwarded_prompt_and_its_events_go_over_the_link(workers, owner, relay):  # noqa: F811
    session, first, second, pid = owned_by_first(workers, owner, "over the link")
    link = relay(peer_address(first))
    publish(first, link.address)
    sock = Socket(second, owner, session.pk)
    sock.send({"type": "resume", "after": len(log_of(session))})
    assert ask_pid(sock, "forwarded") == pid, "the owner's agent answered"
    sock.send({"type": "prompt", "id": "count", "text": "count 5"})
    sock.until_kind("turn_end")
    sock.close()
    assert link.connections == 1, "one connection, kept for the second prompt"
    # follow + two commands; two replies, and the events of two turns pushed back.
    assert link.frames["to owner"] == 3
    assert link.frames["from owner"] >= 2 + 2, link.frames
    stored = log_of(session)
    assert [(f["seq"], f["kind"], f["data"]) for f in sock.events] == stored[-len(sock.events) :]
    assert [seq for seq, _, _ in stored] == list(range(1, len(stored) + 1))


def test_a_link_cut_mid_turn_loses_and_repeats_no_event(workers, owner, relay):  # noqa: F811
    session, first, second, pid = owned_by_first(workers, owner, "cut mid-turn")
    link = relay(peer_address(first))
    publish(first, link.address)
    sock = Socket(second, owner, session.pk)
    after = len(log_of(session))
    sock.send({"type": "resume", "after": after})
    sock.send({"type": "prompt", "id": "slow", "text": "slow 30 0.05"})
    sock.until_kind("agent_message_chunk")
    link.cut()
    frames = sock.until_kind("turn_end")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    assert ask_pid(sock, "after the cut") == pid, "forwarded again, over a new connection"
    assert link.connections == 2
    sock.close()
    stored = log_of(session)
    # Every event of both turns exactly once, in order: the doorbell (Redis) had them too.
    assert [(f["seq"], f["kind"], f["data"]) for f in sock.events] == stored[after:]


def test_an_owner_address_that_refuses_leaves_the_channel_layer(workers, owner):  # noqa: F811
    session, first, second, pid = owned_by_first(workers, owner, "refused")
    with socket.create_server(("127.0.0.1", 0)) as closed:
        nobody = f"127.0.0.1:{closed.getsockname()[1]}"
    publish(first, nobody)
    sock = Socket(second, owner, session.pk)
    sock.send({"type": "resume", "after": len(log_of(session))})
    assert ask_pid(sock, "through redis") == pid
    sock.close()
    wait_for_log(second, f"cannot reach worker at {nobody}", count=1)


def test_a_link_without_the_key_is_closed_and_moves_nothing(workers, owner):  # noqa: F811
    session, first, second, pid = owned_by_first(workers, owner, "hostile")
    address = peer_address(first)
    stored = Event.objects.filter(session=session).count()
    hostile = [
        HEADER.pack(64) + os.urandom(64),  # not encrypted with the servers' key
        HEADER.pack(1 << 31),  # a frame too big to take
        HEADER.pack(3) + b"{}\n",
    ]
    for frame in hostile:
        with socket.create_connection(address, timeout=30) as conn:
            conn.sendall(frame)
            assert conn.recv(1) == b"", "the worker closes the connection"
    with socket.create_connection(address, timeout=60) as silent:
        silent.sendall(HEADER.pack(64))  # a frame begun, never finished
        assert silent.recv(1) == b"", "the worker closes a connection that sends no frame"
    # Signed with the servers' key, but not what a worker sends: closed as well.
    signed = SignedRedisChannelLayer(
        hosts=[REDIS_URL], symmetric_encryption_keys=channel_layer_keys([settings.SECRET_KEY])
    )
    for message in (
        {"type": "shout"},
        {"type": "events", "session": str(session.pk), "first_seq": 1, "last_seq": 1,
         "frames": "not a list"},
        {"type": "follow", "session": "not a uuid"},
    ):  # fmt: skip
        data = signed.serialize(message)
        with socket.create_connection(address, timeout=30) as conn:
            conn.sendall(HEADER.pack(len(data)) + data)
            assert conn.recv(1) == b"", message
    wait_for_log(first, "sent a message Craft does not send; closing", count=3)
    wait_for_log(first, "not signed with this server's key; closing", count=2)
    wait_for_log(first, "bytes; closing", count=1)
    wait_for_log(first, "sent no whole frame in time; closing", count=1)
    assert Event.objects.filter(session=session).count() == stored
    # The worker still serves, forwarded commands included.
    sock = Socket(second, owner, session.pk)
    sock.send({"type": "resume", "after": stored})
    assert ask_pid(sock, "still served") == pid
    sock.close()
    assert Lease.objects.get(session=session).owner.split("/")[1] == str(first.process.pid)


def test_a_worker_that_cannot_listen_says_so_and_is_reached_through_redis(workers, owner):  # noqa: F811
    session = open_ready_session(owner, "port taken")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        (first,) = workers(1, CRAFT_PEER_PORT=port)
        (second,) = workers(1, CRAFT_PEER_PORT=port)
        for server in (first, second):
            wait_for_log(
                server, f"cannot listen for other workers on 127.0.0.1 port {port}", count=1
            )
    sock = Socket(first, owner, session.pk)
    sock.send({"type": "resume", "after": 0})
    pid = ask_pid(sock, "on the owner")
    sock.close()
    sock = Socket(second, owner, session.pk)
    sock.send({"type": "resume", "after": len(log_of(session))})
    assert ask_pid(sock, "forwarded through redis") == pid
    sock.close()
