"""Shared fixtures: personas (owner, stranger, staff) and a private sandbox root per test."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model

from sandboxes.backends import (
    budget,
    containment,
    firewall,
    forget_backends,
    get_backend,
    network,
)
from sandboxes.runtime import runtime as sandbox_runtime
from tests.agents import agent_command

PASSWORD = "correct horse battery staple"
K8S_NAMESPACE = "craft-test"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database, and at the end of the run no connection left to it.

    PostgreSQL refuses to drop a database that a connection still uses (it waits 5 s). A
    server process of the suite stopped at the last moment can leave its connections behind
    for a while longer, until their backends notice: wait for them, 30 s. One of another
    process still there then is a leak: it is ended, so that the database can go, and the run
    fails naming it (servers of the suite name their connections `daphne-<port>`, as their
    logs are named). One of this process (a thread a test started, idle) is ended at once
    and named at the end of the run's output.
    """
    yield
    with django_db_blocker.unblock():
        left = end_other_connections(wait=30)
    LEFT_BY_THIS_PROCESS.extend(what for what, own in left if own)
    theirs = [what for what, own in left if not own]
    if theirs:
        pytest.fail(f"connections to the test database outlived the run by 30 s: {theirs}")


LEFT_BY_THIS_PROCESS: list[str] = []


@pytest.fixture(scope="session", autouse=True)
def flush_quickly_and_again_after_a_deadlock():
    """Empty the tables after each test quickly, and again when PostgreSQL chose the flush
    as a deadlock's victim.

    A server a test started (a module's, for its browser tests) keeps working while the
    tables are emptied after each test: its event writer or housekeeping can hold one table
    and wait for another that the flush holds. PostgreSQL then cancels one of them; when
    it is the flush, every later test would find the last one's rows (a duplicate user).
    """
    from django.core.management.commands import flush as flush_command
    from django.db.backends.postgresql.operations import DatabaseOperations
    from django.db.utils import OperationalError

    flush = DatabaseOperations.execute_sql_flush

    def execute_sql_flush(self, sql_list):
        for attempt in range(5):
            try:
                return flush(self, sql_list)
            except OperationalError as error:
                if "deadlock detected" not in str(error) or attempt == 4:
                    raise
                time.sleep(0.2)

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if not tables or reset_sequences or allow_cascade:
            return truncate(self, style, tables, reset_sequences=reset_sequences,
                            allow_cascade=allow_cascade)  # fmt: skip
        # DELETE, not TRUNCATE: a TRUNCATE makes new files for each of the tables, which
        # took about 0.1 s after every test. The lock is TRUNCATE's (a server still writing
        # waits for the flush's commit, as it did); Django's foreign keys are checked at
        # commit, when every table is empty. The content types and permissions that the
        # migrations made stay (see `emit_post_migrate_signal` below).
        names = [self.quote_name(table) for table in tables if table not in KEPT_TABLES]
        return [f"LOCK TABLE {', '.join(names)} IN ACCESS EXCLUSIVE MODE;"] + [
            f"DELETE FROM {name};" for name in names
        ]

    truncate = DatabaseOperations.sql_flush
    DatabaseOperations.execute_sql_flush = execute_sql_flush
    DatabaseOperations.sql_flush = sql_flush
    # After each flush Django makes the content types and permissions again (0.07 s): they
    # were kept, and nothing else of Craft's listens to post_migrate.
    emit = flush_command.emit_post_migrate_signal
    flush_command.emit_post_migrate_signal = lambda *args, **kwargs: None
    yield
    DatabaseOperations.execute_sql_flush = flush
    DatabaseOperations.sql_flush = truncate
    flush_command.emit_post_migrate_signal = emit


# What the migrations made and no test changes: kept by the flush after each test.
KEPT_TABLES = {"django_content_type", "auth_permission"}


def pytest_terminal_summary(terminalreporter) -> None:
    if LEFT_BY_THIS_PROCESS:
        terminalreporter.section("connections of this process left to the test database (ended)")
        for what in LEFT_BY_THIS_PROCESS:
            terminalreporter.write_line(what)


def end_other_connections(wait: float) -> list[tuple[str, bool]]:
    """Wait up to `wait` seconds for other connections to the test database to close, then
    terminate the rest; describe each, and whether it was this process's. This process's own
    pool is closed first, and the check runs on a connection of its own, outside any pool."""
    import psycopg
    from django.db import connection

    if connection.vendor != "postgresql":
        return []
    connection.close()
    connection.close_pool()
    params = connection.settings_dict
    others = (
        "SELECT pid, client_port, application_name, state, left(query, 120)"
        " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    deadline = time.monotonic() + wait
    with psycopg.connect(
        host=params["HOST"], port=params["PORT"], user=params["USER"], dbname=params["NAME"],
        password=params["PASSWORD"] or None, autocommit=True,
    ) as check:  # fmt: skip
        while True:
            rows = check.execute(others).fetchall()
            mine = own_tcp_ports()  # this process's: they would never go by waiting
            if all(row[1] in mine for row in rows) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for pid, *_ in rows:
            check.execute("SELECT pg_terminate_backend(%s)", [pid])
    return [
        (f"{name or 'pid ' + str(pid)} ({state}: {query})", port in mine)
        for pid, port, name, state, query in rows
    ]


def own_tcp_ports() -> set[int]:
    """The local ports of this process's TCP sockets (from /proc: its descriptors' inodes)."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


# Websockets tests opened on a server (tests.server.Socket): closed after each test, so that a
# test that failed before closing its own never warns (an unclosed socket) in a later test.
OPEN_SOCKETS: weakref.WeakSet[Any] = weakref.WeakSet()


@pytest.fixture(autouse=True)
def close_sockets() -> Iterator[None]:
    yield
    for socket in list(OPEN_SOCKETS):
        socket.close()


@pytest.fixture(autouse=True)
def sandbox_root(request, tmp_path):
    """Give every test its own folder of sandboxes."""
    if not request.config.pluginmanager.has_plugin("django"):
        return None  # a Django-free module run on its own (-p no:django)
    settings = request.getfixturevalue("settings")
    settings.CRAFT_SANDBOX_ROOT = tmp_path / "sandboxes"
    settings.CRAFT_SANDBOX_BACKEND = "local"
    forget_backends()
    return settings.CRAFT_SANDBOX_ROOT


@pytest.fixture(autouse=True)
def stop_agents(request) -> Iterator[None]:
    """Let go of what the test left in the process (`craft.runtime.Runtime.reset`): its
    agents, its runners and channel-layer state (they belong to its event loop, and each
    async test has its own), and the threads holding database connections (closed before
    the test database goes). A module run without Django has only agents to stop."""
    yield
    if not request.config.pluginmanager.has_plugin("django"):
        sandbox_runtime.reset()
        return
    from craft.runtime import runtime

    runtime.reset()


@pytest.fixture
def uid_base() -> Iterator[int]:
    """A uid range of the test's own, and so a network rule and sandbox networks of its own:
    another run of the suite on this machine neither shares its uids nor replaces its
    allow-list. What the test's sandboxes left on the machine goes with it."""
    base = secrets.randbelow(1000) * 1000 + 1_100_000_000
    yield base
    network.remove_installation(base)
    firewall.remove(base)
    budget.remove(base)


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder that other users can enter, as a checkout on a server is (pytest's own
    temporary folders are private to root, where sandboxes refuse to start as root)."""
    folder = Path(tempfile.mkdtemp(prefix="craft-containment-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def machine(settings, place, uid_base):
    """A sandbox root and var folder that other users can enter, as on a real server, a uid
    range of the test's own, and the hostile agent as the agent command."""
    settings.VAR_DIR = place / "var"
    settings.VAR_DIR.mkdir()
    settings.CRAFT_SANDBOX_ROOT = settings.VAR_DIR / "sandboxes"
    python = containment.sandbox_python(uids=True)
    settings.CRAFT_AGENT_COMMAND = agent_command("hostile_agent", place / "agents", python)
    settings.CRAFT_SANDBOX_UID_BASE = uid_base
    settings.CRAFT_SANDBOX_UID_COUNT = 1000
    forget_backends()
    yield place
    # Its agents first: they live in its cgroups, which `uid_base` removes.
    sandbox_runtime.reset()
    forget_backends()


def _redis_url() -> str:
    """CRAFT_TEST_REDIS_URL, with a Redis database of its own for each xdist worker: groups
    are named by primary keys (a user's, say), which every worker's test database reuses."""
    url = urlsplit(os.environ.get("CRAFT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return url.geturl()
    base = int(url.path.strip("/") or 0)
    return url._replace(path=f"/{base + 1 + int(worker[2:])}").geturl()


REDIS_URL = _redis_url()


@pytest.fixture
def redis_layer(settings):
    """Redis as this process's channel layer, as the settings make it for REDIS_URL: signed
    with keys derived from the secret key, so other processes of the test can talk to it."""
    from channels.layers import channel_layers

    from craft.settings import channel_layer_keys

    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "craft.live.channel_layer.SignedRedisChannelLayer",
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
                "symmetric_encryption_keys": channel_layer_keys([settings.SECRET_KEY]),
            },
        }
    }
    channel_layers.backends.clear()
    yield REDIS_URL
    channel_layers.backends.clear()


@pytest.fixture
def owner(db):
    return get_user_model().objects.create_user("olivia", password=PASSWORD)


@pytest.fixture
def stranger(db):
    return get_user_model().objects.create_user("sam", password=PASSWORD)


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_superuser("stella", password=PASSWORD)


def run_concurrently(func, count: int, timeout: float = 30) -> list:
    """Call `func()` from `count` threads released together; return results (raise errors)."""
    import threading

    from django.db import connections

    barrier = threading.Barrier(count)
    results: list = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait()
            results.append(func())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def kube(tmp_path):
    """A Kubernetes API server for this test, speaking the real protocols on loopback."""
    from tests.kubeapi import KubeTestServer

    with KubeTestServer(root=tmp_path / "cluster") as server:
        server.ready_delay = 0.1
        yield server


@pytest.fixture
def kube_backend(settings, kube, tmp_path):
    """Switch the app to the kubernetes backend against `kube`; return the backend."""
    settings.CRAFT_SANDBOX_BACKEND = "kubernetes"
    settings.CRAFT_K8S_KUBECONFIG = str(kube.write_kubeconfig(tmp_path / "kubeconfig"))
    settings.CRAFT_K8S_NAMESPACE = K8S_NAMESPACE
    settings.CRAFT_K8S_POLL_INTERVAL = 0.05
    settings.CRAFT_K8S_READY_TIMEOUT = 10
    settings.CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT = 5
    # The test server runs exec'd commands on this machine: run the demo agent from here,
    # and the workspace tool as the sandbox image has it.
    settings.CRAFT_AGENT_COMMAND = [sys.executable, "-m", "sandboxes.in_sandbox.demo_agent"]
    from tests.sandboxes.kube import image_workspace_tool

    settings.CRAFT_K8S_WORKSPACE_TOOL = image_workspace_tool(tmp_path / "image-tools")
    forget_backends()
    yield get_backend("kubernetes")
    forget_backends()


@contextlib.contextmanager
def queries_in_every_thread() -> Iterator[list[tuple[str, str]]]:
    """Collect (thread name, SQL) of every query any thread runs meanwhile.

    Django's CaptureQueriesContext sees one connection, one thread's; Craft's database work
    runs on threads of its own (the event writer, the database threads).
    """
    import threading

    from django.db.backends.utils import CursorWrapper

    seen: list[tuple[str, str]] = []
    execute, executemany = CursorWrapper.execute, CursorWrapper.executemany

    def counted_execute(self, sql, params=None):
        seen.append((threading.current_thread().name, str(sql)))
        return execute(self, sql, params)

    def counted_executemany(self, sql, param_list):
        seen.append((threading.current_thread().name, str(sql)))
        return executemany(self, sql, param_list)

    # The event log writes its rows with COPY on PostgreSQL, and many sessions' events with a
    # statement bound on the server, straight on psycopg's cursors (Django's own cursors are
    # client-side ones, counted above).
    import psycopg

    copy, raw_execute = psycopg.Cursor.copy, psycopg.Cursor.execute

    def counted_copy(self, statement, *args, **kwargs):
        seen.append((threading.current_thread().name, str(statement)))
        return copy(self, statement, *args, **kwargs)

    def counted_raw_execute(self, statement, *args, **kwargs):
        if type(self) is psycopg.Cursor:
            seen.append((threading.current_thread().name, str(statement)))
        return raw_execute(self, statement, *args, **kwargs)

    CursorWrapper.execute, CursorWrapper.executemany = counted_execute, counted_executemany
    psycopg.Cursor.copy, psycopg.Cursor.execute = counted_copy, counted_raw_execute
    try:
        yield seen
    finally:
        CursorWrapper.execute, CursorWrapper.executemany = execute, executemany
        psycopg.Cursor.copy, psycopg.Cursor.execute = copy, raw_execute
