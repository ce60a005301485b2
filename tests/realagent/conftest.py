"""Fixtures of the real-agent tests: the configuration people run, and the fake model servers
the agents talk to.

Every real agent runs as it would under `make run` as root: as a sandbox user, in the jail,
in its sandbox's own network behind the network rule, within its sandbox's budget. Its fake
model server is the one endpoint of this machine it may reach (`CRAFT_SANDBOX_ALLOW`), as
a local model server would be.
"""

from __future__ import annotations

import ipaddress

import pytest

from sandboxes.backends import forget_backends

from ..agents.fake_model import FakeModel
from ..agents.fake_vendors import FakeVendors
from ..sandboxes.hostile import contain, needs_root

pytestmark = needs_root


@pytest.fixture
def production(settings, machine):
    """Sandbox users, the jail, the sandbox's network and its budget on (the machine's
    sandbox root, a uid range of the test's own)."""
    contain(settings, "on")
    settings.CRAFT_SANDBOX_NETWORK = "isolated"
    settings.CRAFT_SANDBOX_LIMITS = "on"
    forget_backends()
    return machine


def allow(settings, port: int) -> None:
    """Let sandboxes reach 127.0.0.1:`port` of this machine (a fake model server)."""
    settings.CRAFT_SANDBOX_ALLOW = [
        *settings.CRAFT_SANDBOX_ALLOW,
        (ipaddress.ip_address("127.0.0.1"), port),
    ]
    forget_backends()  # the rule is put in place when the backend starts


@pytest.fixture
def fake_model(settings, production):
    """The fake OpenAI-compatible model (opencode, fast-agent) on a loopback port."""
    with FakeModel() as model:
        allow(settings, model.port)
        yield model


@pytest.fixture
def fake_vendors(settings, production):
    """The fake Anthropic, OpenAI Responses and Gemini APIs (Claude Code, Codex, Gemini CLI)."""
    with FakeVendors() as fake:
        allow(settings, fake.port)
        yield fake
