"""One owner per session across server processes: leases and fencing.

With several workers behind a load balancer, a browser's frames reach any of them, but one
session's agent must run in exactly one (two agents in one workspace corrupt each other's
work). So:

* **Leases** (`models.Lease`): the worker that owns a session's agent holds its lease, renews
  it every housekeeping tick while it holds the agent, and releases it when the agent is
  stopped or the worker shuts down. Another worker takes a lease over only once it has
  expired (`CRAFT_SESSION_LEASE_SECONDS`) or its owner is known to be gone; every takeover
  increases the lease's token and closes the running turn the old owner left. A worker
  never starts a session's agent without holding its lease.
* **Fencing**: the runner's writes carry the lease's token, and the event log refuses them
  once the token has changed (`eventlog.Fenced`): a worker that lost its lease (a long pause,
  a partition) stores nothing more for that session, and stops its agent when it notices.

What reaches a worker that is not the owner is forwarded to it (`craft.cluster.forwarding`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from craft.models import Lease, Session, Worker
from craft.storage import workers
from craft.storage.db import db_calls

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    """Who owns a session: this worker (`token` is its fencing token) or another, reached
    through `peer` (a direct link) or `channel` (the channel layer)."""

    mine: bool
    token: int = 0
    owner: str = ""
    channel: str = ""
    peer: str = ""  # the owner's address for direct links (craft.cluster.peers)
    seconds_left: float = 0.0  # how long the owner's lease still runs (another's claim)


def lease_seconds() -> float:
    return float(settings.CRAFT_SESSION_LEASE_SECONDS)


def acquire(session_id: UUID) -> Claim:
    """Take or renew the session's lease if it is free, expired, ours or its owner gone;
    otherwise say who owns it. A takeover closes the old owner's running turn (through
    `Ownership.on_taken_over`, wired at start)."""
    me = workers.me().key
    now = timezone.now()
    expires = now + timedelta(seconds=lease_seconds())
    with transaction.atomic():
        while True:
            token = _create_if_free(session_id, me, expires)
            if token is not None:  # a new session's lease, in one statement
                workers.ensure_registered()
                return Claim(mine=True, token=token, owner=me)
            lease = Lease.objects.select_for_update().filter(session_id=session_id).first()
            if lease is not None:
                break
            if not Session.objects.filter(pk=session_id).exists():
                raise Session.DoesNotExist(f"session {session_id} does not exist")
            # Its owner released it between the two statements: try to create it again.
        if lease.owner == me:
            lease.expires_at = expires
            lease.save(update_fields=["expires_at"])
            return Claim(mine=True, token=lease.token, owner=me)
        owner = Worker.objects.filter(pk=lease.owner).first()
        gone = workers.is_gone(lease.owner, {owner.pk: owner} if owner else {})
        if lease.expires_at > now and not gone:
            left = (lease.expires_at - now).total_seconds()
            return Claim(
                mine=False, owner=lease.owner, channel=owner.channel if owner else "",
                peer=owner.peer if owner else "", seconds_left=left,
            )  # fmt: skip
        previous = lease.owner
        lease.owner, lease.token, lease.expires_at = me, lease.token + 1, expires
        lease.save(update_fields=["owner", "token", "expires_at"])
        workers.ensure_registered()
        assert ownership.on_taken_over is not None, "forwarding.serve() was not called"
        ownership.on_taken_over(session_id, previous)
        logger.info("took session %s over from %s (token %d)", session_id, previous, lease.token)
        return Claim(mine=True, token=lease.token, owner=me)


def _create_if_free(session_id: UUID, owner: str, expires: datetime) -> int | None:
    """Create the session's lease for `owner` if it has none and the session exists; return
    its token, or None (a lease exists, or no session). One statement: a concurrent creator's
    row makes this one do nothing (PostgreSQL waits for it to commit or roll back first)."""
    lease, session = Lease._meta, Session._meta
    pk = lease.pk.get_db_prep_value(session_id, connection)
    until = lease.get_field("expires_at").get_db_prep_value(expires, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {lease.db_table} (session_id, owner, token, expires_at) "
            f"SELECT %s, %s, 1, %s WHERE EXISTS "
            f"(SELECT 1 FROM {session.db_table} WHERE {session.pk.column} = %s) "
            "ON CONFLICT (session_id) DO NOTHING RETURNING token",
            [pk, owner, until, pk],
        )
        row = cursor.fetchone()
    return None if row is None else int(row[0])


# Leases renewed by one statement (two variables each).
RENEW_BATCH = 200


def renew(held: dict[UUID, int]) -> set[UUID]:
    """Renew this worker's leases (session -> token); return the sessions whose lease is lost.

    A statement and a commit per batch of leases, not per lease: with hundreds of sessions,
    one write transaction each would hold the database's write lock (SQLite has one) in
    turns with the event writer every renewal, and make it wait. A batch that renews fewer
    than it holds (some lease was taken over) is done again one lease at a time to say which.

    The leases are locked in session order, as the event writer locks them (its fence reads,
    sessions in that order): an UPDATE locks rows in the order it finds them, and with the
    writer holding one lease and waiting for another PostgreSQL found deadlocks.
    """
    me = workers.me().key
    expires = timezone.now() + timedelta(seconds=lease_seconds())
    lost = set()
    pairs = sorted(held.items(), key=lambda pair: str(pair[0]))
    for start in range(0, len(pairs), RENEW_BATCH):
        batch = pairs[start : start + RENEW_BATCH]
        if _renew_batch(me, batch, expires) == len(batch):
            continue
        for session_id, token in batch:
            if not Lease.objects.filter(session_id=session_id, owner=me, token=token).update(
                expires_at=expires
            ):
                lost.add(session_id)
    return lost


def _renew_batch(me: str, batch: list[tuple[UUID, int]], expires: datetime) -> int:
    """Renew the leases of `batch` that are still `me`'s under their token; return how many.

    Written out rather than built by the ORM: an OR of 200 `(session AND token)` terms took
    about 17 ms of the GIL to build and compile, twice per batch, at every renewal. The rows
    are read by primary key and their tokens compared here; the read locks them (PostgreSQL;
    SQLite's transaction holds its write lock), so none changes before the UPDATE.
    """
    table = Lease._meta.db_table
    tokens = {Session._meta.pk.get_db_prep_value(s, connection): t for s, t in batch}
    listed = ", ".join(["%s"] * len(tokens))
    lock = " FOR UPDATE" if connection.vendor == "postgresql" else ""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"SELECT session_id, token FROM {table} WHERE owner = %s AND session_id IN ({listed})"
            f" ORDER BY session_id{lock}",
            [me, *tokens],
        )
        ours = [pk for pk, token in cursor.fetchall() if tokens.get(pk) == token]
        if ours:
            expires_at = Lease._meta.get_field("expires_at").get_db_prep_value(expires, connection)
            cursor.execute(
                f"UPDATE {table} SET expires_at = %s WHERE session_id IN "
                f"({', '.join(['%s'] * len(ours))})",
                [expires_at, *ours],
            )
    return len(ours)


def release(session_id: UUID, token: int) -> None:
    Lease.objects.filter(session_id=session_id, owner=workers.me().key, token=token).delete()


def release_all() -> None:
    Lease.objects.filter(owner=workers.me().key).delete()


@dataclass
class Held:
    token: int
    good_until: float  # monotonic time: the lease is surely ours until then


class Ownership:
    """This worker's view of session ownership (used on the event loop)."""

    def __init__(self) -> None:
        self.held: dict[UUID, Held] = {}
        # Leases being released (their database delete in flight) and claims being read: a
        # claim waits for a release of its session, and a release gives way to a claim, so a
        # release can never delete a lease a frame has just taken.
        self._releasing: dict[UUID, asyncio.Future[None]] = {}
        self._claiming: dict[UUID, int] = {}
        # Other workers' leases, as last read: (claim, until when to trust it, monotonic).
        self.others: dict[UUID, tuple[Claim, float]] = {}
        self.on_lost: Callable[[UUID], Awaitable[None]] | None = None
        # Closes, in the takeover's transaction, the turns of a session that the worker whose
        # lease was taken over left running (`acquire`); wired at start, like `on_lost`.
        self.on_taken_over: Callable[[UUID, str], None] | None = None

    def token(self, session_id: UUID) -> int | None:
        """Return this worker's token for the session if its lease is surely still ours."""
        held = self.held.get(session_id)
        if held is not None and held.good_until > time.monotonic():
            return held.token
        return None

    async def claim(self, session_id: UUID) -> Claim:
        token = self.token(session_id)
        if token is not None:
            return Claim(mine=True, token=token, owner=workers.me().key)
        known = self.others.get(session_id)
        if known is not None and known[1] > time.monotonic():
            return known[0]  # forwarding needs no database read while the lease surely runs
        while (releasing := self._releasing.get(session_id)) is not None:
            await asyncio.shield(releasing)
        self._claiming[session_id] = self._claiming.get(session_id, 0) + 1
        try:
            claim = await db_calls.run(acquire, session_id)
        finally:
            if self._claiming[session_id] == 1:
                del self._claiming[session_id]
            else:
                self._claiming[session_id] -= 1
        if claim.mine:
            self.others.pop(session_id, None)
            self._hold(session_id, claim.token)
        else:
            self.held.pop(session_id, None)
            # Trusted for at most half of what is left of the owner's lease (and forgotten at
            # once when the owner does not answer).
            self.others[session_id] = (claim, time.monotonic() + claim.seconds_left / 2)
        return claim

    def forget_owner(self, session_id: UUID) -> None:
        """The owner last read did not answer: read the lease again next time."""
        self.others.pop(session_id, None)

    def _hold(self, session_id: UUID, token: int) -> None:
        # Renewals come three times per lease period (craft.lifecycle); a lease this worker
        # could not renew (the database is unreachable) is not trusted beyond two thirds of it.
        good_for = lease_seconds() * 2 / 3
        self.held[session_id] = Held(token, time.monotonic() + good_for)

    async def renew(self) -> None:
        """Renew every lease this worker holds; stop what it lost."""
        if not self.held:
            return
        renewing = dict(self.held)
        lost = await db_calls.run(renew, {s: held.token for s, held in renewing.items()})
        for session_id, held in renewing.items():
            if self.held.get(session_id) is not held:
                # Released (or released and claimed again) while the renewal was on its way:
                # bringing the old hold back would let a command run under a deleted lease.
                continue
            if session_id in lost:
                await self.lose(session_id)
            else:
                self._hold(session_id, held.token)

    async def lose(self, session_id: UUID) -> None:
        """Forget a lease this worker no longer holds, and stop its agent."""
        self.held.pop(session_id, None)
        if self.on_lost is not None:
            await self.on_lost(session_id)

    async def release(self, session_id: UUID) -> None:
        """Give up an idle session's lease (unless a frame is claiming it right now)."""
        if session_id in self._claiming or session_id in self._releasing:
            return
        held = self.held.pop(session_id, None)
        if held is None:
            return
        done = asyncio.get_running_loop().create_future()
        self._releasing[session_id] = done
        try:
            await db_calls.run(release, session_id, held.token)
        finally:
            del self._releasing[session_id]
            done.set_result(None)

    async def release_all(self) -> None:
        self.held.clear()
        await db_calls.run(release_all)


ownership = Ownership()
