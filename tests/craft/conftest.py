"""Fixtures of the session tests."""

from __future__ import annotations

import pytest

from .wsclient import session_cookie


@pytest.fixture
def cookie(owner):
    """A signed-in browser session cookie of the owner."""
    return session_cookie(owner)
