"""Browser sessions are read by `craft.http.browser_sessions` as Django's own database store reads
them: a signed-in session loads its data, and one that expired or is missing loads empty, forgets
its key and signs nobody in (`test_sessions_read_the_same_on_sqlite` runs this module again on
SQLite, `make run`'s database)."""

from __future__ import annotations

from datetime import timedelta
from importlib import import_module

import pytest
from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore as DjangoStore
from django.contrib.sessions.models import Session as BrowserSession
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from craft.http.browser_sessions import SessionStore
from tests.craft.wsclient import session_cookie
from tests.sqlite_rerun import run_again_on_sqlite, runs_the_module_on_sqlite

pytestmark = pytest.mark.django_db


def saved(data: dict) -> str:
    store = DjangoStore()
    store.update(data)
    store.save()
    return store.session_key


def expire(key: str) -> None:
    BrowserSession.objects.filter(pk=key).update(expire_date=timezone.now() - timedelta(seconds=1))


def test_the_engine_in_use_is_this_one():
    assert import_module(settings.SESSION_ENGINE).SessionStore is SessionStore


def test_a_session_loads_what_djangos_own_store_loads():
    key = saved({"a": 1, "b": ["two", 3.0]})
    ours = SessionStore(key)
    assert ours.load() == DjangoStore(key).load() == {"a": 1, "b": ["two", 3.0]}
    assert ours.session_key == key


@pytest.mark.parametrize("fault", ["expired", "missing", "none"])
def test_a_session_expired_or_missing_loads_empty_and_forgets_its_key(fault):
    key = saved({"a": 1})
    if fault == "expired":
        expire(key)
    elif fault == "missing":
        BrowserSession.objects.filter(pk=key).delete()
    store = SessionStore(None if fault == "none" else key)
    assert store.load() == {}
    assert store.session_key is None


def test_reading_a_session_is_one_statement_for_one_column():
    key = saved({"a": 1})
    with CaptureQueriesContext(connection) as queries:
        SessionStore(key).load()
    assert len(queries) == 1
    selected = queries[0]["sql"].split("FROM")[0]
    assert "session_data" in selected
    assert "expire_date" not in selected and "session_key" not in selected


def test_a_request_is_signed_in_until_its_session_expires(client, owner):
    name, _, key = session_cookie(owner).partition("=")
    client.cookies[name] = key
    assert client.get("/api/sessions/").status_code == 200
    expire(key)
    answer = client.get("/api/sessions/")
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "unauthenticated"


@runs_the_module_on_sqlite
def test_sessions_read_the_same_on_sqlite(tmp_path):
    output = run_again_on_sqlite(__file__, tmp_path, deselect="on_sqlite")
    assert "7 passed" in output, output[-2000:]
