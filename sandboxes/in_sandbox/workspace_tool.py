"""Reads a session's workspace for Craft, confined to it: list a folder, read a file, zip it all.

Craft never opens a sandbox's files by path in its own process. Each backend runs this
program where the agent runs, with the agent's rights: the local backend as the sandbox's
user, the Kubernetes backend through pod exec. It uses only the standard library and imports
nothing from the project, because it is also installed in the sandbox image.

Confinement: every name is opened relative to a folder descriptor with O_NOFOLLOW, starting
at the sandbox folder, so a symbolic link (to /etc, to another sandbox), placed anywhere on
the way or swapped in meanwhile, is never followed. A file is first opened with O_PATH, which
opens nothing (a FIFO cannot block, a device is not touched), and read only if that very
inode is a regular file. Links are listed as links with their target; FIFOs, sockets and
devices are listed and never opened.

Names are bytes on Linux. Craft shows and takes them as text in one reversible spelling
(`escape`): valid UTF-8 as itself, a backslash as `\\\\`, control characters and bytes that
are not UTF-8 as `\\xNN`.

Usage: workspace_tool.py <sandbox folder> <workspace, relative to it> <command> [arguments]

* `list <path> <offset> <limit>`: one JSON line, the folder's entries sorted (folders first).
* `read <path> <max bytes>`: one JSON line (the file's size, or an error), then its bytes.
* `archive <max bytes>`: one JSON line (counts, or an error), then the workspace as a zip.
* `write <path> <max bytes> <overwrite 0|1>`: the file's bytes come on stdin, until it ends;
  written to a new file beside it, which then takes its name (missing folders on the way are
  made); one JSON line once it is in place, `{"path", "size"}`, or the refusal: `exists`
  (unless overwrite), `too_large` (past max bytes: nothing is left), `is_link`,
  `not_a_file` (a folder has that name), `invalid_path`.
* `checkpoint <store> <max file bytes> <message>`: record the workspace in the git repository
  `store` (created if need be); one JSON line: the commit, and what was left out.
* `unchanged <store> <commit> <max file bytes>`: one JSON line, whether a checkpoint taken
  now would record what `commit` recorded (`{"unchanged": true}`), without writing one.
* `checkpoint-watch <store> <max file bytes> <message> <seconds>`: `checkpoint`, watching the
  workspace from just before it; then, when stdin gives a line or ends within `seconds`, a
  second JSON line: `{"unchanged": true}` if nothing in the workspace changed meanwhile; no
  second line at the first change or when the time runs out (ask `unchanged` then). After
  answering, it exits when its stdin ends (or the `seconds` are up).
* `changes <store> <before> <after> <limit>`: one JSON line, the files that differ between
  two commits ("" before: the empty tree).
* `diff <store> <before> <after> <path>`: one JSON line, then the unified diff ("" path: all).
* `revert <store> <before> <after> <path> <hunk>`: put the workspace back as it was in commit
  `before`: all of it ("" path), one file (and its old name, if `after` renamed it), or only
  hunk number `hunk` of the file's diff from `before` to `after`; one JSON line.
* `fork <store> <source store> <commit> <max bytes>`: a fork's start. The new session's
  store `store` becomes a copy of another session's, `source` (every checkpoint of it), and
  the files of its checkpoint `commit` are written into the (empty) workspace, by git, as a
  revert writes them; one JSON line, `{"files", "bytes"}`, or the refusal: `not_empty`,
  `too_large`, `no_checkpoint`.

Every answer starts with one JSON line: `{"error": {"code", "message"}}` when refused.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from collections.abc import Callable

# Imported where used (and typing not at all): a listing, the most frequent request, starts in
# a few milliseconds.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    import zipfile
    from collections.abc import Callable, Iterator
    from typing import BinaryIO

FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 16
MAX_DEPTH = 256  # a deeper tree is cut there, and said so


class Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# --- names --------------------------------------------------------------------------------

_SPECIAL = re.compile("[\\\\\x00-\x1f\x7f\udc80-\udcff]")


def escape(name: bytes | str) -> str:
    """Spell a file name as text, reversibly (see the module's docstring). A name may come
    as bytes, or as text decoded with surrogateescape, as `os.scandir` of a descriptor gives."""

    def spell(match: re.Match[str]) -> str:
        char = match.group()
        if char == "\\":
            return "\\\\"
        code = ord(char)
        return f"\\x{code - 0xDC00 if code >= 0xDC80 else code:02x}"

    text = name.decode("utf-8", "surrogateescape") if isinstance(name, bytes) else name
    return _SPECIAL.sub(spell, text) if _SPECIAL.search(text) else text


_SPELLED = re.compile(r"\\(\\|x[0-9a-fA-F]{2})")


def unescape(text: str) -> bytes:
    """Return the bytes a name spelled by `escape` stands for."""
    out = bytearray()
    position = 0
    for match in _SPELLED.finditer(text):
        out += text[position : match.start()].encode("utf-8", "surrogateescape")
        token = match.group(1)
        out += b"\\" if token == "\\" else bytes([int(token[1:], 16)])
        position = match.end()
    out += text[position:].encode("utf-8", "surrogateescape")
    return bytes(out)


def parts_of(path: str) -> list[bytes]:
    """Split a workspace path ("" or "." is the workspace) into names, refusing `..`."""
    names = [unescape(part) for part in path.split("/") if part not in ("", ".")]
    for name in names:
        if name == b".." or b"/" in name or b"\0" in name:
            raise Refused("invalid_path", "a path is names inside the workspace, without '..'")
    return names


# --- walking without following links ------------------------------------------------------


def _descend(fd: int, names: list[bytes], step: Callable[[int, bytes], int]) -> int:
    """Open the folder `names` below folder `fd`, one name at a time with `step(folder,
    name)`, closing each folder passed through; the caller closes the one returned."""
    current = os.dup(fd)
    try:
        for name in names:
            following = step(current, name)
            os.close(current)
            current = following
    except BaseException:
        os.close(current)
        raise
    return current


def _open_one(folder: int, name: bytes) -> int:
    try:
        return os.open(name, FOLDER, dir_fd=folder)
    except FileNotFoundError:
        raise Refused("not_found", f"no such folder: {escape(name)}") from None
    except (NotADirectoryError, OSError) as exc:
        if _is_link(folder, name):
            raise Refused("is_link", f"{escape(name)} is a symbolic link") from None
        raise Refused("not_a_folder", f"{escape(name)} is not a folder ({exc.strerror})") from None


def open_folder(fd: int, names: list[bytes]) -> int:
    """Open the folder `names` below folder `fd`, following no link; the caller closes it."""
    return _descend(fd, names, _open_one)


def _is_link(fd: int, name: bytes) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "other"


def entry(fd: int, item: os.DirEntry[str], spelled: str) -> dict[str, object] | None:
    """Describe `item` of folder `fd` (named `spelled`, as `escape` spells it) without
    following it; None if it vanished meanwhile."""
    try:
        info = item.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None
    kind = kind_of(info.st_mode)
    described: dict[str, object] = {
        "name": spelled,
        "type": kind,
        "size": info.st_size if kind == "file" else None,
        "mtime": info.st_mtime,
    }
    if kind == "link":
        try:
            described["target"] = escape(os.readlink(os.fsencode(item.name), dir_fd=fd))
        except OSError:
            described["target"] = None
    return described


def open_regular(fd: int, name: bytes) -> tuple[int, os.stat_result]:
    """Open regular file `name` of folder `fd` for reading; refuse anything else.

    O_PATH|O_NOFOLLOW opens the inode without opening the file; only once fstat says that
    very inode is a regular file is it opened for reading, through its descriptor.
    """
    try:
        handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except FileNotFoundError:
        raise Refused("not_found", f"no such file: {escape(name)}") from None
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            kind = kind_of(info.st_mode)
            raise Refused("not_a_file", f"{escape(name)} is a {kind}, not a regular file")
        return os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_CLOEXEC), info
    finally:
        os.close(handle)


# --- the commands -------------------------------------------------------------------------


def list_folder(workspace: int, path: str, offset: int, limit: int) -> dict[str, object]:
    """One page of a folder's entries, folders first, then by name regardless of case.

    The order needs only what the folder itself records (names, and whether each is a
    folder), so only the entries of the page asked for are looked at (`entry`).
    """
    folder = open_folder(workspace, parts_of(path))
    try:
        with os.scandir(folder) as found:
            # Each entry's place as one string: "0" for a folder, "1" for the rest, then its
            # name in lower case, then as spelled (a spelled name holds no NUL). Strings alone
            # sort several times faster than tuples; a folder of 10,000 is common.
            keyed = {}
            for item in found:
                name = item.name
                # escape's own test, without the call for the many names it leaves alone
                spelled = escape(name) if _SPECIAL.search(name) else name
                kind = "0" if item.is_dir(follow_symlinks=False) else "1"
                keyed[f"{kind}{spelled.lower()}\0{spelled}"] = spelled, item
        page = [
            entry(folder, item, spelled)
            for spelled, item in map(keyed.__getitem__, sorted(keyed)[offset : offset + limit])
        ]
    finally:
        os.close(folder)
    entries = [described for described in page if described is not None]
    total = len(keyed) - (len(page) - len(entries))  # less what vanished meanwhile
    return {
        "path": "/".join(escape(n) for n in parts_of(path)),
        "total": total,
        "offset": offset,
        "has_more": offset + limit < total,
        "entries": entries,
    }


def read_file(workspace: int, path: str, limit: int, out: BinaryIO) -> None:
    names = parts_of(path)
    if not names:
        raise Refused("not_a_file", "the workspace is a folder, not a file")
    folder = open_folder(workspace, names[:-1])
    try:
        fd, info = open_regular(folder, names[-1])
    finally:
        os.close(folder)
    with open(fd, "rb") as source:
        if info.st_size > limit:
            raise Refused(
                "too_large", f"the file has {info.st_size} bytes; at most {limit} are sent"
            )
        header(out, {"size": info.st_size, "mtime": info.st_mtime})
        # The file may grow meanwhile: never more than the size announced.
        left = info.st_size
        while left > 0 and (chunk := source.read(min(CHUNK, left))):
            out.write(chunk)
            left -= len(chunk)


def make_folders(fd: int, names: list[bytes]) -> int:
    """Open the folder `names` below folder `fd`, making the missing ones (mode 0700 less the
    umask), following no link; the caller closes it."""
    return _descend(fd, names, _make_one)


def _make_one(folder: int, name: bytes) -> int:
    try:
        os.mkdir(name, 0o777, dir_fd=folder)
    except FileExistsError:
        pass
    return _open_one(folder, name)


def write_file(workspace: int, path: str, limit: int, overwrite: bool, source: BinaryIO) -> dict:
    """Write stdin's bytes to `path` of the workspace (see the module docstring)."""
    names = parts_of(path)
    if not names:
        raise Refused("invalid_path", "name the file to write")
    folder = make_folders(workspace, names[:-1])
    name = names[-1]
    spelled = "/".join(escape(n) for n in names)
    temporary = b".%s.upload-%d" % (name[:100], os.getpid())
    try:
        try:
            existing = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            existing = None
        if existing is not None:
            if stat.S_ISLNK(existing.st_mode):
                raise Refused("is_link", f"{spelled} is a symbolic link")
            if not stat.S_ISREG(existing.st_mode):
                raise Refused("not_a_file", f"{spelled} is a {kind_of(existing.st_mode)}")
            if not overwrite:
                raise Refused("exists", f"{spelled} exists already")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(temporary, flags, 0o666, dir_fd=folder)
        size = 0
        try:
            with open(out, "wb") as target:
                while chunk := source.read(CHUNK):
                    size += len(chunk)
                    if size > limit:
                        raise Refused("too_large", f"the file is larger than {limit} bytes")
                    target.write(chunk)
            if overwrite:
                os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
            else:  # never over a file made meanwhile
                try:
                    os.link(temporary, name, src_dir_fd=folder, dst_dir_fd=folder,
                            follow_symlinks=False)  # fmt: skip
                except FileExistsError:
                    raise Refused("exists", f"{spelled} exists already") from None
        finally:
            try:
                os.unlink(temporary, dir_fd=folder)
            except FileNotFoundError:
                pass
    finally:
        os.close(folder)
    return {"path": spelled, "size": size}


def _names(fd: int) -> list[bytes]:
    """The names in folder `fd`, sorted (none when it cannot be listed)."""
    try:
        return sorted(os.fsencode(name) for name in os.listdir(fd))
    except OSError:
        return []


def _entries(fd: int, names: list[bytes]) -> Iterator[tuple[bytes, os.stat_result]]:
    """Yield (name, lstat) for each of `names` in folder `fd` still there."""
    for name in names:
        try:
            yield name, os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue  # gone meanwhile


def walk(
    fd: int, prefix: bytes, depth: int = 0
) -> Iterator[tuple[int, bytes, bytes, os.stat_result]]:
    """Yield (folder fd, name, path, lstat) for everything below folder `fd`, never following
    a link. The folder fd is valid only until the next item is asked for."""
    for name, info in _entries(fd, _names(fd)):
        path = prefix + name
        yield fd, name, path, info
        if stat.S_ISDIR(info.st_mode) and depth < MAX_DEPTH:
            try:
                child = os.open(name, FOLDER, dir_fd=fd)
            except OSError:
                continue  # swapped for a link, or closed to us
            try:
                yield from walk(child, path + b"/", depth + 1)
            finally:
                os.close(child)


def archive(workspace: int, limit: int, out: BinaryIO) -> None:
    """Write the workspace as a zip: files, folders and links (as links); nothing else.

    The sizes are added up first, so an archive over `limit` is refused before a byte goes
    out; files that grow meanwhile are cut at the size they had then.
    """
    import time
    import zipfile

    files = total = 0
    for _, _, _, info in walk(workspace, b""):
        if stat.S_ISREG(info.st_mode):
            files += 1
            total += info.st_size
    if total > limit:
        raise Refused(
            "too_large", f"the workspace holds {total} bytes in files; at most {limit} are sent"
        )
    header(out, {"files": files, "bytes": total})
    with zipfile.ZipFile(_Pipe(out), "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for fd, name, path, info in walk(workspace, b""):
            arcname = escape(path)
            stamp = time.localtime(max(info.st_mtime, 315532800))[:6]  # zip starts in 1980
            if stat.S_ISDIR(info.st_mode):
                zf.writestr(zipfile.ZipInfo(arcname + "/", stamp), b"")
            elif stat.S_ISLNK(info.st_mode):
                member = zipfile.ZipInfo(arcname, stamp)
                member.create_system = 3  # Unix: the mode below marks it as a link
                member.external_attr = (stat.S_IFLNK | 0o777) << 16
                zf.writestr(member, os.readlink(name, dir_fd=fd))
            elif stat.S_ISREG(info.st_mode):
                _add_file(zf, fd, name, arcname, stamp)


def _add_file(
    zf: zipfile.ZipFile, fd: int, name: bytes, arcname: str, stamp: tuple[int, ...]
) -> None:
    import zipfile

    try:
        handle, info = open_regular(fd, name)
    except Refused:
        return  # swapped for something else meanwhile
    member = zipfile.ZipInfo(arcname, stamp)  # type: ignore[arg-type]
    member.create_system = 3
    member.external_attr = (stat.S_IFREG | stat.S_IMODE(info.st_mode)) << 16
    member.compress_type = zipfile.ZIP_DEFLATED
    member.file_size = info.st_size
    with open(handle, "rb") as source, zf.open(member, "w") as target:
        left = info.st_size
        while left > 0 and (chunk := source.read(min(CHUNK, left))):
            target.write(chunk)
            left -= len(chunk)


class _Pipe:
    """A write-only stream without tell(), so that zipfile writes for a pipe (it cannot seek)."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out

    def write(self, data: bytes) -> int:
        return self._out.write(data)

    def flush(self) -> None:
        self._out.flush()

    def close(self) -> None:
        self._out.flush()


# --- checkpoints: git does the work ---------------------------------------------------------
#
# A checkpoint store is a bare git repository outside the workspace (where the agent cannot
# write it, on the local backend); the workspace is its work tree. git runs with the
# workspace, opened by the confined walk above, as its working directory, and nothing in the
# workspace may make it run a program or change the bytes it keeps:
#
# * configuration: none but the store's own and the options below (no system, global or XDG
#   file, nothing from the environment): no hooks, fsmonitor, pager, editor, signing,
#   automatic maintenance or network (`protocol.allow=never`);
# * attributes: the store's info/attributes comes before every .gitattributes (and the
#   macros they define), and leaves each attribute git acts on unspecified (`ATTRIBUTES`):
#   no filter, end-of-line or encoding conversion, `$Id$` expansion, or `-diff` that hides a
#   change as binary. (git 2.40's `--attr-source` could ignore the workspace's files
#   outright; git 2.39 has no such option.);
# * nested repositories (a folder below the top holding a `.git` of its own): git would
#   run `git status` inside one that it records as a commit (a "gitlink") at every `git add`,
#   with that repository's own configuration and attributes: its filters, its fsmonitor.
#   So checkpoints leave them out: excluded by name, and any gitlink is taken out of the
#   index before and after `git add` (one made in the moment between), so that git never
#   has one to look into; every diff and status ignores them besides.

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
# Left out of every checkpoint, besides what the workspace's own .gitignore leaves out.
DEFAULT_EXCLUDES = (
    "node_modules/", ".venv/", "venv/", "__pycache__/", ".mypy_cache/", ".pytest_cache/",
    ".ruff_cache/", ".tox/", ".gradle/", "target/", ".next/", ".cache/", "*.pyc",
    ".craft-demo-agent/",
)  # fmt: skip
_EXCLUDED_FOLDERS = frozenset(p.rstrip("/").encode() for p in DEFAULT_EXCLUDES if p.endswith("/"))
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Craft",
    "GIT_AUTHOR_EMAIL": "craft@localhost",
    "GIT_COMMITTER_NAME": "Craft",
    "GIT_COMMITTER_EMAIL": "craft@localhost",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}
GIT_OPTIONS = (
    "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "core.quotePath=false",
    "-c", "core.autocrlf=false", "-c", "core.symlinks=true", "-c", "gc.auto=0",
    "-c", "maintenance.auto=false", "-c", "commit.gpgSign=false", "-c", "safe.directory=*",
    "-c", "core.attributesFile=/dev/null", "-c", "core.excludesFile=/dev/null",
    "-c", "core.pager=cat", "-c", "protocol.allow=never",
    "-c", "submodule.recurse=false", "-c", "diff.ignoreSubmodules=all",
    "-c", "status.submoduleSummary=false",
)  # fmt: skip
# The store's info/attributes: every attribute that changes what git stores, writes back or
# shows, unspecified for every path, whatever a .gitattributes of the workspace says.
ATTRIBUTES = (
    b"* !text !eol !crlf !ident !filter !working-tree-encoding !encoding !diff !merge !whitespace\n"
)

# Renames found; no colour, external diff program, text conversion or nested repository
# whatever the workspace asks for.
DIFF_OPTIONS = ("-M", "--no-color", "--no-ext-diff", "--no-textconv", "--ignore-submodules=all")


def git_argv(store: str, *args: str) -> list[str]:
    """git on `store` with the workspace (the working directory) as its work tree."""
    return ["git", *GIT_OPTIONS, f"--git-dir={store}", "--work-tree=.", *args]


def git(store: str, *args: str, check: bool = True, argv: list[str] | None = None) -> bytes:
    done = _git_run(argv or git_argv(store, *args))
    if check and done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip()[-500:]
        raise Refused("git_failed", f"git {args[0]} failed: {message}")
    return done.stdout


def _git_run(argv: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    import subprocess

    return subprocess.run(argv, env=_git_env(), input=stdin, capture_output=True, check=False)


def _git_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent", **GIT_ENV}


def checkpoint(workspace: int, store: str, max_file_bytes: int, message: str) -> dict[str, object]:
    """Record the workspace as a commit of `store`; return its id and what was left out."""
    os.fchdir(workspace)
    if not os.path.exists(os.path.join(store, "HEAD")):
        git(store, "init", argv=["git", *GIT_OPTIONS, "init", "--quiet", "--bare", store])
    try:
        os.unlink(os.path.join(store, "index.lock"))  # left by a checkpoint stopped midway
    except FileNotFoundError:
        pass
    too_large, repositories = _left_out(workspace, max_file_bytes)
    own_attributes(store)
    with open(os.path.join(store, "info", "exclude"), "wb") as exclude:
        exclude.write(_excludes(too_large, repositories))
    # Before `add`, which would look into each gitlink (see above); and what an earlier
    # checkpoint recorded in a folder that now holds a repository leaves the checkpoints
    # (exclusion alone keeps tracked files), as does a file that grew past the limit (it is
    # listed in `too_large`).
    _untrack(store, repositories)
    for path in too_large:
        git(store, "rm", "--cached", "--quiet", "--ignore-unmatch", "--", _literal(path))
    git(store, "add", "--all", "--ignore-errors", check=False)
    _untrack(store, [])  # a repository made since `_left_out` looked
    git(store, "commit", "--quiet", "--allow-empty", "--no-verify", "-m", message)
    commit = git(store, "rev-parse", "HEAD").decode().strip()
    return {
        "commit": commit,
        "too_large": [escape(path) for path in too_large],
        "excluded": list(DEFAULT_EXCLUDES),
        "repositories": [escape(path) for path in repositories],
    }


def own_attributes(store: str) -> None:
    """Write the store's info/attributes (`ATTRIBUTES`) unless it already says that."""
    if not os.path.exists(os.path.join(store, "HEAD")):
        return  # no store yet (git then says so)
    path = os.path.join(store, "info", "attributes")
    try:
        with open(path, "rb") as current:
            if current.read() == ATTRIBUTES:
                return
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".new", "wb") as attributes:
        attributes.write(ATTRIBUTES)
    os.replace(path + ".new", path)  # whole, for a diff that reads it meanwhile


def _untrack(store: str, repositories: list[bytes]) -> None:
    """Take out of the store's index every nested repository (a gitlink) and everything in
    the folders `repositories`, without looking into any (`update-index --force-remove`
    checks nothing, unlike `rm --cached`, which asks `git status` in a gitlink)."""
    inside = tuple(path + b"/" for path in repositories)
    gone = []
    for line in git(store, "ls-files", "--stage", "-z").split(b"\0"):
        if line:
            mode, path = line.split(b" ", 1)[0], line.split(b"\t", 1)[1]
            if mode == b"160000" or path.startswith(inside):
                gone.append(path)
    if gone:
        stdin = b"".join(path + b"\0" for path in gone)
        done = _git_run(git_argv(store, "update-index", "-z", "--force-remove", "--stdin"), stdin)
        if done.returncode != 0:
            raise Refused("git_failed", "git update-index failed: " + done.stderr.decode()[-500:])


def _excludes(too_large: list[bytes], repositories: list[bytes]) -> bytes:
    """The store's info/exclude: the default patterns, then each file left out for its size
    and each folder left out for holding a repository of its own."""
    defaults = "\n".join(DEFAULT_EXCLUDES).encode() + b"\n"
    files = b"".join(b"/" + _pattern(path) + b"\n" for path in too_large)
    return defaults + files + b"".join(b"/" + _pattern(path) + b"/\n" for path in repositories)


def unchanged(workspace: int, store: str, commit: str, max_file_bytes: int) -> dict[str, object]:
    """Say whether a checkpoint taken now would record what `commit` recorded: it is the
    store's latest, the same files are left out for their size, and git sees nothing to add
    (nothing modified, deleted or new that is not ignored). Writes nothing but git's index
    refresh; any doubt answers false (the caller then takes a checkpoint)."""
    os.fchdir(workspace)
    try:
        with open(os.path.join(store, "info", "exclude"), "rb") as exclude:
            excludes = exclude.read()
    except FileNotFoundError:
        return {"unchanged": False}
    if excludes != _excludes(*_left_out(workspace, max_file_bytes)):
        return {"unchanged": False}
    own_attributes(store)
    done = _git_run(git_argv(store, "status", "--porcelain=v2", "--branch", "-z",
                             "--untracked-files=all", "--ignore-submodules=all"))  # fmt: skip
    if done.returncode != 0:
        return {"unchanged": False}
    lines = done.stdout.split(b"\0")
    head = next((line[len(b"# branch.oid ") :] for line in lines
                 if line.startswith(b"# branch.oid ")), b"")  # fmt: skip
    changed = any(line and not line.startswith(b"# ") for line in lines)
    return {"unchanged": head.decode() == commit and not changed}


# --- watching the workspace between a checkpoint and the next turn (Linux inotify) ---------

# A file written, closed after writing, its mode, owner or times changed; an entry created,
# deleted or moved in or out of a watched folder; the folder itself deleted or moved.
# (IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE,
# IN_DELETE_SELF, IN_MOVE_SELF.)
_IN_CHANGES = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800
_IN_ONLYDIR = 0x01000000
MAX_WATCHED_FOLDERS = 10_000  # a bigger tree is confirmed by git alone


def checkpoint_watch(
    workspace: int, store: str, max_file_bytes: int, message: str, seconds: float, out: BinaryIO
) -> None:
    """Take a checkpoint and say so; then wait for Craft's word on stdin (its first turn
    begins) and answer whether the workspace is still as the checkpoint recorded.

    The folders are watched from before the checkpoint reads them, so a change made while it
    runs counts as a change. The answer is at once while nothing was heard. At the first
    change heard (or a deleted workspace) the tool ends without a second line, as it does
    when `seconds` pass: Craft then asks `unchanged`. Where the workspace cannot be watched,
    this tool asks git itself when told. What no watch hears, a file written through a shared
    memory map, shows in the turn's own checkpoint.

    Once it has answered, the tool waits for its stdin to end before it exits: its exit tears
    down its jail, and Craft chooses when that happens (not while the turn it answered for
    is beginning)."""
    import select

    deadline = time.monotonic() + seconds
    inotify = watch_folders(workspace)
    recorded = checkpoint(workspace, store, max_file_bytes, message)
    header(out, recorded)
    out.flush()
    stdin = sys.stdin.buffer
    ready = select.select([stdin] if inotify is None else [stdin, inotify], [], [], seconds)[0]
    if stdin not in ready:
        return  # time is up, or something changed: no answer
    if inotify is not None and _heard_nothing(inotify):
        still = True
    else:
        commit = str(recorded["commit"])
        still = unchanged(workspace, store, commit, max_file_bytes)["unchanged"] is True
    out.write(json.dumps({"unchanged": still}).encode() + b"\n")
    out.flush()
    while select.select([stdin], [], [], max(0.0, deadline - time.monotonic()))[0]:
        if not os.read(stdin.fileno(), 1 << 12):
            return  # its end


def watch_folders(workspace: int) -> int | None:
    """Return an inotify descriptor that hears every change to what checkpoints record
    (every folder but the default-excluded ones), or None when that cannot be promised: too
    many folders, no inotify instance left, or a file with a second name (a hard link,
    written through a name outside the watched folders)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    inotify = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
    if inotify < 0:
        return None
    try:
        if _watch_below(libc.inotify_add_watch, inotify, workspace, 0, [0]):
            return inotify
    except OSError:
        pass
    os.close(inotify)
    return None


def _watch_below(
    add_watch: Callable[[int, bytes, int], int], inotify: int, folder: int, depth: int,
    count: list[int],
) -> bool:  # fmt: skip
    """Watch `folder` (before listing it: an entry made meanwhile is heard), then the folders
    below it; false if something cannot be watched."""
    os.fchdir(folder)
    count[0] += 1
    if count[0] > MAX_WATCHED_FOLDERS or depth >= MAX_DEPTH:
        return False
    if add_watch(inotify, b".", _IN_CHANGES | _IN_ONLYDIR) < 0:
        return False
    for name in os.listdir(folder):
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
            return False
        if stat.S_ISDIR(info.st_mode) and os.fsencode(name) not in _EXCLUDED_FOLDERS:
            child = os.open(name, FOLDER, dir_fd=folder)
            try:
                if not _watch_below(add_watch, inotify, child, depth + 1, count):
                    return False
            finally:
                os.close(child)
    return True


def _heard_nothing(inotify: int) -> bool:
    try:
        return not os.read(inotify, 1 << 16)
    except BlockingIOError:
        return True  # no event waiting


def _left_out(workspace: int, limit: int) -> tuple[list[bytes], list[bytes]]:
    """Return what checkpoints leave out besides what patterns do: the files over `limit`
    bytes, and the folders below the top that hold a `.git` of any kind (a repository of
    their own: nothing below one is looked at)."""
    too_large: list[bytes] = []
    repositories: list[bytes] = []

    def visit(fd: int, prefix: bytes, depth: int) -> None:
        names = _names(fd)
        if depth > 0 and b".git" in names:
            repositories.append(prefix[:-1])
            return
        for name, info in _entries(fd, names):
            if stat.S_ISREG(info.st_mode) and info.st_size > limit:
                too_large.append(prefix + name)
            elif (
                stat.S_ISDIR(info.st_mode)
                and depth < MAX_DEPTH
                and name not in _EXCLUDED_FOLDERS
                and name != b".git"
            ):
                try:
                    child = os.open(name, FOLDER, dir_fd=fd)
                except OSError:
                    continue  # swapped for a link, or closed to us
                try:
                    visit(child, prefix + name + b"/", depth + 1)
                finally:
                    os.close(child)

    visit(workspace, b"", 0)
    return too_large, repositories


def _literal(path: bytes) -> str:
    """A git pathspec that matches exactly `path` (no wildcards, no magic)."""
    return ":(literal)" + os.fsdecode(path)


def _pattern(path: bytes) -> bytes:
    """A gitignore pattern that matches exactly `path`."""
    return re.sub(rb"([\\*?\[\]!# ])", rb"\\\1", path)


def changes(workspace: int, store: str, before: str, after: str, limit: int) -> dict[str, object]:
    """The files that differ between two checkpoints, with +/- line counts (git's numstat)."""
    os.fchdir(workspace)
    own_attributes(store)
    before = before or EMPTY_TREE
    numstat = git(store, "diff", *DIFF_OPTIONS, "-z", "--numstat", before, after).split(b"\0")
    status = git(store, "diff", *DIFF_OPTIONS, "-z", "--name-status", before, after).split(b"\0")
    files: list[dict[str, object]] = []
    counts = iter(numstat)
    names = iter(status)
    for code in names:
        if not code:
            break
        added, removed, _ = next(counts).split(b"\t", 2)
        entry: dict[str, object] = {"status": _STATUS.get(code[:1], "modified")}
        if code.startswith(b"R"):
            entry["old_path"] = escape(next(names))
            entry["path"] = escape(next(names))
            next(counts), next(counts)  # numstat spells a rename as "\0old\0new"
        else:
            entry["path"] = escape(next(names))
        binary = added == b"-"
        entry.update(added=0 if binary else int(added), removed=0 if binary else int(removed))
        entry["binary"] = binary
        files.append(entry)
    return {"files": files[:limit], "truncated": len(files) > limit}


_STATUS = {b"A": "added", b"M": "modified", b"D": "deleted", b"R": "renamed", b"T": "modified"}


def diff(workspace: int, store: str, before: str, after: str, path: str, out: BinaryIO) -> None:
    """Write the unified diff between two checkpoints (of one path, if given)."""
    os.fchdir(workspace)
    own_attributes(store)
    selection = ["--", _literal(b"/".join(parts_of(path)))] if path else []
    header(out, {})
    out.flush()
    import subprocess

    argv = git_argv(store, "diff", *DIFF_OPTIONS, before or EMPTY_TREE, after, *selection)
    subprocess.run(argv, env=_git_env(), stdout=out, stderr=subprocess.DEVNULL, check=False)


def revert(
    workspace: int, store: str, before: str, after: str, path: str, hunk: str
) -> dict[str, object]:
    """Put the workspace (or one file, or one hunk) back as it was in checkpoint `before`.

    The caller records the workspace as a checkpoint first (so its index matches the files)
    and again after: the revert is a checkpoint of its own, and can itself be reverted.
    Files the checkpoints leave out (too large, excluded) are never touched.
    """
    os.fchdir(workspace)
    own_attributes(store)
    if not path:
        if hunk:
            raise Refused("invalid", "a hunk is reverted in one file: give its path")
        git(store, "read-tree", "--reset", "-u", before or EMPTY_TREE)
        return {}
    name = b"/".join(parts_of(path))
    if hunk:
        _unapply_hunk(store, before, after, name, hunk)
        return {}
    for each in [name, *_old_names(store, before, after, name)]:
        if before and _exists(store, before, each):
            git(store, "checkout", before, "--", _literal(each))
        else:  # it did not exist then
            git(store, "rm", "--quiet", "--force", "--ignore-unmatch", "--", _literal(each))
    return {}


def _exists(store: str, commit: str, name: bytes) -> bool:
    spec = f"{commit}:{os.fsdecode(name)}"
    return _git_run(git_argv(store, "cat-file", "-e", spec)).returncode == 0


def _old_names(store: str, before: str, after: str, name: bytes) -> list[bytes]:
    """The name `name` had in `before`, if `after` renamed it."""
    status = git(store, "diff", *DIFF_OPTIONS, "-z", "--name-status", before or EMPTY_TREE, after)
    fields = iter(status.split(b"\0"))
    for code in fields:
        if code.startswith(b"R"):
            old, new = next(fields), next(fields)
            if new == name:
                return [old]
        elif code:
            next(fields)
    return []


def _unapply_hunk(store: str, before: str, after: str, name: bytes, hunk: str) -> None:
    """Undo hunk number `hunk` (from 0) of the file's diff from `before` to `after`."""
    patch = git(store, "diff", *DIFF_OPTIONS, before or EMPTY_TREE, after, "--", _literal(name))
    head, *hunks = re.split(rb"^(?=@@ )", patch, flags=re.MULTILINE)
    if not hunk.isdigit() or int(hunk) >= len(hunks):
        raise Refused("no_such_hunk", f"that change of {escape(name)} has {len(hunks)} hunk(s)")
    done = _git_run(git_argv(store, "apply", "-R", "-"), stdin=head + hunks[int(hunk)])
    if done.returncode != 0:
        raise Refused(
            "conflict",
            f"{escape(name)} changed since: that hunk no longer applies (revert the file instead)",
        )


def fork(workspace: int, store: str, source: str, commit: str, limit: int) -> dict[str, object]:
    """Make the new session's checkpoint store `store` a copy of `source` (another session's
    of the same sandbox) and write the files of its checkpoint `commit` into the (empty)
    workspace: a fork (see the module's docstring).

    The copy takes the source's objects (hard links where the two stores share a
    filesystem, else copies; objects are never written in place), so every checkpoint of
    the source is one of the fork's, under the same commit id. git writes the files
    (`read-tree -u`, as a revert does): it refuses a name with `..`, an absolute one or a
    `.git`, writes links as links, and leaves the store's index matching the files, so the
    fork's first checkpoint has nothing to read again.
    """
    os.fchdir(workspace)
    if any(entry.name not in STATE_FOLDERS for entry in os.scandir(".")):
        raise Refused("not_empty", "the workspace already holds files")
    if os.path.exists(os.path.join(store, "HEAD")):
        raise Refused("not_empty", "the session has checkpoints already")
    if not re.fullmatch(r"[0-9a-f]{40,64}", commit):
        raise Refused("invalid", "a checkpoint is named by its commit id")
    if _git_run(git_argv(source, "cat-file", "-e", f"{commit}^{{commit}}")).returncode != 0:
        raise Refused("no_checkpoint", "the store has no such checkpoint")
    files = size = 0
    for line in filter(None, git(source, "ls-tree", "-r", "-l", "-z", commit).split(b"\0")):
        mode, kind, _, length = line.split(b"\t", 1)[0].split()  # "-" for a gitlink
        if kind == b"blob" and mode != b"120000":  # a link is no file
            files += 1
            size += int(length)
    if size > limit:
        raise Refused("too_large", f"the files are larger than {limit} bytes")
    git(store, "init", argv=["git", *GIT_OPTIONS, "init", "--quiet", "--bare", store])
    _link_objects(os.path.join(source, "objects"), os.path.join(store, "objects"))
    own_attributes(store)
    # Written by as many git processes as there are cores: the files of a big checkpoint are
    # most of a fork's time, much of it the kernel's (docs/history/performance-diary.md,
    # "A fork of a big session").
    parallel = ["git", "-c", "checkout.workers=0", *git_argv(store)[1:]]
    git(store, "read-tree", argv=[*parallel, "read-tree", "--reset", "-u", commit])
    git(store, "update-ref", "HEAD", commit)  # the fork's checkpoints follow that one
    return {"files": files, "bytes": size}


def _link_objects(source: str, target: str) -> None:
    """Put every object file of the object folder `source` (loose objects and packs, never
    `info`: no alternates) into `target`: a hard link, or a copy across filesystems."""
    import shutil

    with os.scandir(source) as folders:
        for folder in folders:
            if folder.name == "info" or not folder.is_dir(follow_symlinks=False):
                continue
            into = os.path.join(target, folder.name)
            os.makedirs(into, exist_ok=True)
            with os.scandir(folder.path) as found:
                for each in found:
                    if not each.is_file(follow_symlinks=False):
                        continue
                    there = os.path.join(into, each.name)
                    try:
                        os.link(each.path, there, follow_symlinks=False)
                    except FileExistsError:
                        pass
                    except OSError:  # another filesystem, or links refused
                        shutil.copyfile(each.path, there, follow_symlinks=False)


# What an agent may already have written in a workspace it started in (the demo agent's own
# state): not a file of the session.
STATE_FOLDERS = (".craft-demo-agent",)

_started = False  # whether the answer's first line went out


def header(out: BinaryIO, data: dict[str, object]) -> None:
    global _started
    _started = True
    out.write(json.dumps(data).encode() + b"\n")


USAGE = __doc__.split("Usage: ")[1].split("\n")[0]
# command: how many arguments
COMMANDS = {
    "list": 3, "read": 2, "archive": 1, "checkpoint": 3, "unchanged": 3, "changes": 4, "diff": 4,
    "revert": 5, "checkpoint-watch": 4, "write": 3, "fork": 4,
}  # fmt: skip


def main(argv: list[str]) -> int:
    out = sys.stdout.buffer
    if len(argv) < 3 or COMMANDS.get(argv[2]) != len(argv) - 3:
        header(out, {"error": {"code": "usage", "message": USAGE}})
        return 2
    sandbox, workspace_path, command, *args = argv
    try:
        root = os.open(sandbox, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            workspace = open_folder(root, [os.fsencode(p) for p in workspace_path.split("/") if p])
        except Refused:
            raise Refused("no_workspace", "the session's workspace does not exist yet") from None
        finally:
            os.close(root)
        if command == "list":
            path, offset, limit = args
            header(out, list_folder(workspace, path, int(offset), int(limit)))
        elif command == "read":
            path, limit = args
            read_file(workspace, path, int(limit), out)
        elif command == "archive":
            archive(workspace, int(args[0]), out)
        elif command == "write":
            path, limit, overwrite = args
            header(out, write_file(workspace, path, int(limit), overwrite == "1", sys.stdin.buffer))
        elif command == "checkpoint":
            store, max_file_bytes, message = args
            header(out, checkpoint(workspace, store, int(max_file_bytes), message))
        elif command == "checkpoint-watch":
            store, max_file_bytes, message, seconds = args
            checkpoint_watch(workspace, store, int(max_file_bytes), message, float(seconds), out)
        elif command == "unchanged":
            store, commit, max_file_bytes = args
            header(out, unchanged(workspace, store, commit, int(max_file_bytes)))
        elif command == "changes":
            store, before, after, limit = args
            header(out, changes(workspace, store, before, after, int(limit)))
        elif command == "diff":
            store, before, after, path = args
            diff(workspace, store, before, after, path, out)
        elif command == "fork":
            store, source, commit, limit = args
            header(out, fork(workspace, store, source, commit, int(limit)))
        else:
            store, before, after, path, hunk = args
            header(out, revert(workspace, store, before, after, path, hunk))
    except Refused as refused:
        header(out, {"error": {"code": refused.code, "message": str(refused)}})
    except BrokenPipeError:
        return 1  # Craft stopped reading (the download was cancelled)
    except OSError as exc:
        if not _started:
            code = "denied" if isinstance(exc, PermissionError) else "unreadable"
            header(out, {"error": {"code": code, "message": exc.strerror or str(exc)}})
        return 1  # else the stream is cut short, which Craft sees by the exit code
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
