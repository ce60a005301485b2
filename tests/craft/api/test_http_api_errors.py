"""Every error under /api/ is the documented JSON shape, including the ones Django makes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from django.test import Client
from django.urls import path

from craft.urls import urlpatterns

from ...embedded import embedded_env, serve
from .test_http_api import send

pytestmark = pytest.mark.django_db(transaction=True)

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture
def api(owner):
    client = Client(enforce_csrf_checks=True, raise_request_exception=False)
    client.force_login(owner)
    client.get("/accounts/login/")
    client.csrf = client.cookies["csrftoken"].value
    return client


def assert_error(response, status, code):
    assert response.status_code == status
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code, body
    return body["error"]["message"]


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize(
    "url", ["/api/sessions/not-a-uuid/", "/api/sessions/12345/events/", "/api/nothing/", "/api/"]
)
def test_unknown_api_paths_are_404_json(api, settings, debug, url):
    settings.DEBUG = debug
    assert url in assert_error(api.get(url), 404, "not_found")


def test_a_method_the_endpoint_does_not_take_is_405_json(api):
    response = send(api, "put", "/api/sessions/", {})
    assert_error(response, 405, "method_not_allowed")
    assert response["Allow"] == "GET, POST"


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/x-www-form-urlencoded", "text/plain"]
)
def test_an_oversized_body_is_413_json_before_anything_reads_it(api, settings, content_type):
    body = "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    response = api.post(
        "/api/sessions/", body, content_type=content_type, HTTP_X_CSRFTOKEN=api.csrf
    )
    assert "larger than" in assert_error(response, 413, "too_large")


def test_json_nested_100000_deep_is_a_400_not_a_crash(api):
    response = api.post(
        "/api/sessions/", DEEP, content_type="application/json", HTTP_X_CSRFTOKEN=api.csrf
    )
    assert_error(response, 400, "bad_json")


def test_a_failed_csrf_check_is_403_json(api):
    response = api.post("/api/sessions/", "{}", content_type="application/json")
    assert "CSRF" in assert_error(response, 403, "csrf_failed")


def test_a_crash_under_api_is_500_json(api, settings):
    settings.ROOT_URLCONF = __name__  # the app's URLs plus /api/boom/ (below), which crashes
    assert_error(api.get("/api/boom/"), 500, "internal_error")


def test_pages_outside_the_api_keep_django_s_html_errors(api, settings):
    response = api.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    response = api.post("/sessions/new/", {})  # no CSRF token
    assert response.status_code == 403
    assert response["Content-Type"].startswith("text/html")


def test_daphne_answers_bad_api_requests_with_json(place, uid_base):
    var = place / "var"  # a checkout other users can enter, as make run's is
    with serve(embedded_env(var, uid_base), var) as server:
        cases = [
            ("GET", "/api/sessions/not-a-uuid/", None, 404, "not_found"),
            ("POST", "/api/sessions/", b"x" * 3_000_000, 413, "too_large"),
            ("POST", "/api/sessions/", DEEP.encode(), 400, "bad_json"),
        ]
        for method, url, data, status, code in cases:
            request = urllib.request.Request(
                server.url + url,
                data=data,
                method=method,
                headers={
                    "Content-Type": "application/json",
                    "X-CSRFToken": server.cookies["csrftoken"],
                },
            )
            with pytest.raises(urllib.error.HTTPError) as failed:
                server.opener.open(request, timeout=30)
            with failed.value as answer:
                assert answer.status == status
                assert json.load(answer)["error"]["code"] == code


urlpatterns = [*urlpatterns, path("api/boom/", lambda request: 1 / 0)]
