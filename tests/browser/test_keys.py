"""What a person sees of agents and keys: choosing an agent, storing a key, a missing key.

A server of its own, whose catalog (tests/catalog.py) offers two agents: one that needs a key.
"""

from __future__ import annotations

import re

import pytest
import pytest_asyncio
from playwright.async_api import expect

from craft import services as craft_services
from craft.models import Event, Session
from craft.storage.db import db_sync_to_async
from sandboxes import services as sandbox_services
from tests.catalog import KEY, catalog, catalog_toml

from .conftest import assert_accessible, serve, signed_in_page, snap

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SECRET = "sk-browser-0123456789-wxyz"


@pytest.fixture(scope="module")
def keyed_server(django_db_setup, tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    (folder / "agents.toml").write_text(catalog_toml())
    env = {"CRAFT_AGENTS_FILE": str(folder / "agents.toml")}
    with serve(env, folder / "sandboxes") as server:
        yield server


@pytest.fixture(autouse=True)
def agents(settings):
    settings.CRAFT_AGENTS = catalog()  # the same catalog in this process, for its sessions


@pytest_asyncio.fixture
async def page(browser, keyed_server, owner):
    page = await signed_in_page(browser, keyed_server, owner)
    yield page
    await page.context.close()


@db_sync_to_async
def keyed_session(user) -> Session:
    sandbox_services.provision_sandbox(user)
    return craft_services.open_session(user, agent="keyed")


async def test_new_session_offers_the_catalog_and_keeps_the_chosen_agent(page, keyed_server):
    await page.goto(f"{keyed_server.url}/")
    choice = page.locator("#new-session-agent")
    await expect(choice.locator("option")).to_have_text(["Demo agent", "Keyed agent (needs a key)"])
    await snap(page, "keys-new-session-choice")
    await choice.select_option("keyed")
    await page.get_by_role("button", name="+ New session").click()
    await expect(page).to_have_url(re.compile(r"/sessions/[0-9a-f-]{36}/$"))
    session_id = page.url.rstrip("/").rsplit("/", 1)[1]
    agent = await db_sync_to_async(lambda: Session.objects.get(pk=session_id).agent)()
    assert agent == "keyed"
    await expect(page.locator("#session-agent")).to_have_text("Keyed agent")


async def test_a_missing_key_is_named_with_a_link_and_storing_it_lets_the_prompt_through(
    page, keyed_server, owner
):
    session = await keyed_session(owner)
    await page.goto(f"{keyed_server.url}/sessions/{session.pk}/")
    await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
    await page.fill("#prompt", "hello from the page")
    await page.press("#prompt", "Enter")
    error = page.locator("#frame-error")
    await expect(error).to_contain_text(
        f"Keyed agent needs your Provider API key ({KEY}), which you have not stored."
    )
    await expect(error).to_contain_text("Your message is kept")
    await expect(page.locator("#prompt")).to_have_value("hello from the page")
    await snap(page, "keys-missing-key")
    stored = await db_sync_to_async(lambda: Event.objects.filter(session=session).count())()
    assert stored == 0

    await error.get_by_role("link", name="Open Keys").click()
    await expect(page).to_have_url(f"{keyed_server.url}/keys/")
    row = page.locator(f"#key-{KEY}")
    await expect(row).to_contain_text("Not stored.")
    await expect(row).to_contain_text("Needed by Keyed agent.")
    needs = page.get_by_role("list", name="What each agent needs")
    await expect(needs).to_contain_text(f"Keyed agent: cannot start until you store {KEY}.")
    await expect(needs).to_contain_text("Demo agent: needs no key.")
    await assert_accessible(page, "the keys page")

    # Too long: refused with the reason, and the value is not put back in the page.
    await row.get_by_label(f"Store {KEY}").fill("x" * 9000)
    await row.get_by_role("button", name="Save").click()
    await expect(page.locator(f"#error-{KEY}")).to_contain_text("longer than 8 KiB")
    assert "x" * 100 not in await page.content()

    await page.locator(f"#key-{KEY}").get_by_label(f"Store {KEY}").fill(SECRET)
    await page.locator(f"#key-{KEY}").get_by_role("button", name="Save").click()
    await expect(page.locator(f"#key-{KEY}")).to_contain_text("Stored (ends in wxyz)")
    assert SECRET not in await page.content()
    await snap(page, "keys-stored")

    # Back on the session's page (by its link, not the browser's back): the message is kept.
    await page.goto(f"{keyed_server.url}/sessions/{session.pk}/")
    await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
    await expect(page.locator("#prompt")).to_have_value("hello from the page")
    await page.press("#prompt", "Enter")
    await expect(page.locator("#transcript .turn-end .label")).to_have_text("Done")
    await expect(page.locator("#prompt")).to_have_value("")
    await page.reload()  # once sent, it is not kept
    await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
    await expect(page.locator("#prompt")).to_have_value("")
    await expect(page.locator("#transcript")).to_contain_text("hello from the page")


async def test_a_key_the_server_can_no_longer_read_is_marked_to_enter_again(
    page, keyed_server, owner
):
    from craft.models import Credential

    await db_sync_to_async(Credential.objects.create)(
        owner=owner, name=KEY, ciphertext="gAAAAAB-not-readable-with-this-key", hint="abcd"
    )
    await page.goto(f"{keyed_server.url}/keys/")
    row = page.locator(f"#key-{KEY}")
    await expect(row).to_contain_text("Unreadable: the server's encryption key changed")
    await expect(row.get_by_label(f"Replace {KEY}")).to_be_visible()
    await snap(page, "keys-unreadable")
