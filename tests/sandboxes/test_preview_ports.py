"""The ports a local sandbox offers for previews, and the connections Craft makes to them.

With sandbox users off (the sandbox shares this machine's network), only the sandbox's own
listening sockets count: a port some other process of this machine listens on (a database,
say) is neither offered nor reached. With users, the jail and the sandbox's own network (as
root), the namespace's ports are offered but those pasta holds for CRAFT_SANDBOX_ALLOW.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import signal
import socket

import pytest

from sandboxes import services
from sandboxes.backends import SandboxError
from tests.ports import free_port
from tests.ready import open_ready_session

from .agents import reply_text, run_turn
from .hostile import contain, needs_root

pytestmark = pytest.mark.django_db(transaction=True)


@contextlib.contextmanager
def serving(session, port: int):
    """The session's demo agent serving its app on `port` (killed afterwards by its pid,
    which is this machine's when the agent is not in a PID namespace of its own)."""
    connection = services.connect_agent(session.sandbox, session.pk)
    said = reply_text(run_turn(connection, f"serve {port}"))
    assert "I started a demo app" in said, said
    pid = int(re.search(r"\(pid (\d+)\)", said)[1])
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_without_sandbox_users_only_the_sandboxs_own_ports_are_offered_and_reached(owner):
    session = open_ready_session(owner, "ports")
    port = free_port()
    with socket.create_server(("127.0.0.1", 0)) as theirs, serving(session, port):
        other = theirs.getsockname()[1]  # listening, but not the sandbox's
        offered = services.preview_ports(session.sandbox)
        assert port in offered and other not in offered
        with services.preview_connect(session.sandbox, port, 5) as connection:
            connection.sendall(b"GET / HTTP/1.0\r\n\r\n")
            assert connection.recv(12).endswith(b" 200")
        with pytest.raises(SandboxError, match=f"port {other}"):
            services.preview_connect(session.sandbox, other, 5)


@needs_root
def test_in_the_sandboxs_network_pastas_forwarded_ports_are_not_offered(settings, machine, owner):
    contain(settings, "on")
    settings.CRAFT_AGENT_COMMAND = ["craft-demo-agent"]
    allowed = free_port()
    settings.CRAFT_SANDBOX_ALLOW = [(ipaddress.ip_address("127.0.0.1"), allowed)]
    session = open_ready_session(owner, "ports in a network of its own")
    connection = services.connect_agent(session.sandbox, session.pk)
    said = reply_text(run_turn(connection, "serve 8080"))
    assert "I started a demo app" in said, said
    # pasta listens on the allowed port in the namespace: not the sandbox's app.
    assert services.preview_ports(session.sandbox) == [8080]
    with services.preview_connect(session.sandbox, 8080, 5) as reached:
        reached.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert reached.recv(12).endswith(b" 200")
    # This machine's loopback is not the sandbox's: nothing of it is reached from there.
    with socket.create_server(("127.0.0.1", 0)) as here:
        port = here.getsockname()[1]
        with pytest.raises(SandboxError, match=f"port {port}"):
            services.preview_connect(session.sandbox, port, 5)
