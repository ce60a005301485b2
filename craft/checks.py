"""System checks of Craft's own settings: `manage.py check` (and `--deploy`)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning

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


def git_hosts_file(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report a CRAFT_GIT_HOSTS_FILE that cannot be used (unreadable, not TOML, an entry
    with an unknown kind, no api_url, a host listed twice): nothing is offered from half a
    file, and `manage.py check` and `migrate` stop until it is fixed."""
    from craft.git_hosts import HostsFileError, read_hosts_file

    if not settings.CRAFT_GIT_HOSTS_FILE:
        return []
    try:
        read_hosts_file(settings.CRAFT_GIT_HOSTS_FILE)
    except HostsFileError as exc:
        hint = "See docs/repositories.md for the file's fields."
        return [Error(str(exc), hint=hint, id="craft.E001")]
    return []
