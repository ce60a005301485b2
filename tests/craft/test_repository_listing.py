"""Which repository events change a session's line in its owner's lists of sessions: its
clone's status and its pull request do; the clone's progress and its set-up's output, which
come every second, do not (each would make every open page fetch the list again)."""

from __future__ import annotations

import pytest

from craft.storage.eventlog import _changes_list, _encode


@pytest.mark.parametrize(
    "kind, data, listed",
    [
        ("repository_status", {"status": "cloning", "url": "u", "branch": "b", "base": ""}, True),
        ("repository_status", {"status": "ready", "commit": "c", "setup": None}, True),
        (
            "repository_status",
            {"status": "failed", "code": "x", "reason": 'it said "output"'},
            True,
        ),
        ("repository_status", {"status": "cloning", "progress": {"text": "Receiving"}}, False),
        ("repository_status", {"status": "setting_up", "output": "npm ci\n"}, False),
        ("pull_request_opened", {"url": "u", "number": 1, "state": "open"}, True),
        ("pull_request_updated", {"url": "u", "number": 1, "state": "merged"}, True),
        ("repository_pushed", {"branch": "b", "head": "h"}, False),
        ("agent_message_chunk", {"content": {"type": "text", "text": '"status"'}}, False),
        ("turn_end", {"stop_reason": "end_turn"}, True),
    ],
)
def test_what_changes_the_list_of_sessions(kind, data, listed):
    assert _changes_list(_encode([(kind, data)])) is listed
