"""A real server and a real browser: daphne in a subprocess, Debian's Chromium via Playwright.

The server runs on a free loopback port against the test database. It serves the app behind
`tests.browser.faults`, so that a test can fail, slow down or hang session loads and drop
websockets from outside the product code.
Every page of every browser test is watched for Content-Security-Policy violations (the
`securitypolicyviolation` events and Chromium's console reports of them): a test during which
one occurred fails, so every page these tests drive is shown to work under the policy.
Screenshots go to the test run's output folder (CRAFT_TEST_OUTPUT, default `test-output/`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest
import pytest_asyncio
from django.conf import settings
from playwright.async_api import Browser, BrowserContext, async_playwright

from craft.storage.db import db_sync_to_async

from ..craft.wsclient import session_cookie
from ..server import Daphne

CHROMIUM = os.environ.get("CRAFT_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
OUTPUT = Path(os.environ.get("CRAFT_TEST_OUTPUT", settings.BASE_DIR / "test-output"))
# axe-core, vendored with its license (tests/browser/vendor/axe-LICENSE.txt).
AXE = Path(__file__).parent / "vendor" / "axe-4.14.1.min.js"
DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/browser" in str(item.fspath):
            item.add_marker(pytest.mark.browser)


def screenshot_path(name: str) -> Path:
    folder = OUTPUT / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


async def snap(page, name: str) -> None:
    """Screenshot the page as it is now, on a laptop (1440 by 900) and on a phone (390 by 844)."""
    size = page.viewport_size
    for suffix, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        await page.set_viewport_size(viewport)
        await page.screenshot(path=screenshot_path(f"{name}-{suffix}.png"))
    await page.set_viewport_size(size)


async def axe_violations(page, impacts=("serious", "critical")) -> list[dict]:
    """Run axe-core on the page; return its violations of the given impacts (WCAG 2.x A/AA)."""
    if not await page.evaluate("typeof window.axe !== 'undefined'"):
        # Evaluated through the browser's debugging protocol, which the page's policy does
        # not govern (a <script> tag with axe's text would be an inline script it refuses).
        await page.evaluate("() => {\n" + AXE.read_text() + "\n}")
    results = await page.evaluate(
        """async () => {
            const r = await axe.run(document, {runOnly: {type: "tag", values:
                ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"]}});
            return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                nodes: v.nodes.slice(0, 5).map(
                    n => n.target.join(" ") + " :: " + n.failureSummary)}));
        }"""
    )
    return [v for v in results if v["impact"] in impacts]


async def assert_accessible(page, what: str) -> None:
    """Fail with axe's findings if the page has serious or critical violations."""
    violations = await axe_violations(page)
    assert violations == [], f"{what}: " + json.dumps(violations, indent=1)


class LiveServer:
    def __init__(self, url: str, process: subprocess.Popen, log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log

    def hook(self, path: str, **fields: object) -> dict:
        """POST to the fault injector (tests/browser/faults.py) and return its JSON answer."""
        data = "&".join(f"{k}={v}" for k, v in fields.items()).encode()
        with urllib.request.urlopen(f"{self.url}/_faults/{path}", data=data, timeout=10) as r:
            return json.load(r)

    def loads(self, session_id: object) -> int:
        with urllib.request.urlopen(f"{self.url}/_faults/loads/", timeout=10) as r:
            return json.load(r)["loads"].get(str(session_id), 0)


@contextlib.contextmanager
def serve(extra_env: dict[str, str], sandboxes: Path):
    """Serve the app with daphne, as `make run` does (behind the fault injector), against the
    test database."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    OUTPUT.mkdir(parents=True, exist_ok=True)
    # A turn a test leaves running (a permission never answered) would hold the server's
    # shutdown for the default 30 s grace; the browser tests are not about the grace.
    env = {"CRAFT_SHUTDOWN_GRACE_SECONDS": "2", **extra_env}
    server = Daphne(
        OUTPUT, app="tests.browser.faults:application",
        CRAFT_SANDBOX_ROOT=str(sandboxes), DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost", **env,
    )  # fmt: skip
    try:
        server.start()
    except AssertionError as exc:
        pytest.fail(str(exc))
    assert server.process is not None
    try:
        yield LiveServer(server.url, server.process, server.log)
    finally:
        # Its own shutdown, whole (stopping every agent the run left it): a kill midway can
        # leave a database connection behind for seconds.
        server.terminate(timeout=60)


@pytest.fixture(scope="module")
def craft_server(django_db_setup, tmp_path_factory):
    """The app on the local backend, for one test module.

    Not for the whole run: a server is a worker, and its housekeeping acts on the shared test
    database (it closes the turns of workers that are gone and runs their queued prompts), so
    one left running would take over what later tests' own servers are meant to do."""
    with serve({}, tmp_path_factory.mktemp("live-sandboxes")) as server:
        yield server


@pytest.fixture
def hooks(craft_server):
    craft_server.hook("configure/", reset=1)
    yield craft_server
    craft_server.hook("configure/", reset=1)


# Runs in every frame before the page's own scripts.
CSP_WATCH = """
document.addEventListener("securitypolicyviolation", (event) => {
  window.craftCspViolation(`${event.effectiveDirective} refused ${event.blockedURI || "?"} `
    + `(${event.sourceFile || document.URL}:${event.lineNumber}) ${event.sample || ""}`);
}, true);
"""


async def watch_csp(context: BrowserContext, violations: list[str]) -> None:
    """Collect the Content-Security-Policy violations of every page of `context`."""
    await context.expose_binding(
        "craftCspViolation", lambda source, text: violations.append(f"{source['page'].url}: {text}")
    )
    await context.add_init_script(CSP_WATCH)

    def on_console(message) -> None:
        if message.type == "error" and "Content Security Policy" in message.text:
            violations.append(f"{message.page.url if message.page else '?'}: {message.text}")

    context.on("console", on_console)


@pytest.fixture
def csp_violations() -> list[str]:
    """The Content-Security-Policy violations seen during this test (there must be none)."""
    return []


@pytest_asyncio.fixture
async def browser(monkeypatch, csp_violations):
    """Chromium, whose every context (however a test makes it) is watched for CSP violations;
    the test fails if there was one."""
    violations = csp_violations
    new_context = Browser.new_context

    async def watched_new_context(self, *args, **kwargs):
        context = await new_context(self, *args, **kwargs)
        await watch_csp(context, violations)
        return context

    monkeypatch.setattr(Browser, "new_context", watched_new_context)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        await browser.close()
    assert not violations, "Content-Security-Policy violations:\n" + "\n".join(violations)


async def signed_in_page(browser, server, user):
    cookie = (await db_sync_to_async(session_cookie)(user)).split("=", 1)[1]
    context = await browser.new_context(viewport={"width": 1280, "height": 860})
    await context.add_cookies([{"name": "sessionid", "value": cookie, "url": server.url}])
    page = await context.new_page()
    page.set_default_timeout(15000)
    return page


@pytest_asyncio.fixture
async def page(browser, craft_server, owner):
    """A browser page signed in as the owner."""
    page = await signed_in_page(browser, craft_server, owner)
    yield page
    await page.context.close()


@pytest_asyncio.fixture
async def staff_page(browser, craft_server, staff):
    """A browser page signed in as a staff member."""
    page = await signed_in_page(browser, craft_server, staff)
    yield page
    await page.context.close()
