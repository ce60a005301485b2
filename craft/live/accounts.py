"""Open websockets follow the account: when the right to them ends, they close with 4401.

A websocket is authenticated once, at its handshake; afterwards it would run prompts for as
long as it stays open. Two things end it when the account's right to it ends:

* **Signals, at once.** Every session socket joins its user's group on the channel layer
  (`user.<id>`), and, after the change is committed, signing out closes the sockets opened
  with that browser session (the user's other browsers stay signed in, and so do their
  sockets); a password change, deactivation (`is_active` turned off) or deletion of the user
  closes all of the user's sockets (Django signs out the user's other sessions on a password
  change, and the browser that changed it reconnects with its refreshed session). Signals
  fire only for `save()` and `delete()` in a process that has Craft's code, and the message
  reaches other server processes only through Redis.
* **A re-check, every `CRAFT_SOCKET_AUTH_CHECK_SECONDS`,** for whatever the signals cannot
  see: `manage.py changepassword` or a shell in another process with the in-memory channel
  layer, a QuerySet `update()`, a sign-out whose message was lost, an expired session. Each
  server process (each event loop) asks the database in two queries, for all its sockets at
  once, which of their users changed password, were deactivated or deleted, and which of
  their browser sessions no longer exist, and closes those sockets with the same 4401.

The same registry counts each person's sockets in this process: past
`CRAFT_MAX_SOCKETS_PER_USER`, a new one is closed with 4429 (see craft.live.sign_in).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import import_module
from types import SimpleNamespace
from typing import Any, Protocol

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user, get_user_model, user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_save
from django.utils import timezone

from craft.live.loops import PerLoop
from craft.storage.db import db_calls

logger = logging.getLogger(__name__)

CLOSE_SIGNED_OUT = 4401
WATCHED_FIELDS = {"password", "is_active"}
# Ids per query of the re-check: far below any database's limit on query parameters.
CHECK_CHUNK = 500


def user_group(user_id: Any) -> str:
    return f"user.{int(user_id)}"


def close_sockets(user_id: Any, session_key: str | None = None) -> None:
    """Close the user's open session sockets (only those of `session_key`, if given)."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "account.closed", "session_key": session_key}
    try:
        async_to_sync(layer.group_send)(user_group(user_id), message)
    except Exception:
        logger.exception("closing the sockets of user %s failed", user_id)


class Closable(Protocol):
    """A socket the registry can close (see craft.live.consumer.SessionConsumer)."""

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None: ...


@dataclass
class Held:
    """What a socket was granted by: its user and, once it follows the account, the browser
    session and the user's session auth hash (it changes with the password) it was opened
    with."""

    user_id: Any
    session_key: str | None = None
    auth_hash: str | None = None


class AccountSockets:
    """The session sockets of one event loop (under daphne, of one server process), by user.

    Used on that loop only. A task runs the re-check while the loop holds sockets.
    """

    def __init__(self) -> None:
        self.held: dict[Closable, Held] = {}
        self.per_user: Counter[Any] = Counter()
        self._task: asyncio.Task[None] | None = None

    def admit(self, socket: Closable, user_id: Any) -> bool:
        """Count a new socket of `user_id`; False (and not counted) past the user's limit."""
        limit = settings.CRAFT_MAX_SOCKETS_PER_USER
        if limit and self.per_user[user_id] >= limit:
            return False
        self.held[socket] = Held(user_id)
        self.per_user[user_id] += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._check_while_held())
        return True

    def watch(self, socket: Closable, session_key: str | None, auth_hash: str) -> None:
        """Have the re-check compare the socket's account with what it was opened with."""
        held = self.held.get(socket)
        if held is not None:
            held.session_key, held.auth_hash = session_key, auth_hash

    def release(self, socket: Closable) -> None:
        held = self.held.pop(socket, None)
        if held is not None:
            self.per_user[held.user_id] -= 1
            if self.per_user[held.user_id] <= 0:
                del self.per_user[held.user_id]
        if not self.held:
            self._stop_checking()

    def _stop_checking(self) -> None:
        """Stop the re-check's task while no socket is held (the next one starts it again),
        rather than leave it asleep on a loop that may be closing. Not from inside it: a
        socket it closes is released there, and the task ends by itself after."""
        task, self._task = self._task, None
        if task is None or task.done():
            return
        try:
            inside = asyncio.current_task() is task
        except RuntimeError:  # no running loop here
            inside = False
        if inside:
            self._task = task
        else:
            task.cancel()

    async def close(self, socket: Closable) -> None:
        """Close a socket whose account's right to it ended (once: it is released first)."""
        self.release(socket)
        await socket.close(code=CLOSE_SIGNED_OUT)

    async def check(self) -> int:
        """Close (4401) every socket whose account no longer grants it; return how many."""
        watched = {s: h for s, h in self.held.items() if h.auth_hash is not None}
        if not watched:
            return 0
        users = {held.user_id for held in watched.values()}
        keys = {held.session_key for held in watched.values() if held.session_key}
        hashes, live_keys = await db_calls.run(account_state, users, keys)
        ended = [
            socket
            for socket, held in watched.items()
            if hashes.get(held.user_id) != held.auth_hash or held.session_key not in live_keys
        ]
        for socket in ended:
            if self.held.get(socket) is watched[socket]:  # not gone meanwhile
                try:
                    await self.close(socket)
                except Exception:
                    logger.exception("closing a socket whose account ended failed")
        return len(ended)

    async def _check_while_held(self) -> None:
        while self.held:
            await asyncio.sleep(settings.CRAFT_SOCKET_AUTH_CHECK_SECONDS)
            try:
                await self.check()
            except Exception:
                logger.exception("re-checking the accounts of open sockets failed")


_registries: PerLoop[AccountSockets] = PerLoop(lambda loop: AccountSockets())


def account_sockets() -> AccountSockets:
    """Return the registry of the running event loop (created on first use)."""
    return _registries.here()


def account_state(user_ids: Iterable[Any], session_keys: Iterable[str]) -> tuple[dict, set[str]]:
    """Return the session auth hash of each of these users who may still sign in (who exist
    and are active), and which of these browser sessions still exist and have not expired.

    Two queries, whatever the number of sockets (two more per 500 users or sessions).
    """
    users = get_user_model()._default_manager
    hashes = {}
    for chunk in _chunks(user_ids):
        for user in users.filter(pk__in=chunk):
            if getattr(user, "is_active", True):  # as Django's ModelBackend decides
                hashes[user.pk] = user.get_session_auth_hash()
    # Craft keeps browser sessions in the database (Django's default session engine).
    sessions = import_module(settings.SESSION_ENGINE).SessionStore.get_model_class()
    live: set[str] = set()
    now = timezone.now()
    for chunk in _chunks(session_keys):
        found = sessions.objects.filter(session_key__in=chunk, expire_date__gt=now)
        live.update(found.values_list("session_key", flat=True))
    return hashes, live


def _chunks(items: Iterable[Any]) -> Iterator[list[Any]]:
    items = list(items)
    for start in range(0, len(items), CHECK_CHUNK):
        yield items[start : start + CHECK_CHUNK]


class FollowsAccount:
    """Consumer mixin: count the socket, join the user's group, and close with 4401 when the
    account's right to it ends (told by a signal, or found by the re-check)."""

    scope: dict[str, Any]
    channel_layer: Any
    channel_name: str

    def hold_socket(self, user: Any) -> bool:
        """Count this socket as one of `user`'s; False when they have as many as allowed."""
        return account_sockets().admit(self, user.pk)  # type: ignore[arg-type]

    async def join_account(self, user: Any) -> None:
        """Join `user`'s group: a sign-out, password change or deactivation committed from now
        on reaches this socket. One committed between the handshake's authentication and
        this join reached no one: the caller reads `signed_in_as` after it, then `watch`es.
        """
        self.account_group = user_group(user.pk)
        session = self.scope.get("session")
        self.session_key = session.session_key if session is not None else None
        await self.channel_layer.group_add(self.account_group, self.channel_name)

    def watch_account(self, auth_hash: str) -> None:
        """Let the re-check compare the account with `auth_hash`, as `signed_in_as` read it."""
        account_sockets().watch(self, self.session_key, auth_hash)  # type: ignore[arg-type]

    async def unfollow_account(self) -> None:
        account_sockets().release(self)  # type: ignore[arg-type]
        if hasattr(self, "account_group"):
            await self.channel_layer.group_discard(self.account_group, self.channel_name)

    async def account_closed(self, message: dict[str, Any]) -> None:
        if message.get("session_key") in (None, self.session_key):
            await account_sockets().close(self)  # type: ignore[arg-type]


def signed_in_as(session_key: str | None, user_id: Any) -> str | None:
    """Return the session auth hash of `user_id` if the browser session still signs them in
    now, by Django's own checks (a fresh read: the handshake's copy of the session would not
    show a sign-out); None if it does not."""
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]
    if not (user.is_authenticated and user.pk == user_id):
        return None
    return user.get_session_auth_hash()


def _after_commit(user_id: Any, session_key: str | None = None) -> None:
    transaction.on_commit(functools.partial(close_sockets, user_id, session_key))


def on_logged_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None and getattr(request, "session", None) is not None:
        _after_commit(user.pk, request.session.session_key)


def remember_access(sender: Any, instance: Any, update_fields: Any = None, **kwargs: Any) -> None:
    """Before a user is saved, note what grants access (a save of other fields is skipped)."""
    if instance.pk is None or (
        update_fields is not None and not WATCHED_FIELDS & set(update_fields)
    ):
        return
    before = sender.objects.filter(pk=instance.pk).values("password", "is_active").first()
    instance._access_before = before


def on_user_saved(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    before = instance.__dict__.pop("_access_before", None)
    if created or before is None:
        return
    if before["password"] != instance.password or (before["is_active"] and not instance.is_active):
        _after_commit(instance.pk)


def on_user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    _after_commit(instance.pk)


def connect_signals() -> None:
    user_model = get_user_model()
    user_logged_out.connect(on_logged_out, dispatch_uid="craft.live.accounts.logout")
    pre_save.connect(remember_access, sender=user_model, dispatch_uid="craft.live.accounts.pre")
    post_save.connect(on_user_saved, sender=user_model, dispatch_uid="craft.live.accounts.post")
    post_delete.connect(
        on_user_deleted, sender=user_model, dispatch_uid="craft.live.accounts.delete"
    )
