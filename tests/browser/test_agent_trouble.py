"""Agent trouble, as the person reads it in Chromium: the line of the agent's stderr that says
what went wrong, the whole of it under Details.

Real agent processes behind a real daphne: a Node agent installed without one of its packages
(ERR_MODULE_NOT_FOUND at start), and an agent that dies mid-turn with a Python traceback.
Each page is checked with axe and for Content-Security-Policy violations. Screenshots:
`trouble-<case>`.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import expect

from tests.ready import open_ready_session

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

    def start(command: list[str]):
        servers.append(serve({"CRAFT_AGENT_COMMAND": shlex.join(command)}, tmp_path / "sandboxes"))
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
