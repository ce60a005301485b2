"""Fixtures of the sandbox tests: session workspaces on both backends."""

from __future__ import annotations

import os

import pytest

from .hostile import needs_root
from .workspaces import Workspaces, open_on

BACKENDS = [pytest.param("local", marks=needs_root), "kubernetes"]


@pytest.fixture(params=BACKENDS)
def workspace(request, settings, owner) -> Workspaces:
    return open_on(request.param, request, settings, owner)


@pytest.fixture
def local_workspace(request, settings, owner) -> Workspaces:
    if os.geteuid() != 0:
        pytest.skip("sandbox users need root")
    return open_on("local", request, settings, owner)
