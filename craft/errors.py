"""What Craft refuses, in one place: the errors a client or a person is told about."""

from __future__ import annotations


class Refused(Exception):
    """A client request that was not accepted; `code` and `message` go into the websocket's
    `error` frame (docs/websocket-api.md lists the codes). Nothing of it was stored."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class SessionError(Exception):
    """A session operation was refused; the message is fit to show to the user."""


class SessionLimit(SessionError):
    """The user has as many sessions as one person may have."""


class DiskFull(SessionError):
    """The session's sandbox takes more disk than CRAFT_SANDBOX_DISK: no new prompt."""


class RepositoryRefused(SessionError):
    """A session was asked for on a repository this server will not clone (`code` says why:
    `unknown_git_host`, `invalid_repository_url`, `invalid_branch`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class UnknownAgent(SessionError):
    """A session was asked for with an agent the catalog does not offer."""
