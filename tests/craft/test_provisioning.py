"""Provisioning in the background: "New session" answers at once, the sandbox follows.

A real daphne on the kubernetes backend, against the test API server, whose pods take seconds
to become Ready (or fail to pull their image); the real client; the HTTP API and websockets
as a browser uses them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as kubernetes

from craft.models import Event
from sandboxes.models import Sandbox, WarmSandbox

from ..server import Daphne, Socket, api, open_session

pytestmark = pytest.mark.django_db(transaction=True)


def kubernetes_server(kube, folder: Path, **env: str) -> Daphne:
    return Daphne(
        folder,
        **env,
        CRAFT_SANDBOX_BACKEND="kubernetes",
        CRAFT_K8S_KUBECONFIG=str(kube.write_kubeconfig(folder / "kubeconfig")),
        CRAFT_K8S_NAMESPACE="craft-provisioning",
        CRAFT_K8S_POLL_INTERVAL="0.1",
        CRAFT_K8S_READY_TIMEOUT="30",
        CRAFT_AGENT_COMMAND=f"{sys.executable} -m sandboxes.in_sandbox.demo_agent",
    )


def follow_sandbox(server: Daphne, user, until: set[str], timeout: float = 30) -> list[dict]:
    """Poll GET /api/sandbox/ as the page does; return every answer up to a status in `until`."""
    seen: list[dict] = []
    deadline = time.monotonic() + timeout
    while True:
        status, body = api(server, user, "GET", "/api/sandbox/")
        assert status == 200, body
        seen.append(body)
        if body["status"] in until:
            return seen
        assert time.monotonic() < deadline, f"still {body['status']}: {seen[-3:]}"
        time.sleep(0.1)


def test_a_new_session_answers_at_once_while_its_pod_starts_then_works(kube, owner, tmp_path):
    kube.ready_delay = 3
    server = kubernetes_server(kube, tmp_path).start()
    try:
        status, session = api(server, owner, "POST", "/api/sessions/", {"title": "slow pod"})
        assert status == 201, session
        # It answered before the pod was ready: its sandbox is provisioning still, and
        # becomes running only later (below). Had it waited for the pod, it would be running.
        sandbox = Sandbox.objects.get(pk=session["sandbox"])
        assert sandbox.status == Sandbox.Status.PROVISIONING, sandbox.status_detail

        socket = Socket(server, owner, session["id"])
        assert socket.hello["sandbox"]["status"] == "provisioning"
        socket.send({"type": "resume", "after": 0})
        socket.send({"type": "prompt", "id": "early", "text": "pid", "queue": False})
        # (The sandbox's own frames may come between: skipped.)
        refused = socket.until(lambda f: f["type"] != "sandbox")[-1]
        assert refused["type"] == "error" and refused["code"] == "sandbox_starting", refused
        assert not Event.objects.filter(session_id=session["id"]).exists()  # nothing stored
        # A prompt that may wait is queued, and runs once the sandbox is ready.
        socket.send({"type": "prompt", "id": "queued", "text": "pid"})
        queued = socket.until(lambda f: f["type"] != "sandbox")[-1]
        assert (queued.get("kind"), queued.get("data")) == (
            "prompt_queued",
            {"id": "queued", "text": "pid"},
        ), queued

        progress = follow_sandbox(server, owner, {"running", "failed"})
        assert progress[-1]["status"] == "running", progress[-1]
        details = [p["detail"] for p in progress if p["status"] == "provisioning"]
        assert any(d.startswith("pod Pending") for d in details), details

        frames = socket.until(lambda f: f.get("kind") == "turn_end")  # nobody sent it again
        assert frames[-1]["data"] == {"stop_reason": "end_turn"}
        started = [f["data"]["id"] for f in frames if f.get("kind") == "user_message"]
        assert started == ["queued"]
        agents = [e for e in kube.execs if "sandboxes.in_sandbox.demo_agent" in e.argv]
        assert len(agents) == 1
        pod = f"craft-sandbox-{session['sandbox']}"
        workspace = kube.workspace("craft-provisioning", pod) / "sessions" / session["id"]
        assert workspace.is_dir()  # made by the agent's first start
        socket.close()
    finally:
        server.stop()


def test_a_prompt_queued_for_a_slow_pod_is_started_by_its_own_worker_once_the_pod_is_ready(
    kube, owner, tmp_path
):
    # Longer than a housekeeping round, which releases the leases of sessions with no agent:
    # the session waiting for its sandbox must keep its lease, or the start of its prompt is
    # refused (fenced) and it waits for the housekeeping after that one.
    kube.ready_delay = 7
    server = kubernetes_server(kube, tmp_path).start()
    try:
        status, session = api(server, owner, "POST", "/api/sessions/", {"title": "slower pod"})
        assert status == 201, session
        socket = Socket(server, owner, session["id"])
        socket.send({"type": "resume", "after": 0})
        socket.send({"type": "prompt", "id": "queued", "text": "pid"})
        frames = socket.until(lambda f: f.get("kind") == "turn_end")
        assert frames[-1]["data"] == {"stop_reason": "end_turn"}
        socket.close()
    finally:
        server.stop()
    log = server.log.read_text()
    assert "starting its queued prompts" not in log, "housekeeping had to start it"


def test_a_failed_sandbox_says_why_and_a_retry_gets_a_new_pod(kube, owner, tmp_path):
    kube.ready_delay = 0.3
    kube.image_pull_backoff = True
    server = kubernetes_server(kube, tmp_path).start()
    try:
        status, session = api(server, owner, "POST", "/api/sessions/", {})
        assert status == 201, session
        failed = follow_sandbox(server, owner, {"running", "failed"})[-1]
        assert failed["status"] == "failed"
        assert "ImagePull" in failed["error"] and "HTTP" not in failed["error"], failed

        kube.image_pull_backoff = False  # the cause is fixed: the retry must not adopt the pod
        status, retried = api(server, owner, "POST", "/api/sandbox/")
        assert status == 202 and retried["status"] == "provisioning", retried
        assert retried["id"] == failed["id"]
        assert follow_sandbox(server, owner, {"running", "failed"})[-1]["status"] == "running"
        assert api(server, owner, "POST", "/api/sandbox/")[0] == 200  # running: nothing to do

        socket = Socket(server, owner, session["id"])
        socket.send({"type": "resume", "after": 0})
        socket.send({"type": "prompt", "id": "after-retry", "text": "pid"})
        frames = socket.until(lambda f: f.get("kind") == "turn_end")
        assert frames[-1]["data"] == {"stop_reason": "end_turn"}
        socket.close()
    finally:
        server.stop()


def test_a_server_stopped_while_provisioning_leaves_no_sandbox_stuck(kube, owner, tmp_path):
    kube.ready_delay = 4
    server = kubernetes_server(kube, tmp_path).start()
    try:
        status, session = api(server, owner, "POST", "/api/sessions/", {})
        assert status == 201, session
        assert follow_sandbox(server, owner, {"provisioning"})[-1]["detail"]
        server.signal(signal.SIGTERM)
        assert server.wait(30) == 0
    finally:
        server.stop()
    sandbox = Sandbox.objects.get(pk=session["sandbox"])
    assert sandbox.status == Sandbox.Status.FAILED
    assert "restarted" in sandbox.error

    # The next server: "Start again" provisions the same sandbox, and the session works.
    server = kubernetes_server(kube, tmp_path / "again").start()
    try:
        assert api(server, owner, "POST", "/api/sandbox/")[0] == 202
        assert follow_sandbox(server, owner, {"running", "failed"})[-1]["status"] == "running"
        socket = Socket(server, owner, session["id"])
        socket.send({"type": "resume", "after": 0})
        socket.send({"type": "prompt", "id": "after-restart", "text": "pid"})
        frames = socket.until(lambda f: f.get("kind") == "turn_end")
        assert frames[-1]["data"] == {"stop_reason": "end_turn"}
        socket.close()
    finally:
        server.stop()


# How long a server stopped under load may take to exit (its graceful stop takes about a
# second on a quiet machine): past it, the attempt fails and says how long each one took.
STOPPED_WITHIN = 40


# Ten servers started and stopped, each with its own load: longer than a test's usual limit
# on a machine the rest of the suite already keeps busy.
@pytest.mark.timeout(600)
def test_a_server_stopped_while_provisioning_under_load_exits_0_ten_times(kube, owner, tmp_path):
    """SIGTERM while a provisioning thread waits on the Kubernetes API, every CPU busy
    (`stress-ng --cpu 2`, from just before the SIGTERM to the exit), ten times: daphne exits
    0 each time.

    Found under load: daphne died of SIGABRT. The provisioning thread, a daemon thread, was
    inside a call of the kubernetes client when the interpreter finalized; CPython (before
    3.14) ends such a thread with pthread_exit when it wakes, and that forced unwinding
    aborts the process at the Rust frames of pydantic's `validate_call`, which wraps every
    API call of the client. Every answer of the API server here takes a while, so that at
    each SIGTERM the thread is waiting on one. The load runs only while each server stops
    (about a second of ten): the rest of the suite, on the same cores, hardly feels it.
    """
    stress = shutil.which("stress-ng")
    if stress is None:
        pytest.skip("needs Debian's stress-ng for the load (make test installs it)")
    kube.ready_delay = 600  # the pod never becomes ready meanwhile
    kube.rest_delay = 0.2
    took: list[str] = []  # each attempt's start and stop, for a failure's message
    for attempt in range(10):
        server = kubernetes_server(kube, tmp_path / str(attempt), PYTHONFAULTHANDLER="1")
        started = time.monotonic()
        server.start()
        try:
            if attempt == 0:
                status, _ = api(server, owner, "POST", "/api/sessions/", {})
                assert status == 201
            else:  # "Start again" of the sandbox the last server abandoned
                assert api(server, owner, "POST", "/api/sandbox/")[0] == 202
            provisioning_started(server, owner)
            stopping = time.monotonic()
            with cpu_load(stress):
                server.signal(signal.SIGTERM)
                try:
                    code = server.wait(STOPPED_WITHIN)
                except subprocess.TimeoutExpired:
                    code = f"not stopped within {STOPPED_WITHIN} s"
            took.append(f"{stopping - started:.1f} s + {time.monotonic() - stopping:.1f} s")
            log = server.log.read_text()[-3000:]
            assert code == 0, f"attempt {attempt}: {code}; start + stop: {took}\n{log}"
        finally:
            server.stop()


def test_a_server_whose_provisioning_thread_never_leaves_the_backend_exits_0(owner, tmp_path):
    """A provisioning thread the shutdown cannot stop (its API never answers for good) is
    awake in the Rust frames of `validate_call` as the shutdown ends: the process ends
    there, with code 0, instead of finalizing the interpreter into a SIGABRT."""
    server = Daphne(
        tmp_path, app="tests.craft.stuck_backend:application", PYTHONFAULTHANDLER="1"
    ).start()
    try:
        status, _ = api(server, owner, "POST", "/api/sessions/", {})
        assert status == 201
        provisioning_started(server, owner)
        server.signal(signal.SIGTERM)
        code = server.wait(STOPPED_WITHIN)
        log = server.log.read_text()
        assert code == 0, f"{code}\n{log[-3000:]}"
        assert "exiting at once: 1 provisioning thread(s) still in the backend" in log
    finally:
        server.stop()
    sandbox = Sandbox.objects.get(owner=owner)
    assert sandbox.status == Sandbox.Status.FAILED
    assert "restarted" in sandbox.error


@contextlib.contextmanager
def cpu_load(stress: str) -> Iterator[None]:
    """Keep two CPUs busy (`stress-ng --cpu 2`) while the block runs."""
    load = subprocess.Popen(
        [stress, "--cpu", "2", "--timeout", "300"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its workers are stopped with it, as one group
    )
    try:
        yield
    finally:
        os.killpg(load.pid, signal.SIGKILL)
        load.wait()


def provisioning_started(server: Daphne, user, timeout: float = 60) -> None:
    """Wait until the user's sandbox is being provisioned by the backend (it said how far)."""
    deadline = time.monotonic() + timeout
    while True:
        status, body = api(server, user, "GET", "/api/sandbox/")
        assert status == 200, body
        if body["status"] == "provisioning" and body["detail"]:
            return
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


# --- the sandbox's claim: what outlives its pod --------------------------------------------

RESTORING_AGENTS = """\
[[agents]]
id = "load"
title = "Loads its sessions"
command = {load}

[[agents]]
id = "resume"
title = "Resumes its sessions"
command = {resume}
"""


def turn(socket: Socket, text: str) -> list[dict]:
    """Send a prompt; return the frames up to its turn's end."""
    socket.send({"type": "prompt", "id": f"{text}-{time.monotonic()}", "text": text})
    return socket.until(lambda f: f.get("kind") == "turn_end")


def said(frames: list[dict]) -> str:
    chunks = [f["data"] for f in frames if f.get("kind") == "agent_message_chunk"]
    return "".join(chunk["content"]["text"] for chunk in chunks)


def outline(frames: list[dict]) -> list:
    """The frames in short, for a failure's message: a long turn's whole frames are cut."""
    short: list = []
    for frame in frames:
        if frame.get("kind") == "agent_message_chunk":
            short.append(frame["data"]["content"]["text"])
        elif "kind" in frame:
            short.append((frame["kind"], frame.get("data")))
        else:
            short.append(str(frame)[:300])
    return short


def test_a_pod_that_vanished_comes_back_on_the_sandboxs_claim_with_its_files_and_memory(
    kube, owner, tmp_path
):
    """Through daphne and the real client: a new user's sandbox takes a warm pod and its
    blank claim (no pod started on the user's path); two sessions (an agent that offers
    `session/load`, one that offers only `session/resume`) leave files and memory; the pod
    is deleted behind Craft's back; the next prompts find every file and agents that
    remember; Delete removes the claim."""
    kube.ready_delay = 2
    demo = [sys.executable, "-m", "sandboxes.in_sandbox.demo_agent", "--restore"]
    catalog = tmp_path / "agents.toml"
    catalog.write_text(
        RESTORING_AGENTS.format(
            load=json.dumps(shlex.join([*demo, "load"])),
            resume=json.dumps(shlex.join([*demo, "resume"])),
        )
    )
    server = kubernetes_server(
        kube, tmp_path, CRAFT_AGENTS_FILE=str(catalog), CRAFT_K8S_WARM_SANDBOXES="1"
    ).start()
    namespace = "craft-provisioning"
    core = kubernetes.CoreV1Api(kubernetes.ApiClient(kube.configuration()))
    try:
        deadline = time.monotonic() + 30
        while not WarmSandbox.objects.filter(status=WarmSandbox.Status.READY).exists():
            assert time.monotonic() < deadline, "no warm pod"
            time.sleep(0.1)
        kube.requests.clear()
        load = open_session(server, owner, "load")
        first = turn(load, "remember the blue door")
        assert said(first) == "I will remember the blue door.", first
        # The warm pod's: no pod and no claim was created on the user's path (its speed is
        # `bench.warm`'s figure, not this test's).
        assert not [p for m, p in kube.requests if m == "POST" and p.endswith(("/pods", "claims"))]
        sandbox = Sandbox.objects.get(owner=owner)
        pod = f"craft-sandbox-{sandbox.pk}"
        claim = core.read_namespaced_persistent_volume_claim(pod, namespace)
        assert claim.metadata.labels["craft.dev/owner"] == str(owner.pk)
        assert "craft.dev/warm" not in claim.metadata.labels
        resume = open_session(server, owner, "resume")
        assert "red key" in said(turn(resume, "remember the red key"))
        load_id = load.hello["session"]
        folder = kube.workspace(namespace, pod) / "sessions" / load_id
        (folder / "kept.txt").write_text("on the claim")

        core.delete_namespaced_pod(pod, namespace)  # behind Craft's back

        frames = turn(load, "read kept.txt")
        frames += turn(load, "recall")
        restarted = [f["data"] for f in frames if f.get("kind") == "agent_restarted"]
        assert restarted == [{"restored": "load"}], outline(frames)
        assert "Read kept.txt (12 characters)." in said(frames), outline(frames)
        assert said(frames).endswith("You asked me to remember: the blue door."), outline(frames)
        assert core.read_namespaced_pod(pod, namespace).metadata.uid  # a new pod, same claim
        frames = turn(resume, "recall")
        restarted = [f["data"] for f in frames if f.get("kind") == "agent_restarted"]
        assert restarted == [{"restored": "resume"}], restarted
        assert said(frames) == "You asked me to remember: the red key.", frames
        load.close()
        resume.close()

        status, body = api(server, owner, "DELETE", "/api/sandbox/")  # Delete: files too
        assert (status, body["status"]) == (200, "terminated"), body
        assert (namespace, pod) not in kube.cluster.claims
        assert not kube.claim_folder(namespace, pod).exists()
    finally:
        server.stop()


def test_a_prompt_whose_pod_goes_before_its_agent_says_a_word_is_answered_on_the_next_pod(
    kube, owner, tmp_path
):
    """The pod is deleted behind Craft's back while its agent has the prompt and has said
    nothing of it yet (a prompt written as a pod is being deleted reaches a process about to
    die): the sandbox is set up again on its claim and the prompt answered there, once, with
    no error in the log."""
    kube.ready_delay = 1
    troubled = [sys.executable, str(Path(__file__).parents[1] / "agents" / "troubled_agent.py")]
    catalog = tmp_path / "agents.toml"
    command = json.dumps(shlex.join(troubled))
    catalog.write_text(f'[[agents]]\nid = "troubled"\ntitle = "Troubled"\ncommand = {command}\n')
    server = kubernetes_server(
        kube, tmp_path, CRAFT_AGENTS_FILE=str(catalog), CRAFT_AGENT_QUIET_SECONDS="0.5"
    ).start()
    namespace = "craft-provisioning"
    core = kubernetes.CoreV1Api(kubernetes.ApiClient(kube.configuration()))
    try:
        socket = open_session(server, owner, "troubled")
        assert said(turn(socket, "hello")) == "fine"
        session_id = socket.hello["session"]
        pod = f"craft-sandbox-{Sandbox.objects.get(owner=owner).pk}"
        folder = kube.workspace(namespace, pod) / "sessions" / session_id
        socket.send({"type": "prompt", "id": "held", "text": "quiet"})
        # Its stderr says it has the prompt; it has sent nothing of the turn.
        socket.until(lambda f: f.get("type") == "agent_stderr" and "attempt 1/5" in f["text"])

        core.delete_namespaced_pod(pod, namespace)  # behind Craft's back: the agent dies
        (folder / "next").touch()  # on the claim: the next pod's agent goes on at once
        (folder / "go").touch()

        frames = socket.until(lambda f: f.get("kind") == "turn_end")
        ends = [f["data"] for f in frames if f.get("kind") == "turn_end"]
        assert ends == [{"stop_reason": "end_turn"}], outline(frames)
        assert said(frames) == "answered at last", outline(frames)
        assert not [f for f in frames if f.get("kind") == "agent_error"], outline(frames)
        assert core.read_namespaced_pod(pod, namespace).metadata.uid  # a new pod, same claim
        kinds = list(
            Event.objects.filter(session_id=session_id)
            .order_by("seq")
            .values_list("kind", flat=True)
        )
        assert kinds.count("user_message") == 2 and kinds.count("turn_end") == 2, kinds
        assert "agent_error" not in kinds, kinds
        socket.close()
    finally:
        server.stop()
