"""Going back in Chromium: "Rewind here", "Fork from here" and an earlier message edited and
sent again (a fork from just before it), against daphne, the demo agent and real git. The
workspace is checked file by file; what the agent knows is asked of it."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import expect

from craft.models import Session
from craft.storage.db import db_sync_to_async
from sandboxes import services as sandbox_services
from tests.ready import open_ready_session

from .conftest import assert_accessible, snap
from .test_chat_page import TURN_END, open_page, send_prompt
from .test_workspace_panel import allowed_turn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

USER = "#transcript .msg.user"
AGENT = "#transcript .msg.agent"


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "Going back")


def files_of(session) -> dict[str, str]:
    folder = Path(sandbox_services.workspace_path(session.sandbox, session.pk))
    return {
        path.relative_to(folder).as_posix(): path.read_text()
        for path in folder.rglob("*")
        if path.is_file() and not path.relative_to(folder).as_posix().startswith(".craft-demo")
    }


@db_sync_to_async
def newest_session(owner):
    return Session.objects.filter(owner=owner).select_related("sandbox").order_by("-created_at")[0]


async def said_turn(page, text: str, turns: int) -> None:
    await send_prompt(page, text)
    await expect(page.locator(TURN_END)).to_have_count(turns)


async def a_history(page) -> None:
    """Four turns: notes.txt "one", remember apple, notes.txt "two", remember banana."""
    await allowed_turn(page, "write notes.txt one", 1)
    await said_turn(page, "remember apple", 2)
    await allowed_turn(page, "write notes.txt two", 3)
    await said_turn(page, "remember banana", 4)


async def confirm(page, message, name: str) -> None:
    """Click a message's button, then its confirmation (a first click only arms it)."""
    await message.hover()
    await message.get_by_role("button", name=name, exact=False).first.click()
    await message.get_by_role("button", name=f"Confirm: {name.lower()}").click()


async def test_rewind_here_restores_the_files_collapses_the_later_turns_and_the_agent_forgets(
    page, craft_server, session
):
    await open_page(page, craft_server, session)
    await a_history(page)
    assert files_of(session) == {"notes.txt": "two"}
    second = page.locator(USER).nth(1)
    await second.hover()
    rewind = second.get_by_role("button", name="Rewind here")
    await rewind.click()
    # Asked once more: nothing happened yet.
    await expect(second.get_by_role("button", name="Confirm: rewind here")).to_be_visible()
    assert files_of(session) == {"notes.txt": "two"}
    await second.get_by_role("button", name="Confirm: rewind here").click()
    note = page.locator('#transcript [data-kind="rewound"]')
    await expect(note).to_contain_text("Rewound to “remember apple”: 2 later turns set aside.")
    assert files_of(session) == {"notes.txt": "one"}
    # The later turns: their messages marked, everything else of them collapsed.
    users = page.locator(USER)
    await expect(users.nth(2).locator(".rewound-badge")).to_have_text("Rewound")
    await expect(users.nth(3).locator(".rewound-badge")).to_have_text("Rewound")
    await expect(users.nth(1).locator(".rewound-badge")).to_have_count(0)
    await expect(page.locator(f'{AGENT}[data-rewound="true"]').first).to_be_hidden()
    await snap(page, "going-back-rewound")
    await assert_accessible(page, "a rewound session")
    await note.get_by_role("button", name="Show them").click()
    await expect(page.locator(f'{AGENT}[data-rewound="true"]').first).to_be_visible()
    await note.get_by_role("button", name="Hide them").click()
    # The agent's next answer knows nothing of the turns set aside.
    await said_turn(page, "recall", 5)
    answer = page.locator(AGENT).last
    await expect(answer).to_contain_text("I was given the conversation so far (2 of your messages)")
    await expect(answer).to_contain_text("You asked me to remember: apple.")
    await expect(answer).not_to_contain_text("banana")


async def test_fork_from_here_opens_a_new_session_as_it_was_and_the_original_keeps_its_own(
    page, craft_server, session, owner
):
    await open_page(page, craft_server, session)
    await a_history(page)
    await confirm(page, page.locator(USER).nth(1), "Fork from here")
    await page.wait_for_url(lambda url: str(session.pk) not in url)
    fork = await newest_session(owner)
    assert fork.pk != session.pk and str(fork.pk) in page.url
    await expect(page.locator('#transcript [data-kind="forked"]')).to_contain_text(
        "Forked from “Going back”"
    )
    await expect(page.locator(USER)).to_have_count(2)
    # The copied tool card names the file as the fork's workspace has it, never a host path.
    await expect(page.locator("#transcript .tool").first).to_contain_text("notes.txt")
    await expect(page.locator("#transcript .tool").first).not_to_contain_text("/sessions/")
    assert files_of(fork) == {"notes.txt": "one"}
    assert files_of(session) == {"notes.txt": "two"}
    await snap(page, "going-back-forked")
    await assert_accessible(page, "a fork")
    await said_turn(page, "recall", 3)
    answer = page.locator(AGENT).last
    await expect(answer).to_contain_text("You asked me to remember: apple.")
    await expect(answer).not_to_contain_text("banana")
    # The original is as it was, and its agent remembers both.
    await page.locator('#transcript [data-kind="forked"] a').click()
    await expect(page).to_have_url(f"{craft_server.url}/sessions/{session.pk}/")
    await expect(page.locator(TURN_END)).to_have_count(4)
    await said_turn(page, "recall", 5)
    await expect(page.locator(AGENT).last).to_contain_text("remember: apple banana.")


async def test_an_earlier_message_edited_and_sent_becomes_a_fork_with_the_new_text(
    page, craft_server, session, owner
):
    await open_page(page, craft_server, session)
    await a_history(page)
    second = page.locator(USER).nth(1)
    await second.hover()
    await second.get_by_role("button", name="Edit").click()
    await expect(page.locator("#prompt")).to_have_value("remember apple")
    await expect(page.locator(".editing-note")).to_be_visible()
    await snap(page, "going-back-editing")
    await page.fill("#prompt", "remember cherry")
    await page.press("#prompt", "Enter")
    await page.wait_for_url(lambda url: str(session.pk) not in url)
    fork = await newest_session(owner)
    # Just before that message: the first turn, then the edited one, answered.
    await expect(page.locator(TURN_END)).to_have_count(2)
    await expect(page.locator(USER).last).to_contain_text("remember cherry")
    await expect(page.locator(AGENT).last).to_contain_text("I will remember cherry.")
    assert files_of(fork) == {"notes.txt": "one"}
    await said_turn(page, "recall", 3)
    await expect(page.locator(AGENT).last).to_contain_text("You asked me to remember: cherry.")


async def test_going_back_while_the_agent_works_is_refused_and_said(page, craft_server, session):
    await open_page(page, craft_server, session)
    await allowed_turn(page, "write notes.txt one", 1)
    await send_prompt(page, "slow 100 0.2")
    await expect(page.locator(AGENT).last).to_contain_text("1")
    await confirm(page, page.locator(USER).first, "Fork from here")
    await expect(page.locator("#frame-error")).to_contain_text(
        "Not forked: The agent is working: try again once its turn ends."
    )
    await page.click("#stop")
    await expect(page.locator(TURN_END)).to_have_count(2)
