"""A websocket's sign-in: the steps every socket of Craft takes before it serves anyone.

`SignsIn.sign_in` answers the handshake first (under load the reads that follow can wait for
the database longer than the server waits for a handshake, daphne's
`--websocket_connect_timeout`, which would drop the socket; a refusal then closes it with its
code), authenticates the user (`craft.live.auth`), counts the socket against
`CRAFT_MAX_SOCKETS_PER_USER` before any other query (a socket past the limit costs nothing
more) and joins the user's group (`craft.live.accounts`). The socket then listens for what it
shows and reads whether its browser session still signs the user in (`signed_in_as`, with
what it serves); `SignsIn.admit` holds that read against the sign-in. Listening before the
read means a sign-out committed after it reaches the socket, and the read sees any committed
before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from craft.live.accounts import FollowsAccount
from craft.live.auth import authenticate

# Close codes (4000-4999 are for applications).
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_TOO_MANY_SOCKETS = 4429


class SignsIn(FollowsAccount):
    """Consumer mixin (before channels' consumer class): the sign-in steps of a socket, which
    closes itself with a code through its `_refuse`."""

    user: Any
    _accepted = False  # the websocket handshake is answered

    if TYPE_CHECKING:

        async def accept(self, subprotocol: str | None = None, headers: Any = None) -> None: ...

        async def _refuse(self, code: int, /) -> None: ...

    async def sign_in(self) -> bool:
        """Answer the handshake, authenticate the user, count the socket and join the user's
        group; False once the socket is closed (4401 signed out, 4429 too many sockets)."""
        await self.accept()
        self._accepted = True
        user = await authenticate(self.scope)
        if not user.is_authenticated:
            await self._refuse(CLOSE_UNAUTHENTICATED)
            return False
        if not self.hold_socket(user):
            await self._refuse(CLOSE_TOO_MANY_SOCKETS)
            return False
        await self.join_account(user)
        self.user = user
        return True

    async def admit(self, auth_hash: str | None, allowed: bool = True) -> bool:
        """Hold the socket's read against its sign-in: close it (4401) if its browser session
        no longer signs the user in (`auth_hash` None), or (4403) if what it asks for is not
        `allowed` them; else have the account's re-check compare with `auth_hash`."""
        if auth_hash is None:
            await self._refuse(CLOSE_UNAUTHENTICATED)
            return False
        if not allowed:
            await self._refuse(CLOSE_FORBIDDEN)
            return False
        self.watch_account(auth_hash)
        return True
