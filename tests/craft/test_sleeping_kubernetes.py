"""Sleeping sandboxes on the Kubernetes backend, against the test API server with the real
`kubernetes` client, through daphne: an idle sandbox's pod is deleted and its volume kept, the
next prompt wakes it on the same volume (files and the agent's memory there), a running turn
keeps it awake, and two workers that both try to put it to sleep and wake it do each once.
"""

from __future__ import annotations

import shlex
import sys
import threading
import time
from typing import Any

import pytest
from django.utils import timezone
from kubernetes.client.rest import ApiException

from sandboxes.backends.kubernetes import KubernetesBackend, pod_name
from sandboxes.in_sandbox import demo_agent
from sandboxes.models import ReaperAction, Sandbox

from ..server import Daphne, Socket, api, ask
from .cluster.test_workers import redis_url  # noqa: F401 (a fixture)
from .test_sleeping import QUICK_SLEEP, put_file, read_file, sandbox_of, wait_for_status

pytestmark = pytest.mark.django_db(transaction=True)

NAMESPACE = "craft-sleeping"


def kube_env(kube: Any, tmp_path: Any, settings: Any) -> dict[str, str]:
    return {
        "CRAFT_SANDBOX_BACKEND": "kubernetes",
        "CRAFT_K8S_KUBECONFIG": str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
        "CRAFT_K8S_NAMESPACE": NAMESPACE,
        "CRAFT_K8S_POLL_INTERVAL": "0.05",
        "CRAFT_K8S_READY_TIMEOUT": "30",
        # The checkout's own file (`-m` would import the package the virtualenv points at).
        "CRAFT_AGENT_COMMAND": f"{sys.executable} {demo_agent.__file__}",
        # The sandbox image's tools, as the test API server's pods see them (`kube_backend`).
        "CRAFT_K8S_WORKSPACE_TOOL": shlex.join(settings.CRAFT_K8S_WORKSPACE_TOOL),
        "CRAFT_K8S_GIT_TOOL": shlex.join(settings.CRAFT_K8S_GIT_TOOL),
        **QUICK_SLEEP,
    }


def pod_exists(kube_backend: KubernetesBackend, sandbox_id: str) -> bool:
    sandbox = Sandbox.objects.get(pk=sandbox_id)
    try:
        kube_backend.core.read_namespaced_pod(pod_name(sandbox), NAMESPACE)
    except ApiException as exc:
        assert exc.status == 404, exc
        return False
    return True


def scheduled(kube: Any, pod: str) -> int:
    """Return how many pods named `pod` were scheduled (made) so far."""
    events = kube.cluster.list_events(NAMESPACE)
    return sum(e["reason"] == "Scheduled" and e["involvedObject"]["name"] == pod for e in events)


def open_socket(server: Daphne, user: Any) -> Socket:
    status, session = api(server, user, "POST", "/api/sessions/", {})
    assert status == 201, session
    sock = Socket(server, user, session["id"])
    sock.send({"type": "resume", "after": 0})
    return sock


def test_a_sleeping_pod_is_deleted_and_the_next_prompt_wakes_it_on_the_same_volume(
    kube, kube_backend, tmp_path, settings, owner
):
    settings.CRAFT_K8S_NAMESPACE = NAMESPACE
    server = Daphne(tmp_path, **kube_env(kube, tmp_path, settings)).start()
    try:
        sock = open_socket(server, owner)
        session_id = sock.hello["session"]
        wait_for_status(server, owner, "running")
        # A turn longer than the sleep time keeps the sandbox (and its pod) awake.
        sock.send({"type": "prompt", "id": "long", "text": "slow 12 0.5"})
        statuses = {
            sandbox_of(server, owner)["status"]
            for frame in sock.until(lambda f: f.get("kind") == "turn_end")
            if frame.get("kind") == "agent_message_chunk"
        }
        assert statuses == {"running"}
        assert "pelican" in ask(sock, "remember pelican")
        assert put_file(server, owner, session_id, "notes/plan.txt", b"kept across sleep") == 201

        asleep = wait_for_status(server, owner, "sleeping")

        assert not pod_exists(kube_backend, asleep["id"])
        claim = kube_backend.core.read_namespaced_persistent_volume_claim(
            pod_name(Sandbox.objects.get(pk=asleep["id"])), NAMESPACE
        )
        assert claim.metadata.deletion_timestamp is None  # the volume stays while it sleeps
        assert "pelican" in ask(sock, "recall")  # woken: a new pod, the agent's session loaded
        restarted = [e["data"] for e in sock.events if e["kind"] == "agent_restarted"]
        assert restarted and restarted[-1]["restored"] in ("resume", "load"), restarted
        assert pod_exists(kube_backend, asleep["id"])
        assert read_file(server, owner, session_id, "notes/plan.txt") == b"kept across sleep"
        sock.close()
    finally:
        server.terminate(timeout=30)


def test_two_workers_put_one_sandbox_to_sleep_once_and_wake_it_once(
    kube,
    kube_backend,
    tmp_path,
    settings,
    owner,
    redis_url,  # noqa: F811
):
    settings.CRAFT_K8S_NAMESPACE = NAMESPACE
    env = {**kube_env(kube, tmp_path, settings), "REDIS_URL": redis_url}
    first, second = (Daphne(tmp_path, **env).start() for _ in range(2))
    try:
        socks = [open_socket(first, owner), open_socket(second, owner)]
        # (No wait for "running": on a loaded machine the idle sandbox may fall asleep, 2 s
        # after it is up, before the first prompt, which then wakes it.)
        for index, sock in enumerate(socks):
            assert "pelican" in ask(sock, f"remember pelican{index}")
        answered = timezone.now()
        pod = pod_name(Sandbox.objects.get(owner=owner))
        created = scheduled(kube, pod)

        asleep = wait_for_status(first, owner, "sleeping")  # both reapers try

        sandbox = Sandbox.objects.get(pk=asleep["id"])
        slept = sandbox.reaper_actions.filter(kind=ReaperAction.Kind.SLEPT_IDLE, at__gte=answered)
        # The reaper records its action just after the sandbox is asleep: wait for it.
        deadline = time.monotonic() + 10
        while not slept.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert slept.count() == 1, list(slept)  # one sleep for the idle time after the answers
        answers: dict[int, str] = {}

        def recall(index: int) -> None:  # both at once, each session on its own worker
            answers[index] = ask(socks[index], "recall")

        threads = [threading.Thread(target=recall, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)

        assert answers == {0: answers[0], 1: answers[1]}
        assert "pelican0" in answers[0] and "pelican1" in answers[1], answers
        assert Sandbox.objects.get(pk=sandbox.pk).status == Sandbox.Status.RUNNING
        assert pod_exists(kube_backend, asleep["id"])
        assert scheduled(kube, pod) == created + 1  # woken once: one new pod
        for sock in socks:
            prompts = [e["data"]["text"] for e in sock.events if e["kind"] == "user_message"]
            assert prompts.count("recall") == 1
            sock.close()
    finally:
        for server in (first, second):
            server.terminate(timeout=30)
