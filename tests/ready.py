"""Sessions ready for a prompt, for tests that are not about provisioning.

A request opens a session at once and provisions its sandbox in the background
(`sandboxes.services.request_sandbox`); tests that prompt right away provision first, on
their own thread, the way that background thread does.
"""

from __future__ import annotations

import time

from django.contrib.auth.models import User

from craft import services as craft_services
from craft.models import Session
from sandboxes import services as sandbox_services
from sandboxes.models import Sandbox


def open_ready_session(user: User, title: str = "") -> Session:
    """Provision the user's sandbox (blocking), then open a session in it."""
    sandbox_services.provision_sandbox(user)
    return craft_services.open_session(user, title)


def settled_sandbox(sandbox_id: object, timeout: float = 30) -> Sandbox:
    """Wait for a sandbox provisioning in the background to end; return it, running or failed."""
    deadline = time.monotonic() + timeout
    while (sandbox := Sandbox.objects.get(pk=sandbox_id)).status == Sandbox.Status.PROVISIONING:
        assert time.monotonic() < deadline, f"sandbox still provisioning: {sandbox.status_detail}"
        time.sleep(0.02)
    return sandbox


def running_sandbox(user: User, timeout: float = 30) -> Sandbox:
    """Wait for the user's live sandbox to be running (one provisioning in the background,
    say); return it."""
    deadline = time.monotonic() + timeout
    while True:
        sandbox = Sandbox.objects.live().owned_by(user).first()
        if sandbox is not None and sandbox.status == Sandbox.Status.RUNNING:
            return sandbox
        assert time.monotonic() < deadline, "sandbox not running"
        time.sleep(0.05)
