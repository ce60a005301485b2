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

Every answer starts with one JSON line: `{"error": {"code", "message"}}` when refused.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
import zipfile
from collections.abc import Iterator
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


def escape(name: bytes) -> str:
    """Spell a file name (bytes) as text, reversibly (see the module's docstring)."""

    def spell(match: re.Match[str]) -> str:
        char = match.group()
        if char == "\\":
            return "\\\\"
        code = ord(char)
        return f"\\x{code - 0xDC00 if code >= 0xDC80 else code:02x}"

    return _SPECIAL.sub(spell, name.decode("utf-8", "surrogateescape"))


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


def open_folder(fd: int, names: list[bytes]) -> int:
    """Open the folder `names` below folder `fd`, following no link; the caller closes it."""
    current = os.dup(fd)
    try:
        for name in names:
            try:
                following = os.open(name, FOLDER, dir_fd=current)
            except FileNotFoundError:
                raise Refused("not_found", f"no such folder: {escape(name)}") from None
            except (NotADirectoryError, OSError) as exc:
                if _is_link(current, name):
                    raise Refused("is_link", f"{escape(name)} is a symbolic link") from None
                raise Refused(
                    "not_a_folder", f"{escape(name)} is not a folder ({exc.strerror})"
                ) from None
            os.close(current)
            current = following
    except BaseException:
        os.close(current)
        raise
    return current


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


def entry(fd: int, name: bytes) -> dict[str, object] | None:
    """Describe `name` in folder `fd` without following it; None if it vanished meanwhile."""
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    kind = kind_of(info.st_mode)
    described: dict[str, object] = {
        "name": escape(name),
        "type": kind,
        "size": info.st_size if kind == "file" else None,
        "mtime": info.st_mtime,
    }
    if kind == "link":
        try:
            described["target"] = escape(os.readlink(name, dir_fd=fd))
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
    folder = open_folder(workspace, parts_of(path))
    try:
        names = [os.fsencode(name) for name in os.listdir(folder)]
        entries = [e for e in (entry(folder, n) for n in names) if e is not None]
    finally:
        os.close(folder)
    entries.sort(key=lambda e: (e["type"] != "folder", str(e["name"]).lower(), e["name"]))
    return {
        "path": "/".join(escape(n) for n in parts_of(path)),
        "total": len(entries),
        "offset": offset,
        "entries": entries[offset : offset + limit],
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


def walk(
    fd: int, prefix: bytes, depth: int = 0
) -> Iterator[tuple[int, bytes, bytes, os.stat_result]]:
    """Yield (folder fd, name, path, lstat) for everything below folder `fd`, never following
    a link. The folder fd is valid only until the next item is asked for."""
    try:
        names = sorted(os.fsencode(name) for name in os.listdir(fd))
    except OSError:
        return
    for name in names:
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue  # gone meanwhile
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


_started = False  # whether the answer's first line went out


def header(out: BinaryIO, data: dict[str, object]) -> None:
    global _started
    _started = True
    out.write(json.dumps(data).encode() + b"\n")


USAGE = __doc__.split("Usage: ")[1].split("\n")[0]
COMMANDS = {"list": 3, "read": 2, "archive": 1}  # command: how many arguments


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
        else:
            archive(workspace, int(args[0]), out)
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
