"""Settings come from the environment; bad values stop the process with the variable's name."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings

SHOW = """
import craft.settings as s
print(s.DATABASES["default"]["ENGINE"], s.CHANNEL_LAYERS["default"]["BACKEND"])
print(s.CRAFT_SANDBOX_BACKEND, s.CRAFT_AGENT_COMMAND)
"""


def load_settings(**env: str) -> subprocess.CompletedProcess[str]:
    """Import the real settings module in a fresh interpreter with `env` added."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRAFT_"))}
    clean.pop("DATABASE_URL", None)
    clean.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-c", SHOW],
        env={**clean, **env},
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DJANGO_DEBUG", "maybe", "DJANGO_DEBUG must be a boolean"),
        (
            "CRAFT_SANDBOX_BACKEND",
            "docker",
            "CRAFT_SANDBOX_BACKEND must be one of kubernetes, local",
        ),
        (
            "CRAFT_AGENT_COMMAND",
            "agent 'unclosed",
            "CRAFT_AGENT_COMMAND is not a valid command line",
        ),
        ("CRAFT_AGENT_START_TIMEOUT", "soon", "CRAFT_AGENT_START_TIMEOUT must be a number"),
        ("CRAFT_K8S_RUN_AS_USER", "0", "CRAFT_K8S_RUN_AS_USER must be at least 1"),
        ("CRAFT_K8S_WARM_SANDBOXES", "-1", "CRAFT_K8S_WARM_SANDBOXES must be at least 0"),
        ("CRAFT_K8S_WARM_SANDBOXES", "two", "CRAFT_K8S_WARM_SANDBOXES must be an integer"),
        ("CRAFT_MAX_STDERR_BYTES", "100", "CRAFT_MAX_STDERR_BYTES must be at least 256"),
        ("CRAFT_MAX_STDERR_BYTES", "16k", "CRAFT_MAX_STDERR_BYTES must be an integer"),
        (
            "CRAFT_STDERR_LOG_BYTES_PER_SECOND",
            "-1",
            "CRAFT_STDERR_LOG_BYTES_PER_SECOND must be at least 0",
        ),
        ("CRAFT_K8S_IMAGE_PULL_POLICY", "Sometimes", "CRAFT_K8S_IMAGE_PULL_POLICY must be one of"),
        ("CRAFT_SANDBOX_NETWORK", "closed", "CRAFT_SANDBOX_NETWORK must be one of isolated, open"),
        (
            "CRAFT_SANDBOX_ALLOW",
            "127.0.0.1",
            "CRAFT_SANDBOX_ALLOW: '127.0.0.1' is not address:port",
        ),
        ("CRAFT_SANDBOX_ALLOW", "localhost:80", "CRAFT_SANDBOX_ALLOW: 'localhost' is not an IP"),
        ("CRAFT_SANDBOX_ALLOW", "[::1]:70000", "is not address:port (a port from 1 to 65535)"),
        ("CRAFT_SANDBOX_PIDS", "-1", "CRAFT_SANDBOX_PIDS must be at least 0"),
        ("CRAFT_SANDBOX_LIMITS", "auto", "CRAFT_SANDBOX_LIMITS must be one of off, on"),
        ("CRAFT_SANDBOX_MEMORY", "4GB", "CRAFT_SANDBOX_MEMORY must be a size: bytes, or a"),
        ("CRAFT_SANDBOX_MEMORY", "1MiB", "CRAFT_SANDBOX_MEMORY must be 0 or at least 33554432"),
        ("CRAFT_SANDBOX_CPU", "0.001", "CRAFT_SANDBOX_CPU must be 0 (no limit) or at least 0.01"),
        ("CRAFT_SANDBOX_DISK", "lots", "CRAFT_SANDBOX_DISK must be a size"),
        (
            "CRAFT_SOCKET_AUTH_CHECK_SECONDS",
            "often",
            "CRAFT_SOCKET_AUTH_CHECK_SECONDS must be a number",
        ),
        (
            "CRAFT_SOCKET_AUTH_CHECK_SECONDS",
            "0.1",
            "CRAFT_SOCKET_AUTH_CHECK_SECONDS must be at least 0.5",
        ),
        ("CRAFT_MAX_SOCKETS_PER_USER", "-1", "CRAFT_MAX_SOCKETS_PER_USER must be at least 0"),
        (
            "CRAFT_LOGIN_FAILURES_PER_ACCOUNT",
            "0",
            "CRAFT_LOGIN_FAILURES_PER_ACCOUNT must be at least 1",
        ),
        (
            "CRAFT_LOGIN_FAILURES_PER_ADDRESS",
            "many",
            "CRAFT_LOGIN_FAILURES_PER_ADDRESS must be an integer",
        ),
        ("CRAFT_LOGIN_COOLOFF_SECONDS", "0", "CRAFT_LOGIN_COOLOFF_SECONDS must be at least 1"),
        ("CRAFT_PREVIEW_ORIGIN", "https://preview.example.com", "CRAFT_PREVIEW_ORIGIN must be"),
        ("CRAFT_PREVIEW_ORIGIN", "https://x.{port}-{session}.example.com", "leading host"),
        ("CRAFT_PREVIEW_ORIGIN", "ftp://{port}-{session}.example.com", "an http(s) origin"),
        ("CRAFT_PREVIEW_ORIGIN", "https://{port}-{session}.example.com/a", "an http(s) origin"),
    ],
)
def test_a_bad_value_fails_at_start_naming_the_variable(name, value, message):
    result = load_settings(**{"DJANGO_DEBUG": "1", name: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


def test_production_needs_a_secret_key():
    result = load_settings()
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY (or DJANGO_SECRET_KEY_FILE) must be set" in result.stderr


def test_secrets_can_come_from_files(tmp_path):
    key = tmp_path / "secret"
    key.write_text("from-a-file\n")
    script = "import craft.settings as s; print(s.SECRET_KEY)"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRAFT_"))}
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**clean, "DJANGO_SECRET_KEY_FILE": str(key)},
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.stdout.strip() == "from-a-file"


def test_the_embedded_defaults_need_nothing_installed():
    result = load_settings(DJANGO_DEBUG="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "django.db.backends.sqlite3",
        "channels.layers.InMemoryChannelLayer",
        "local",
        "['craft-demo-agent']",
    ]


def test_the_redis_channel_layer_is_signed_with_keys_derived_from_the_secret_keys():
    script = (
        "import craft.settings as s; c = s.CHANNEL_LAYERS['default']; "
        "print(c['BACKEND']); print(*c['CONFIG']['symmetric_encryption_keys'])"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRAFT_"))}
    env = {
        **clean,
        "DJANGO_SECRET_KEY": "new-key",
        "DJANGO_SECRET_KEY_FALLBACKS": "old-key",
        "REDIS_URL": "redis://:password@127.0.0.1:6379/0",
    }
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=settings.BASE_DIR,
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    backend, keys = result.stdout.splitlines()
    assert backend == "craft.live.channel_layer.SignedRedisChannelLayer"
    new, old = keys.split()
    assert len(new) == len(old) == 64 and new != old
    assert "new-key" not in keys and "old-key" not in keys  # derived, never the secret itself


GOOD_AGENT = 'id = "claude"\ntitle = "Claude Code"\ncommand = "claude-agent-acp"\n'


@pytest.mark.parametrize(
    ("catalog", "message"),
    [
        (
            f'[[agents]]\n{GOOD_AGENT}model = "opus"\n',
            "CRAFT_AGENTS_FILE: agent 'claude': unknown key 'model'",
        ),
        (
            f"[[agents]]\n{GOOD_AGENT}\n[[agents]]\n{GOOD_AGENT}",
            "CRAFT_AGENTS_FILE: agent 'claude': the id is used by an earlier agent too",
        ),
        (
            '[[agents]]\nid = "claude"\ncommand = "  "\n',
            "CRAFT_AGENTS_FILE: agent 'claude': command is empty",
        ),
        (
            f'[[agents]]\n{GOOD_AGENT}credentials = [{{ name = "ANTHROPIC-KEY", label = "x" }}]\n',
            "CRAFT_AGENTS_FILE: agent 'claude': credential name 'ANTHROPIC-KEY' is not an "
            "environment variable name",
        ),
        (
            '[[agents]]\nid = "claude code"\ncommand = "claude-agent-acp"\n',
            "CRAFT_AGENTS_FILE: agent 1: id 'claude code' must be 1 to 64 letters, digits",
        ),
        (
            f'[[agents]]\n{GOOD_AGENT}env = ["DJANGO_SECRET_KEY"]\n',
            "CRAFT_AGENTS_FILE: agent 'claude': env must not pass DJANGO_SECRET_KEY",
        ),
        (
            f'[[agents]]\n{GOOD_AGENT}credentials = [{{ name = "K", help = "javascript:x" }}]\n',
            "CRAFT_AGENTS_FILE: agent 'claude': credential help must be an http(s) address",
        ),
        ('agents = "claude"\n', "CRAFT_AGENTS_FILE: "),
        ("[[agents]\n", "is not valid TOML"),
    ],
)
def test_a_bad_agent_catalog_fails_at_start_naming_the_entry(tmp_path, catalog, message):
    path = tmp_path / "agents.toml"
    path.write_text(catalog)
    result = load_settings(DJANGO_DEBUG="1", CRAFT_AGENTS_FILE=str(path))
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


def test_an_agent_catalog_that_is_not_utf_8_or_not_there_fails_at_start_in_words(tmp_path):
    path = tmp_path / "agents.toml"
    path.write_bytes(b'[[agents]]\nid = "caf\xe9"\ncommand = "x"\n')  # Latin-1
    result = load_settings(DJANGO_DEBUG="1", CRAFT_AGENTS_FILE=str(path))
    assert result.returncode != 0
    assert f"CRAFT_AGENTS_FILE: {str(path)!r} is not valid TOML" in result.stderr
    assert "UnicodeDecodeError" not in result.stderr.splitlines()[-1]
    result = load_settings(DJANGO_DEBUG="1", CRAFT_AGENTS_FILE=str(tmp_path / "missing.toml"))
    assert "CRAFT_AGENTS_FILE: " in result.stderr and "cannot read" in result.stderr


def test_agents_that_ask_for_credentials_need_a_secrets_key(tmp_path):
    path = tmp_path / "agents.toml"
    path.write_text(f'[[agents]]\n{GOOD_AGENT}credentials = [{{ name = "ANTHROPIC_API_KEY" }}]\n')
    result = load_settings(DJANGO_DEBUG="1", CRAFT_AGENTS_FILE=str(path))
    assert "CRAFT_SECRETS_KEY (or CRAFT_SECRETS_KEY_FILE) must be set" in result.stderr
    key = "6Ijl_GdANX76rs7fpuqxpj0MAJSXQd_PfPTn58A-i4c="
    result = load_settings(DJANGO_DEBUG="1", CRAFT_AGENTS_FILE=str(path), CRAFT_SECRETS_KEY=key)
    assert result.returncode == 0, result.stderr


def test_a_bad_secrets_key_fails_at_start_naming_the_variable(tmp_path):
    result = load_settings(DJANGO_DEBUG="1", CRAFT_SECRETS_KEY="not-a-key")
    assert "CRAFT_SECRETS_KEY: key 1 is not a Fernet key" in result.stderr
    keys = tmp_path / "keys"
    keys.write_text("6Ijl_GdANX76rs7fpuqxpj0MAJSXQd_PfPTn58A-i4c=\nshort\n")
    result = load_settings(DJANGO_DEBUG="1", CRAFT_SECRETS_KEY_FILE=str(keys))
    assert "CRAFT_SECRETS_KEY: key 2 is not a Fernet key" in result.stderr


def test_the_catalog_file_is_read_into_agents(tmp_path):
    path = tmp_path / "agents.toml"
    path.write_text(
        f'[[agents]]\n{GOOD_AGENT}env = ["ANTHROPIC_BASE_URL", "MODE=fast"]\n'
        'credentials = [{ name = "ANTHROPIC_API_KEY", label = "Anthropic API key" }]\n'
        '[[agents]]\nid = "demo"\ncommand = "craft-demo-agent --controls \'modes\'"\n'
    )
    script = "import craft.settings as s; import json; print(json.dumps(s.CRAFT_AGENTS))"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRAFT_"))}
    env = {**clean, "DJANGO_DEBUG": "1", "CRAFT_AGENTS_FILE": str(path),
           "CRAFT_SECRETS_KEY": "6Ijl_GdANX76rs7fpuqxpj0MAJSXQd_PfPTn58A-i4c="}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=settings.BASE_DIR,
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    agents = json.loads(result.stdout)
    assert agents == [
        {
            "id": "claude",
            "title": "Claude Code",
            "command": ["claude-agent-acp"],
            "env": {"ANTHROPIC_BASE_URL": None, "MODE": "fast"},
            "credentials": [
                {"name": "ANTHROPIC_API_KEY", "label": "Anthropic API key", "help": ""}
            ],
        },
        {
            "id": "demo",
            "title": "demo",
            "command": ["craft-demo-agent", "--controls", "modes"],
            "env": {},
            "credentials": [],
        },
    ]


def test_sizes_are_bytes_or_binary_units():
    show = "import craft.settings as s; print(s.CRAFT_SANDBOX_MEMORY, s.CRAFT_SANDBOX_DISK)"
    for memory, disk, expected in [
        ("512MiB", "10 GiB", f"{512 << 20} {10 << 30}"),
        ("1.5Gi", "0", f"{3 << 29} 0"),
        ("268435456", "2tib", f"{1 << 28} {2 << 40}"),
        ("0", "4096", "0 4096"),
    ]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRAFT_"))}
        result = subprocess.run(
            [sys.executable, "-c", show],
            env={**clean, "DJANGO_DEBUG": "1", "CRAFT_SANDBOX_MEMORY": memory,
                 "CRAFT_SANDBOX_DISK": disk},
            cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert result.stdout.split() == expected.split(), result.stderr
