"""System checks: settings that cannot work stop `manage.py` (migrate, check) at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error
from django.core.exceptions import ImproperlyConfigured

from .backends import containment


def sandbox_users(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report CRAFT_SANDBOX_UIDS=on on a server that cannot give sandboxes users of their own."""
    if settings.CRAFT_SANDBOX_BACKEND != "local" or settings.CRAFT_SANDBOX_UIDS != "on":
        return []
    try:
        containment.sandbox_uids_enabled(Path(settings.CRAFT_SANDBOX_ROOT))
    except ImproperlyConfigured as exc:
        hint = "Run the server as root, or set CRAFT_SANDBOX_UIDS=auto or off."
        return [Error(str(exc), hint=hint, id="sandboxes.E001")]
    return []
