"""The git hosts people may clone from and push to, and the repository URLs they accept.

Operators list the hosts in the TOML file named by CRAFT_GIT_HOSTS_FILE (docs/repositories.md);
unset, github.com and gitlab.com are offered. A repository URL is accepted only on a listed
host, as `https://` (plain `http://` only where the host's entry says `allow_http = true`),
and only as `host/owner/name`: no other scheme (`file://`, `ext::`, `ssh://`, scp-like
`git@host:path`, a local path), no user name or token, no query or fragment, nothing in the
path that git or a shell could read as something else. These are how a git URL becomes a way
out of the sandbox; the list of hosts is also how this machine's own addresses stay out of
reach: `https://127.0.0.1/…` is accepted only when an entry names `127.0.0.1` (and its port).

The file is read once per process: a change needs a restart, and a bad file stops
`manage.py check` and `migrate` (craft.checks.git_hosts_file) rather than being half used.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from craft.toml_files import read_tables

KINDS = ("github", "gitlab", "gitea")
MAX_URL_LENGTH = 2000
# GitLab's groups nest up to 20 deep; a repository is the last part.
MAX_GITLAB_DEPTH = 21

# A host as URLs and the hosts file write it: a name or an IPv4 address, or [an IPv6
# address], and an optional port.
HOST = re.compile(
    r"(?P<name>[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?|\[[0-9a-f:.]+\])(?::(?P<port>\d{1,5}))?"
)
# One part of a repository's path as GitHub, GitLab and Gitea allow them.
PATH_PART = re.compile(r"[A-Za-z0-9_.-]+")
SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
DEFAULT_PORTS = {"https": 443, "http": 80}


@dataclass(frozen=True)
class RepositorySettings:
    """What a host entry says of one of its repositories."""

    setup: str | None = None  # the command that readies a fresh clone (else .craft/setup.sh)


@dataclass(frozen=True)
class GitHost:
    """One host people may use: where its API is and what it allows."""

    host: str  # "github.com" or "git.example.com:8443", lowercase: the key of tokens and URLs
    kind: str  # "github" | "gitlab" | "gitea" (gitea also covers Forgejo)
    api_url: str  # without a trailing slash
    allow_http: bool = False
    submodules: bool = False
    # By "owner/name", lowercase (the hosts compare paths without case).
    repositories: Mapping[str, RepositorySettings] = field(
        default_factory=dict, hash=False, compare=False
    )

    def setup_for(self, path: str) -> str | None:
        """Return the set-up command the entry names for the repository `path`, if any."""
        settings_ = self.repositories.get(path.lower().removesuffix(".git"))
        return settings_.setup if settings_ else None


DEFAULT_HOSTS = (
    GitHost("github.com", "github", "https://api.github.com"),
    GitHost("gitlab.com", "gitlab", "https://gitlab.com/api/v4"),
)


class GitHostError(Exception):
    """A repository URL was refused; the message is fit to show and never repeats a secret."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code  # unknown_git_host | invalid_repository_url
        self.message = message


class HostsFileError(Exception):
    """CRAFT_GIT_HOSTS_FILE cannot be used; the message says where and what."""


@dataclass(frozen=True)
class RepositoryUrl:
    """A repository URL that may be cloned: on an allowed host, in its normal form."""

    host: GitHost
    url: str  # scheme, lowercase host (no default port), path as given without a trailing /
    path: str  # "owner/name" (GitLab: "group/sub/name"), without ".git"

    @property
    def owner(self) -> str:
        return self.path.rsplit("/", 1)[0]

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[1]


def hosts() -> dict[str, GitHost]:
    """Return the hosts people may use, by `host`: the file's, or the defaults when unset.

    Raises ImproperlyConfigured when the file cannot be used (which `manage.py check` said).
    """
    path = settings.CRAFT_GIT_HOSTS_FILE
    if not path:
        return {h.host: h for h in DEFAULT_HOSTS}
    try:
        return dict(_read_cached(path))
    except HostsFileError as exc:
        raise ImproperlyConfigured(str(exc)) from exc


@functools.cache
def _read_cached(path: str) -> dict[str, GitHost]:
    return read_hosts_file(path)


ENTRY_KEYS = {"host", "kind", "api_url", "allow_http", "submodules", "repositories"}


def read_hosts_file(path: str) -> dict[str, GitHost]:
    """Read the hosts file at `path`; raise HostsFileError naming the entry, its line and the
    field at fault."""
    name = "CRAFT_GIT_HOSTS_FILE"
    entries, text = read_tables(name, path, "hosts", HostsFileError)
    lines = _entry_lines(text)
    found: dict[str, GitHost] = {}
    for number, entry in enumerate(entries, start=1):
        line = f", line {lines[number - 1]}" if number <= len(lines) else ""
        where = f"{name}: host {number}{line}"
        host = _host_entry(where, entry)
        if host.host in found:
            raise HostsFileError(f"{where}: {host.host!r} is listed twice")
        found[host.host] = host
    return found


def _entry_lines(text: str) -> list[int]:
    """Return the line number of each `[[hosts]]` header, in order."""
    return [
        number
        for number, line in enumerate(text.splitlines(), start=1)
        if re.fullmatch(r"\s*\[\[\s*hosts\s*\]\]\s*(#.*)?", line)
    ]


def _host_entry(where: str, entry: object) -> GitHost:
    if not isinstance(entry, dict):
        raise HostsFileError(f"{where} is not a table")
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise HostsFileError(
            f"{where}: unknown field {sorted(unknown)[0]!r} "
            f"(known: {', '.join(sorted(ENTRY_KEYS))})"
        )
    host = entry.get("host")
    if not isinstance(host, str) or not host:
        raise HostsFileError(f"{where}: 'host' must be a host name, or name:port")
    host = host.strip().lower()
    match = HOST.fullmatch(host)
    if match is None or (match["port"] and not 0 < int(match["port"]) < 65536):
        raise HostsFileError(
            f"{where}: host {host!r} must be a host name or address, with an optional :port "
            "(no scheme, no path)"
        )
    if match["port"] and int(match["port"]) in DEFAULT_PORTS.values():
        raise HostsFileError(
            f"{where}: host {host!r}: write it without its scheme's default port "
            f"({match['name']!r})"
        )
    where = f"{where} ({host!r})"
    kind = entry.get("kind")
    if kind not in KINDS:
        raise HostsFileError(f"{where}: kind {kind!r} must be one of {', '.join(KINDS)}")
    allow_http = _boolean(where, entry, "allow_http")
    submodules = _boolean(where, entry, "submodules")
    api_url = entry.get("api_url")
    if not isinstance(api_url, str) or not api_url.strip():
        raise HostsFileError(f"{where}: 'api_url' is missing (the URL of the host's REST API)")
    api_url = api_url.strip().rstrip("/")
    api = urlsplit(api_url)
    schemes = ("https", "http") if allow_http else ("https",)
    if (
        api.scheme not in schemes
        or not api.hostname
        or "@" in api.netloc
        or api.query
        or api.fragment
    ):
        raise HostsFileError(
            f"{where}: api_url {api_url!r} must be an {' or '.join(schemes)} URL with no user "
            "name, query or fragment"
        )
    repositories = entry.get("repositories", {})
    if not isinstance(repositories, dict):
        raise HostsFileError(f"{where}: 'repositories' must be a table of \"owner/name\" tables")
    return GitHost(
        host=host,
        kind=kind,
        api_url=api_url,
        allow_http=allow_http,
        submodules=submodules,
        repositories={
            _repository_key(where, key): _repository_settings(where, key, value)
            for key, value in repositories.items()
        },
    )


def _boolean(where: str, entry: dict[str, object], key: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise HostsFileError(f"{where}: {key!r} must be true or false")
    return value


def _repository_key(where: str, key: str) -> str:
    parts = key.removesuffix(".git").split("/")
    if len(parts) < 2 or not all(PATH_PART.fullmatch(p) and p not in (".", "..") for p in parts):
        raise HostsFileError(f'{where}: repositories.{key!r} must be "owner/name"')
    return "/".join(parts).lower()


def _repository_settings(where: str, key: str, value: object) -> RepositorySettings:
    if not isinstance(value, dict) or set(value) - {"setup"}:
        raise HostsFileError(f'{where}: repositories.{key!r} may only say setup = "..."')
    setup = value.get("setup")
    if setup is not None and (not isinstance(setup, str) or not setup.strip()):
        raise HostsFileError(f"{where}: repositories.{key!r}: setup must be a command")
    return RepositorySettings(setup=setup)


def _refuse(message: str) -> GitHostError:
    return GitHostError("invalid_repository_url", message)


HTTPS_FORM = "give it as https://host/owner/name"


def parse_repository_url(text: object) -> RepositoryUrl:
    """Return the repository `text` names, on an allowed host; raise GitHostError saying why
    it is refused otherwise. The message never repeats what could be a secret."""
    if not isinstance(text, str) or not text.strip():
        raise _refuse("the repository must be a URL such as https://github.com/owner/name")
    text = text.strip()
    if len(text) > MAX_URL_LENGTH:
        raise _refuse(f"the repository URL is longer than {MAX_URL_LENGTH} characters")
    if any(c.isspace() or not c.isprintable() for c in text):
        raise _refuse("the repository URL contains spaces or control characters")
    scheme = SCHEME.match(text)
    if text.startswith(("/", ".", "~", "\\")) or re.match(r"[A-Za-z]:[\\/]", text):
        raise _refuse(f"a local path is not a repository Craft can clone: {HTTPS_FORM}")
    if scheme is None or not text[scheme.end() :].startswith("//"):
        if scheme and scheme[1].lower() == "ext":
            raise _refuse("ext:: URLs run commands: only https:// URLs are accepted")
        if "@" in text or ":" in text:
            raise _refuse(
                f"SSH addresses (such as git@host:owner/name) are not supported yet: {HTTPS_FORM}"
            )
        raise _refuse(f"the repository must be a URL: {HTTPS_FORM}")
    kind = scheme[1].lower()
    if kind not in DEFAULT_PORTS:
        raise _refuse(f"{kind}:// URLs are not accepted: {HTTPS_FORM}")
    rest = text[scheme.end() + 2 :]
    netloc, slash, _ = rest.partition("/")
    if "@" in netloc:
        raise _refuse(
            "the URL carries a user name or a token: store your token for the host on the Keys "
            "page, and give the URL without it"
        )
    if "?" in text or "#" in text:
        raise _refuse("the repository URL must have no query (?) or fragment (#)")
    host = _host_key(netloc.lower(), kind)
    allowed = hosts()
    entry = allowed.get(host)
    if entry is None:
        raise GitHostError(
            "unknown_git_host",
            f"{host[:255]} is not a git host this server allows (it allows: "
            f"{', '.join(sorted(allowed))})",
        )
    if kind == "http" and not entry.allow_http:
        raise _refuse(f"{host} is reached over https only: give the URL as https://")
    raw_path = text[scheme.end() + 2 + len(netloc) :] if slash else ""
    path = _repository_path(entry, raw_path.removesuffix("/"))
    return RepositoryUrl(host=entry, url=f"{kind}://{host}{raw_path.removesuffix('/')}", path=path)


def _host_key(netloc: str, scheme: str) -> str:
    """Return the host as the hosts file would name it (no default port)."""
    match = HOST.fullmatch(netloc)
    if match is None or (match["port"] is not None and not 0 < int(match["port"]) < 65536):
        raise _refuse("the repository URL's host is not a host name or address")
    port = match["port"]
    if port is None or int(port) == DEFAULT_PORTS[scheme]:
        return match["name"]
    return f"{match['name']}:{int(port)}"


def _repository_path(host: GitHost, raw: str) -> str:
    if "%" in raw or "\\" in raw:
        raise _refuse("the repository's path must be plain owner/name (no % or \\)")
    parts = raw.removeprefix("/").split("/") if raw else []
    if parts:
        parts[-1] = parts[-1].removesuffix(".git")
    if any(p in ("", ".", "..") or not PATH_PART.fullmatch(p) for p in parts):
        if any(p in (".", "..") for p in parts):
            raise _refuse("the repository's path must not contain . or .. parts")
        raise _refuse(
            "the repository's path must be owner/name, each made of letters, digits, '-', '_' "
            "and '.'"
        )
    nested = host.kind == "gitlab"
    if len(parts) < 2 or (len(parts) > 2 and not nested) or len(parts) > MAX_GITLAB_DEPTH:
        shape = "group/name (or group/subgroup/name)" if nested else "owner/name"
        raise _refuse(
            f"a repository URL on {host.host} is https://{host.host}/{shape}, nothing more "
            "(not a page of the repository)"
        )
    return "/".join(parts)
