"""`make run-cluster`: daphne workers behind HAProxy on PostgreSQL and Redis, tried as a person
would: chat through the proxy, kill the worker that runs the agent, chat on."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import websocket
from django.conf import settings

from craft.models import Lease
from tests.conftest import REDIS_URL
from tests.ready import open_ready_session

from .craft.wsclient import session_cookie
from .ports import free_port

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = Path(settings.BASE_DIR) / "deploy" / "cluster" / "run.py"


@pytest.fixture
def cluster(tmp_path):
    if not (shutil.which("haproxy") or Path("/usr/sbin/haproxy").exists()):
        pytest.fail("haproxy is missing: `make test` installs Debian's haproxy")
    db = settings.DATABASES["default"]
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": REDIS_URL,
        "CRAFT_VAR_DIR": str(tmp_path / "var"),
        "CRAFT_SANDBOX_ROOT": str(settings.CRAFT_SANDBOX_ROOT),
        "CRAFT_SESSION_LEASE_SECONDS": "3",
        "PYTHONUNBUFFERED": "1",
    }
    log = (tmp_path / "cluster.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--port", str(port),
         "--worker-ports", f"{free_port()},{free_port()}"],
        env=env, cwd=settings.BASE_DIR, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,  # a process group: nothing of it outlives a failed stop
    )  # fmt: skip
    deadline = time.monotonic() + 90
    text = ""
    while "Serving Craft" not in text:
        text = (tmp_path / "cluster.log").read_text(errors="replace")
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the cluster did not start:\n{text[-3000:]}")
        time.sleep(0.2)
    pids = [int(p) for p in re.findall(r"worker pid (\d+)", text)]
    yield port, pids, tmp_path / "cluster.log"
    try:
        stop_cluster(process, tmp_path / "cluster.log")
    finally:
        log.close()


def stop_cluster(process: subprocess.Popen[bytes], log: Path) -> None:
    """Ctrl-C the cluster as a person would; it must be all gone within 90 s.

    When it is not, every process of it is killed (none is left to hold the test database)
    and the failure shows the end of its log, which times each process's stop.
    """
    process.send_signal(signal.SIGINT)
    try:
        process.wait(90)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        tail = log.read_text(errors="replace")[-4000:]
        raise AssertionError(f"the cluster did not stop within 90 s:\n{tail}") from None


def ask_pid(ws, prompt_id: str) -> str:
    """Return the agent's answer to `pid` (its process id and token), once its turn ended:
    a prompt sent before that would be refused with turn_running."""
    ws.send(json.dumps({"type": "prompt", "id": prompt_id, "text": "pid"}))
    mine = False
    answer = None
    while True:
        frame = json.loads(ws.recv())
        assert frame["type"] != "error", frame
        if frame.get("kind") == "user_message" and frame["data"]["id"] == prompt_id:
            mine = True
        if mine and frame.get("kind") == "agent_message_chunk":
            answer = frame["data"]["content"]["text"]
        if mine and frame.get("kind") == "turn_end":
            assert answer is not None, "the turn ended without the agent's answer"
            return answer


def test_a_session_works_through_the_proxy_and_survives_its_worker(cluster, owner):
    port, worker_pids, log = cluster
    session = open_ready_session(owner, "cluster")
    cookie = session_cookie(owner)

    def connect():
        ws = websocket.create_connection(
            f"ws://127.0.0.1:{port}/ws/sessions/{session.pk}/",
            header=[f"Cookie: {cookie}"], origin=f"http://127.0.0.1:{port}", timeout=30,
        )  # fmt: skip
        hello = json.loads(ws.recv())
        ws.send(json.dumps({"type": "resume", "after": hello["last_seq"]}))
        return ws

    # Round-robin: two connections land on the two workers; one agent serves both.
    first, second = connect(), connect()
    pid = ask_pid(first, "a")
    assert ask_pid(second, "b") == pid
    owner_pid = int(Lease.objects.get(session=session).owner.split("/")[1])
    assert owner_pid in worker_pids
    first.close()
    second.close()
    # The worker that runs the agent dies; the proxy and the other worker carry on.
    os.kill(owner_pid, signal.SIGKILL)
    ws = connect()
    assert ask_pid(ws, "c") != pid, "a new agent, in the surviving worker"
    ws.close()
    deadline = time.monotonic() + 30
    while "restarting it" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, "the dead worker is started again"
        time.sleep(0.2)


def test_run_cluster_brings_its_own_redis_and_postgresql_that_ask_for_passwords(tmp_path):
    """Without DATABASE_URL and REDIS_URL, the cluster runs its own services, with passwords:
    an agent on this machine that got past the network rule would still need them."""
    import psycopg
    import redis

    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env = {**env, "CRAFT_VAR_DIR": str(tmp_path / "var"), "PYTHONUNBUFFERED": "1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    log_path = tmp_path / "cluster.log"
    pg_data: Path | None = None
    # Started with SIGINT ignored, as a background job of a script is: Ctrl-C stops it anyway.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    with log_path.open("wb") as log:
        try:
            process = subprocess.Popen(
                [sys.executable, str(SCRIPT), "--port", str(free_port()),
                 "--worker-ports", str(free_port())],
                env=env, cwd=settings.BASE_DIR, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        finally:
            signal.signal(signal.SIGINT, previous)
        try:
            deadline = time.monotonic() + 120
            while "Serving Craft" not in (text := log_path.read_text(errors="replace")):
                assert process.poll() is None and time.monotonic() < deadline, text[-3000:]
                time.sleep(0.2)
            pg_port = int(re.search(r"PostgreSQL on 127\.0\.0\.1:(\d+)", text).group(1))
            # Kept between runs of one cluster folder; this one's folder goes with the test.
            pg_data = Path(re.search(r"PostgreSQL on \S+, data in (\S+) ", text).group(1))
            redis_port = int(re.search(r"Redis on 127\.0\.0\.1:(\d+)", text).group(1))
            var = tmp_path / "var"
            pg_password = (var / "postgres-password").read_text().strip()
            redis_password = (var / "redis-password").read_text().strip()

            with pytest.raises(psycopg.OperationalError, match="password"):
                psycopg.connect(host="127.0.0.1", port=pg_port, user="craft", dbname="craft")
            with psycopg.connect(
                host="127.0.0.1", port=pg_port, user="craft", dbname="craft",
                password=pg_password,
            ) as conn:  # fmt: skip
                assert conn.execute("SELECT count(*) FROM auth_user").fetchone() == (1,)
            with pytest.raises(redis.AuthenticationError):
                redis.Redis(port=redis_port).ping()
            assert redis.Redis(port=redis_port, password=redis_password).ping()
        finally:
            stop_cluster(process, log_path)
            if pg_data is not None:
                shutil.rmtree(pg_data, ignore_errors=True)
    for port in (pg_port, redis_port):  # the services stop with the cluster
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
