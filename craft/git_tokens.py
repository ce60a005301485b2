"""Each person's token for each git host (docs/repositories.md): checked, stored, handed over.

Tokens are encrypted at rest exactly as agents' keys are (craft.credentials: Fernet under
CRAFT_SECRETS_KEY, rotated by `manage.py rotate_credentials`), shown again only as a hint,
and never logged. A token is asked of its host before it is stored: a wrong one, or one the
host could not be asked about, is not stored. It leaves this module only for Craft's own use
on its owner's behalf: in a `Remote` for Craft's git (`remote_for`), or for the host's API
(`token_for`). It never reaches an agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import User
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from craft import credentials, host_api
from craft.git_hosts import GitHost, RepositoryUrl, hosts
from craft.models import GitToken
from sandboxes.repository import Remote

# The user name each kind of host wants beside a token over HTTPS (Gitea: the token's login).
USERNAMES = {"github": "x-access-token", "gitlab": "oauth2"}


class GitTokenError(Exception):
    """A token was refused; the message is fit to show and never holds the token."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        # unknown_git_host | invalid_git_token | git_auth_failed | host_api_error
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Stored:
    """What may be shown of a person's token for a host."""

    host: str
    hint: str
    login: str
    updated_at: datetime
    readable: bool


def _stored(token: GitToken, readable: bool) -> Stored:
    return Stored(token.host, token.hint, token.login, token.updated_at, readable)


def host_of(host: str) -> GitHost:
    """Return the configured host named `host`; GitTokenError `unknown_git_host` otherwise."""
    allowed = hosts()
    found = allowed.get(host.strip().lower())
    if found is None:
        raise GitTokenError(
            "unknown_git_host",
            f"{host[:255]!r} is not a git host this server allows (it allows: "
            f"{', '.join(sorted(allowed))})",
        )
    return found


@sensitive_variables("value", "clean")
def store_token(user: User, host: str, value: object) -> Stored:
    """Check the token with the host's API, then store (or replace) it, encrypted; return
    what may be shown. A token the host refuses (`git_auth_failed`) or that could not be
    checked (`host_api_error`) is not stored, and the one stored before stays.

    Blocks for the host's answer (at most host_api.TIMEOUT, per request).
    """
    entry = host_of(host)
    try:
        clean = credentials.check_value(value)
    except credentials.CredentialError as exc:
        raise GitTokenError("invalid_git_token", str(exc).replace("'value'", "the token")) from None
    try:
        login = host_api.check_token(entry, clean)
    except host_api.HostApiError as exc:
        code = "git_auth_failed" if exc.code == "git_auth_failed" else "host_api_error"
        raise GitTokenError(code, exc.message) from None
    token, _ = GitToken.objects.update_or_create(
        owner=user,
        host=entry.host,
        defaults={
            "ciphertext": credentials.encrypt(clean),
            "hint": credentials.hint_of(clean),
            "login": login[:255],
            "updated_at": timezone.now(),
        },
    )
    return _stored(token, True)


def delete_token(user: User, host: str) -> bool:
    """Delete the user's token for `host`; return whether there was one."""
    deleted, _ = GitToken.objects.filter(owner=user, host=host.strip().lower()).delete()
    return bool(deleted)


def tokens_of(user: User | int) -> list[Stored]:
    """Return the user's stored tokens (never their values), by host."""
    rows = GitToken.objects.filter(owner=user).order_by("host")
    return [_stored(t, credentials.decrypt(t.ciphertext) is not None) for t in rows]


def token_of(user: User | int, host: str) -> Stored | None:
    """Return what may be shown of the user's token for `host`, if one is stored."""
    token = GitToken.objects.filter(owner=user, host=host.strip().lower()).first()
    return _stored(token, credentials.decrypt(token.ciphertext) is not None) if token else None


@sensitive_variables("value")
def _read(owner_id: int, host: str) -> tuple[str, str] | None:
    """Return the owner's token for `host` and its login; None when none is stored.

    Raises GitTokenError `git_auth_failed` when one is stored that no listed key reads.
    """
    row = (
        GitToken.objects.filter(owner_id=owner_id, host=host)
        .values_list("ciphertext", "login")
        .first()
    )
    if row is None:
        return None
    value = credentials.decrypt(row[0])
    if value is None:
        raise GitTokenError(
            "git_auth_failed",
            f"your token for {host} can no longer be read (the server's key changed): "
            "store it again on the Keys page",
        )
    return value, row[1]


def token_for(owner_id: int, host: str) -> str | None:
    """Return the owner's token for `host`, for the host's API; None when none is stored."""
    found = _read(owner_id, host)
    return found[0] if found else None


@sensitive_variables("found")
def remote_for(owner_id: int, url: RepositoryUrl) -> Remote:
    """Return the `sandboxes.repository.Remote` Craft's git uses for the owner on `url`: with
    their token for its host (none stored: anonymous, for a public repository) and the user
    name the host wants beside it."""
    found = _read(owner_id, url.host.host)
    token, login = found if found else ("", "")
    return Remote(
        url=url.url,
        token=token,
        username=USERNAMES.get(url.host.kind, login or "x-access-token"),
        allow_http=url.host.allow_http,
        submodules=url.host.submodules,
    )


def rotate_all() -> tuple[int, int]:
    """Encrypt every stored token again with the newest key; return how many were, and how
    many no listed key can read (left as they are)."""
    rotated = unreadable = 0
    for token in GitToken.objects.only("pk", "ciphertext").iterator():
        ciphertext = credentials.reencrypt(token.ciphertext)
        if ciphertext is None:
            unreadable += 1
            continue
        # Conditional: a token stored meanwhile is newer, and encrypted with the new key.
        rotated += GitToken.objects.filter(pk=token.pk, ciphertext=token.ciphertext).update(
            ciphertext=ciphertext
        )
    return rotated, unreadable
