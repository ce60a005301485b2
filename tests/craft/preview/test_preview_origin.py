"""The preview origin's template: which hosts are previews, and the CSP source for them all."""

from __future__ import annotations

from uuid import uuid4

from craft.preview.origin import PreviewHost, PreviewOrigin
from craft.preview.passes import Pass, make_cookie, make_token, read_cookie, redeem_token


def test_a_preview_host_names_its_session_and_port_and_nothing_else_is_one():
    origin = PreviewOrigin("https://{port}-{session}.preview.example.com")
    session = uuid4()
    url = origin.url(session, 5173)
    assert url == f"https://5173-{session.hex}.preview.example.com"
    assert origin.match(url.split("://")[1]) == PreviewHost(5173, session)
    assert origin.match(url.split("://")[1].upper()) == PreviewHost(5173, session)
    for host in (
        "preview.example.com",
        "craft.example.com",
        f"5173-{session.hex}.preview.example.com.evil.com",
        f"5173-{session.hex}.preview.example.com:8443",
        f"99999-{session.hex}.preview.example.com",
        f"0-{session.hex}.preview.example.com",
        f"5173-{session}.preview.example.com",  # dashes: not the 32 hex digits
        f"x.5173-{session.hex}.preview.example.com",
    ):
        assert origin.match(host) is None, host
    assert origin.frame_source() == "https://*.preview.example.com"


def test_a_local_preview_origin_keeps_its_port():
    origin = PreviewOrigin("http://{port}-{session}.localhost:8001")
    session = uuid4()
    assert origin.match(f"8080-{session.hex}.localhost:8001") == PreviewHost(8080, session)
    assert origin.match(f"8080-{session.hex}.localhost:8000") is None
    assert origin.match(f"8080-{session.hex}.localhost") is None
    assert origin.frame_source() == "http://*.localhost:8001"


def test_a_token_is_good_once_and_a_cookie_is_not_a_token(db):
    grant = Pass(7, uuid4(), 8080, "https://craft.example.com")
    token = make_token(grant)
    assert redeem_token(token) == grant
    assert redeem_token(token) is None  # used
    cookie = make_cookie(grant)
    assert read_cookie(cookie) == grant
    assert redeem_token(cookie) is None and read_cookie(make_token(grant)) is None
    assert read_cookie(cookie[:-2] + "xx") is None
