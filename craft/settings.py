"""Django settings for Craft, read from the environment.

Every setting has an embedded default that needs nothing installed (SQLite, the in-memory
channel layer, the local sandbox backend, the bundled demo agent), so `make run` works on a
laptop. Production overrides them through environment variables; bad values stop the process
at start with an error that names the variable. Secrets may also come from `NAME_FILE` paths
(how Kubernetes mounts secrets).
"""

import os
import shlex
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

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
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    """Return a number variable of at least `minimum`."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
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
    "sandboxes",
    "craft",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
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
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'craft.sqlite3'}"),
        conn_max_age=0,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Agent turns write events from worker threads while pages read: wait for the write lock
    # instead of failing at once with "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 20
    DATABASES["default"]["OPTIONS"]["init_command"] = "PRAGMA journal_mode=WAL;"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
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

SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SESSION_COOKIE_HTTPONLY = True
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
# Seconds to wait for the agent's `initialize` and `session/new` answers.
CRAFT_AGENT_START_TIMEOUT = env_float("CRAFT_AGENT_START_TIMEOUT", 30.0, minimum=1.0)
# Seconds an agent may take to end a cancelled turn before it is stopped.
CRAFT_CANCEL_GRACE_SECONDS = env_float("CRAFT_CANCEL_GRACE_SECONDS", 10.0, minimum=0.1)

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
CRAFT_K8S_WORKSPACE_SIZE = env_str("CRAFT_K8S_WORKSPACE_SIZE", "10Gi")
CRAFT_K8S_RUN_AS_USER = env_int("CRAFT_K8S_RUN_AS_USER", 1000, minimum=1)
CRAFT_K8S_READY_TIMEOUT = env_float("CRAFT_K8S_READY_TIMEOUT", 180.0, minimum=1.0)
CRAFT_K8S_POLL_INTERVAL = env_float("CRAFT_K8S_POLL_INTERVAL", 0.5, minimum=0.05)
CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT = env_float("CRAFT_K8S_EXEC_HANDSHAKE_TIMEOUT", 20.0, minimum=1.0)
CRAFT_K8S_EXEC_IDLE_TIMEOUT = env_float("CRAFT_K8S_EXEC_IDLE_TIMEOUT", 60.0, minimum=1.0)
