"""Deployment checks (`manage.py check --deploy`) of Craft's own settings."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.core.checks import CheckMessage, Warning

HINT = (
    "Give the service a password and put it in the URL (docs/deployment.md): whatever else "
    "runs on its network, an agent that got past the sandbox network rule included, could "
    "otherwise use it."
)


def service_passwords(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn about a PostgreSQL or Redis reached over TCP without a password."""
    found: list[CheckMessage] = []
    database = settings.DATABASES["default"]
    if (
        database["ENGINE"] == "django.db.backends.postgresql"
        and database.get("HOST", "")
        and not str(database["HOST"]).startswith("/")
        and not database.get("PASSWORD")
    ):
        found.append(Warning("DATABASE_URL has no password", hint=HINT, id="craft.W001"))
    redis = getattr(settings, "REDIS_URL", "")
    if redis and urlparse(redis).scheme in ("redis", "rediss") and not urlparse(redis).password:
        found.append(Warning("REDIS_URL has no password", hint=HINT, id="craft.W002"))
    return found
