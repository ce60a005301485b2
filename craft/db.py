"""Run ORM work from the event loop without leaking database connections."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from channels.db import database_sync_to_async
from django.db import close_old_connections

T = TypeVar("T")


def db_sync_to_async(func: Callable[..., T] | None = None, *, thread_sensitive: bool = True) -> Any:
    """Wrap a blocking ORM function so that event-loop code can await it.

    Like Channels' `database_sync_to_async`, but the connection cleanup runs inside the call's
    own context. asgiref runs the function in a copy of the caller's context, and Django keeps
    connections in context-local storage, so a cleanup outside that copy (which is what
    `database_sync_to_async` does) can miss the connection the function opened; it then stays
    open in the caller's context. `thread_sensitive=False` runs the call in a pool thread,
    for work that can take long (starting an agent) and must not hold Django's sync thread.
    """

    def wrap(inner: Callable[..., T]) -> Any:
        @functools.wraps(inner)
        def closing(*args: Any, **kwargs: Any) -> T:
            try:
                return inner(*args, **kwargs)
            finally:
                close_old_connections()

        return database_sync_to_async(closing, thread_sensitive=thread_sensitive)

    return wrap(func) if func is not None else wrap
