"""Whatever a client or an agent sends: no crash, nothing stored for a refused frame, and every
stored event replays over the websocket and the HTTP API.

Hypothesis generates client frames (any JSON, lone surrogates, NULs, deep nesting, wrong
types) and agent output (ACP-shaped messages with arbitrary contents, and garbage), which a
real agent (`tests/agents/scripted_agent.py`) writes verbatim. The suite runs on PostgreSQL;
`test_the_properties_hold_on_sqlite` runs this module again on SQLite.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from craft.models import Event, Session
from craft.turns.registry import runners
from tests.ready import open_ready_session
from tests.sqlite_rerun import run_again_on_sqlite, runs_the_module_on_sqlite

from ..agents import AGENTS
from .wsclient import CONNECT_TIMEOUT, communicator, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

# Text with everything in it: lone surrogates (category Cs), NUL and other controls.
POISON = ["\ud800", "a\x00b", "\udfff\ud83d", "\ud83d\ude00", "\x00", "é\ud834"]
TEXT = st.text(st.characters(exclude_categories=()), max_size=30) | st.sampled_from(POISON)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
FIELDS = ["id", "text", "after", "request", "option"]
FRAMES = (
    st.fixed_dictionaries(
        {"type": st.sampled_from(["prompt", "cancel", "permission", "resume", "other"])},
        optional={field: JSON | TEXT for field in FIELDS},
    )
    | JSON
)
DEEP = st.integers(min_value=1, max_value=5000).map(lambda n: "[" * n + "]" * n)
EXAMPLES = int(os.environ.get("CRAFT_PROPERTY_EXAMPLES", "40"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def dumps(value) -> str:
    # ensure_ascii: a lone surrogate goes on the wire as an escape, as a browser would send it.
    return json.dumps(value)


class Harness:
    """One session, one event loop, one socket: each example is sent through them."""

    def __init__(self, owner) -> None:
        self.session = open_ready_session(owner, "properties")
        self.cookie = session_cookie(owner)
        self.http = Client()
        self.http.force_login(owner)
        self.loop = asyncio.new_event_loop()
        self.comm = communicator(self.session.pk, self.cookie)
        self.run(self._connect())

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    async def _connect(self) -> None:
        connected, _ = await self.comm.connect(timeout=CONNECT_TIMEOUT)
        assert connected
        assert (await self.comm.receive_json_from(timeout=5))["type"] == "hello"
        await self.comm.send_json_to({"type": "resume", "after": 0})

    async def exchange(self, text: str) -> list[dict]:
        """Send a frame; return what came back before a marker frame's answer (the socket
        is alive and in order if the marker is answered)."""
        await self.comm.send_to(text_data=text)
        await self.comm.send_json_to({"type": "marker"})
        frames = []
        while True:
            output = await self.comm.receive_output(timeout=10)
            assert output["type"] == "websocket.send", f"the socket closed: {output}"
            frame = json.loads(output["text"])
            if (
                frame.get("type") == "error"
                and frame.get("code") == "unknown_type"
                and ("'marker'" in frame.get("message", ""))
            ):
                return frames
            frames.append(frame)

    async def idle(self) -> None:
        """Wait until no turn runs (each accepted prompt's turn has ended)."""
        for _ in range(400):
            if not runners.is_running(self.session.pk):
                return
            await asyncio.sleep(0.025)
        raise AssertionError("a turn did not end")

    def close(self) -> None:
        self.run(self.comm.disconnect())
        self.loop.close()

    def check_log(self) -> None:
        """Every stored event replays on a new socket and lists over HTTP, and parses."""
        last_seq = Session.objects.get(pk=self.session.pk).last_seq

        async def replay() -> list[dict]:
            comm = communicator(self.session.pk, self.cookie)
            await comm.connect(timeout=CONNECT_TIMEOUT)
            await comm.receive_json_from(timeout=5)
            await comm.send_json_to({"type": "resume", "after": 0})
            frames = [await comm.receive_json_from(timeout=10) for _ in range(last_seq)]
            await comm.disconnect()
            return frames

        frames = self.run(replay())
        assert [f["seq"] for f in frames] == list(range(1, last_seq + 1))
        listed, after = [], 0
        while True:
            response = self.http.get(f"/api/sessions/{self.session.pk}/events/?after={after}")
            assert response.status_code == 200
            body = json.loads(response.content)
            listed += body["events"]
            if not body["has_more"]:
                break
            after = listed[-1]["seq"]
        assert [e["seq"] for e in listed] == list(range(1, last_seq + 1))
        for item in [*frames, *listed]:
            json.dumps(item).encode("utf-8")  # nothing a reader cannot encode
        assert self.http.get(f"/sessions/{self.session.pk}/").status_code == 200


@pytest.fixture
def harness(owner):
    harness = Harness(owner)
    yield harness
    harness.close()


def accepted(frame) -> bool:
    """Whether the frame is a prompt that the API accepts (as documented)."""
    if not isinstance(frame, dict) or frame.get("type") != "prompt":
        return False
    client_id, text = frame.get("id"), frame.get("text")
    return (
        isinstance(client_id, str)
        and 0 < len(client_id) <= 100
        and isinstance(text, str)
        and bool(text.strip())
    )


@PROPERTY
@given(frames=st.lists(FRAMES.map(dumps) | TEXT.filter(bool) | DEEP, min_size=1, max_size=6))
def test_client_frames_never_break_the_socket_and_refused_ones_store_nothing(harness, frames):
    for text in frames:
        answers = harness.run(harness.exchange(text))
        stored_before = Event.objects.filter(session=harness.session, kind="user_message").count()
        try:
            frame = json.loads(text)
        except (ValueError, RecursionError):
            frame = None
        refused = [a for a in answers if a.get("type") == "error"]
        if frame is None or not accepted(frame):
            assert refused or (isinstance(frame, dict) and frame.get("type") == "resume"), (
                "a frame the API does not accept gets an error"
            )
        harness.run(harness.idle())
        stored = Event.objects.filter(session=harness.session, kind="user_message").count()
        if refused:
            assert stored == stored_before, "a refused frame stores nothing"
    harness.check_log()


ACP_UPDATE = st.fixed_dictionaries(
    {"sessionUpdate": st.sampled_from(["agent_message_chunk", "tool_call", "plan", "x" * 80])
     | TEXT},
    optional={"content": JSON, "entries": JSON, "toolCallId": JSON, "title": JSON},
)  # fmt: skip
AGENT_LINES = st.lists(
    st.one_of(
        ACP_UPDATE.map(lambda u: dumps({"jsonrpc": "2.0", "method": "session/update",
                                        "params": {"sessionId": "scripted", "update": u}})),
        JSON.map(lambda p: dumps({"jsonrpc": "2.0", "method": "session/update", "params": p})),
        JSON.map(lambda p: dumps({"jsonrpc": "2.0", "id": 7, "method": "session/request_permission",
                                  "params": p})),
        JSON.map(dumps),
        TEXT,
    ),
    max_size=8,
)  # fmt: skip


@PROPERTY
@given(lines=AGENT_LINES)
def test_agent_output_never_breaks_a_session_and_every_turn_ends_once(
    harness, lines, settings_override
):
    ends_before = Event.objects.filter(session=harness.session, kind="turn_end").count()
    prompt = {"type": "prompt", "id": os.urandom(8).hex(), "text": json.dumps(lines)}
    answers = harness.run(harness.exchange(json.dumps(prompt)))
    assert not [a for a in answers if a.get("type") == "error"], answers
    harness.run(harness.idle())
    ends = Event.objects.filter(session=harness.session, kind="turn_end").count()
    assert ends == ends_before + 1, "the turn ended exactly once"
    harness.check_log()


@pytest.fixture
def settings_override(settings):
    settings.CRAFT_AGENT_COMMAND = [sys.executable, str(AGENTS / "scripted_agent.py")]
    # A permission request the property test sends is never answered by a person.
    settings.CRAFT_TURN_IDLE_SECONDS = 2
    return settings


@runs_the_module_on_sqlite
def test_the_properties_hold_on_sqlite(tmp_path):
    """Run this module's property tests again with SQLite as the database."""
    examples = str(max(10, EXAMPLES // 2))
    run_again_on_sqlite(
        __file__, tmp_path, deselect="sqlite", env={"CRAFT_PROPERTY_EXAMPLES": examples}
    )


# Beyond JSON's own values: what agents' parsed output can hold that orjson refuses (integers
# over 64 bits, keys that are not strings after a client's sloppy object) or writes its own way
# (NaN and the infinities, floats spelled differently).
ODD = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**64) | st.floats() | TEXT,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(TEXT | st.integers(), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(value=ODD)
def test_stored_json_is_json_s_own_value_cleaned(value):
    """The event writer's encoding (orjson, `json` where orjson refuses) stores what `json`
    would have: the same value once parsed, NaN as null, nothing a reader cannot encode, no
    NUL for PostgreSQL to refuse."""
    from craft.storage.normalise import clean, dumps

    text = dumps(value)
    text.encode("utf-8")
    assert "\\u0000" not in text
    expected = json.loads(json.dumps(clean(value), ensure_ascii=False))
    assert json.loads(text) == expected
