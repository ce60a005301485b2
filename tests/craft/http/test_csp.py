"""Every HTML page carries the strict Content-Security-Policy (scripts and styles from Craft's
own files only, no inline code, no framing, the websocket origin allowed); JSON does not need
one. That the pages work under it is shown in Chromium by every browser test, which fails on
any violation (tests/browser/conftest.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse

from tests.ready import open_ready_session

pytestmark = pytest.mark.django_db(transaction=True)

STRICT = {
    "default-src": ["'none'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'"],
    "font-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'none'"],
    "frame-ancestors": ["'none'"],
    "form-action": ["'self'"],
    "connect-src": ["'self'", "ws://testserver"],
}


def directives(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    return {name: rest for name, *rest in (part.split() for part in header.split(";"))}


def test_the_sign_in_page_has_the_policy(client):
    response = client.get(reverse("login"))
    assert response.status_code == 200
    assert directives(response) == STRICT


def test_the_home_session_and_admin_pages_have_the_policy(client, staff):
    session = open_ready_session(staff, "csp")
    client.force_login(staff)
    pages = [
        reverse("home"),
        reverse("session", args=[session.pk]),
        reverse("admin:index"),
        reverse("admin:sandboxes_sandbox_changelist"),
        reverse("admin:craft_session_change", args=[session.pk]),
        reverse("admin:auth_user_change", args=[staff.pk]),
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url
        assert directives(response) == STRICT, url
    # htmx fragments are HTML too.
    assert directives(client.get(reverse("session_list"))) == STRICT


def test_over_https_the_websocket_origin_is_wss(client, owner):
    client.force_login(owner)
    response = client.get(reverse("home"), secure=True)
    assert directives(response)["connect-src"] == ["'self'", "wss://testserver"]


def test_with_previews_on_only_the_preview_origin_may_be_framed(client, owner, settings):
    settings.CRAFT_PREVIEW_ORIGIN = "https://{port}-{session}.preview.example.com"
    client.force_login(owner)
    response = client.get(reverse("home"))
    assert directives(response) == {**STRICT, "frame-src": ["https://*.preview.example.com"]}


def test_error_pages_have_it_and_only_django_s_debug_pages_go_without(client, settings):
    assert directives(client.get("/no/such/page/")) == STRICT
    settings.DEBUG = True  # its technical 404 page is inline styles
    assert "Content-Security-Policy" not in client.get("/no/such/page/")


def test_json_answers_go_without(client, owner):
    client.force_login(owner)
    response = client.get("/api/sessions/")
    assert response["Content-Type"] == "application/json"
    assert "Content-Security-Policy" not in response


def test_no_template_has_inline_code():
    """What the policy refuses must not be in the templates: inline scripts, event handler
    attributes, style attributes or <style> elements, javascript: links."""
    inline = re.compile(
        r"<script(?![^>]*\bsrc=)[^>]*>|\son[a-z]+\s*=|\sstyle\s*=|<style\b|javascript:", re.I
    )
    for template in Path(settings.BASE_DIR, "templates").rglob("*.html"):
        found = inline.findall(template.read_text())
        assert not found, f"{template}: {found}"
