"""The production settings documented in docs/deployment.md pass `check --deploy` and work."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys

import pytest
from django.conf import settings

from .test_deploy import by_kind
from .test_settings import load_settings

DEPLOYMENT_DOC = settings.BASE_DIR / "docs" / "deployment.md"


def documented_environment(tmp_path) -> dict[str, str]:
    """Return the variables of the doc's production block; `_FILE`s point at real files."""
    section = DEPLOYMENT_DOC.read_text().split("## Production settings", 1)[1]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    env = dict(line.split("=", 1) for line in block.strip().splitlines())
    for name in [n for n in env if n.endswith("_FILE")]:
        secret = tmp_path / name.lower()
        secret.write_text(secrets.token_urlsafe(50))
        env[name] = str(secret)
    return env


def test_check_deploy_is_clean_with_the_documented_settings(tmp_path, place):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRAFT_"))}
    # A var folder other users can enter, as a server's is (as root, sandboxes need it).
    env = {**clean, **documented_environment(tmp_path), "CRAFT_VAR_DIR": str(place)}
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=env, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (1 silenced)." in result.stdout


def test_without_the_documented_settings_check_deploy_warns():
    # The check above can fail: a bare production configuration still gets Django's warnings.
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRAFT_"))}
    env = {
        **clean,
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_SECURE_SSL_REDIRECT": "0",
        "DJANGO_SECURE_HSTS_SECONDS": "0",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=env, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "security.W004" in result.stderr and "security.W008" in result.stderr


@pytest.mark.parametrize("value", ["X-Forwarded-Proto", "X Forwarded=https", "=https"])
def test_a_malformed_proxy_header_fails_at_start(value):
    result = load_settings(DJANGO_DEBUG="1", DJANGO_SECURE_PROXY_SSL_HEADER=value)
    assert result.returncode != 0
    assert "DJANGO_SECURE_PROXY_SSL_HEADER must look like X-Forwarded-Proto=https" in result.stderr


@pytest.mark.django_db
def test_behind_the_proxy_http_is_redirected_and_https_gets_hsts(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 31_536_000
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    plain = client.get("/accounts/login/")
    assert plain.status_code == 301
    assert plain["Location"] == "https://testserver/accounts/login/"
    secure = client.get("/accounts/login/", HTTP_X_FORWARDED_PROTO="https")
    assert secure.status_code == 200
    assert secure["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"


def test_the_proxy_header_is_read_as_django_expects():
    script = "import craft.settings as s; print(s.SECURE_PROXY_SSL_HEADER)"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRAFT_"))}
    env = {
        **clean,
        "DJANGO_DEBUG": "1",
        "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto=https",
    }
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=env, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.stdout.strip() == "('HTTP_X_FORWARDED_PROTO', 'https')"


def test_the_kubernetes_deployment_uses_the_production_settings():
    (deployment,) = by_kind("Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DJANGO_SECURE_PROXY_SSL_HEADER"] == "X-Forwarded-Proto=https"
    assert "DJANGO_DEBUG" not in env
    # The probes speak plain HTTP to the pod: their paths are exempt from the HTTPS redirect.
    for probe in ("readinessProbe", "livenessProbe"):
        path = container[probe]["httpGet"]["path"].lstrip("/")
        assert any(re.fullmatch(p, path) for p in settings.SECURE_REDIRECT_EXEMPT), probe
    assert re.fullmatch(r"https://[a-z.]+", env["DJANGO_CSRF_TRUSTED_ORIGINS"])


@pytest.mark.parametrize(
    ("name", "value", "warning"),
    [
        ("REDIS_URL", "redis://127.0.0.1:6379/0", "craft.W002"),
        ("DATABASE_URL", "postgres://craft@127.0.0.1:5432/craft", "craft.W001"),
    ],
)
def test_check_deploy_warns_of_a_service_without_a_password(tmp_path, name, value, warning):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRAFT_"))}
    env = {**clean, **documented_environment(tmp_path), "CRAFT_VAR_DIR": str(tmp_path), name: value}
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=env, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert f"({warning}) {name} has no password" in result.stdout + result.stderr
