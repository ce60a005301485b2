"""Sandbox backends: where sandboxes live and how agents start in them.

A backend is picked by name (`CRAFT_SANDBOX_BACKEND`) from `CRAFT_SANDBOX_BACKENDS`, which maps
names to dotted paths; the module is imported only when first used, so the kubernetes client
is never imported by a site that runs the local backend.
"""

from functools import cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .base import (
    Health,
    Resource,
    SandboxBackend,
    SandboxError,
    WarmPool,
    WarmState,
    WarmUnusable,
)

__all__ = [
    "Health",
    "Resource",
    "SandboxBackend",
    "SandboxError",
    "WarmPool",
    "WarmState",
    "WarmUnusable",
    "get_backend",
    "warm_pool",
]


@cache
def get_backend(name: str | None = None) -> SandboxBackend:
    """Return the (shared) backend instance called `name`, default the configured one."""
    name = name or settings.CRAFT_SANDBOX_BACKEND
    try:
        path = settings.CRAFT_SANDBOX_BACKENDS[name]
    except KeyError:
        raise ImproperlyConfigured(f"unknown sandbox backend {name!r}") from None
    backend: SandboxBackend = import_string(path)()
    return backend


def warm_pool(backend: SandboxBackend) -> WarmPool | None:
    """Return the backend as a pool of warm sandboxes, or None if it keeps none."""
    return backend if isinstance(backend, WarmPool) else None
