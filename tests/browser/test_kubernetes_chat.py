"""The whole chat on the kubernetes backend: Chromium, daphne, the real client, a test API server.

daphne runs with CRAFT_SANDBOX_BACKEND=kubernetes against the test Kubernetes API server; the
pod takes a while to become Ready: "New session" opens the session's page at once, and the page
shows the provisioning's progress until the sandbox runs. The workspace panel reads the pod's
files and reverts a turn through pod exec, as the local backend does through its own tool, and
its Terminal tab runs a shell in the pod by exec with a TTY.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import sys

import pytest
from playwright.async_api import expect

from craft.models import Session
from craft.storage.db import db_sync_to_async
from tests.kubeapi import KubeTestServer
from tests.sandboxes.kube import image_workspace_tool

from ..craft.live.test_terminal_socket import open_session
from .conftest import serve, snap
from .test_live_status import off_the_loop
from .test_terminal import SCREEN as TERMINAL_SCREEN
from .test_terminal import open_terminal_tab, type_line
from .test_uploads import DROP, REPLY
from .test_workspace_panel import CHIP, allowed_turn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture(scope="module")
def kube_server(tmp_path_factory):
    with KubeTestServer(root=tmp_path_factory.mktemp("cluster")) as server:
        server.ready_delay = 3
        yield server


@pytest.fixture(scope="module")
def k8s_craft_server(django_db_setup, kube_server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("k8s")
    env = {
        "CRAFT_SANDBOX_BACKEND": "kubernetes",
        "CRAFT_K8S_KUBECONFIG": str(kube_server.write_kubeconfig(folder / "kubeconfig")),
        "CRAFT_K8S_NAMESPACE": "craft-browser",
        "CRAFT_K8S_POLL_INTERVAL": "0.1",
        "CRAFT_AGENT_COMMAND": f"{sys.executable} -m sandboxes.in_sandbox.demo_agent",
        # The sandbox image's copy of the workspace tool, as the test API server's pods see it.
        "CRAFT_K8S_WORKSPACE_TOOL": shlex.join(image_workspace_tool(folder / "image-tools")),
    }
    with serve(env, folder / "unused") as server:
        yield server


@pytest.fixture
def craft_server(k8s_craft_server):
    """Point the signed-in `page` fixture at the kubernetes-backed server."""
    return k8s_craft_server


async def test_a_new_session_shows_pod_progress_then_chats_with_an_agent_in_the_pod(
    page, craft_server, kube_server, owner
):
    # The page's first load of the events is read at once but arrives late, after the socket
    # said the pod is Pending: the older sandbox state in it must not come back.
    pending = asyncio.Event()

    async def late(route):
        answer = await route.fetch()
        await pending.wait()
        await route.fulfill(response=answer)

    await page.route(re.compile(r"/api/sessions/[^/]+/events/"), late, times=1)
    await page.goto(f"{craft_server.url}/")
    await page.get_by_role("button", name="+ New session").click()
    # The session's page comes at once; the pod is not Ready for seconds yet.
    await page.wait_for_url("**/sessions/*/")
    status = page.locator("#sandbox-status")
    banner = page.locator("#sandbox-banner")
    await expect(status).to_have_attribute("data-status", "provisioning")
    await expect(banner).to_contain_text("Your sandbox is starting… pod Pending")
    pending.set()
    await expect(page.locator("#load-error")).to_be_hidden()
    await expect(page.locator("#empty-transcript")).to_be_visible()
    await expect(status.locator(".sandbox-detail")).to_contain_text("pod Pending")
    await expect(banner).to_contain_text("Your sandbox is starting… pod Pending")
    # A message sent while the pod starts waits, and runs once the sandbox is ready.
    await expect(page.locator("#send")).to_be_enabled()
    await page.fill("#prompt", "typed while the pod starts")
    await page.press("#prompt", "Enter")
    await expect(page.locator("#queue-list .queued-text")).to_have_text(
        ["typed while the pod starts"]
    )
    await expect(page.locator("#prompt")).to_have_value("")
    await snap(page, "kubernetes-provisioning")
    await expect(status).to_have_attribute("data-status", "running", timeout=20000)
    await expect(banner).to_be_hidden()
    ends = page.locator("#transcript .turn-end .label")
    await expect(ends).to_have_text(["Done"], timeout=20000)  # nobody sent it again
    await expect(page.locator("#queue")).to_be_hidden()
    await expect(page.locator("#transcript .msg.agent .bubble")).to_have_text(
        ["Echo: typed while the pod starts"]
    )
    await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")

    await page.fill("#prompt", "write from-browser.txt hello pod")
    await page.press("#prompt", "Enter")
    await page.locator("#transcript .permission").get_by_role("button", name="Allow").click()
    await expect(ends).to_have_text(["Done", "Done"])
    await page.fill("#prompt", "pid")
    await page.press("#prompt", "Enter")
    await expect(ends).to_have_count(3)

    session = await db_sync_to_async(Session.objects.get)(owner=owner)
    pod = f"craft-sandbox-{session.sandbox_id}"
    folder = kube_server.workspace("craft-browser", pod) / "sessions" / str(session.pk)
    assert (folder / "from-browser.txt").read_text() == "hello pod"
    agents = [e for e in kube_server.execs if "sandboxes.in_sandbox.demo_agent" in e.argv]
    assert len(agents) == 1
    await expect(page.locator("#transcript .msg.agent .bubble").last).to_have_text(
        re.compile(rf"pid {agents[0].pid} [0-9a-f]+")
    )
    await snap(page, "kubernetes-chat")


async def test_a_sandbox_that_could_not_start_is_set_up_again_for_the_same_session(
    page, craft_server, kube_server, owner
):
    kube_server.image_pull_backoff = True  # the pods this test creates cannot pull their image
    try:
        await page.goto(f"{craft_server.url}/")
        await page.get_by_role("button", name="+ New session").click()
        await page.wait_for_url("**/sessions/*/")
        session_url = page.url
        banner = page.locator("#sandbox-banner")
        await expect(banner).to_have_attribute("data-status", "failed", timeout=20000)
        await expect(banner).to_contain_text("could not start")
        await expect(page.locator("#send")).to_be_disabled()
        await snap(page, "sandbox-failed")
    finally:
        kube_server.image_pull_backoff = False  # the cause is fixed
    await banner.get_by_role("button", name="Try again").click()
    await expect(banner).to_contain_text("Your sandbox is starting…")
    await expect(banner).to_be_hidden(timeout=20000)
    assert page.url == session_url  # the same session, not a new one

    await page.fill("#prompt", "pid")
    await page.press("#prompt", "Enter")
    await expect(page.locator("#transcript .turn-end .label")).to_have_text("Done")
    sessions = await db_sync_to_async(list)(Session.objects.filter(owner=owner))
    assert len(sessions) == 1


async def test_the_workspace_panel_shows_reviews_and_reverts_the_pod_s_files(
    page, craft_server, kube_server, owner
):
    await page.goto(f"{craft_server.url}/")
    await page.get_by_role("button", name="+ New session").click()
    await page.wait_for_url("**/sessions/*/")
    await expect(page.locator("#sandbox-status")).to_have_attribute(
        "data-status", "running", timeout=20000
    )
    await allowed_turn(page, "write notes/plan.md # Plan", 1)
    await allowed_turn(page, "write app.py print('pod')", 2)
    session = await db_sync_to_async(Session.objects.get)(owner=owner)
    pod = f"craft-sandbox-{session.sandbox_id}"
    folder = kube_server.workspace("craft-browser", pod) / "sessions" / str(session.pk)
    assert (folder / "app.py").read_text() == "print('pod')"

    await page.click("#workspace-toggle")
    tree = page.locator("#file-tree")
    await expect(tree.get_by_role("button", name="notes/")).to_be_visible()
    await tree.get_by_role("button", name="app.py").click()
    await expect(page.locator("#file-preview code")).to_have_text("print('pod')")
    # The second turn's change, from its chip: reverted, in the pod.
    await expect(page.locator(CHIP)).to_have_text(["1 file changed"] * 2)
    await page.locator(CHIP).nth(1).click()
    change = page.locator("#change-list li.change[data-change]").nth(1)
    await expect(change.locator(".add")).to_have_text("print('pod')")
    await change.get_by_role("button", name="Revert turn").click()
    await change.get_by_role("button", name="Confirm: revert turn").click()
    await expect(page.locator(CHIP)).to_have_count(3)
    assert not (folder / "app.py").exists()
    assert (folder / "notes" / "plan.md").read_text() == "# Plan"
    await expect(tree.get_by_role("button", name="app.py")).to_have_count(0)


async def test_uploads_and_a_file_dropped_on_the_composer_land_in_the_pod(
    page, craft_server, kube_server, owner, tmp_path
):
    await page.goto(f"{craft_server.url}/")
    await page.get_by_role("button", name="+ New session").click()
    await page.wait_for_url("**/sessions/*/")
    await expect(page.locator("#sandbox-status")).to_have_attribute(
        "data-status", "running", timeout=20000
    )
    session = await db_sync_to_async(Session.objects.get)(owner=owner)
    pod = f"craft-sandbox-{session.sandbox_id}"
    folder = kube_server.workspace("craft-browser", pod) / "sessions" / str(session.pk)

    # A folder chosen with the folder picker, through pod exec, its structure kept.
    chosen = tmp_path / "site"
    (chosen / "css").mkdir(parents=True)
    (chosen / "index.html").write_text("<p>pod</p>")
    (chosen / "css" / "main.css").write_text("p {}")
    await page.click("#workspace-toggle")
    await page.set_input_files("#upload-folder-input", chosen)
    rows = page.locator("#upload-list li.upload")
    await expect(rows.locator(".upload-state")).to_have_text(["Done"] * 2)
    assert (folder / "site" / "index.html").read_text() == "<p>pod</p>"
    assert (folder / "site" / "css" / "main.css").read_text() == "p {}"
    await expect(page.locator("#file-tree").get_by_role("button", name="site/")).to_be_visible()
    # The same name again is asked about; Skip leaves the pod's file as it was.
    await page.locator("#file-tree").get_by_role("button", name="site/").click()
    await page.set_input_files(
        "#upload-input",
        files=[{"name": "index.html", "mimeType": "text/html", "buffer": b"other"}],
    )
    await page.get_by_role("button", name="Skip").click()
    assert (folder / "site" / "index.html").read_text() == "<p>pod</p>"

    # A file dropped on the composer is uploaded to the pod and reaches the agent as a link.
    await page.evaluate(DROP, ["#prompt", [{"name": "notes.txt", "text": "from the page"}]])
    await expect(page.locator("#attachments li")).to_contain_text(["uploads/notes.txt"])
    await page.fill("#prompt", "look at this")
    await page.press("#prompt", "Enter")
    await expect(page.locator(REPLY).last).to_contain_text("link to notes.txt")
    assert (folder / "uploads" / "notes.txt").read_text() == "from the page"
    await snap(page, "k8s-uploads")


async def test_a_terminal_runs_in_the_sandbox_s_pod_and_comes_back_after_a_drop(
    page, craft_server, owner
):
    session_id = await off_the_loop(open_session, craft_server, owner)
    await open_terminal_tab(page, craft_server, session_id)
    await page.click("#terminal-new")
    screen = page.locator(TERMINAL_SCREEN)
    # Pod exec with a TTY, in the session's workspace (the test API server's pod folder).
    await type_line(page, "echo in-$(basename $(pwd)) tty-$(tty | cut -c1-8)")
    await expect(screen).to_contain_text(f"in-{session_id} tty-/dev/pts")
    craft_server.hook(f"drop/{session_id}/")
    await expect(page.locator("#terminal-state")).to_contain_text("Connected again")
    await expect(screen).to_contain_text(f"in-{session_id}")  # the scrollback
    await type_line(page, "exit 4")
    await expect(page.locator("#terminal-state")).to_contain_text("code 4")
    await snap(page, "terminal-kubernetes")
