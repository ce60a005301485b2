"""Each person's own credentials for their agents (docs/agents.md): stored, listed, handed over.

Values are encrypted at rest with Fernet under CRAFT_SECRETS_KEY (a MultiFernet over the keys
listed, newest first: the first encrypts, each reads what it wrote, so rotating is listing the
new key before the old one). A value is never shown again (`hint`: at most its last four
characters), never logged, and never put in an event or an error. It leaves this module only
in a `Launch` for its owner's own agent (`launch_of`), which the sandbox backends put in the
agent's environment.

A key that no listed key can read (CRAFT_SECRETS_KEY was replaced without the old one) is
`unreadable`: listed as such, asked for again, and never given to an agent.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import datetime

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from craft.errors import SessionError
from craft.models import Credential, Session
from sandboxes import catalog
from sandboxes.catalog import Agent, Launch

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_VALUE_BYTES = 8192
# Values shorter than this get no hint: four characters of a short value say too much.
HINT_FROM_LENGTH = 12


class CredentialError(Exception):
    """A credential was refused (its name or value); the message is fit to show."""


class CredentialsMissing(SessionError):
    """The session's agent needs credentials its owner has not stored, or that can no longer
    be read; the message names them and says what to do."""

    def __init__(self, agent: Agent, missing: list[str], unreadable: list[str]) -> None:
        self.agent = agent
        self.missing = missing
        self.unreadable = unreadable
        labels = {c.name: c.label for c in agent.credentials}

        def named(names: list[str]) -> str:
            return " and ".join(f"{labels[n]} ({n})" if labels.get(n, n) != n else n for n in names)

        parts = []
        if missing:
            parts.append(f"{named(missing)}, which you have not stored")
        if unreadable:
            parts.append(
                f"{named(unreadable)}, which can no longer be read (the server's "
                "credentials key changed): enter it again"
            )
        super().__init__(
            f"{agent.title} needs your {'; and '.join(parts)}. Store it on the Keys page."
        )


@dataclass(frozen=True)
class Stored:
    """What may be shown of a stored credential."""

    name: str
    hint: str
    updated_at: datetime
    readable: bool


@functools.cache
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise CredentialError("this server has no CRAFT_SECRETS_KEY: it cannot store credentials")
    return MultiFernet([Fernet(key) for key in keys])


# Error reports (Django's debug page, mail to admins) leave these functions' values out.
@sensitive_variables("value")
def encrypt(value: str) -> str:
    return _fernet(tuple(settings.CRAFT_SECRETS_KEYS)).encrypt(value.encode()).decode()


def decrypt(token: str) -> str | None:
    """Return the value, or None when none of the listed keys can read it."""
    try:
        return _fernet(tuple(settings.CRAFT_SECRETS_KEYS)).decrypt(token.encode()).decode()
    except (InvalidToken, CredentialError):
        return None


def reencrypt(token: str) -> str | None:
    """Return `token` encrypted again with the newest key; None when no listed key reads it."""
    try:
        return _fernet(tuple(settings.CRAFT_SECRETS_KEYS)).rotate(token.encode()).decode()
    except InvalidToken:
        return None


def rotate_all() -> tuple[int, int]:
    """Encrypt every stored credential again with the newest key; return how many were, and
    how many no listed key can read (left as they are). Git tokens: craft.git_tokens."""
    _fernet(tuple(settings.CRAFT_SECRETS_KEYS))  # no key at all: say so
    rotated = unreadable = 0
    for credential in Credential.objects.only("pk", "ciphertext").iterator():
        token = reencrypt(credential.ciphertext)
        if token is None:
            unreadable += 1
            continue
        # Conditional: a value stored meanwhile is newer, and encrypted with the new key.
        rotated += Credential.objects.filter(
            pk=credential.pk, ciphertext=credential.ciphertext
        ).update(ciphertext=token)
    return rotated, unreadable


def check_name(name: str) -> None:
    """Refuse a name that no agent of the catalog asks for."""
    if not NAME.fullmatch(name) or name not in catalog.credential_names():
        offered = ", ".join(sorted(catalog.credential_names())) or "none"
        raise CredentialError(
            f"{name[:100]!r} is not a credential any agent here needs (they need: {offered})"
        )


@sensitive_variables("value")
def check_value(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CredentialError("'value' must be a non-empty string")
    if any(c in value for c in "\r\n\x00"):
        raise CredentialError("the value must be one line: it contains a line break")
    if len(value.encode()) > MAX_VALUE_BYTES:
        raise CredentialError(f"the value is longer than {MAX_VALUE_BYTES // 1024} KiB")
    return value.strip()


def hint_of(value: str) -> str:
    return value[-4:] if len(value) >= HINT_FROM_LENGTH else ""


@sensitive_variables("value", "clean")
def store_credential(user: User, name: str, value: object) -> Stored:
    """Store (or replace) the user's credential `name`, encrypted; return what may be shown.

    Agents already running keep the value they started with; the next agent start gets the
    new one.
    """
    check_name(name)
    clean = check_value(value)
    credential, _ = Credential.objects.update_or_create(
        owner=user,
        name=name,
        defaults={
            "ciphertext": encrypt(clean),
            "hint": hint_of(clean),
            "updated_at": timezone.now(),
        },
    )
    return Stored(credential.name, credential.hint, credential.updated_at, True)


def delete_credential(user: User, name: str) -> bool:
    """Delete the user's credential `name`; return whether there was one."""
    deleted, _ = Credential.objects.filter(owner=user, name=name).delete()
    return bool(deleted)


def credentials_of(user: User | int) -> list[Stored]:
    """Return the user's stored credentials (never their values), by name."""
    rows = Credential.objects.filter(owner=user).order_by("name")
    return [Stored(c.name, c.hint, c.updated_at, decrypt(c.ciphertext) is not None) for c in rows]


@sensitive_variables("values", "value")
def _values(owner_id: int, names: list[str]) -> tuple[dict[str, str], list[str], list[str]]:
    """Return the readable values of `names`, and the names missing and unreadable."""
    if not names:
        return {}, [], []  # an agent that needs no key: nothing to read
    rows = dict(
        Credential.objects.filter(owner_id=owner_id, name__in=names).values_list(
            "name", "ciphertext"
        )
    )
    values, missing, unreadable = {}, [], []
    for name in names:
        if name not in rows:
            missing.append(name)
        elif (value := decrypt(rows[name])) is None:
            unreadable.append(name)
        else:
            values[name] = value
    return values, missing, unreadable


def agents_for(user: User) -> list[tuple[Agent, list[str]]]:
    """Return the catalog's agents, each with the credentials the user still has to store
    (missing or unreadable), in the catalog's order."""
    stored = {c.name: c.readable for c in credentials_of(user)}
    return [(a, [n for n in a.credential_names if not stored.get(n)]) for a in catalog.agents()]


def agent_of(session: Session) -> Agent:
    """Return the session's agent from the catalog; SessionError when it is no longer offered."""
    agent = catalog.agent(session.agent)
    if agent is None:
        raise SessionError(
            f"this session's agent ({session.agent}) is no longer offered here: start a new session"
        )
    return agent


def launch_of(session: Session) -> Launch:
    """Return what starts the session's agent (a session already read: its `agent` and
    `owner_id`): its catalog entry and its owner's credentials.

    Raises CredentialsMissing when the agent needs a credential its owner has not stored or
    that cannot be read, SessionError when its agent is no longer offered.
    """
    agent = agent_of(session)
    values, missing, unreadable = _values(session.owner_id, agent.credential_names)
    if missing or unreadable:
        raise CredentialsMissing(agent, missing, unreadable)
    return Launch(agent, values)


def likely_launch(owner_id: int) -> Launch | None:
    """Return what the person's next session would most likely start: the agent of their
    latest session (while offered), else the catalog's first, with their credentials; None
    when some of those are missing or unreadable (then no agent is kept warm for them)."""
    latest = (
        Session.objects.filter(owner_id=owner_id)
        .order_by("-created_at")
        .values_list("agent", flat=True)
        .first()
    )
    agent = (catalog.agent(latest) if latest else None) or catalog.default_agent()
    values, missing, unreadable = _values(owner_id, agent.credential_names)
    if missing or unreadable:
        return None
    return Launch(agent, values)


def missing_in(session: Session) -> CredentialsMissing | None:
    """Return why the session's agent (a session already read) cannot start for want of
    credentials, or None."""
    try:
        launch_of(session)
    except CredentialsMissing as missing:
        return missing
    except SessionError:
        return None  # another reason: the start says it
    return None
