"""Django settings for Craft, read from the environment.

Every setting has an embedded default that needs nothing installed (SQLite, the in-memory
channel layer, the local sandbox backend, the bundled demo agent), so `make run` works on a
laptop. Production overrides them through environment variables; bad values stop the process
at start with an error that names the variable. Secrets may also come from `NAME_FILE` paths
(how Kubernetes mounts secrets).
"""

import hashlib
import hmac
import ipaddress
import os
import re
import shlex
from pathlib import Path
from typing import Any

import dj_database_url
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from craft.toml_files import read_tables

BASE_DIR = Path(__file__).resolve().parent.parent

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    """Return the variable, or the content of the file named by `NAME_FILE`, or default."""
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE: cannot read {file_path!r}: {exc}") from exc
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    """Return a boolean variable; anything but the usual spellings is an error."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false, yes/no), got {raw!r}")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    """Return an integer variable of at least `minimum`."""
    return _env_number(name, default, minimum, int, "an integer")


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    """Return a number variable of at least `minimum`."""
    return _env_number(name, default, minimum, float, "a number")


def _env_number(name: str, default: Any, minimum: Any, parse: Any, what: str) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = parse(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be {what}, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


SIZE_UNITS = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}


def env_size(name: str, default: int, *, minimum: int = 0) -> int:
    """Return a size in bytes: a number of bytes, or a number with a binary unit (`512MiB`,
    `4 GiB`, `1.5Gi`; KiB, MiB, GiB, TiB). 0 stays 0 (no limit); others are at least
    `minimum`."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])i(?:b)?)?\s*", raw, re.IGNORECASE)
    if match is None:
        raise ImproperlyConfigured(
            f"{name} must be a size: bytes, or a number with KiB, MiB, GiB or TiB, got {raw!r}"
        )
    value = int(float(match[1]) * (1 << SIZE_UNITS[(match[2] or "").lower()]))
    if 0 < value < minimum:
        raise ImproperlyConfigured(f"{name} must be 0 or at least {minimum} bytes, got {raw!r}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """Return a comma-separated variable as a list without blanks."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_argv(name: str, default: list[str]) -> list[str]:
    """Return a command line split like a POSIX shell would (no shell ever runs it)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        argv = shlex.split(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} is not a valid command line: {exc}") from None
    return argv


def env_agent_env(name: str) -> dict[str, str | None]:
    """Return `NAME` and `NAME=value` entries of a comma-separated variable.

    `NAME` means "copy NAME from the server's environment when the agent starts" (None here);
    `NAME=value` sets it (a value cannot contain a comma). The server's own variables are
    refused, loudly, so that a typo cannot leak a secret to agents, and so are the variables
    that Craft points inside the sandbox.
    """
    return agent_env_entries(name, os.environ.get(name, "").split(","))


VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def agent_env_entries(where: str, items: list[str]) -> dict[str, str | None]:
    """Return the `NAME` / `NAME=value` entries of `items` (see `env_agent_env`); `where`
    names the setting in the error."""
    entries: dict[str, str | None] = {}
    for item in items:
        key, has_value, value = item.strip().partition("=")
        key = key.strip()
        if not key and not has_value:
            continue
        if not VARIABLE_NAME.fullmatch(key):
            raise ImproperlyConfigured(f"{where}: {key!r} is not a variable name")
        check_agent_variable(where, key)
        entries[key] = value if has_value else None
    return entries


def check_agent_variable(where: str, key: str) -> None:
    """Refuse a variable an agent must never be given (the server's) or set (the sandbox's)."""
    if re.fullmatch(r"DJANGO_.*|CRAFT_.*|DATABASE_URL(_FILE)?|REDIS_URL(_FILE)?", key):
        raise ImproperlyConfigured(f"{where} must not pass {key}: it belongs to the server")
    if key in ("HOME", "TMPDIR", "USER", "LOGNAME"):
        raise ImproperlyConfigured(f"{where} cannot set {key}: Craft points it into the sandbox")


AGENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
AGENT_KEYS = {"id", "title", "command", "env", "credentials"}
CREDENTIAL_KEYS = {"name", "label", "help"}


def env_agents_file(name: str) -> list[dict[str, Any]]:
    """Return the agent catalog of the TOML file named by `name` (see docs/agents.md), or []
    when unset (then the one agent of CRAFT_AGENT_COMMAND and CRAFT_AGENT_ENV is offered).

    Each entry becomes `{"id", "title", "command": argv, "env": {NAME: value or None},
    "credentials": [{"name", "label", "help"}]}`; anything unexpected stops the process with
    the entry's place and id.
    """
    path = os.environ.get(name, "").strip()
    if not path:
        return []
    entries, _ = read_tables(name, path, "agents", ImproperlyConfigured)
    agents: list[dict[str, Any]] = []
    for number, entry in enumerate(entries, start=1):
        agents.append(_catalog_entry(name, number, entry, {a["id"] for a in agents}))
    return agents


def _catalog_entry(name: str, number: int, entry: Any, taken: set[str]) -> dict[str, Any]:
    where = f"{name}: agent {number}"
    if not isinstance(entry, dict):
        raise ImproperlyConfigured(f"{where} is not a table")
    agent_id = entry.get("id")
    if not isinstance(agent_id, str) or not AGENT_ID.fullmatch(agent_id):
        raise ImproperlyConfigured(
            f"{where}: id {agent_id!r} must be 1 to 64 letters, digits, '-' or '_'"
        )
    where = f"{name}: agent {agent_id!r}"
    unknown = set(entry) - AGENT_KEYS
    if unknown:
        raise ImproperlyConfigured(f"{where}: unknown key {sorted(unknown)[0]!r}")
    if agent_id in taken:
        raise ImproperlyConfigured(f"{where}: the id is used by an earlier agent too")
    title = entry.get("title", agent_id)
    if not isinstance(title, str) or not title.strip():
        raise ImproperlyConfigured(f"{where}: title must be a non-empty string")
    command = entry.get("command")
    if not isinstance(command, str):
        raise ImproperlyConfigured(f"{where}: command must be a string (a command line)")
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{where}: command is not a valid command line: {exc}") from None
    if not argv:
        raise ImproperlyConfigured(f"{where}: command is empty")
    env = entry.get("env", [])
    if not isinstance(env, list) or not all(isinstance(item, str) for item in env):
        raise ImproperlyConfigured(f"{where}: env must be a list of strings")
    credentials = entry.get("credentials", [])
    if not isinstance(credentials, list):
        raise ImproperlyConfigured(f"{where}: credentials must be a list of tables")
    needed: list[dict[str, str]] = []
    for credential in credentials:
        if not isinstance(credential, dict):
            raise ImproperlyConfigured(f"{where}: credentials must be a list of tables")
        unknown = set(credential) - CREDENTIAL_KEYS
        if unknown:
            raise ImproperlyConfigured(f"{where}: unknown credential key {sorted(unknown)[0]!r}")
        variable = credential.get("name")
        if not isinstance(variable, str) or not VARIABLE_NAME.fullmatch(variable):
            raise ImproperlyConfigured(
                f"{where}: credential name {variable!r} is not an environment variable name"
            )
        check_agent_variable(f"{where}: credential", variable)
        if variable in {c["name"] for c in needed}:
            raise ImproperlyConfigured(f"{where}: credential {variable} is listed twice")
        label, help_text = credential.get("label", variable), credential.get("help", "")
        if not isinstance(label, str) or not isinstance(help_text, str):
            raise ImproperlyConfigured(f"{where}: credential label and help must be strings")
        if help_text and not re.match(r"https?://", help_text):
            # The Keys page links to it: never a javascript: or data: link.
            raise ImproperlyConfigured(f"{where}: credential help must be an http(s) address")
        needed.append({"name": variable, "label": label or variable, "help": help_text})
    return {
        "id": agent_id,
        "title": title.strip(),
        "command": argv,
        "env": agent_env_entries(f"{where}: env", env),
        "credentials": needed,
    }


def env_fernet_keys(name: str) -> list[str]:
    """Return the Fernet keys of `name` (or `NAME_FILE`), newest first: comma- or
    line-separated, each 32 url-safe base64-encoded bytes (`Fernet.generate_key()`)."""
    keys = [key.strip() for key in re.split(r"[,\n]", env_str(name)) if key.strip()]
    for position, key in enumerate(keys, start=1):
        try:
            Fernet(key)
        except (ValueError, TypeError):
            raise ImproperlyConfigured(
                f"{name}: key {position} is not a Fernet key (32 url-safe base64-encoded "
                "bytes; make one with: python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())')"
            ) from None
    return keys


def env_proxy_header(name: str) -> tuple[str, str] | None:
    """Return Django's SECURE_PROXY_SSL_HEADER from `Header-Name=value`, or None when unset.

    `X-Forwarded-Proto=https` means: a request is secure when that header says https. Set it
    only behind a proxy that always sets (or strips) that header, or clients can forge it.
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    header, _, value = raw.partition("=")
    header, value = header.strip(), value.strip()
    if not re.fullmatch(r"[A-Za-z0-9-]+", header) or not value:
        raise ImproperlyConfigured(
            f"{name} must look like X-Forwarded-Proto=https (a header, '=', its secure value), "
            f"got {raw!r}"
        )
    return "HTTP_" + header.upper().replace("-", "_"), value


def env_endpoints(name: str) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """Return a comma-separated list of `address:port` (`[::1]:8080` for IPv6) as pairs."""
    endpoints = []
    for item in env_list(name, []):
        host, colon, port = item.rpartition(":")
        if not colon or not port.isdigit() or not 0 < int(port) < 65536:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not address:port (a port from 1 to 65535)"
            )
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        try:
            endpoints.append((ipaddress.ip_address(host), int(port)))
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {host!r} is not an IP address") from None
    return endpoints


def env_preview_origin(name: str) -> str:
    """Return a preview origin template (see CRAFT_PREVIEW_ORIGIN), or "" (previews off)."""
    raw = os.environ.get(name, "").strip().rstrip("/")
    if not raw:
        return ""
    match = re.fullmatch(r"(https?)://([A-Za-z0-9.{}-]+)(:[0-9]{1,5})?", raw)
    host = match[2] if match else ""
    labels = host.split(".")
    marked = [i for i, label in enumerate(labels) if "{" in label]
    if (
        match is None
        or host.count("{port}") != 1
        or host.count("{session}") != 1
        or host.replace("{port}", "").replace("{session}", "").count("{")
        or marked != list(range(len(marked)))  # the leading labels, for a wildcard name
        or len(labels) - len(marked) < 1
    ):
        raise ImproperlyConfigured(
            f"{name} must be an http(s) origin whose leading host labels hold {{port}} and "
            f"{{session}} once each, e.g. https://{{port}}-{{session}}.preview.example.com, "
            f"got {raw!r}"
        )
    return raw


def env_choice(name: str, default: str, choices: set[str]) -> str:
    """Return a variable that must be one of `choices`."""
    value = os.environ.get(name, default).strip()
    if value not in choices:
        allowed = ", ".join(sorted(choices))
        raise ImproperlyConfigured(f"{name} must be one of {allowed}, got {value!r}")
    return value


DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = env_str("DJANGO_SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY (or DJANGO_SECRET_KEY_FILE) must be set when DJANGO_DEBUG is off"
        )
    SECRET_KEY = "insecure-development-key-only-used-with-DJANGO_DEBUG"

# Earlier keys, still accepted for what they signed (sessions, the channel layer) while a new
# DJANGO_SECRET_KEY rolls out; comma-separated.
SECRET_KEY_FALLBACKS = env_list("DJANGO_SECRET_KEY_FALLBACKS", [])

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "axes",
    "sandboxes",
    "craft",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Near the outside: every HTML answer gets the policy, Django's error pages included.
    "craft.http.csp.ContentSecurityPolicyMiddleware",
    # Outside the rest, so that it sees every error Django makes under /api/ (see the module).
    "craft.api.errors.ApiErrorMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a locked-out sign-in into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "craft.urls"
ASGI_APPLICATION = "craft.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

VAR_DIR = Path(env_str("CRAFT_VAR_DIR", str(BASE_DIR / "var")))
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'craft.sqlite3'}"), conn_max_age=0
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        # Writers wait for the write lock instead of failing at once with "database is
        # locked"; IMMEDIATE takes it when a transaction starts, so a transaction that read
        # first never fails when it then writes.
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        # WAL lets pages read while the event writer writes; synchronous=NORMAL is safe with
        # WAL (a crash of the server loses nothing; a power cut can lose the last commits).
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # Requests run on threads that are kept (craft.http.handler), so each keeps its
    # connection: opening one (and its PRAGMAs) cost about 1.2 ms of every request that
    # reads the database. At most this old, then opened again at the end of a request.
    DATABASES["default"]["CONN_MAX_AGE"] = 600
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # A pool hands connections back to whichever thread asks next (the request threads beyond
    # those kept come and go); Django allows no persistent connections beside it. The event
    # writer and the database threads of craft.storage.db hold one each for as long as they
    # live.
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 2,
        "max_size": env_int("CRAFT_DB_POOL_SIZE", 20, minimum=8),
        "timeout": 20,
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def channel_layer_keys(secret_keys: list[str]) -> list[str]:
    """Derive the channel layer's keys from the secret keys (never the secret keys as such)."""
    label = b"craft channel layer"
    return [hmac.new(key.encode(), label, hashlib.sha256).hexdigest() for key in secret_keys]


REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # Every message authenticated with a key derived from the secret key, which agents
            # never see: whoever else writes to this Redis cannot act as a user (the module).
            "BACKEND": "craft.live.channel_layer.SignedRedisChannelLayer",
            # channels_redis waits on Redis with BZPOPMIN for 5 s; redis-py 8 gives every read
            # a 5 s socket timeout by default, so an idle socket's wait could fail with
            # "Timeout reading" and kill its consumer (redis/redis-py#4091). Reads may wait
            # longer than the blocking pop; connecting still fails fast.
            "CONFIG": {
                "hosts": [
                    {"address": REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 5}
                ],
                "symmetric_encryption_keys": channel_layer_keys(
                    [SECRET_KEY, *SECRET_KEY_FALLBACKS]
                ),
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Sign-in throttling (django-axes, see craft/http/login_throttle.py). Failed sign-ins are stored in
# the database, so every server process counts the same ones. A client's address is the one
# daphne sees (REMOTE_ADDR): behind a proxy, see docs/deployment.md.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses locked-out sign-ins
    "django.contrib.auth.backends.ModelBackend",
]
# Failed sign-ins to one account from one address before that pair is locked out.
CRAFT_LOGIN_FAILURES_PER_ACCOUNT = env_int("CRAFT_LOGIN_FAILURES_PER_ACCOUNT", 5, minimum=1)
# Failed sign-ins from one address, to any accounts, before the address is locked out.
CRAFT_LOGIN_FAILURES_PER_ADDRESS = env_int("CRAFT_LOGIN_FAILURES_PER_ADDRESS", 30, minimum=1)
# How long a lockout lasts, counted from the last failure that was recorded.
CRAFT_LOGIN_COOLOFF_SECONDS = env_int("CRAFT_LOGIN_COOLOFF_SECONDS", 900, minimum=1)
AXES_HANDLER = "craft.http.login_throttle.LoginThrottle"
# In this order (craft/http/login_throttle.py gives each its own limit).
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]
AXES_FAILURE_LIMIT = "craft.http.login_throttle.failure_limit"
AXES_COOLOFF_TIME = "craft.http.login_throttle.cool_off"
# Tries during a lockout are refused without being counted: it ends when the page says.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "craft.views.signin_locked"
# No log of every sign-in: it would grow without end; failures are kept for the cool-off.
AXES_DISABLE_ACCESS_LOG = True

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
WHITENOISE_USE_FINDERS = True

# HTTPS (see docs/deployment.md). Production defaults assume the site is served over HTTPS
# only: secure cookies, a redirect of plain HTTP, and HSTS for a year.
SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", not DEBUG)
# Probes speak plain HTTP to the pod (craft.http.health).
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 0 if DEBUG else 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
# Off unless asked: anyone may submit a domain that sends `preload` to the browsers' preload
# list, and leaving it takes months. check --deploy's reminder (W021) is silenced meanwhile.
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
SECURE_PROXY_SSL_HEADER = env_proxy_header("DJANGO_SECURE_PROXY_SSL_HEADER")
SESSION_COOKIE_HTTPONLY = True
# Django's database sessions, read by one statement written out (craft/http/browser_sessions.py).
SESSION_ENGINE = "craft.http.browser_sessions"
CSRF_FAILURE_VIEW = "craft.api.errors.csrf_failure"
X_FRAME_OPTIONS = "DENY"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("CRAFT_LOG_LEVEL", "INFO")},
}

# --- Sandboxes and agents ------------------------------------------------------------------

CRAFT_SANDBOX_BACKENDS = {
    "local": "sandboxes.backends.local.LocalBackend",
    "kubernetes": "sandboxes.backends.kubernetes.KubernetesBackend",
}
CRAFT_SANDBOX_BACKEND = env_choice("CRAFT_SANDBOX_BACKEND", "local", set(CRAFT_SANDBOX_BACKENDS))
CRAFT_AGENT_COMMAND = env_argv("CRAFT_AGENT_COMMAND", ["craft-demo-agent"])
CRAFT_SANDBOX_ROOT = Path(env_str("CRAFT_SANDBOX_ROOT", str(VAR_DIR / "sandboxes")))
# What agents get besides Craft's minimal environment (see sandboxes/backends/containment.py).
CRAFT_AGENT_ENV = env_agent_env("CRAFT_AGENT_ENV")
# The agents a new session can pick (docs/agents.md); empty: the one agent above, id "default".
CRAFT_AGENTS = env_agents_file("CRAFT_AGENTS_FILE")
# The git hosts people may clone from (docs/repositories.md), a TOML file read by
# craft.git_hosts and checked at start (craft.checks); unset: github.com and gitlab.com.
CRAFT_GIT_HOSTS_FILE = os.environ.get("CRAFT_GIT_HOSTS_FILE", "").strip()
# The keys that encrypt the credentials people store for their agents, newest first (an old
# key listed after the new one still reads what it wrote). Needed once an agent asks for any.
CRAFT_SECRETS_KEYS = env_fernet_keys("CRAFT_SECRETS_KEY")
if not CRAFT_SECRETS_KEYS and any(agent["credentials"] for agent in CRAFT_AGENTS):
    raise ImproperlyConfigured(
        "CRAFT_SECRETS_KEY (or CRAFT_SECRETS_KEY_FILE) must be set: agents of CRAFT_AGENTS_FILE "
        "ask for credentials, which are stored encrypted with it"
    )
# Local sandboxes run as users of their own: "auto" when the server is root, "on", "off".
CRAFT_SANDBOX_UIDS = env_choice("CRAFT_SANDBOX_UIDS", "auto", {"auto", "on", "off"})
CRAFT_SANDBOX_UID_BASE = env_int("CRAFT_SANDBOX_UID_BASE", 1_000_000_000, minimum=1000)
CRAFT_SANDBOX_UID_COUNT = env_int("CRAFT_SANDBOX_UID_COUNT", 1_000_000, minimum=1)
# With sandbox users, agents cannot open connections to this machine's own addresses (its
# database, Redis, this server) nor to link-local ones ("isolated"), except the endpoints
# of CRAFT_SANDBOX_ALLOW (address:port); "open" lifts the rule (see the README).
CRAFT_SANDBOX_NETWORK = env_choice("CRAFT_SANDBOX_NETWORK", "isolated", {"isolated", "open"})
CRAFT_SANDBOX_ALLOW = env_endpoints("CRAFT_SANDBOX_ALLOW")
# With sandbox users, the most processes and threads one sandbox may run at once (0: no limit).
CRAFT_SANDBOX_PIDS = env_int("CRAFT_SANDBOX_PIDS", 4096)
# With sandbox users, each sandbox's budget is held by a cgroup of its own: "off" runs
# sandboxes without one (see the README). Memory (with swap) in bytes and CPU in cores, 0: no
# limit.
CRAFT_SANDBOX_LIMITS = env_choice("CRAFT_SANDBOX_LIMITS", "on", {"on", "off"})
CRAFT_SANDBOX_MEMORY = env_size("CRAFT_SANDBOX_MEMORY", 4 << 30, minimum=32 << 20)
CRAFT_SANDBOX_CPU = env_float("CRAFT_SANDBOX_CPU", 2.0)
if 0 < CRAFT_SANDBOX_CPU < 0.01:
    raise ImproperlyConfigured(
        f"CRAFT_SANDBOX_CPU must be 0 (no limit) or at least 0.01, got {CRAFT_SANDBOX_CPU:g}"
    )
# Past this disk use (measured by the reaper), a sandbox's sessions take no new prompt (0: no
# limit).
CRAFT_SANDBOX_DISK = env_size("CRAFT_SANDBOX_DISK", 10 << 30)
# Seconds to wait for the agent's `initialize` and `session/new` answers.
CRAFT_AGENT_START_TIMEOUT = env_float("CRAFT_AGENT_START_TIMEOUT", 30.0, minimum=1.0)
# How many local agents may be starting at once (0: no limit): a start is mostly the agent's
# own CPU, and a burst of them would starve the running sessions of this machine.
CRAFT_LOCAL_AGENT_STARTS = env_int("CRAFT_LOCAL_AGENT_STARTS", os.cpu_count() or 2, minimum=0)
# What a websocket may have sent but its client not read yet; a client past it that reads nothing
# for CRAFT_SOCKET_STALL_SECONDS is closed (4408) and resumes from its last seq when it reconnects
# (one that reads, however slowly, is waited for).
CRAFT_SOCKET_BUFFER_BYTES = env_int("CRAFT_SOCKET_BUFFER_BYTES", 4 * 1024 * 1024, minimum=65536)
CRAFT_SOCKET_STALL_SECONDS = env_float("CRAFT_SOCKET_STALL_SECONDS", 30.0, minimum=0.5)
# How often each server process asks the database, for all its websockets at once, whether
# their accounts still grant them (password, active, browser session): what signals cannot
# see, such as a password changed by a command in another process, is caught this late.
CRAFT_SOCKET_AUTH_CHECK_SECONDS = env_float("CRAFT_SOCKET_AUTH_CHECK_SECONDS", 5.0, minimum=0.5)
# The most session websockets one person may hold in one server process (0: no limit); one
# more is closed with 4429, and the others go on.
CRAFT_MAX_SOCKETS_PER_USER = env_int("CRAFT_MAX_SOCKETS_PER_USER", 100)
# The most terminals (shells in a session's workspace) one person may have open in one server
# process (0: no limit); one more is refused with a `too_many_terminals` error.
CRAFT_MAX_TERMINALS_PER_USER = env_int("CRAFT_MAX_TERMINALS_PER_USER", 4)
# What one turn may store; past it the turn is stopped and what the agent still sends is
# counted, not stored (the turn's end says how much).
CRAFT_MAX_TURN_BYTES = env_int("CRAFT_MAX_TURN_BYTES", 256 * 1024 * 1024, minimum=65536)
# How many sessions one person may have (0: no limit).
CRAFT_MAX_SESSIONS_PER_USER = env_int("CRAFT_MAX_SESSIONS_PER_USER", 500)
# The longest message (one line of ACP JSON) Craft takes from an agent; a longer one is skipped
# without being held in memory, and the log records that it was (`message_too_large`).
CRAFT_MAX_MESSAGE_BYTES = env_int("CRAFT_MAX_MESSAGE_BYTES", 16 * 1024 * 1024, minimum=65536)
# Live command output (a tool call's `_meta.terminal_output`) Craft keeps per tool call of a
# turn; what comes after is dropped as it arrives, and the log says so (`terminal_output_limited`).
CRAFT_MAX_TERMINAL_OUTPUT_BYTES = env_int(
    "CRAFT_MAX_TERMINAL_OUTPUT_BYTES", 1024 * 1024, minimum=1024
)
# An agent's stderr (see sandboxes/stderr_log.py): the longest line Craft keeps (a longer one is
# cut, the rest skipped without being held in memory), and how many bytes of one agent's stderr
# are logged per second (0: no limit); lines past the rate are counted, not logged.
CRAFT_MAX_STDERR_BYTES = env_int("CRAFT_MAX_STDERR_BYTES", 16384, minimum=256)
CRAFT_STDERR_LOG_BYTES_PER_SECOND = env_int("CRAFT_STDERR_LOG_BYTES_PER_SECOND", 65536)
# Reading a session's workspace (files panel, downloads): the most seconds one listing may
# take, and the most bytes one download sends (a file, or the workspace as a zip).
CRAFT_WORKSPACE_TIMEOUT_SECONDS = env_float("CRAFT_WORKSPACE_TIMEOUT_SECONDS", 30.0, minimum=1.0)
CRAFT_ARCHIVE_MAX_BYTES = env_int("CRAFT_ARCHIVE_MAX_BYTES", 1 << 30, minimum=1)
# The largest request body the server reads: one uploaded file (docs/workspace.md). A larger
# one is answered 413 as soon as its size is known, before the rest of it is read.
CRAFT_UPLOAD_MAX_BYTES = env_int("CRAFT_UPLOAD_MAX_BYTES", 100 << 20, minimum=1)
# Checkpoints of a session's workspace (git commits in a store of its own): files bigger than
# this are left out, and a checkpoint that takes longer is skipped (both are said).
CRAFT_CHECKPOINT_MAX_FILE_BYTES = env_int("CRAFT_CHECKPOINT_MAX_FILE_BYTES", 10 << 20, minimum=1)
CRAFT_CHECKPOINT_TIMEOUT_SECONDS = env_float("CRAFT_CHECKPOINT_TIMEOUT_SECONDS", 30.0, minimum=1.0)
# Sessions on a repository (docs/repositories.md): the most bytes a clone may fetch, and the
# most seconds a clone (or a fetch, a push) and a repository's set-up may take.
CRAFT_CLONE_MAX_BYTES = env_size("CRAFT_CLONE_MAX_BYTES", 2 << 30, minimum=1)
CRAFT_CLONE_TIMEOUT_SECONDS = env_float("CRAFT_CLONE_TIMEOUT_SECONDS", 600.0, minimum=1.0)
CRAFT_SETUP_TIMEOUT_SECONDS = env_float("CRAFT_SETUP_TIMEOUT_SECONDS", 600.0, minimum=1.0)
# Seconds an agent may take to end a cancelled turn before it is stopped.
CRAFT_CANCEL_GRACE_SECONDS = env_float("CRAFT_CANCEL_GRACE_SECONDS", 10.0, minimum=0.1)
# A turn is cut short (cancelled, its agent stopped after the cancel grace) when it runs longer
# than this, or when its agent sends nothing for CRAFT_TURN_IDLE_SECONDS (time spent waiting for
# a person's permission answer does not count as silence).
CRAFT_TURN_TIMEOUT_SECONDS = env_float("CRAFT_TURN_TIMEOUT_SECONDS", 1800.0, minimum=1.0)
CRAFT_TURN_IDLE_SECONDS = env_float("CRAFT_TURN_IDLE_SECONDS", 300.0, minimum=0.5)
# A turn whose agent sends nothing for this long has its owner's pages say what the agent last
# wrote to stderr during the turn (a model call it retries, say), until it goes on.
CRAFT_AGENT_QUIET_SECONDS = env_float("CRAFT_AGENT_QUIET_SECONDS", 5.0, minimum=0.1)
# On SIGTERM/SIGINT, how long running turns may go on before they are cancelled and recorded.
CRAFT_SHUTDOWN_GRACE_SECONDS = env_float("CRAFT_SHUTDOWN_GRACE_SECONDS", 30.0, minimum=0.0)
# How long a worker's claim on a session's agent (its lease) lasts without renewal; when the
# owner dies, another worker takes the session over after this long (at once if the owner
# ran on the same host and its process is gone).
CRAFT_SESSION_LEASE_SECONDS = env_float("CRAFT_SESSION_LEASE_SECONDS", 15.0, minimum=3.0)
# Where this worker listens for the other workers' forwarded commands (craft.cluster.peers):
# an address of this host that the other workers reach (in Kubernetes, the pod's IP) and a
# port (0: any free one). Empty host: commands go through the channel layer (Redis) only.
CRAFT_PEER_HOST = env_str("CRAFT_PEER_HOST", "127.0.0.1")
CRAFT_PEER_PORT = env_int("CRAFT_PEER_PORT", 0)
# A server process not heard from for this long is gone: its running turns are closed.
CRAFT_WORKER_TIMEOUT_SECONDS = env_float("CRAFT_WORKER_TIMEOUT_SECONDS", 30.0, minimum=5.0)

# The kubernetes backend (see docs/kubernetes.md). The agent command above runs in the pod.
CRAFT_K8S_KUBECONFIG = env_str("CRAFT_K8S_KUBECONFIG")  # else in-cluster, else KUBECONFIG
CRAFT_K8S_NAMESPACE = env_str("CRAFT_K8S_NAMESPACE", "craft-sandboxes")
CRAFT_K8S_IMAGE = env_str("CRAFT_K8S_IMAGE", "craft-sandbox:latest")
CRAFT_K8S_IMAGE_PULL_POLICY = env_choice(
    "CRAFT_K8S_IMAGE_PULL_POLICY", "IfNotPresent", {"Always", "IfNotPresent", "Never"}
)
CRAFT_K8S_CPU_REQUEST = env_str("CRAFT_K8S_CPU_REQUEST", "250m")
CRAFT_K8S_CPU_LIMIT = env_str("CRAFT_K8S_CPU_LIMIT", "2")
CRAFT_K8S_MEMORY_REQUEST = env_str("CRAFT_K8S_MEMORY_REQUEST", "512Mi")
CRAFT_K8S_MEMORY_LIMIT = env_str("CRAFT_K8S_MEMORY_LIMIT", "2Gi")
# Each sandbox's PersistentVolumeClaim: its size, and its storage class (empty: the cluster's
# default class).
CRAFT_K8S_WORKSPACE_SIZE = env_str("CRAFT_K8S_WORKSPACE_SIZE", "10Gi")
CRAFT_K8S_STORAGE_CLASS = env_str("CRAFT_K8S_STORAGE_CLASS")
CRAFT_K8S_RUN_AS_USER = env_int("CRAFT_K8S_RUN_AS_USER", 1000, minimum=1)
CRAFT_K8S_READY_TIMEOUT = env_float("CRAFT_K8S_READY_TIMEOUT", 180.0, minimum=1.0)
CRAFT_K8S_POLL_INTERVAL = env_float("CRAFT_K8S_POLL_INTERVAL", 0.5, minimum=0.05)
CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT = env_float("CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT", 20.0, minimum=1.0)
CRAFT_K8S_EXEC_IDLE_TIMEOUT = env_float("CRAFT_K8S_EXEC_IDLE_TIMEOUT", 60.0, minimum=1.0)
# Ready pods kept with no owner yet, for new users' sandboxes to claim at once (0: none).
CRAFT_K8S_WARM_SANDBOXES = env_int("CRAFT_K8S_WARM_SANDBOXES", 0, minimum=0)
# How the pod runs Craft's workspace tool (sandboxes/in_sandbox/workspace_tool.py): the sandbox
# image has it in /opt/craft with its bytecode, and it runs as an imported module, not compiled
# each time.
CRAFT_K8S_WORKSPACE_TOOL = env_argv(
    "CRAFT_K8S_WORKSPACE_TOOL",
    [
        "python3", "-I", "-S", "-c",
        "import sys; sys.path.append('/opt/craft'); import workspace_tool; "
        "sys.exit(workspace_tool.main(sys.argv[1:]))",
    ],
)  # fmt: skip
# How the pod's `git` container runs Craft's git tool (sandboxes/in_sandbox/git_tool.py), as above.
CRAFT_K8S_GIT_TOOL = env_argv(
    "CRAFT_K8S_GIT_TOOL",
    [
        "python3", "-I", "-S", "-c",
        "import sys; sys.path.append('/opt/craft'); import git_tool; "
        "sys.exit(git_tool.main(sys.argv[1:]))",
    ],
)  # fmt: skip
# Addresses sandbox pods may reach although CRAFT_K8S_EGRESS_BLOCKED holds them: a git host on
# the intranet (its CIDR, e.g. 10.1.2.3/32).
CRAFT_K8S_EGRESS_ALLOWED = env_list("CRAFT_K8S_EGRESS_ALLOWED", [])
# Addresses sandbox pods may not reach (their NetworkPolicy): private, shared, link-local (cloud
# metadata) and loopback ranges, where the cluster's pods, services and API server live. Add a
# Kubernetes API endpoint with a public address here.
CRAFT_K8S_EGRESS_BLOCKED = env_list(
    "CRAFT_K8S_EGRESS_BLOCKED",
    [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
        "127.0.0.0/8",
        "0.0.0.0/8",
        "fc00::/7",
        "fe80::/10",
        "::1/128",
    ],
)

# Previews (docs/workbench.md): the origin an app served in a sandbox is shown on, never
# Craft's own: a URL with `{port}` and `{session}` (32 hex digits) in its host, e.g.
# `https://{port}-{session}.preview.example.com` (a wildcard name and certificate). Empty:
# previews off. `make run` sets `http://{port}-{session}.localhost:<its port + 1>`.
CRAFT_PREVIEW_ORIGIN = env_preview_origin("CRAFT_PREVIEW_ORIGIN")
# The namespace Craft's own pods run in (labelled app.kubernetes.io/name=craft): with previews
# on, the only pods sandbox pods accept connections from (their NetworkPolicy).
CRAFT_K8S_SERVER_NAMESPACE = env_str("CRAFT_K8S_SERVER_NAMESPACE", "craft")

# Reaping (see docs/reliability.md). Each server process stops its own idle agents every few
# seconds and runs a sandbox pass every CRAFT_REAPER_INTERVAL_SECONDS; `manage.py reap` runs
# the sandbox pass from outside.
# An agent connection without a running turn, unused this long, is stopped (0: never).
CRAFT_AGENT_IDLE_SECONDS = env_float("CRAFT_AGENT_IDLE_SECONDS", 900.0)
# A sandbox without session activity, running turn, queued prompt, live agent or open
# terminal this long is put to sleep: its agents stopped, its pod deleted, its files kept (its
# volume on Kubernetes, its folder locally); the next prompt wakes it (0: never). By default
# on Kubernetes only, where an idle pod holds a node's resources; a sleeping folder saves
# nothing.
CRAFT_SANDBOX_SLEEP_SECONDS = env_float(
    "CRAFT_SANDBOX_SLEEP_SECONDS", 1800.0 if CRAFT_SANDBOX_BACKEND == "kubernetes" else 0.0
)
# ...this long, awake or asleep, it is deleted: terminated, its files (and volume) with it
# (0: never).
CRAFT_SANDBOX_IDLE_SECONDS = env_float("CRAFT_SANDBOX_IDLE_SECONDS", 0.0)
# A sandbox provisioning (or terminating) for longer is stuck: its server died or hung.
CRAFT_SANDBOX_PROVISIONING_TIMEOUT = env_float(
    "CRAFT_SANDBOX_PROVISIONING_TIMEOUT", 300.0, minimum=5.0
)
CRAFT_SANDBOX_TERMINATING_TIMEOUT = env_float(
    "CRAFT_SANDBOX_TERMINATING_TIMEOUT", 120.0, minimum=5.0
)
CRAFT_REAPER_INTERVAL_SECONDS = env_float("CRAFT_REAPER_INTERVAL_SECONDS", 60.0, minimum=1.0)
for _name in ("CRAFT_SANDBOX_IDLE_SECONDS", "CRAFT_SANDBOX_SLEEP_SECONDS"):
    if 0 < globals()[_name] < 2 * CRAFT_REAPER_INTERVAL_SECONDS:
        # A live agent or terminal is marked on its sandbox once per reaper interval: a
        # shorter idle time could stop a sandbox whose agent another process still holds.
        raise ImproperlyConfigured(
            f"{_name} must be 0 (never) or at least twice "
            f"CRAFT_REAPER_INTERVAL_SECONDS ({2 * CRAFT_REAPER_INTERVAL_SECONDS:g}), "
            f"got {globals()[_name]:g}"
        )
if CRAFT_SANDBOX_PROVISIONING_TIMEOUT <= CRAFT_K8S_READY_TIMEOUT:
    raise ImproperlyConfigured(
        "CRAFT_SANDBOX_PROVISIONING_TIMEOUT must be longer than CRAFT_K8S_READY_TIMEOUT "
        f"({CRAFT_K8S_READY_TIMEOUT:g}), or pods still starting would be taken as stuck"
    )

# The most agent connections one server process keeps (each is a process or an exec).
CRAFT_MAX_AGENT_CONNECTIONS = env_int("CRAFT_MAX_AGENT_CONNECTIONS", 200, minimum=1)
# Agents one person may have running at once in one server process (0: no limit); the
# longest-idle one makes room for a new one, busy ones never do.
CRAFT_MAX_AGENTS_PER_USER = env_int("CRAFT_MAX_AGENTS_PER_USER", 10)
# Agents each running sandbox keeps started and initialized, in no session yet, in each server
# process, so that a new session's first prompt pays only session/new (sandboxes.warm_agents;
# 0: off). They count against both limits above and are reaped like idle agents.
CRAFT_WARM_AGENTS = env_int("CRAFT_WARM_AGENTS", 1, minimum=0)
