"""Sign-in throttling: django-axes, with a limit per account and address and one per address.

django-axes records failed sign-ins in the database (so every server process counts the same
ones), refuses sign-ins that are locked out before any password is checked, and compares one
count with one limit (`AXES_FAILURE_LIMIT`). Craft has two limits:

* `CRAFT_LOGIN_FAILURES_PER_ACCOUNT` (5): one account from one address, someone guessing a
  password, or a person who forgot theirs. Another address can still sign in to that account,
  so that a stranger cannot lock a person out of their own account.
* `CRAFT_LOGIN_FAILURES_PER_ADDRESS` (30): one address, whatever the accounts, someone trying
  one password on many accounts. Higher, because an office or a school may share an address.

Both lockouts end `CRAFT_LOGIN_COOLOFF_SECONDS` after the last failure that was counted;
`manage.py axes_reset_ip`, `axes_reset_username` or deleting the attempts in the admin ends
one earlier.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from axes.handlers.database import AxesDatabaseHandler
from django.conf import settings
from django.db.models import Sum
from django.http import HttpRequest


def failure_limit(request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
    """Return django-axes' limit: the per-account one (read when used, as settings change)."""
    return settings.CRAFT_LOGIN_FAILURES_PER_ACCOUNT


def cool_off(request: HttpRequest | None = None) -> timedelta:
    """Return how long a lockout lasts after the last failure that was counted."""
    return timedelta(seconds=settings.CRAFT_LOGIN_COOLOFF_SECONDS)


class LoginThrottle(AxesDatabaseHandler):
    """django-axes' database handler with a separate limit for the address alone."""

    def get_failures(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        """Return the count django-axes compares with `AXES_FAILURE_LIMIT` (the per-account
        limit): the failures of this account from this address, or those of this address
        scaled so that reaching `CRAFT_LOGIN_FAILURES_PER_ADDRESS` reaches that limit,
        whichever is higher."""
        # In the order of AXES_LOCKOUT_PARAMETERS: account and address, then address.
        per_account, per_address = (
            attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0
            for attempts in self.get_user_attempts(request, credentials)
        )
        account_limit = settings.CRAFT_LOGIN_FAILURES_PER_ACCOUNT
        # floor(n * a / d) >= a exactly when n >= d: the address limit, in account units.
        scaled = per_address * account_limit // settings.CRAFT_LOGIN_FAILURES_PER_ADDRESS
        return max(per_account, scaled)

    def reset_user_attempts(
        self, request: HttpRequest, credentials: dict[str, Any] | None = None
    ) -> int:
        """Forget this account's failures from this address once it signed in; the address's
        failures at other accounts stay counted (one known password must not clear them)."""
        account_attempts = self.filter_user_attempts(request, credentials)[0]
        count, _ = account_attempts.delete()
        return count
