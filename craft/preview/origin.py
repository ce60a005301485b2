"""The preview origin: a URL template with `{port}` and `{session}` in its host.

`CRAFT_PREVIEW_ORIGIN` (checked by the settings) is, say,
`https://{port}-{session}.preview.example.com`: each (session, port) is an origin of its own,
never Craft's, so that the app (the agent's code) can read nothing of Craft's, nor of another
preview's, and its cookies are its own.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from uuid import UUID

from django.conf import settings


@dataclass(frozen=True)
class PreviewHost:
    """What a preview host names: a session's port."""

    port: int
    session: UUID


@dataclass(frozen=True)
class PreviewOrigin:
    """The preview origin template, read."""

    template: str

    @property
    def scheme(self) -> str:
        return self.template.split("://", 1)[0]

    @property
    def secure(self) -> bool:
        return self.scheme == "https"

    def url(self, session: UUID, port: int) -> str:
        """Return the origin of `session`'s `port` (no trailing slash)."""
        return self.template.replace("{port}", str(port)).replace("{session}", session.hex)

    def match(self, host: str) -> PreviewHost | None:
        """Return what a Host header names, or None when it is no preview host."""
        found = self._pattern.fullmatch(host.lower())
        if found is None:
            return None
        port = int(found["port"])
        if not 0 < port < 65536:
            return None
        return PreviewHost(port, UUID(found["session"]))

    def frame_source(self) -> str:
        """Return the CSP source that covers every preview origin: the labels holding
        `{port}` and `{session}` as one wildcard, e.g. `https://*.preview.example.com`."""
        scheme, rest = self.template.split("://", 1)
        labels = rest.split(".")
        fixed = [label for label in labels if "{" not in label]
        return f"{scheme}://*.{'.'.join(fixed)}"

    @functools.cached_property
    def _pattern(self) -> re.Pattern[str]:
        host = re.escape(self.template.split("://", 1)[1].lower())
        host = host.replace(re.escape("{port}"), r"(?P<port>[1-9][0-9]{0,4})")
        host = host.replace(re.escape("{session}"), r"(?P<session>[0-9a-f]{32})")
        return re.compile(host)


def preview_origin() -> PreviewOrigin | None:
    """Return the configured preview origin, or None: previews are off."""
    template = settings.CRAFT_PREVIEW_ORIGIN
    return _read(template) if template else None


@functools.lru_cache(maxsize=4)
def _read(template: str) -> PreviewOrigin:
    return PreviewOrigin(template)
