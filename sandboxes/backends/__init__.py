"""Sandbox backends: where sandboxes live and how agents start in them.

A backend is picked by name (`CRAFT_SANDBOX_BACKEND`) from `CRAFT_SANDBOX_BACKENDS`, which maps
names to dotted paths; the module is imported only when first used, so the kubernetes client
is never imported by a site that runs the local backend.
"""

import threading

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .base import (
    Health,
    Resource,
    SandboxBackend,
    SandboxError,
    TerminalProcess,
    WarmPool,
    WarmState,
    WarmUnusable,
)

__all__ = [
    "Health",
    "Resource",
    "SandboxBackend",
    "SandboxError",
    "TerminalProcess",
    "WarmPool",
    "WarmState",
    "WarmUnusable",
    "forget_backends",
    "get_backend",
    "warm_pool",
]


_backends: dict[str, SandboxBackend] = {}
_making = threading.Lock()


def get_backend(name: str | None = None) -> SandboxBackend:
    """Return the shared backend instance called `name`, default the configured one.

    One instance per backend, however it is asked for (by default or by its name) and by
    however many threads at once: an instance holds this process's limits and locks (the
    local backend's agent start slots, the lock around installing its tools). Two threads
    that each made one at a server's start installed the tools at the same time.
    """
    name = name or settings.CRAFT_SANDBOX_BACKEND
    backend = _backends.get(name)
    if backend is None:
        with _making:
            backend = _backends.get(name)
            if backend is None:
                try:
                    path = settings.CRAFT_SANDBOX_BACKENDS[name]
                except KeyError:
                    raise ImproperlyConfigured(f"unknown sandbox backend {name!r}") from None
                backend = _backends[name] = import_string(path)()
    return backend


def forget_backends() -> None:
    """Drop the backend instances: the next `get_backend` makes new ones, from the settings
    as they are then (tests that change a backend's settings)."""
    with _making:
        _backends.clear()


def warm_pool(backend: SandboxBackend) -> WarmPool | None:
    """Return the backend as a pool of warm sandboxes, or None if it keeps none."""
    return backend if isinstance(backend, WarmPool) else None
