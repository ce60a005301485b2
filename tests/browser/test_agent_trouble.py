"""Agent trouble, as the person reads it in Chromium: the line of the agent's stderr that says
what went wrong, the whole of it under Details.

Real agent processes behind a real daphne: a Node agent installed without one of its packages
(ERR_MODULE_NOT_FOUND at start), and an agent that dies mid-turn with a Python traceback.
Each page is checked with axe and for Content-Security-Policy violations. Screenshots:
`trouble-<case>`.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import expect

from craft.storage.db import db_sync_to_async
from tests.ready import open_ready_session, running_sandbox

from ..craft.wsclient import session_cookie
from ..server import api_request
from .conftest import assert_accessible, serve, signed_in_page, snap
from .test_chat_page import open_page, send_prompt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

AGENTS = Path(__file__).parent.parent / "agents"
NODE = shutil.which("node")
ERROR = "#transcript .agent-error"


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "Trouble session")


@pytest.fixture
def server_with(tmp_path):
    """Start the app with `command` as its agent: `server_with(command)`."""
    servers = []

    def start(command: list[str], **env: str):
        env = {"CRAFT_AGENT_COMMAND": shlex.join(command), **env}
        servers.append(serve(env, tmp_path / "sandboxes"))
        return servers[-1].__enter__()

    yield start
    for server in servers:
        server.__exit__(None, None, None)


@pytest_asyncio.fixture
async def owner_page(browser, owner):
    """Open a page signed in as the owner on `server`: `await owner_page(server)`."""
    pages = []

    async def open_on(server):
        pages.append(await signed_in_page(browser, server, owner))
        return pages[-1]

    yield open_on
    for page in pages:
        await page.context.close()


@pytest.mark.skipif(NODE is None, reason="Node is not installed (make test installs it)")
async def test_an_agent_that_cannot_start_says_which_package_and_shows_its_stderr_on_request(
    server_with, owner_page, session
):
    assert NODE is not None
    server = server_with([NODE, str(AGENTS / "broken_install_agent.mjs")])
    page = await owner_page(server)
    await open_page(page, server, session)
    # The page starts the agent as it opens: why it could not is said before a word is sent.
    await expect(page.locator("#frame-error")).to_have_text(
        "The agent could not start. Your first message will try again. It says: Cannot find "
        "package '@example/acp-agent-runtime-that-is-not-installed' imported from "
        "…/broken_install_agent.mjs"
    )
    await send_prompt(page, "hello")

    error = page.locator(ERROR)
    await expect(error).to_contain_text("The agent could not start.")
    await expect(error.locator(".error-wrote")).to_have_text(
        "Its error output says: Cannot find package "
        "'@example/acp-agent-runtime-that-is-not-installed' "
        "imported from …/broken_install_agent.mjs"
    )
    details = error.locator("details.tech")
    await expect(details).to_have_count(1)
    stderr = details.locator("pre.stderr")
    await expect(stderr).to_be_hidden()  # closed until asked for
    await details.locator("summary").focus()
    await page.keyboard.press("Enter")  # a keyboard opens it as a click does
    await expect(stderr).to_be_visible()
    await expect(stderr).to_contain_text("Error [ERR_MODULE_NOT_FOUND]: Cannot find package")
    await expect(stderr).to_contain_text("at defaultResolve (node:internal/modules/esm/resolve")
    await expect(stderr).to_contain_text("Node.js v")
    await expect(stderr).to_have_attribute("tabindex", "0")  # it scrolls: the keyboard reaches it
    await expect(page.locator("#transcript .turn-end .label")).to_have_text("Ended with an error")
    await assert_accessible(page, "an agent that cannot start, its details open")
    await snap(page, "trouble-cannot-start")


async def test_an_agent_that_dies_mid_turn_says_its_last_exception(
    server_with, owner_page, session
):
    server = server_with([sys.executable, str(AGENTS / "troubled_agent.py")])
    page = await owner_page(server)
    await open_page(page, server, session)
    await send_prompt(page, "crash")

    error = page.locator(ERROR)
    await expect(error).to_contain_text("The agent stopped unexpectedly.")
    await expect(error.locator(".error-wrote")).to_have_text(
        "Its error output says: RuntimeError: the model provider closed the connection"
    )
    await error.locator("details.tech summary").click()
    await expect(error.locator("pre.stderr")).to_contain_text(
        "calling the model\nTraceback (most recent call last):"
    )
    await assert_accessible(page, "an agent that died mid-turn, its details open")
    await snap(page, "trouble-died")


async def test_stderr_longer_than_the_kept_tail_says_its_start_was_cut(
    server_with, owner_page, session
):
    server = server_with([sys.executable, str(AGENTS / "troubled_agent.py")])
    page = await owner_page(server)
    await open_page(page, server, session)
    await send_prompt(page, "crash deep")
    error = page.locator(ERROR)
    await expect(error.locator(".error-wrote")).to_have_text(
        "Its error output says: RuntimeError: the model provider closed the connection"
    )
    await error.locator("details.tech summary").click()
    shown = await error.locator("pre.stderr").text_content()
    assert shown is not None
    first, second = shown.split("\n")[:2]
    assert first == "[… earlier lines cut]"
    assert second.startswith("step ") and second.endswith("4,096 tokens)"), second  # whole
    assert shown.endswith("RuntimeError: the model provider closed the connection")
    await snap(page, "trouble-long-traceback")


async def test_an_agent_that_wants_a_sign_in_names_the_key_and_links_the_keys_page(
    server_with, owner_page, owner, tmp_path
):
    # An agent whose catalog entry asks for a key, and that refuses to work until someone
    # signs in (the demo agent's `--auth`), as a CLI does with a key it does not take.
    command = shlex.join([sys.executable, "-m", "sandboxes.in_sandbox.demo_agent", "--auth"])
    catalog = tmp_path / "agents.toml"
    catalog.write_text(
        f'[[agents]]\nid = "signin"\ncommand = {json.dumps(command)}\n'
        'credentials = [{ name = "PROVIDER_API_KEY", label = "Provider API key" }]\n'
    )
    server = server_with(["unused"], CRAFT_AGENTS_FILE=str(catalog))
    cookie = await db_sync_to_async(session_cookie)(owner)
    status, _ = api_request(
        server.url, cookie, "PUT", "/api/credentials/PROVIDER_API_KEY/", {"value": "sk-wrong-key"}
    )
    assert status == 200
    status, session = api_request(server.url, cookie, "POST", "/api/sessions/", {"agent": "signin"})
    assert status == 201
    await db_sync_to_async(running_sandbox)(owner)
    page = await owner_page(server)
    await page.goto(f"{server.url}/sessions/{session['id']}/")
    await send_prompt(page, "hello")

    error = page.locator(ERROR)
    await expect(error.locator(".error-next")).to_have_text(
        "It signs in with your Provider API key: check it on the Keys page (it may be wrong or "
        "expired), then send your message again. Open Keys"
    )
    await error.get_by_role("link", name="Open Keys").click()
    await expect(page).to_have_url(f"{server.url}/keys/")
    await page.go_back()
    await expect(page.locator(ERROR)).to_be_visible()
    await assert_accessible(page, "an agent that wants a sign-in")
    await snap(page, "trouble-sign-in")


async def test_a_quiet_turn_shows_what_the_agent_last_wrote_until_it_goes_on(
    server_with, owner_page, session
):
    workspace = Path(session.sandbox.reference) / "sessions" / str(session.pk)
    agent = [sys.executable, str(AGENTS / "troubled_agent.py")]
    server = server_with(agent, CRAFT_AGENT_QUIET_SECONDS="0.5")
    page = await owner_page(server)
    await open_page(page, server, session)
    quiet = page.locator("#agent-quiet")
    await expect(quiet).to_be_hidden()
    await send_prompt(page, "quiet")

    retry = "retrying the model call (attempt {}/5): 503 Service Unavailable"
    await expect(quiet).to_be_visible()
    await expect(quiet).to_have_text(
        f"The agent is quiet. Its error output says: {retry.format(1)}"
    )
    await expect(page.locator("#working")).to_be_visible()
    await assert_accessible(page, "a quiet turn's status")
    await snap(page, "trouble-quiet")
    (workspace / "next").touch()
    await expect(quiet.locator("q")).to_have_text(retry.format(2))
    (workspace / "go").touch()
    await expect(page.locator("#transcript .msg.agent").last).to_contain_text("answered at last")
    await expect(quiet).to_be_hidden()
    await expect(page.locator("#transcript .turn-end .label")).to_have_text("Done")
