"""The reaper, on real agent processes, the real database and the real kubernetes client.

Each test injects the fault the reaper exists for (an agent left idle, a server that died in
the middle of provisioning, a folder or a pod removed behind Craft's back, a resource whose
row is gone) and checks what the reaper did, what it left alone and what it recorded.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone
from kubernetes.client.rest import ApiException

from craft import services as craft_services
from craft.models import QueuedPrompt, Session
from craft.session_activity import session_activity
from craft.storage.eventlog import append_events
from sandboxes import reaper, services
from sandboxes.agent.connections import agent_connections
from sandboxes.agent.protocol import PermissionRequest, TurnEnd, TurnFailed
from sandboxes.backends.kubernetes import pod_name
from sandboxes.models import ReaperAction, Sandbox
from tests.procs import gone
from tests.ready import open_ready_session, settled_sandbox

from .agents import reply_text, run_turn
from .kube import NAMESPACE

pytestmark = pytest.mark.django_db(transaction=True)

Kind = ReaperAction.Kind


def user(name: str):
    return get_user_model().objects.create_user(name, password="x")


def agent_pid(connection) -> int:
    return int(reply_text(run_turn(connection, "pid")).split()[1])


def start_turn(connection, text: str) -> tuple[threading.Event, list]:
    done, items = threading.Event(), []

    def sink(item) -> None:
        items.append(item)
        if isinstance(item, TurnEnd | TurnFailed):
            done.set()

    connection.prompt(text, sink)
    return done, items


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def start_durable_turn(session: Session, client_id: str = "p1") -> None:
    """Store a prompt: the session's turn is running (as when its agent is still starting)."""
    append_events(
        session.pk, [("user_message", {"id": client_id, "text": "hi"})], client_id=client_id
    )


def end_durable_turn(session: Session) -> None:
    append_events(session.pk, [("turn_end", {"stop_reason": "end_turn"})])


def age(sandbox: Sandbox, seconds: float) -> None:
    """Make the sandbox (and its sessions) look untouched for `seconds`."""
    then = timezone.now() - timedelta(seconds=seconds)
    Sandbox.objects.filter(pk=sandbox.pk).update(last_activity_at=then)
    Session.objects.filter(sandbox=sandbox).update(updated_at=then)


# --- idle agents --------------------------------------------------------------------------


def test_the_reaper_stops_an_idle_agent_and_spares_a_recent_one(owner, settings):
    settings.CRAFT_AGENT_IDLE_SECONDS = 0.5
    idle_session = open_ready_session(owner)
    recent_session = open_ready_session(owner)
    idle = services.connect_agent(idle_session.sandbox, idle_session.pk)
    pid = agent_pid(idle)
    time.sleep(0.6)
    recent = services.connect_agent(recent_session.sandbox, recent_session.pk)
    run_turn(recent, "hello")

    actions = reaper.stop_idle_agents(session_activity)

    assert [(a.kind, a.target) for a in actions] == [
        (Kind.STOPPED_IDLE_AGENT, f"session {idle_session.pk}")
    ]
    assert "no prompt for 0.5 s" in actions[0].reason
    assert not idle.is_running and gone(pid)
    assert recent.is_running
    assert ReaperAction.objects.get(sandbox=idle_session.sandbox).kind == Kind.STOPPED_IDLE_AGENT
    # The session goes on: its next prompt starts a new agent.
    again = services.connect_agent(idle_session.sandbox, idle_session.pk)
    assert again is not idle and reply_text(run_turn(again, "back")) == "Echo: back"


def test_the_reaper_never_stops_an_agent_in_a_turn_or_waiting_for_permission(owner, settings):
    settings.CRAFT_AGENT_IDLE_SECONDS = 0.3
    working, asking, starting = (open_ready_session(owner) for _ in range(3))
    working_agent = services.connect_agent(working.sandbox, working.pk)
    asking_agent = services.connect_agent(asking.sandbox, asking.pk)
    starting_agent = services.connect_agent(starting.sandbox, starting.pk)
    working_done, _ = start_turn(working_agent, "slow 200 0.05")
    asking_done, asked = start_turn(asking_agent, "write a.txt hello")
    wait_until(lambda: any(isinstance(item, PermissionRequest) for item in asked))
    # The third session's turn has started in the log, but its agent has no ACP turn yet
    # (the runner is between storing the prompt and sending it).
    start_durable_turn(starting)
    time.sleep(0.4)  # all three are "unused" for longer than the idle time now

    assert reaper.stop_idle_agents(session_activity) == []
    assert working_agent.is_running and asking_agent.is_running and starting_agent.is_running

    # Once their turns are over, the same pass stops them: the test above could fail.
    working_agent.cancel()
    asking_agent.cancel()
    assert working_done.wait(10) and asking_done.wait(10)
    end_durable_turn(starting)
    time.sleep(0.4)
    stopped = reaper.stop_idle_agents(session_activity)
    assert sorted(a.target for a in stopped) == sorted(
        f"session {s.pk}" for s in (working, asking, starting)
    )


def test_the_reaper_stops_the_agents_of_a_sandbox_that_is_not_running_any_more(owner):
    session = open_ready_session(owner)
    agent = services.connect_agent(session.sandbox, session.pk)
    # Another server process (or `manage.py reap`) found it gone.
    Sandbox.objects.filter(pk=session.sandbox_id).update(status=Sandbox.Status.FAILED)
    (action,) = reaper.stop_idle_agents(session_activity)
    assert (action.kind, action.reason) == (Kind.STOPPED_AGENT, "its sandbox is failed")
    assert not agent.is_running


# --- stuck sandboxes ----------------------------------------------------------------------


def test_a_sandbox_stuck_provisioning_is_reclaimed_and_the_next_session_provisions_it(
    owner, stranger, settings
):
    settings.CRAFT_SANDBOX_PROVISIONING_TIMEOUT = 60
    # A server died while provisioning: the row says `provisioning` and nobody will finish it.
    stuck = Sandbox.objects.create(
        owner=owner,
        backend="local",
        status=Sandbox.Status.PROVISIONING,
        status_detail="creating sandbox folder",
        status_changed_at=timezone.now() - timedelta(seconds=61),
    )
    # One that started provisioning a moment ago is merely slow.
    slow = Sandbox.objects.create(owner=stranger, backend="local", status="provisioning")

    report = reaper.reap_sandboxes(session_activity)

    assert [(a.kind, a.sandbox_id) for a in report.actions] == [
        (Kind.RECLAIMED_PROVISIONING, stuck.pk)
    ]
    stuck.refresh_from_db()
    assert stuck.status == Sandbox.Status.FAILED
    assert stuck.error == (
        "Setting up the sandbox did not finish within 1 min: the server doing it may have "
        "stopped. A new session sets it up again."
    )
    assert Sandbox.objects.get(pk=slow.pk).status == Sandbox.Status.PROVISIONING

    session = open_ready_session(owner)
    assert session.sandbox_id == stuck.pk
    assert Sandbox.objects.get(pk=stuck.pk).status == Sandbox.Status.RUNNING
    agent = services.connect_agent(session.sandbox, session.pk)
    assert reply_text(run_turn(agent, "hi")) == "Echo: hi"


def test_a_sandbox_stuck_terminating_is_terminated_again(kube_backend, kube, owner, settings):
    settings.CRAFT_SANDBOX_TERMINATING_TIMEOUT = 0.2
    sandbox = services.provision_sandbox(owner)
    kube.rest_failures = 2  # both deletes fail: it stays terminating
    assert services.terminate_sandbox(sandbox).status == Sandbox.Status.TERMINATING
    time.sleep(0.3)

    report = reaper.reap_sandboxes(session_activity)

    assert [a.kind for a in report.actions] == [Kind.RETRIED_TERMINATING]
    assert Sandbox.objects.get(pk=sandbox.pk).status == Sandbox.Status.TERMINATED
    with pytest.raises(ApiException) as missing:
        kube_backend.core.read_namespaced_pod(pod_name(sandbox), NAMESPACE)
    assert missing.value.status == 404


# --- idle sandboxes -----------------------------------------------------------------------


def test_an_idle_sandbox_is_terminated_but_never_a_used_busy_or_live_one(owner, settings):
    settings.CRAFT_SANDBOX_IDLE_SECONDS = 60
    idle, talked, turning, live = (
        open_ready_session(user(name)) for name in ("ida", "tom", "tara", "liv")
    )
    start_durable_turn(turning)
    agent = services.connect_agent(live.sandbox, live.pk)
    for session in (idle, talked, turning, live):
        age(session.sandbox, 120)
    append_events(talked.pk, [("agent_message_chunk", {"content": {"text": "still here"}})])

    report = reaper.reap_sandboxes(session_activity)

    assert [(a.kind, a.sandbox_id) for a in report.actions] == [
        (Kind.TERMINATED_IDLE, idle.sandbox_id)
    ]
    idle_for = "no session activity, running turn, queued prompt, live agent or terminal for 1 min"
    assert idle_for in report.actions[0].reason
    assert Sandbox.objects.get(pk=idle.sandbox_id).status == Sandbox.Status.TERMINATED
    assert not Path(idle.sandbox.reference).exists()
    for spared in (talked, turning, live):
        assert Sandbox.objects.get(pk=spared.sandbox_id).status == Sandbox.Status.RUNNING
    assert agent.is_running
    # The live agent was marked on its sandbox, for other processes to see.
    live_sandbox = Sandbox.objects.get(pk=live.sandbox_id)
    assert timezone.now() - live_sandbox.last_activity_at < timedelta(seconds=30)


def test_an_idle_sandbox_sleeps_but_never_a_used_busy_queued_or_live_one(owner, settings):
    settings.CRAFT_SANDBOX_SLEEP_SECONDS = 60
    idle, talked, turning, queued, live = (
        open_ready_session(user(name)) for name in ("ida", "tom", "tara", "quinn", "liv")
    )
    (Path(idle.sandbox.reference) / "home" / "notes.txt").write_text("kept")
    start_durable_turn(turning)
    QueuedPrompt.objects.create(session=queued, client_id="q1", position=1, text="later")
    agent = services.connect_agent(live.sandbox, live.pk)
    for session in (idle, talked, turning, queued, live):
        age(session.sandbox, 120)
    append_events(talked.pk, [("agent_message_chunk", {"content": {"text": "still here"}})])

    report = reaper.reap_sandboxes(session_activity)

    assert [(a.kind, a.sandbox_id) for a in report.actions] == [(Kind.SLEPT_IDLE, idle.sandbox_id)]
    assert "its files are kept" in report.actions[0].reason
    asleep = Sandbox.objects.get(pk=idle.sandbox_id)
    assert (asleep.status, asleep.status_detail) == ("sleeping", Sandbox.ASLEEP_IDLE)
    assert (Path(idle.sandbox.reference) / "home" / "notes.txt").read_text() == "kept"
    for spared in (talked, turning, queued, live):
        assert Sandbox.objects.get(pk=spared.sandbox_id).status == Sandbox.Status.RUNNING
    assert agent.is_running

    # Asleep past CRAFT_SANDBOX_IDLE_SECONDS it is deleted, its files with it.
    settings.CRAFT_SANDBOX_IDLE_SECONDS = 600
    age(asleep, 700)
    report = reaper.reap_sandboxes(session_activity)
    assert [(a.kind, a.sandbox_id) for a in report.actions] == [
        (Kind.TERMINATED_IDLE, idle.sandbox_id)
    ]
    assert Sandbox.objects.get(pk=idle.sandbox_id).status == Sandbox.Status.TERMINATED
    assert not Path(idle.sandbox.reference).exists()


def test_a_turn_stored_while_the_sandbox_falls_asleep_keeps_it_awake(owner):
    session = open_ready_session(owner)
    sandbox = Sandbox.objects.get(pk=session.sandbox_id)

    def a_turn_comes_in():  # between the sleep's claim and its second look
        start_durable_turn(session)
        return session_activity.busy().sandboxes

    assert not services.sleep_sandbox(sandbox, a_turn_comes_in, idle_since=sandbox.last_activity_at)
    assert Sandbox.objects.get(pk=sandbox.pk).status == Sandbox.Status.RUNNING


def test_a_sandbox_wakes_only_once_it_is_asleep(owner):
    session = open_ready_session(owner)
    sandbox = Sandbox.objects.get(pk=session.sandbox_id)
    woken_early = []

    def a_prompt_comes_in():  # while its agents are stopped and its pod deleted
        woken_early.append(services.request_sandbox(owner).status)
        return frozenset()

    assert services.sleep_sandbox(sandbox, a_prompt_comes_in)

    assert woken_early == [Sandbox.Status.SLEEPING]  # not claimed: it was falling asleep
    assert services.request_sandbox(owner).status == Sandbox.Status.PROVISIONING
    assert Sandbox.objects.get(pk=sandbox.pk).status_detail.startswith(Sandbox.WAKING)


def test_sandboxes_are_never_terminated_for_idleness_by_default(owner):
    session = open_ready_session(owner)
    age(session.sandbox, 86400 * 365)
    assert reaper.reap_sandboxes(session_activity).actions == []
    assert Sandbox.objects.get(pk=session.sandbox_id).status == Sandbox.Status.RUNNING


# --- orphans ------------------------------------------------------------------------------


def test_orphan_folders_are_removed_and_live_ones_kept(owner, stranger, sandbox_root):
    live = open_ready_session(owner).sandbox
    (sandbox_root / ".craft" / "bin").mkdir(parents=True, exist_ok=True)  # the server's own
    nobodys = sandbox_root / str(uuid.uuid4())  # a folder whose row was deleted
    (nobodys / "sessions").mkdir(parents=True)
    (nobodys / "sessions" / "notes.txt").write_text("left behind")
    terminated = services.provision_sandbox(stranger)
    services.terminate_sandbox(terminated)
    Path(terminated.reference, "home").mkdir(parents=True)  # its removal half failed
    # Checkpoint stores whose sandbox is gone (their removal failed), and a live one's.
    stores = sandbox_root / ".craft" / "checkpoints"
    (stores / str(terminated.pk) / "a-session").mkdir(parents=True)
    (stores / str(live.pk) / "a-session").mkdir(parents=True)

    report = reaper.reap_sandboxes(session_activity)

    removed = {(a.target, a.sandbox_id, a.reason) for a in report.actions}
    assert removed == {
        (f"folder {nobodys}", None, "no sandbox of this site owns it (its row is gone)"),
        (f"folder {terminated.reference}", terminated.pk, "its sandbox is terminated"),
        (f"checkpoints {stores / str(terminated.pk)}", terminated.pk, "its sandbox is terminated"),
    }
    assert not nobodys.exists() and not Path(terminated.reference).exists()
    assert not (stores / str(terminated.pk)).exists() and (stores / str(live.pk)).is_dir()
    assert Path(live.reference).is_dir()
    assert (sandbox_root / ".craft" / "bin").is_dir()


def test_an_orphan_pod_service_and_claim_are_removed_and_live_ones_kept(kube_backend, kube, owner):
    live = services.provision_sandbox(owner)
    ghost = Sandbox(id=uuid.uuid4(), owner=owner, backend="kubernetes")  # never saved
    kube_backend.core.create_namespaced_persistent_volume_claim(
        NAMESPACE, kube_backend.claim_manifest(ghost)
    )
    kube_backend.core.create_namespaced_pod(NAMESPACE, kube_backend.pod_manifest(ghost))
    kube_backend.core.create_namespaced_service(NAMESPACE, kube_backend.service_manifest(ghost))
    stranger_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "not-ours", "labels": {"app": "else"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    kube_backend.core.create_namespaced_pod(NAMESPACE, stranger_pod)

    report = reaper.reap_sandboxes(session_activity)

    assert sorted(a.target for a in report.actions) == [
        f"claim {pod_name(ghost)}",
        f"pod {pod_name(ghost)}",
        f"service {pod_name(ghost)}",
    ]
    for read in (
        kube_backend.core.read_namespaced_pod,
        kube_backend.core.read_namespaced_service,
        kube_backend.core.read_namespaced_persistent_volume_claim,
    ):
        with pytest.raises(ApiException) as missing:
            read(pod_name(ghost), NAMESPACE)
        assert missing.value.status == 404
    kube_backend.core.read_namespaced_persistent_volume_claim(pod_name(live), NAMESPACE)
    kube_backend.core.read_namespaced_pod(pod_name(live), NAMESPACE)
    kube_backend.core.read_namespaced_service(pod_name(live), NAMESPACE)
    kube_backend.core.read_namespaced_pod("not-ours", NAMESPACE)


# --- vanished sandboxes -------------------------------------------------------------------


def assert_human(message: str) -> None:
    for raw in ("-+-+-", "content-type", "Traceback", "Exception(", "HTTPResponse"):
        assert raw not in message, message


def test_a_sandbox_whose_pod_vanished_is_marked_failed_and_the_next_session_reprovisions_it(
    kube_backend, kube, owner
):
    first = open_ready_session(owner)
    agent = services.connect_agent(first.sandbox, first.pk)
    run_turn(agent, "write kept.txt on the claim", answer="allow")
    # Deleted through the API server, behind Craft's back (kubectl delete pod, say).
    kube_backend.core.delete_namespaced_pod(pod_name(first.sandbox), NAMESPACE)
    wait_until(lambda: not agent.is_running)

    report = reaper.reap_sandboxes(session_activity)

    assert [a.kind for a in report.actions] == [Kind.MARKED_GONE]
    sandbox = Sandbox.objects.get(pk=first.sandbox_id)
    assert sandbox.status == Sandbox.Status.FAILED
    assert sandbox.error == (
        "The sandbox's pod is gone (found by the reaper). Your next message sets the sandbox "
        "up again."
    )
    assert_human(sandbox.error)

    second = open_ready_session(owner)
    assert second.sandbox_id == sandbox.pk
    assert Sandbox.objects.get(pk=sandbox.pk).status == Sandbox.Status.RUNNING
    kube_backend.core.read_namespaced_pod(pod_name(sandbox), NAMESPACE)
    agent = services.connect_agent(second.sandbox, second.pk)
    assert reply_text(run_turn(agent, "new pod")) == "Echo: new pod"
    # The new pod is on the sandbox's claim: the first session's files are all there.
    agent = services.connect_agent(second.sandbox, first.pk)
    assert reply_text(run_turn(agent, "read kept.txt")) == "Read kept.txt (12 characters)."


def test_a_prompt_in_a_sandbox_whose_pod_vanished_fails_in_words_and_marks_it_failed(
    kube_backend, kube, owner
):
    session = open_ready_session(owner)
    kube_backend.core.delete_namespaced_pod(pod_name(session.sandbox), NAMESPACE)

    with pytest.raises(services.SandboxUnavailable) as failure:
        services.connect_agent(session.sandbox, session.pk)

    assert str(failure.value) == (
        "The sandbox's pod is gone (found when starting an agent). Your next message sets the "
        "sandbox up again."
    )
    assert Sandbox.objects.get(pk=session.sandbox_id).status == Sandbox.Status.FAILED
    assert open_ready_session(owner).sandbox.status == Sandbox.Status.RUNNING


def test_a_local_sandbox_whose_folder_vanished_is_marked_failed_and_reprovisioned(owner):
    first = open_ready_session(owner)
    agent = services.connect_agent(first.sandbox, first.pk)
    shutil.rmtree(first.sandbox.reference)  # behind Craft's back

    report = reaper.reap_sandboxes(session_activity)

    assert [a.kind for a in report.actions] == [Kind.MARKED_GONE]
    sandbox = Sandbox.objects.get(pk=first.sandbox_id)
    assert sandbox.status == Sandbox.Status.FAILED
    assert sandbox.error == (
        "The sandbox's folder is gone (found by the reaper). Your next message sets the sandbox up "
        "again."
    )
    assert not agent.is_running, "its agent lost its folder and was stopped"

    second = open_ready_session(owner)
    assert second.sandbox_id == sandbox.pk
    assert Path(sandbox.reference).is_dir()
    agent = services.connect_agent(second.sandbox, second.pk)
    assert reply_text(run_turn(agent, "new folder")) == "Echo: new folder"


def test_opening_a_session_in_a_sandbox_whose_folder_vanished_provisions_it_again(owner):
    first = open_ready_session(owner)
    shutil.rmtree(first.sandbox.reference)
    second = craft_services.open_session(owner)  # no reaper pass in between
    assert second.sandbox_id == first.sandbox_id
    assert settled_sandbox(second.sandbox_id).status == Sandbox.Status.RUNNING
    assert Path(first.sandbox.reference).is_dir()
    action = ReaperAction.objects.get(sandbox=first.sandbox)
    assert action.kind == Kind.MARKED_GONE
    assert "found when opening a session" in action.reason


def test_a_sandbox_with_a_running_turn_is_not_marked_even_if_its_folder_vanished(owner):
    session = open_ready_session(owner)
    start_durable_turn(session)
    shutil.rmtree(session.sandbox.reference)
    assert reaper.reap_sandboxes(session_activity).actions == []
    assert Sandbox.objects.get(pk=session.sandbox_id).status == Sandbox.Status.RUNNING
    end_durable_turn(session)
    assert [a.kind for a in reaper.reap_sandboxes(session_activity).actions] == [Kind.MARKED_GONE]


# --- manage.py reap -----------------------------------------------------------------------


def test_manage_py_reap_reaps_once_and_says_what_it_did(owner, sandbox_root, capsys):
    open_ready_session(owner)
    orphan = sandbox_root / str(uuid.uuid4())
    orphan.mkdir()
    call_command("reap")
    out = capsys.readouterr().out
    assert f"removed an orphan folder {orphan}: no sandbox of this site owns it" in out
    assert not orphan.exists()
    call_command("reap")
    assert capsys.readouterr().out.strip() == "nothing to reap"
    assert agent_connections.count() == 0
