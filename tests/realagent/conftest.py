"""Fixtures of the real-agent tests: the fake model servers the agents talk to."""

from __future__ import annotations

import pytest

from ..agents.fake_model import FakeModel
from ..agents.fake_vendors import FakeVendors


@pytest.fixture
def fake_model():
    """The fake OpenAI-compatible model (opencode, fast-agent) on a loopback port."""
    with FakeModel() as model:
        yield model


@pytest.fixture
def fake_vendors():
    """The fake Anthropic, OpenAI Responses and Gemini APIs (Claude Code, Codex, Gemini CLI)."""
    with FakeVendors() as fake:
        yield fake
