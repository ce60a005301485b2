"""Sign-ins are throttled per account and address, and per address: failed guesses lock
further tries out, even with the right password, for the cool-off; other accounts and other
addresses are not affected; the lock is kept in the database, so every server process
enforces it."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.core.management import call_command
from django.db.models import F
from django.test import Client
from django.urls import reverse

from ...conftest import PASSWORD
from ...server import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

HERE, THERE, ELSEWHERE = "203.0.113.7", "198.51.100.20", "192.0.2.33"
LOCKED = "Too many failed sign-ins"


def sign_in(username: str, password: str, address: str) -> tuple[int, str, bool]:
    """Sign in from `address` with a fresh browser; return the status, the page, and whether
    the browser is signed in afterwards."""
    browser = Client()
    response = browser.post(
        reverse("login"), {"username": username, "password": password}, REMOTE_ADDR=address
    )
    return response.status_code, response.content.decode(), "_auth_user_id" in browser.session


def fail(times: int, username: str, address: str) -> list[int]:
    return [sign_in(username, "not the password", address)[0] for _ in range(times)]


def test_failed_sign_ins_lock_the_account_from_that_address_even_with_the_right_password(
    owner, stranger
):
    # The fifth failure is the one that locks; the page says so.
    assert fail(5, "olivia", HERE) == [200, 200, 200, 200, 429]
    status, page, signed_in = sign_in("olivia", PASSWORD, HERE)
    assert (status, signed_in) == (429, False)
    assert LOCKED in page and "15 minutes" in page
    # The person can still sign in from elsewhere: a stranger cannot lock them out.
    assert sign_in("olivia", PASSWORD, THERE)[::2] == (302, True)
    # Another account is not affected, from another address or from this one.
    assert sign_in("sam", PASSWORD, ELSEWHERE)[::2] == (302, True)
    assert sign_in("sam", PASSWORD, HERE)[::2] == (302, True)


def test_an_address_trying_many_accounts_is_locked_out_of_all(owner, settings):
    settings.CRAFT_LOGIN_FAILURES_PER_ADDRESS = 6
    assert fail(2, "ann", HERE) + fail(2, "bob", HERE) + fail(2, "cy", HERE) == [200] * 5 + [429]
    status, page, signed_in = sign_in("olivia", PASSWORD, HERE)
    assert (status, signed_in) == (429, False)
    assert LOCKED in page
    assert sign_in("olivia", PASSWORD, THERE)[::2] == (302, True)


def test_signing_in_forgets_that_account_s_failures_only(owner, settings):
    settings.CRAFT_LOGIN_FAILURES_PER_ADDRESS = 6
    assert fail(4, "someone", HERE) + fail(1, "olivia", HERE) == [200] * 5
    assert sign_in("olivia", PASSWORD, HERE)[::2] == (302, True)
    # Olivia's typo is forgotten; the address's four failures at another account are not.
    assert fail(1, "olivia", HERE) == [200]
    assert fail(1, "another", HERE) == [429]


def test_a_lock_ends_after_the_cool_off(owner):
    assert fail(5, "olivia", HERE)[-1] == 429
    assert sign_in("olivia", PASSWORD, HERE)[0] == 429
    # The clock moves on by the cool-off (15 minutes), as far as the records are concerned.
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=15, seconds=1))
    assert sign_in("olivia", PASSWORD, HERE)[::2] == (302, True)


def test_an_administrator_can_lift_a_lock(owner):
    assert fail(5, "olivia", HERE)[-1] == 429
    call_command("axes_reset_username", "olivia")
    assert sign_in("olivia", PASSWORD, HERE)[::2] == (302, True)


def test_the_lock_holds_across_server_processes(tmp_path, owner):
    """Failures counted by one daphne lock the account on another (they share the database)."""
    first, second = Daphne(tmp_path).start(), Daphne(tmp_path).start()
    try:
        assert [post_sign_in(first.url, "not the password")[0] for _ in range(5)] == [200] * 4 + [
            429
        ]
        status, page = post_sign_in(second.url, PASSWORD)
        assert status == 429 and LOCKED in page
    finally:
        first.terminate()
        second.terminate()


def post_sign_in(url: str, password: str) -> tuple[int, str]:
    """Sign in to a server as a browser does (the form, its CSRF token); return the status and
    the page."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    login = opener.open(f"{url}/accounts/login/", timeout=10).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login).group(1)
    form = {"username": "olivia", "password": password, "csrfmiddlewaretoken": token}
    request = urllib.request.Request(
        f"{url}/accounts/login/", data=urllib.parse.urlencode(form).encode()
    )
    request.add_header("Referer", f"{url}/accounts/login/")
    try:
        with opener.open(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as failed:
        with failed:
            return failed.status, failed.read().decode()
