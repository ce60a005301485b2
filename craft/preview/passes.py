"""The token the page hands over to a preview, and the cookie the preview origin keeps.

The page asks Craft (`POST /api/sessions/<id>/preview/`, signed in, CSRF) for a URL of the
preview origin carrying a token: signed with the secret key under a salt of its own, bound to
the user, the session, the port and Craft's origin (the page's, which alone may frame the
preview), good for TOKEN_SECONDS and, in each server process, once. The preview origin's entry
path trades it for a cookie of that origin only, signed under another salt, which every
request and websocket of the preview then shows.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from uuid import UUID

from django.core import signing
from django.core.cache import cache

TOKEN_SALT = "craft.preview.token"
COOKIE_SALT = "craft.preview.cookie"
TOKEN_SECONDS = 60
COOKIE_SECONDS = 12 * 3600
COOKIE = "craft_preview"
ENTRY_PATH = "/__craft_preview__/enter"


@dataclass(frozen=True)
class Pass:
    """Who may see which preview, and which page (Craft's origin) may frame it."""

    user_id: int
    session: UUID
    port: int
    craft_origin: str


def make_token(grant: Pass) -> str:
    """Return a handover token for `grant`."""
    return signing.dumps(
        [grant.user_id, grant.session.hex, grant.port, grant.craft_origin, secrets.token_hex(8)],
        salt=TOKEN_SALT,
        compress=False,
    )


def redeem_token(token: str) -> Pass | None:
    """Return the pass a token carries: None when it is forged, older than TOKEN_SECONDS, or
    was redeemed already (in this server process)."""
    value = _loads(token, TOKEN_SALT, TOKEN_SECONDS, 5)
    if value is None:
        return None
    # One use: the nonce is remembered for as long as the token could be good.
    if not cache.add(f"craft-preview-token:{value[4]}", 1, TOKEN_SECONDS + 5):
        return None
    return _pass(value)


def make_cookie(grant: Pass) -> str:
    """Return the preview origin's cookie value for `grant`."""
    return signing.dumps(
        [grant.user_id, grant.session.hex, grant.port, grant.craft_origin],
        salt=COOKIE_SALT,
        compress=False,
    )


def read_cookie(value: str) -> Pass | None:
    """Return the pass of a cookie value, or None when it is forged or expired."""
    found = _loads(value, COOKIE_SALT, COOKIE_SECONDS, 4)
    return _pass(found) if found is not None else None


def _loads(text: str, salt: str, max_age: int, length: int) -> list[object] | None:
    try:
        value = signing.loads(text, salt=salt, max_age=max_age)
    except signing.BadSignature:  # SignatureExpired included
        return None
    if not isinstance(value, list) or len(value) != length:
        return None
    return value


def _pass(value: list[object]) -> Pass | None:
    user_id, session, port, origin = value[:4]
    if not (isinstance(user_id, int) and isinstance(port, int) and isinstance(origin, str)):
        return None
    try:
        return Pass(user_id, UUID(str(session)), port, origin)
    except ValueError:
        return None
