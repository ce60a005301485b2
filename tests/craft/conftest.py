"""Fixtures of the session tests."""

from __future__ import annotations

import pytest

from tests.catalog import write_catalog

from ..server import Daphne
from .wsclient import session_cookie


@pytest.fixture
def cookie(owner):
    """A signed-in browser session cookie of the owner."""
    return session_cookie(owner)


@pytest.fixture
def catalog_server(tmp_path):
    """Start daphne with the test catalog (tests/catalog.py) as its agents:
    `catalog_server(**env)` starts one with `env` on top; each is killed after the test."""
    started: list[Daphne] = []

    def start(**env: str) -> Daphne:
        daphne = Daphne(tmp_path, CRAFT_AGENTS_FILE=str(write_catalog(tmp_path)), **env)
        started.append(daphne)
        return daphne.start()

    yield start
    for daphne in started:
        daphne.stop()
