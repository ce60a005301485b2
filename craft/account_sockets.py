"""Open websockets follow the account: when the right to them ends, they close with 4401.

A websocket is authenticated once, at its handshake; afterwards it would run prompts for as
long as it stays open. So every session socket also joins its user's group on the channel
layer (`user.<id>`), and, after the change is committed:

* signing out closes the sockets opened with that browser session (the user's other
  browsers stay signed in, and so do their sockets);
* a password change, deactivation (`is_active` turned off) or deletion of the user closes
  all of the user's sockets: Django signs out the user's other sessions on a password change,
  and the browser that changed it reconnects with its refreshed session.

Changes are seen through model signals, so they must go through `save()` and `delete()`, as
the admin, Django's password views and `manage.py changepassword` do; a QuerySet `update()`
is not seen. With Redis as the channel layer this reaches sockets held by every server
process.
"""

from __future__ import annotations

import functools
import logging
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user, get_user_model, user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_save

from .db import readers

logger = logging.getLogger(__name__)

CLOSE_SIGNED_OUT = 4401
WATCHED_FIELDS = {"password", "is_active"}


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


class FollowsAccount:
    """Consumer mixin: join the user's group, and close with 4401 when told the account ended."""

    scope: dict[str, Any]
    channel_layer: Any
    channel_name: str

    async def follow_account(self, user: Any) -> bool:
        """Join `user`'s group; return whether the handshake's session is still signed in.

        Checked again after joining: a sign-out committed between the handshake's
        authentication and the join would otherwise never reach this socket.
        """
        self.account_group = user_group(user.pk)
        session = self.scope.get("session")
        self.session_key = session.session_key if session is not None else None
        await self.channel_layer.group_add(self.account_group, self.channel_name)
        current = await readers.run(_signed_in_user, self.session_key)
        return bool(current.is_authenticated and current.pk == user.pk)

    async def unfollow_account(self) -> None:
        if hasattr(self, "account_group"):
            await self.channel_layer.group_discard(self.account_group, self.channel_name)

    async def account_closed(self, message: dict[str, Any]) -> None:
        if message.get("session_key") in (None, self.session_key):
            await self.close(code=CLOSE_SIGNED_OUT)  # type: ignore[attr-defined]


def _signed_in_user(session_key: str | None) -> Any:
    """Return who a browser session is signed in as now, by Django's own checks (a fresh read:
    the handshake's copy of the session would not show a sign-out)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    return get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]


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
    user_logged_out.connect(on_logged_out, dispatch_uid="craft.account_sockets.logout")
    pre_save.connect(remember_access, sender=user_model, dispatch_uid="craft.account_sockets.pre")
    post_save.connect(on_user_saved, sender=user_model, dispatch_uid="craft.account_sockets.post")
    post_delete.connect(
        on_user_deleted, sender=user_model, dispatch_uid="craft.account_sockets.delete"
    )
