"""Going back in a conversation through daphne: fork a session from a turn, rewind it to one.

The real demo agent writes files after permissions and remembers words (`remember`,
`recall`); checkpoints are real git commits; fork and rewind are asked over HTTP as the page
asks them. The workspace is checked file by file; what the agent of a fork (or of a rewound
session) knows is asked of it: it was given the transcript of the turns kept, and nothing of
the others.
"""

from __future__ import annotations

import os
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from craft.models import Event, Session
from craft.turns.checkpoints import checkpoints_of
from sandboxes import services as sandbox_services
from tests.ready import open_ready_session
from tests.sandboxes.hostile import contain, needs_root
from tests.server import Daphne

from ..wsclient import session_cookie
from .test_revert import Person, of_kind, post

pytestmark = pytest.mark.django_db(transaction=True)


class Talker(Person):
    """A person with a session open, who also prompts without permissions and goes back."""

    def say(self, text: str) -> tuple[int, str]:
        """Send a prompt that asks nothing; return its seq and what the agent said."""
        self.prompts += 1
        client_id = f"s{self.prompts}"
        self.socket.send({"type": "prompt", "id": client_id, "text": text})
        mine = self.socket.until(
            lambda f: f.get("kind") == "user_message" and f["data"]["id"] == client_id
        )[-1]
        return mine["seq"], said(self.socket.until_kind("turn_end"))

    def fork(self, seq: Any) -> tuple[int, dict[str, Any]]:
        return post(self.server, self.cookie, self.csrf, self.going("fork"), {"seq": seq})

    def rewind(self, seq: Any) -> tuple[int, dict[str, Any]]:
        return post(self.server, self.cookie, self.csrf, self.going("rewind"), {"seq": seq})

    def going(self, how: str) -> str:
        return f"/api/sessions/{self.session.pk}/{how}/"


def said(frames: list[dict[str, Any]]) -> str:
    return "".join(
        f["data"].get("content", {}).get("text", "")
        for f in frames
        if f.get("kind") == "agent_message_chunk"
    )


def files_of(session: Session) -> dict[str, str]:
    """Every file of the session's workspace (but the demo agent's own state), by path."""
    folder = Path(sandbox_services.workspace_path(session.sandbox, session.pk))
    found = {}
    for path in folder.rglob("*"):
        relative = path.relative_to(folder).as_posix()
        if path.is_file() and not relative.startswith(".craft-demo-agent"):
            found[relative] = path.read_text()
    return found


@pytest.fixture
def server(tmp_path):
    server = Daphne(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def talker(server, owner):
    talker = Talker(server, owner, open_ready_session(owner, "going back"))
    yield talker
    talker.socket.close()


def a_history(talker: Talker) -> tuple[int, int, int, int]:
    """Four turns: a file written, a word remembered, the file changed and another file
    written, another word remembered. Return their seqs."""
    first = talker.turn("write notes.txt one")
    second, answer = talker.say("remember apple")
    assert "I will remember apple" in answer
    third = talker.turn("write notes.txt two")
    talker.turn("write later.txt later")
    fourth, _ = talker.say("remember banana")
    return first, second, third, fourth


def test_a_fork_has_the_files_and_the_conversation_as_they_were_and_the_original_keeps_its_own(
    server, talker, owner
):
    _, second, _, _ = a_history(talker)
    source = talker.session
    assert files_of(source) == {"notes.txt": "two", "later.txt": "later"}

    status, answer = talker.fork(second)
    assert status == 201, answer
    fork = Session.objects.get(pk=answer["id"])
    assert (fork.owner, fork.sandbox_id, fork.agent) == (owner, source.sandbox_id, source.agent)
    assert fork.title == "going back (fork)"
    # The files as they were just after the second turn, file by file.
    assert files_of(fork) == {"notes.txt": "one"}
    assert files_of(source) == {"notes.txt": "two", "later.txt": "later"}
    # The conversation up to the end of that turn, renumbered from 1, then `forked`.
    events = list(
        Event.objects.filter(session=fork).order_by("seq").values_list("seq", "kind", "data")
    )
    assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))
    prompts = [data["text"] for _, kind, data in events if kind == "user_message"]
    assert prompts == ["write notes.txt one", "remember apple"]
    assert sum(kind == "turn_end" for _, kind, _ in events) == 2
    assert not {kind for _, kind, _ in events} & {"permission_request", "permission_answer"}
    # The agent's paths name the fork's workspace, never the source's.
    copied = str(events[:-1])  # the `forked` event names the source, as it should
    assert f"/sessions/{fork.pk}/notes.txt" in copied and str(source.pk) not in copied
    assert events[-1][1:] == ("forked", {"from": str(source.pk), "seq": second,
                                         "title": "going back"})  # fmt: skip

    # The fork's agent was given the conversation: it knows apple, and nothing of banana.
    forked = Talker(server, owner, fork)
    try:
        _, recalled = forked.say("recall")
        assert "I was given the conversation so far (2 of your messages)" in recalled
        assert "You asked me to remember: apple." in recalled
        # Given once: the next prompt is an ordinary one.
        _, again = forked.say("recall")
        assert "given the conversation" not in again and "remember: apple." in again
        forked.turn("write notes.txt forked")
    finally:
        forked.socket.close()
    # The original keeps its own conversation and files.
    _, recalled = talker.say("recall")
    assert "You asked me to remember: apple banana." in recalled
    assert files_of(source) == {"notes.txt": "two", "later.txt": "later"}
    assert files_of(fork) == {"notes.txt": "forked"}


def test_a_fork_carries_the_checkpoints_of_the_turns_it_copies_and_rewinds_to_any_of_them(
    server, talker, owner
):
    a_history(talker)
    source = talker.session
    last = Event.objects.filter(session=source, kind="user_message").order_by("seq").last()
    status, answer = talker.fork(last.seq)
    assert status == 201, answer
    fork = Session.objects.get(pk=answer["id"])
    assert files_of(fork) == {"notes.txt": "two", "later.txt": "later"}
    # Its turns, renumbered: each has the checkpoint of the files just after it (the
    # source's own commits), so the fork goes back to a copied turn as the source would.
    prompts = list(
        Event.objects.filter(session=fork, kind="user_message")
        .order_by("seq")
        .values_list("seq", flat=True)
    )
    assert len(prompts) == 5
    before, after = checkpoints_of(fork.pk, prompts[2])
    changes = sandbox_services.session_workspace(fork.sandbox, fork.pk).changes(before, after)
    assert [(f["path"], f["status"]) for f in changes["files"]] == [("notes.txt", "modified")]
    forked = Talker(server, owner, fork)
    try:
        assert forked.rewind(prompts[2]) == (200, {"seq": prompts[2]})
        rewound = forked.socket.until(of_kind("rewound"))[-1]
        assert {(f["path"], f["status"]) for f in rewound["data"]["files"]} == {
            ("later.txt", "deleted")
        }
        assert files_of(fork) == {"notes.txt": "two"}
        assert forked.rewind(prompts[1]) == (200, {"seq": prompts[1]})
        assert files_of(fork) == {"notes.txt": "one"}
        # The fork's own turns take their checkpoints after those it copied.
        forked.turn("write notes.txt forked")
        assert files_of(fork) == {"notes.txt": "forked"}
    finally:
        forked.socket.close()
    assert files_of(source) == {"notes.txt": "two", "later.txt": "later"}


def test_a_rewind_restores_the_files_sets_the_later_turns_aside_and_the_agent_forgets_them(
    talker,
):
    _, second, third, fourth = a_history(talker)
    assert talker.rewind(second) == (200, {"seq": second})
    rewound = talker.socket.until(of_kind("rewound"))[-1]
    turns = rewound["data"]["turns"]
    assert rewound["data"]["to"] == second
    assert turns[0] == third and turns[-1] == fourth and len(turns) == 3
    changed = {(f["path"], f["status"]) for f in rewound["data"]["files"]}
    assert changed == {("notes.txt", "modified"), ("later.txt", "deleted")}
    assert files_of(talker.session) == {"notes.txt": "one"}

    # The agent's next answer knows nothing of the turns set aside.
    _, recalled = talker.say("recall")
    assert "I was given the conversation so far (2 of your messages)" in recalled
    assert "You asked me to remember: apple." in recalled
    assert "banana" not in recalled

    # A fork after the rewind leaves the turns set aside out too.
    status, answer = talker.fork(second)
    assert status == 201, answer
    fork = Session.objects.get(pk=answer["id"])
    prompts = list(
        Event.objects.filter(session=fork, kind="user_message").values_list("data__text", flat=True)
    )
    assert prompts == ["write notes.txt one", "remember apple"]
    # Nothing to set aside after the last turn; a turn set aside is no place to go back to.
    assert talker.rewind(second)[0] == 200  # the recall turn came after it
    assert talker.rewind(fourth)[1]["error"]["code"] == "invalid"


def test_nothing_goes_back_while_a_turn_runs_nor_to_what_is_no_turn(talker):
    first = talker.turn("write notes.txt one")
    talker.socket.send({"type": "prompt", "id": "slow", "text": "slow 100 0.2"})
    talker.socket.until(of_kind("agent_message_chunk"))
    for going in (talker.fork, talker.rewind):
        status, answer = going(first)
        assert status == 409 and answer["error"]["code"] == "turn_running", answer
    talker.socket.send({"type": "cancel"})
    talker.socket.until_kind("turn_end")
    not_a_turn = Event.objects.filter(session=talker.session, kind="turn_end").first().seq
    for seq in (not_a_turn, 10_000, "1", True, 0):
        for going in (talker.fork, talker.rewind):
            status, answer = going(seq)
            assert status == 400 and answer["error"]["code"] == "invalid", (seq, answer)
    # Rewinding to the last turn kept sets nothing aside.
    last = Event.objects.filter(session=talker.session, kind="user_message").last().seq
    assert talker.rewind(last)[1]["error"]["code"] == "nothing_to_rewind"
    assert Session.objects.count() == 1


def test_another_persons_session_is_not_found(server, talker, stranger):
    first = talker.turn("write notes.txt one")
    with urllib.request.urlopen(f"{server.url}/accounts/login/", timeout=30) as page:
        cookies = page.headers.get_all("Set-Cookie")
    csrf = next(re.match(r"csrftoken=([^;]+)", c)[1] for c in cookies if "csrftoken" in c)
    cookie = f"{session_cookie(stranger)}; csrftoken={csrf}"
    for path in (talker.going("fork"), talker.going("rewind")):
        status, answer = post(server, cookie, csrf, path, {"seq": first})
        assert status == 404 and answer["error"]["code"] == "not_found"
    assert Session.objects.count() == 1
    assert files_of(talker.session) == {"notes.txt": "one"}


@pytest.fixture
def contained(settings, machine, uid_base):
    """Root's configuration (sandbox users, the jail, the network rule) in daphne."""
    contain(settings, "on")
    settings.CRAFT_AGENT_COMMAND = ["craft-demo-agent"]
    server = Daphne(
        settings.VAR_DIR,
        CRAFT_SANDBOX_UIDS="on",
        CRAFT_SANDBOX_ROOT=str(settings.CRAFT_SANDBOX_ROOT),
        CRAFT_SANDBOX_UID_BASE=str(uid_base),
        CRAFT_SANDBOX_UID_COUNT="1000",
        CRAFT_AGENT_COMMAND="craft-demo-agent",
    ).start()
    yield server
    server.stop()


@needs_root
def test_a_forks_files_are_written_as_the_sandboxs_user(contained, owner):
    talker = Talker(contained, owner, open_ready_session(owner, "contained"))
    try:
        talker.turn("write notes.txt one")
        second = talker.turn("write deep/er/file.txt two")
        status, answer = talker.fork(second)
        assert status == 201, answer
    finally:
        talker.socket.close()
    fork = Session.objects.get(pk=answer["id"])
    assert files_of(fork) == {"notes.txt": "one", "deep/er/file.txt": "two"}
    folder = Path(sandbox_services.workspace_path(fork.sandbox, fork.pk))
    owners = {os.lstat(path).st_uid for path in [folder, *folder.rglob("*")]}
    source = Path(sandbox_services.workspace_path(fork.sandbox, talker.session.pk))
    assert owners == {os.lstat(source / "notes.txt").st_uid}
    assert owners.pop() >= 1_000_000_000  # the sandbox's user, never the server's


def test_an_edited_earlier_message_becomes_a_fork_from_just_before_it_with_the_new_text(
    server, talker, owner
):
    _, second, _, _ = a_history(talker)
    body = {"seq": second, "before": True, "text": "remember cherry"}
    status, answer = post(talker.server, talker.cookie, talker.csrf, talker.going("fork"), body)
    assert status == 201 and set(answer) == {"id"}, answer
    fork = Session.objects.get(pk=answer["id"])
    # The workspace as it was before that message's turn: after the first.
    assert files_of(fork) == {"notes.txt": "one"}
    forked = Talker(server, owner, fork)
    try:
        # Its first prompt is the edited text, already sent: its agent got the one turn before.
        frames = forked.socket.until_kind("turn_end", count=2)
        assert "I was given the conversation so far (1 of your messages)" in said(frames)
        assert "I will remember cherry." in said(frames)
        _, recalled = forked.say("recall")
        assert "You asked me to remember: cherry." in recalled
    finally:
        forked.socket.close()
    prompts = list(
        Event.objects.filter(session=fork, kind="user_message")
        .order_by("seq")
        .values_list("data__text", flat=True)
    )
    assert prompts == ["write notes.txt one", "remember cherry", "recall"]
    assert Event.objects.get(session=fork, kind="forked").data["before"] is True
    for bad in ({"seq": second, "text": "  "}, {"seq": second, "before": "yes"}):
        status, answer = post(talker.server, talker.cookie, talker.csrf, talker.going("fork"), bad)
        assert status == 400, answer
