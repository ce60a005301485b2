"""Each command is declared once (`craft.commands`): its frame type, its parser, and what
carries it out; the socket accepts exactly the frame types docs/websocket-api.md lists."""

from __future__ import annotations

import typing

import pytest

from craft import commands
from craft.errors import Refused
from craft.turns.runner import CARRIED_OUT_BY

SOCKET_FRAMES = {
    "prompt", "cancel", "permission", "elicitation", "set_config_option", "set_mode",
    "edit_queued", "remove_queued", "send_now", "start_agent", "resume", "seen",
    "follow_sessions",
}  # fmt: skip


def test_the_socket_takes_the_documented_frame_types_and_no_other():
    taken = {kind for kind, command in commands.COMMANDS.items() if command.from_socket}
    assert taken == SOCKET_FRAMES


@pytest.mark.parametrize("kind", ["run_queue", "revert", "fork", "rewind", "commit_repository"])
def test_a_server_s_own_command_is_an_unknown_frame_on_the_socket(kind):
    with pytest.raises(Refused) as refused:
        commands.parse({"type": kind})
    assert (refused.value.code, refused.value.message) == (
        "unknown_type",
        f"unknown frame type {kind!r}",
    )


def test_every_session_command_is_carried_out_by_the_runner():
    assert set(CARRIED_OUT_BY) == set(typing.get_args(commands.SessionCommand))


def test_every_command_has_one_frame_type_and_crosses_to_another_worker_as_it_is():
    every = typing.get_args(commands.Command)
    assert {command.frame_type for command in every} == set(commands.COMMANDS)
    prompt = commands.parse({"type": "prompt", "id": "p1", "text": "hi", "attachments": [
        {"type": "file", "path": "a/./b.txt"}]})  # fmt: skip
    assert isinstance(prompt, commands.Prompt)
    for command in (prompt, commands.Cancel(), commands.Fork(3, "new", True)):
        assert commands.from_wire(commands.to_wire(command)) == command


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ({"type": "permission", "request": "r"}, "permission needs 'request' and 'option' strings"),
        ({"type": "set_config_option", "config": 1, "value": "v"},
         "set_config_option needs 'config' and 'value' strings"),
        ({"type": "set_mode"}, "set_mode needs a 'mode' string"),
        ({"type": "send_now", "id": ""}, "send_now needs the queued prompt's 'id'"),
        ({"type": "edit_queued", "id": "q1"}, "edit_queued needs a 'text' string"),
    ],
)  # fmt: skip
def test_a_frame_without_what_its_type_needs_is_refused_saying_so(frame, message):
    with pytest.raises(Refused) as refused:
        commands.parse(frame)
    assert (refused.value.code, refused.value.message) == ("bad_frame", message)
