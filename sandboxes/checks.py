"""System checks: settings that cannot work stop `manage.py` (migrate, check) at once."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error
from django.core.exceptions import ImproperlyConfigured

from .backends import containment


def sandbox_users(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report a local backend that could not give sandboxes users of their own: `on` without
    root (E001), or, as root, a sandbox root that sandbox users cannot reach (E002), where
    Craft refuses to start sandboxes rather than run agents as root."""
    if settings.CRAFT_SANDBOX_BACKEND != "local" or settings.CRAFT_SANDBOX_UIDS == "off":
        return []
    root = Path(settings.CRAFT_SANDBOX_ROOT)
    try:
        containment.sandbox_uids_enabled(root)
    except ImproperlyConfigured as exc:
        hint = "Run the server as root, or set CRAFT_SANDBOX_UIDS=auto or off."
        return [Error(str(exc), hint=hint, id="sandboxes.E001")]
    if os.geteuid() != 0:
        return []
    problem = containment.sandbox_root_problem(root)
    if problem:
        hint = "Local sandboxes refuse to start until then: no agent runs as root."
        return [Error(problem[0].upper() + problem[1:], hint=hint, id="sandboxes.E002")]
    return []
