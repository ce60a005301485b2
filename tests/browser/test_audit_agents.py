"""What the audit found about agents other than the demo agent (issue 46's bug 10), in
Chromium: a permission card under a command's live output (as Claude Code sends it), the
agent picker, a session whose agent's key is missing, and the empty session's hint.
Screenshots: `audit-agents-<case>`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import expect

from craft.storage.db import db_sync_to_async
from tests.ready import open_ready_session

from .conftest import serve, signed_in_page, snap
from .test_chat_page import open_page, send_prompt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

AGENTS = Path(__file__).parent.parent / "agents"


def update(body: dict) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "session/update",
                       "params": {"sessionId": "scripted", "update": body}})  # fmt: skip


@pytest.fixture(scope="module")
def scripted_server(django_db_setup, tmp_path_factory):
    """The app whose agent writes what each prompt lists (tests/agents/scripted_agent.py)."""
    folder = tmp_path_factory.mktemp("scripted")
    command = f"{sys.executable} {AGENTS / 'scripted_agent.py'}"
    with serve({"CRAFT_AGENT_COMMAND": command}, folder / "sandboxes") as server:
        yield server


@pytest_asyncio.fixture
async def scripted_page(browser, scripted_server, owner):
    page = await signed_in_page(browser, scripted_server, owner)
    yield page
    await page.context.close()


async def test_a_permission_card_under_a_command_s_live_output_does_not_deny_showing_it(
    scripted_page, scripted_server, owner
):
    page = scripted_page
    session = await db_sync_to_async(open_ready_session)(owner, "Permissions")
    terminal = [{"type": "terminal", "terminalId": "t1"}]
    call = {"toolCallId": "t1", "title": "Run the tests", "kind": "execute",
            "rawInput": {"command": "npm test"}, "content": terminal}  # fmt: skip
    started = {"terminal_info": {"terminal_id": "t1", "cwd": "/w"}}
    output = {"terminal_output": {"terminal_id": "t1", "data": "ok 1 - adds\n"}}
    allow = {"optionId": "yes", "name": "Allow", "kind": "allow_once"}
    asked = {"sessionId": "scripted", "toolCall": call, "options": [allow]}
    script = [
        update({"sessionUpdate": "tool_call", "status": "in_progress", **call, "_meta": started}),
        update({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "_meta": output}),
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": "ask-1",
                "method": "session/request_permission",
                "params": asked,
            }
        ),
    ]
    await open_page(page, scripted_server, session)
    await send_prompt(page, json.dumps(script))
    tool = page.locator("#transcript .tool").first
    await expect(tool).to_contain_text("ok 1 - adds")
    card = page.locator("#transcript .permission").first
    await expect(card).to_contain_text("$ npm test")
    await expect(card).not_to_contain_text("Terminal output is not shown here")
    await snap(page, "audit-agents-permission-under-output")
