"""The git hosts operators allow, and the repository URLs people may give."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from craft import git_hosts
from craft.checks import git_hosts_file
from craft.git_hosts import GitHostError, parse_repository_url

HOSTS = """\
[[hosts]]
host = "github.com"
kind = "github"
api_url = "https://api.github.com"

[[hosts]]
host = "GHE.Example.com:8443"
kind = "github"
api_url = "https://ghe.example.com:8443/api/v3/"

[[hosts]]
host = "gitlab.example.com"
kind = "gitlab"
api_url = "https://gitlab.example.com/api/v4"
submodules = true

[hosts.repositories."Team/App"]
setup = "make deps"

[[hosts]]
host = "git.intranet:3000"
kind = "gitea"
api_url = "http://git.intranet:3000/api/v1"
allow_http = true

[[hosts]]
host = "127.0.0.1:8443"
kind = "gitea"
api_url = "https://127.0.0.1:8443/api/v1"
"""


@pytest.fixture
def hosts_file(tmp_path, settings):
    """Write `text` as the hosts file and point the settings at it."""

    def write(text: str = HOSTS, name: str = "hosts.toml") -> str:
        path = tmp_path / name
        path.write_text(text)
        settings.CRAFT_GIT_HOSTS_FILE = str(path)
        return str(path)

    return write


@pytest.fixture
def configured(hosts_file):
    hosts_file()


def test_unset_the_defaults_are_github_and_gitlab(settings):
    settings.CRAFT_GIT_HOSTS_FILE = ""
    listed = git_hosts.hosts()
    assert sorted(listed) == ["github.com", "gitlab.com"]
    assert listed["github.com"].api_url == "https://api.github.com"
    assert listed["gitlab.com"].kind == "gitlab"
    assert listed["gitlab.com"].api_url == "https://gitlab.com/api/v4"
    assert not listed["github.com"].allow_http and not listed["github.com"].submodules


def test_the_file_names_each_host_lowercase_with_its_settings(configured):
    listed = git_hosts.hosts()
    assert sorted(listed) == [
        "127.0.0.1:8443",
        "ghe.example.com:8443",
        "git.intranet:3000",
        "github.com",
        "gitlab.example.com",
    ]
    enterprise = listed["ghe.example.com:8443"]
    assert enterprise.api_url == "https://ghe.example.com:8443/api/v3"
    gitlab = listed["gitlab.example.com"]
    assert gitlab.submodules and not gitlab.allow_http
    assert gitlab.setup_for("team/app") == "make deps"
    assert gitlab.setup_for("Team/App.git") == "make deps"
    assert gitlab.setup_for("team/other") is None
    assert listed["git.intranet:3000"].allow_http


@pytest.mark.parametrize(
    ("text", "url", "host", "path"),
    [
        (
            "https://github.com/owner/name",
            "https://github.com/owner/name",
            "github.com",
            "owner/name",
        ),
        (
            "https://GitHub.com/Owner/Name.git/",
            "https://github.com/Owner/Name.git",
            "github.com",
            "Owner/Name",
        ),
        ("  https://github.com:443/o/n  ", "https://github.com/o/n", "github.com", "o/n"),
        (
            "https://ghe.example.com:8443/o/n.git",
            "https://ghe.example.com:8443/o/n.git",
            "ghe.example.com:8443",
            "o/n",
        ),
        (
            "https://gitlab.example.com/group/sub/deeper/name",
            "https://gitlab.example.com/group/sub/deeper/name",
            "gitlab.example.com",
            "group/sub/deeper/name",
        ),
        (
            "http://git.intranet:3000/team/app",
            "http://git.intranet:3000/team/app",
            "git.intranet:3000",
            "team/app",
        ),
        ("https://127.0.0.1:8443/o/n", "https://127.0.0.1:8443/o/n", "127.0.0.1:8443", "o/n"),
    ],
)
def test_a_repository_url_is_accepted_in_its_normal_form(configured, text, url, host, path):
    repository = parse_repository_url(text)
    assert (repository.url, repository.host.host, repository.path) == (url, host, path)


def refused(text: object) -> GitHostError:
    with pytest.raises(GitHostError) as caught:
        parse_repository_url(text)
    return caught.value


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("file:///etc/passwd", "file:// URLs are not accepted"),
        ("ext::sh", "ext:: URLs run commands"),
        ("ext::sh -c touch% /tmp/pwned", "spaces or control characters"),
        ("ssh://git@github.com/o/n", "ssh:// URLs are not accepted"),
        ("git@github.com:o/n.git", "SSH addresses"),
        ("github.com:o/n", "SSH addresses"),
        ("/srv/git/repo.git", "a local path"),
        ("./repo", "a local path"),
        ("~/repo", "a local path"),
        ("github.com/o/n", "must be a URL"),
        ("http://github.com/o/n", "github.com is reached over https only"),
        ("https://github.com/o/n?ref=main", "no query"),
        ("https://github.com/o/n#readme", "no query"),
        ("https://github.com/o/../n", "must not contain . or .."),
        ("https://github.com/o/%2e%2e/n", "no % or"),
        ("https://github.com/o/n\n", "https://github.com/o/n\n"),  # stripped, accepted below
        ("https://github.com/o/n\x00x", "control characters"),
        ("https://github.com/o/n x", "spaces"),
        ("https://github.com/o", "https://github.com/owner/name, nothing more"),
        ("https://github.com/o/n/tree/main", "https://github.com/owner/name, nothing more"),
        ("https://github.com//o/n", "owner/name, each made of"),
        ("https://github.com/o/.git", "owner/name, each made of"),
        ("https:///o/n", "not a host name"),
        ("https://github.com./o/n", "not a host name"),
        ("https://github.com:99999/o/n", "not a host name"),
        ("", "must be a URL such as"),
        (42, "must be a URL such as"),
        ("https://github.com/" + "a" * 2000, "longer than 2000"),
    ],
)
def test_a_url_that_is_not_a_plain_https_repository_is_refused(configured, text, says):
    if text == "https://github.com/o/n\n":
        assert parse_repository_url(text).url == "https://github.com/o/n"
        return
    error = refused(text)
    assert error.code == "invalid_repository_url"
    assert says in error.message


def test_a_token_in_the_url_is_refused_and_not_repeated(configured):
    for text in (
        "https://ghp_secret0123456789@github.com/o/n",
        "https://user:ghp_secret0123456789@github.com/o/n",
        "http://oauth2:glpat-secret0123456789@git.intranet:3000/o/n",
    ):
        error = refused(text)
        assert error.code == "invalid_repository_url"
        assert "store your token for the host on the Keys page" in error.message
        assert "secret0123456789" not in error.message


@pytest.mark.parametrize(
    ("text", "host"),
    [
        ("https://gitlab.com/o/n", "gitlab.com"),  # a default, but the file replaces them
        ("https://evil.example/o/n", "evil.example"),
        ("https://github.com:8443/o/n", "github.com:8443"),
        ("https://ghe.example.com/o/n", "ghe.example.com"),  # the entry names port 8443
        ("https://127.0.0.1/o/n", "127.0.0.1"),
        ("https://127.0.0.1:8444/o/n", "127.0.0.1:8444"),
        ("https://localhost:8443/o/n", "localhost:8443"),  # not the entry 127.0.0.1:8443
        ("https://[::1]:8443/o/n", "[::1]:8443"),
        ("https://2130706433:8443/o/n", "2130706433:8443"),
        ("http://git.intranet/o/n", "git.intranet"),
    ],
)
def test_a_host_the_file_does_not_name_is_refused_naming_those_it_does(configured, text, host):
    error = refused(text)
    assert error.code == "unknown_git_host"
    assert error.message.startswith(f"{host} is not a git host this server allows")
    assert "github.com, gitlab.example.com" in error.message


def test_this_machines_addresses_are_refused_with_the_defaults(settings):
    settings.CRAFT_GIT_HOSTS_FILE = ""
    for text in ("https://127.0.0.1/o/n", "https://localhost/o/n", "https://[::1]/o/n"):
        assert refused(text).code == "unknown_git_host"


def test_only_gitlab_takes_nested_groups(configured):
    assert parse_repository_url("https://gitlab.example.com/a/b/c").path == "a/b/c"
    error = refused("https://ghe.example.com:8443/a/b/c")
    assert "https://ghe.example.com:8443/owner/name, nothing more" in error.message


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("not toml [", "is not valid TOML"),
        ("[[hosts]]\nhost = 'a.example'\nkind = 'bitbucket'\napi_url = 'https://a.example'\n",
         "host 1, line 1 ('a.example'): kind 'bitbucket' must be one of github, gitlab, gitea"),
        ("[[hosts]]\nhost = 'a.example'\nkind = 'github'\napi_url = 'https://a'\n\n[[hosts]]\n"
         "host = 'b.example'\nkind = 'gitea'\n", "host 2, line 6 ('b.example'): 'api_url'"),
        ("[[hosts]]\nhost = 'A.example'\nkind = 'github'\napi_url = 'https://a.example'\n"
         "[[hosts]]\nhost = 'a.example'\nkind = 'gitea'\napi_url = 'https://a.example'\n",
         "host 2, line 5: 'a.example' is listed twice"),
        ("[[hosts]]\nhost = 'https://a.example'\nkind = 'github'\napi_url = 'https://a'\n",
         "must be a host name or address"),
        ("[[hosts]]\nhost = 'a.example:443'\nkind = 'github'\napi_url = 'https://a'\n",
         "without its scheme's default port"),
        ("[[hosts]]\nhost = 'a.example'\nkind = 'github'\napi_url = 'http://a.example/api'\n",
         "api_url 'http://a.example/api' must be an https URL"),
        ("[[hosts]]\nhost = 'a.example'\nkind = 'github'\napi_url = 'https://a'\n"
         "allow-http = true\n", "unknown field 'allow-http'"),
        ("[[hosts]]\nhost = 'a.example'\nkind = 'github'\napi_url = 'https://a'\n"
         "allow_http = 'yes'\n", "'allow_http' must be true or false"),
        ("[[hosts]]\nhost = 'a.example'\nkind = 'github'\napi_url = 'https://a'\n"
         "[hosts.repositories.'o/n']\nsetup = 3\n", "repositories.'o/n': setup must be a command"),
        ("[[hosts]]\nhost = 'a.example'\nkind = 'github'\napi_url = 'https://a'\n"
         "[hosts.repositories.'../n']\nsetup = 'x'\n", "repositories.'../n' must be"),
        ("[hosts]\nhost = 'a.example'\n", "lists no [[hosts]]"),
        ("[[agents]]\nid = 'x'\n", "unknown key 'agents'"),
    ],
)  # fmt: skip
def test_a_bad_hosts_file_is_a_check_error_naming_the_entry_and_field(hosts_file, text, says):
    hosts_file(text)
    (error,) = git_hosts_file()
    assert error.id == "craft.E001"
    assert error.msg.startswith("CRAFT_GIT_HOSTS_FILE: ")
    assert says in error.msg


def test_a_missing_hosts_file_is_a_check_error(settings, tmp_path):
    settings.CRAFT_GIT_HOSTS_FILE = str(tmp_path / "nowhere.toml")
    (error,) = git_hosts_file()
    assert "cannot read" in error.msg and "No such file or directory" in error.msg


def test_a_good_hosts_file_or_none_passes_the_check(hosts_file, settings):
    hosts_file()
    assert git_hosts_file() == []
    settings.CRAFT_GIT_HOSTS_FILE = ""
    assert git_hosts_file() == []


def test_manage_py_check_stops_on_a_bad_hosts_file(tmp_path):
    bad = tmp_path / "hosts.toml"
    bad.write_text("[[hosts]]\nhost = 'a.example'\nkind = 'svn'\napi_url = 'https://a'\n")
    env = {"CRAFT_GIT_HOSTS_FILE": str(bad), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    ran = subprocess.run(
        [sys.executable, "manage.py", "check"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode != 0
    assert "craft.E001" in ran.stderr and "kind 'svn' must be one of" in ran.stderr
