"""Sandbox and session services against the database and the local backend."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from craft import services as craft_services
from craft.models import Session
from craft.runtime import runtime
from sandboxes import services
from sandboxes.models import ReaperAction, Sandbox
from tests.ready import open_ready_session

from ..conftest import run_concurrently

pytestmark = pytest.mark.django_db(transaction=True)


def test_provisioning_creates_a_running_sandbox_folder(owner, sandbox_root):
    sandbox = services.provision_sandbox(owner)
    assert sandbox.status == Sandbox.Status.RUNNING
    assert sandbox.backend == "local"
    assert Path(sandbox.reference).is_dir()
    assert Path(sandbox.reference).parent == sandbox_root


def test_provisioning_again_returns_the_same_sandbox(owner):
    assert services.provision_sandbox(owner).pk == services.provision_sandbox(owner).pk


def test_concurrent_provisioning_creates_one_sandbox(owner):
    results = run_concurrently(lambda: services.provision_sandbox(owner).pk, 6)
    assert len(results) == 6
    assert len(set(results)) == 1
    assert Sandbox.objects.filter(owner=owner).count() == 1


def test_a_failed_sandbox_is_provisioned_again(owner, settings, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the sandbox root should be")
    settings.CRAFT_SANDBOX_ROOT = blocker
    failed = services.provision_sandbox(owner)
    assert failed.status == Sandbox.Status.FAILED
    assert "cannot create sandbox folder" in failed.error
    settings.CRAFT_SANDBOX_ROOT = tmp_path / "good"
    retried = services.provision_sandbox(owner)
    assert retried.pk == failed.pk
    assert retried.status == Sandbox.Status.RUNNING
    assert retried.error == ""


def test_a_session_gets_its_workspace_at_its_agents_first_start(owner):
    session = open_ready_session(owner, "  Fix   the build ")
    assert session.title == "Fix the build"
    workspace = Path(session.sandbox.reference) / "sessions" / str(session.pk)
    assert not workspace.exists()  # opening a session touches nothing in the sandbox
    connection = services.connect_agent(session.sandbox, session.pk)
    assert workspace.is_dir()
    assert Path(connection.cwd) == workspace


def test_opening_a_session_provisions_its_sandbox_in_the_background(owner):
    session = craft_services.open_session(owner, "first")
    assert session.sandbox.status == Sandbox.Status.PROVISIONING  # answered before it is ready
    deadline = time.monotonic() + 30
    while (sandbox := Sandbox.objects.get(pk=session.sandbox_id)).status == "provisioning":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert sandbox.status == Sandbox.Status.RUNNING, sandbox.error
    second = craft_services.open_session(owner, "second")
    assert second.sandbox_id == sandbox.pk


def test_deleting_a_session_removes_its_workspace_and_stops_its_agent(owner):
    session = open_ready_session(owner)
    workspace = Path(session.sandbox.reference) / "sessions" / str(session.pk)
    connection = services.connect_agent(session.sandbox, session.pk)
    craft_services.delete_session(session)
    assert not workspace.exists()
    assert not connection.is_running
    assert not Session.objects.filter(pk=session.pk).exists()


def test_terminate_stops_every_connection_and_frees_the_folder(owner):
    first = open_ready_session(owner)
    second = open_ready_session(owner)
    connections = [services.connect_agent(s.sandbox, s.pk) for s in (first, second)]
    sandbox = services.terminate_sandbox(first.sandbox)
    assert sandbox.status == Sandbox.Status.TERMINATED
    assert sandbox.terminated_at is not None
    assert all(not c.is_running for c in connections)
    assert not Path(sandbox.reference).exists()
    # Terminating twice is fine, and the user can get a new sandbox afterwards.
    assert services.terminate_sandbox(sandbox).status == Sandbox.Status.TERMINATED
    assert services.provision_sandbox(owner).pk != sandbox.pk


def test_nothing_starts_in_a_terminated_sandbox(owner):
    session = open_ready_session(owner)
    services.terminate_sandbox(session.sandbox)
    with pytest.raises(services.SandboxUnavailable):
        services.connect_agent(session.sandbox, session.pk)


def test_a_request_takes_over_a_provisioning_that_stopped(owner, settings):
    settings.CRAFT_SANDBOX_PROVISIONING_TIMEOUT = 1.0
    # A server began provisioning this sandbox and died: nobody will finish it.
    stuck = Sandbox.objects.create(owner=owner, backend="local", status="provisioning")
    started = time.monotonic()
    results = run_concurrently(lambda: services.provision_sandbox(owner), 3)
    waited = time.monotonic() - started
    assert {(s.pk, s.status) for s in results} == {(stuck.pk, Sandbox.Status.RUNNING)}
    assert 0.9 < waited < 5, "they waited for the provisioning, then one took it over"
    (action,) = ReaperAction.objects.filter(sandbox=stuck)
    assert action.kind == ReaperAction.Kind.RECLAIMED_PROVISIONING


def test_a_test_s_end_stops_the_provisioning_it_started(owner, settings, kube, kube_backend):
    """`Runtime.reset` (every test's teardown) stops provisioning threads while the test's
    settings still hold: one that went on made its folders under the settings restored after
    the test (the checkout's own `var/`)."""
    kube.ready_delay = 60  # the pod stays Pending: the thread waits in the backend
    settings.CRAFT_K8S_READY_TIMEOUT = 60
    session = craft_services.open_session(owner, "slow pod")
    deadline = time.monotonic() + 30
    while "pod Pending" not in Sandbox.objects.get(pk=session.sandbox_id).status_detail:
        assert time.monotonic() < deadline, "provisioning did not reach the pod"
        time.sleep(0.02)
    runtime.reset()
    assert services.stop_provisioning(0.0) == 0  # no provisioning thread is left running


def test_an_agent_whose_start_ends_while_its_sandbox_falls_asleep_is_stopped_with_it(
    owner, settings, tmp_path
):
    """Found in the browser: the page asks for a new session's agent (`start_agent`) as it
    opens, and a sleep that came meanwhile was refused ("an agent is working in it") when the
    start ended between the sleep's stop of idle agents and its last look. Only a turn keeps
    a sandbox awake; an agent that is only started is stopped with the others."""
    gate = tmp_path / "go"  # the agent's start waits for it, once it says it waits
    waiting = tmp_path / "go.waiting"
    settings.CRAFT_AGENT_COMMAND = [
        "sh", "-c", ': > "$0.waiting"; while [ ! -e "$0" ]; do sleep 0.02; done; exec "$1" -m "$2"',
        str(gate), sys.executable, "sandboxes.in_sandbox.demo_agent",
    ]  # fmt: skip
    session = open_ready_session(owner)
    started: list = []

    def start() -> None:
        try:
            started.append(services.connect_agent(session.sandbox, session.pk))
        finally:
            connection.close()  # this thread's database connection

    starting = threading.Thread(target=start)
    starting.start()
    deadline = time.monotonic() + 30
    while not waiting.exists():
        assert time.monotonic() < deadline, "the agent's start did not begin"
        time.sleep(0.02)

    def busy() -> frozenset:
        # The sleep has stopped the idle agents (this one was still starting): its start
        # ends now, before the sleep's last look.
        gate.touch()
        starting.join(30)
        assert started and started[0].is_running
        return frozenset()

    assert services.sleep_sandbox(session.sandbox, busy, by_staff=True)
    sandbox = Sandbox.objects.get(pk=session.sandbox_id)
    assert (sandbox.status, sandbox.status_detail) == ("sleeping", Sandbox.ASLEEP_BY_STAFF)
    assert not started[0].is_running
