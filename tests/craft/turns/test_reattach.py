"""A replaced agent keeps the conversation: Craft resumes or loads its session, or says it
starts fresh. Real demo agents (advertising resume, load or neither), killed with SIGKILL or
stopped as idle, the real consumer, runner and event log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from craft.models import Session
from craft.storage.db import db_sync_to_async
from sandboxes import services as sandbox_services
from sandboxes.agent.connection import AgentConnection
from sandboxes.agent.protocol import PromptNotSent
from sandboxes.in_sandbox.demo_agent import FRESH_MARKER
from tests.ready import open_ready_session

from ...procs import killed
from ..logs import stored_log
from ..wsclient import is_turn_end, open_socket, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

REMEMBERED = "You asked me to remember: banana."
# The demo agent's --restore switch, and how Craft then restores a replaced agent.
RESTORES = {"resume": "resume", "load": "load", "none": "none", "both": "resume"}


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "memory")


@db_sync_to_async
def agent_session_id(session) -> str:
    return Session.objects.get(pk=session.pk).agent_session_id


async def turn(comm, prompt_id: str, text: str) -> tuple[list[dict], str]:
    """Run a turn; return its frames and the agent's reply."""
    await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": text})
    frames = await receive_until(comm, is_turn_end)
    reply = "".join(
        f["data"]["content"]["text"] for f in frames if f.get("kind") == "agent_message_chunk"
    )
    return frames, reply


async def agent_pid(comm, prompt_id: str) -> int:
    _, reply = await turn(comm, prompt_id, "pid")
    return int(reply.split()[1])


def user_texts_and_replies(log) -> list[tuple[str, str]]:
    """Each user message and the agent's text up to the next one, in log order."""
    pairs: list[tuple[str, str]] = []
    for _, kind, data in log:
        if kind == "user_message":
            pairs.append((data["text"], ""))
        elif kind == "agent_message_chunk" and pairs:
            pairs[-1] = (pairs[-1][0], pairs[-1][1] + data["content"]["text"])
    return pairs


@pytest.mark.parametrize("restore", ["resume", "load", "none", "both"])
async def test_a_killed_agent_is_reattached_and_remembers(session, cookie, settings, restore):
    settings.CRAFT_AGENT_COMMAND = ["craft-demo-agent", "--restore", restore]
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    frames, reply = await turn(comm, "r1", "remember banana")
    assert reply == "I will remember banana."
    assert [f["kind"] for f in frames[:2]] == ["user_message", "agent_info"], "no restart yet"
    first_id = await agent_session_id(session)
    _, pid_reply = await turn(comm, "r2", "pid")

    await asyncio.to_thread(killed, int(pid_reply.split()[1]))
    frames, reply = await turn(comm, "r3", "recall")

    restored = RESTORES[restore]
    assert reply == (FRESH_MARKER if restored == "none" else REMEMBERED)
    restarts = [f["data"] for f in frames if f.get("kind") == "agent_restarted"]
    assert restarts == [{"restored": restored}]
    assert (await agent_session_id(session) == first_id) is (restored != "none")
    log = await stored_log(session)
    assert [seq for seq, _, _ in log] == list(range(1, len(log) + 1))
    # The load replayed the conversation to the agent; none of it reached the log again.
    assert [k for _, k, _ in log].count("user_message_chunk") == 0
    assert user_texts_and_replies(log) == [
        ("remember banana", "I will remember banana."),
        ("pid", pid_reply),
        ("recall", FRESH_MARKER if restored == "none" else REMEMBERED),
    ]
    assert [d for _, k, d in log if k == "agent_restarted"] == [{"restored": restored}]
    await comm.disconnect()


async def test_a_resume_that_replays_stores_nothing_of_the_replay(session, cookie, settings):
    settings.CRAFT_AGENT_COMMAND = ["craft-demo-agent", "--restore", "resume",
                                    "--replay-on-resume"]  # fmt: skip
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await turn(comm, "m1", "remember kiwi")
    await asyncio.to_thread(killed, await agent_pid(comm, "m2"))
    _, reply = await turn(comm, "m3", "recall")
    assert reply == "You asked me to remember: kiwi."
    log = await stored_log(session)
    chunks = [d["content"]["text"] for _, k, d in log if k == "agent_message_chunk"]
    assert chunks.count("I will remember kiwi.") == 1
    assert [k for _, k, _ in log].count("user_message_chunk") == 0
    await comm.disconnect()


async def test_an_idle_agent_stopped_comes_back_with_its_memory(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await turn(comm, "i1", "remember plum")
    stopped = await asyncio.to_thread(sandbox_services.stop_idle_connections)
    assert stopped == 1
    frames, reply = await turn(comm, "i2", "recall")
    assert reply == "You asked me to remember: plum."
    assert [f["data"] for f in frames if f.get("kind") == "agent_restarted"] == [
        {"restored": "resume"}
    ]
    await comm.disconnect()


async def test_an_agent_the_reaper_stopped_as_idle_comes_back_with_its_memory(
    session, cookie, settings
):
    from craft.session_activity import SessionActivity
    from sandboxes.reaper import stop_idle_agents

    settings.CRAFT_AGENT_IDLE_SECONDS = 0.2
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await turn(comm, "i3", "remember quince")
    await asyncio.sleep(0.3)
    actions = await db_sync_to_async(stop_idle_agents)(SessionActivity())
    assert [action.target for action in actions] == [f"session {session.pk}"]
    frames, reply = await turn(comm, "i4", "recall")
    assert reply == "You asked me to remember: quince."
    assert [f["data"] for f in frames if f.get("kind") == "agent_restarted"] == [
        {"restored": "resume"}
    ]
    await comm.disconnect()


async def test_the_first_start_of_a_session_is_no_restart(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await turn(comm, "f1", "hello")
    await turn(comm, "f2", "hello again")
    kinds = [k for _, k, _ in await stored_log(session)]
    assert "agent_restarted" not in kinds
    assert kinds.count("agent_info") == 1, "one agent process, one agent_info"
    await comm.disconnect()


async def test_a_prompt_the_dead_agent_could_not_take_goes_to_a_new_agent(
    session, cookie, monkeypatch
):
    """Writing the prompt failed (the agent had just died): it never got it, so a new agent
    takes it, once, and the turn goes on as if nothing happened."""
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await turn(comm, "d1", "remember fig")
    failures = []
    prompt = AgentConnection.prompt

    def write_fails_once(self, text, sink, blocks=None):
        if not failures:
            failures.append(self.process.ident)
            self.process.terminate()  # gone between the liveness check and the write
            raise PromptNotSent("cannot write to agent: [Errno 32] Broken pipe")
        return prompt(self, text, sink, blocks)

    monkeypatch.setattr(AgentConnection, "prompt", write_fails_once)
    frames, reply = await turn(comm, "d2", "recall")
    assert reply == "You asked me to remember: fig."
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    assert [f["data"] for f in frames if f.get("kind") == "agent_restarted"] == [
        {"restored": "resume"}
    ]
    assert not [f for f in frames if f.get("kind") == "agent_error"]
    await comm.disconnect()


async def test_an_agent_that_forgot_the_session_starts_fresh_and_says_so(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await turn(comm, "g1", "remember pear")
    pid = await agent_pid(comm, "g2")
    await asyncio.to_thread(killed, pid)
    workspace = Path(session.sandbox.reference) / "sessions" / str(session.pk)
    for state in (workspace / ".craft-demo-agent").iterdir():
        state.unlink()  # the agent's own record of the session is gone
    frames, reply = await turn(comm, "g3", "recall")
    assert reply == FRESH_MARKER
    assert [f["data"] for f in frames if f.get("kind") == "agent_restarted"] == [
        {"restored": "none"}
    ]
    await comm.disconnect()
