"""`make run`'s settings end to end: SQLite, in-memory channel layer, local backend, demo agent.

The rest of the suite runs on PostgreSQL; this test serves the app exactly as `make run` does
(daphne, DJANGO_DEBUG on, nothing configured) from a fresh folder, signs in as the admin
account that `ensure_admin` created, and holds a conversation of two prompts over a real
websocket, checking that one agent process answered both.
"""

from __future__ import annotations

import re

import pytest

from .embedded import chunks, embedded_env, manage, serve, turn


@pytest.fixture
def env(place, uid_base):
    """`make run`'s environment, in a checkout other users can enter (as root, sandbox users
    and their jail are then on, as they are for `make run`), with a uid range of its own."""
    return embedded_env(
        place / "var", CRAFT_SANDBOX_UID_BASE=str(uid_base), CRAFT_SANDBOX_UID_COUNT="1000"
    )


def test_ensure_admin_creates_a_random_password_once(env, place):
    (place / "var").mkdir()
    manage(env, "migrate", "--noinput")
    first = manage(env, "ensure_admin")
    password = re.search(r"with password (\S+)", first).group(1)
    assert len(password) >= 20
    kept = place / "var" / "admin-password.txt"
    assert kept.read_text().split() == ["admin", password]
    assert kept.stat().st_mode & 0o777 == 0o600
    second = manage(env, "ensure_admin")
    assert password not in second
    assert "exists" in second


def test_make_runs_configuration_serves_a_two_prompt_conversation(env, place):
    with serve(env, place / "var") as server:
        session = server.post_json("/api/sessions/", {"title": "embedded"})
        ws = server.socket(session["id"])
        try:
            replies = [chunks(turn(ws, f"p{n}", "pid")) for n in (1, 2)]
        finally:
            ws.close()
    assert [len(reply) for reply in replies] == [1, 1]
    assert replies[0] == replies[1]  # the same agent process answered both
    assert replies[0][0].startswith("pid ")
    assert (place / "var" / "craft.sqlite3").exists()
