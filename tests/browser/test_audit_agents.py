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
from tests.catalog import KEY, catalog, catalog_toml
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


async def test_an_agent_other_than_the_demo_is_not_offered_the_demo_s_commands(
    scripted_page, scripted_server, owner
):
    session = await db_sync_to_async(open_ready_session)(owner, "Not the demo")
    await open_page(scripted_page, scripted_server, session)
    await expect(scripted_page.locator("#empty-transcript")).to_have_text("Say hello to the agent.")


@pytest.fixture(scope="module")
def keyed_server(django_db_setup, tmp_path_factory):
    """Two agents, one of which needs a key (tests/catalog.py)."""
    folder = tmp_path_factory.mktemp("keyed")
    (folder / "agents.toml").write_text(catalog_toml())
    with serve({"CRAFT_AGENTS_FILE": str(folder / "agents.toml")}, folder / "sandboxes") as server:
        yield server


@pytest_asyncio.fixture
async def keyed_page(browser, keyed_server, owner, settings):
    settings.CRAFT_AGENTS = catalog()  # the same catalog in this process
    page = await signed_in_page(browser, keyed_server, owner)
    yield page
    await page.context.close()


async def test_the_picker_keeps_the_last_choice_and_a_missing_key_is_said_on_opening(
    keyed_page, keyed_server
):
    page = keyed_page
    await page.goto(f"{keyed_server.url}/")
    picker = page.locator("#new-session-agent")  # the sidebar's
    await expect(picker).to_have_value("demo")
    await picker.select_option("keyed")
    await page.get_by_role("button", name="+ New session").click()
    await page.wait_for_url("**/sessions/*/")
    # The picker remembers; the page says at once that the agent's key is missing.
    await expect(page.locator("#new-session-agent")).to_have_value("keyed")
    missing = page.locator("#keys-missing")
    await expect(missing).to_contain_text(
        f"Keyed agent needs your Provider API key ({KEY}), which you have not stored."
    )
    await expect(missing.get_by_role("link", name="Open Keys")).to_have_attribute("href", "/keys/")
    # Its agent runs the demo agent's program? No: no demo commands in its hint.
    await expect(page.locator("#empty-transcript")).to_have_text("Say hello to the agent.")
    picker_box = await page.locator("#new-session-agent").bounding_box()
    assert picker_box is not None and picker_box["height"] >= 30  # a control, not a sliver
    await snap(page, "audit-agents-key-missing")
    # A demo agent's session: its commands, and no word of keys.
    await page.locator("#new-session-agent").select_option("demo")
    await page.get_by_role("button", name="+ New session").click()
    await expect(page.locator("#session-agent")).to_have_text("Demo agent")
    await expect(page.locator("#empty-transcript")).to_contain_text("Try demo, plan or")
    await expect(page.locator("#keys-missing")).to_have_count(0)
    await expect(page.locator("#new-session-agent")).to_have_value("demo")
