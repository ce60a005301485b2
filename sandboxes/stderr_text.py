"""What an agent's stderr says, in words a person can read: its line that names the trouble.

Craft keeps an agent's last stderr lines (`stderr_log.StderrLog`) and shows them when the agent
fails to start, a turn errors, or a turn goes quiet. Quoted raw, they mislead: the tail of a
Node crash is the end of its stack (`ve:946:18)\\n at defaultResolve …`), and terminal colours
and progress bars come as escape codes. `clean` makes the text fit to show (what `StderrLog`
kept, decoded, with credentials redacted already), `said` picks the one line that says what
went wrong, and `last_said` the last line worth reading (what an agent retrying says it does).

What is not worth a line: blank lines, stack frames (`    at f (file.js:1:2)`), Node's source
excerpt (a `file:line` header, the line of code, the caret line under it), the object Node
prints after a stack (`{ code: 'ERR_…' }`), its `Require stack:` list and `Node.js v20`
footer, the frames and code of a Python traceback and the sentences that chain two of them,
a bare `Error:`, and the kubelet's "command terminated with non-zero exit code" that a pod
exec's end adds. Of what is left, `said` takes the last line that reads as an error
(Python's last `SomeError: message`, Node's `Error [ERR_MODULE_NOT_FOUND]: Cannot find
package …` read as `Cannot find package …`), else the last line left.
"""

from __future__ import annotations

import re

# The longest line shown as what the agent said, cut at a word.
LINE_CHARS = 300
# The most of the kept stderr stored with an error (`CRAFT_MAX_STDERR_BYTES` lines of up to
# 16 KiB each could make 320 KiB); past it the earliest lines go.
KEPT_CHARS = 32_000
EARLIER_CUT = "[… earlier lines cut]"

# Escape sequences a terminal would act on: CSI (colours, cursor moves), OSC (titles, links)
# and the two-byte ones.
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# Control characters but tab; the line feed is the line's end, and a carriage return is
# handled before (the text after the last one is what a terminal shows).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

_FRAME = re.compile(r"\s+at\s")  # `    at f (file.js:1:2)`, also Java's and Go's-like
_CARET = re.compile(r"\s*[\^~]+\s*")  # under a line of code (Node, Python 3.11+)
# Node's header of a source excerpt: a file (or `node:internal/…`, `[eval]`) and a line.
_LOCATION = re.compile(r"\S+:\d+(?::\d+)?")
_NODE_FOOTER = re.compile(r"Node\.js v\d+(?:\.\d+)*")
_BARE_ERROR = re.compile(r"(?:error|Error|ERROR):?")
_TRACEBACK = "Traceback (most recent call last):"  # also ends "Exception Group Traceback …"
# Rust's panic: its header names where, the next line says what.
_PANIC = re.compile(r"thread '.*' panicked at .*:")
_RUST_HINT = re.compile(r"note: run with `RUST_BACKTRACE=")
# Where a Python SyntaxError was found, without a traceback's header; its code follows.
_PYTHON_FILE = re.compile(r'File ".*", line \d+')
_PYTHON_CHAINS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# A log line's leading time (tracing's `2026-01-02T03:04:05.678Z`, Python logging's): the
# person reads the line as it is now.
_TIMESTAMP = re.compile(
    r"\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?\s+"
)
# What the kubelet says of a pod exec that ended badly, kept with the agent's stderr: the exit
# code is in Craft's own message already, and the agent's line says why.
_EXEC_EXIT = re.compile(r"command terminated with non-zero exit code")
_NODE_HINT = re.compile(r"\(Use `node --trace-")
# Words of a line that says what went wrong.
_ERRORISH = re.compile(
    r"(?:Error|Exception|Fault)\b|\bERR_[A-Z0-9_]+|\b(?:error|fatal|panic(?:ked)?|failed|"
    r"failure|cannot|can't|could not|unable|denied|refused|invalid|unauthori[sz]ed|"
    r"forbidden|not found|no such|missing)\b",
    re.IGNORECASE,
)
# The generic head of a JavaScript error's line, which says nothing the rest does not.
_GENERIC_HEAD = re.compile(r"(?:Uncaught )?Error(?: \[[A-Z0-9_]+\])?: ")


def clean(text: str) -> str:
    """Return stderr text fit to show: each line as a terminal would leave it (the text after
    its last carriage return), without escape sequences, control characters (tab excepted),
    NULs or lone surrogates, and without blank lines at its ends."""
    lines = []
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if "\r" in line:
            line = line.rsplit("\r", 1)[1]
        if "\x1b" in line:
            line = _ESCAPE.sub("", line)
        lines.append(_CONTROL.sub("", line).rstrip())
    # Lone surrogates cannot come out of a decode with errors="replace"; a caller's text may
    # hold them all the same.
    cleaned = "\n".join(lines).strip("\n")
    try:
        cleaned.encode("utf-8")
    except UnicodeEncodeError:
        cleaned = cleaned.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return cleaned


def kept(text: str) -> str:
    """Return what is stored of the kept stderr: cleaned, at most KEPT_CHARS, the latest
    lines first to stay (the earliest are cut whole, and the cut is said)."""
    cut, text = without_earlier(clean(text))
    if len(text) <= KEPT_CHARS - (len(EARLIER_CUT) + 1 if cut else 0):
        return f"{EARLIER_CUT}\n{text}" if cut else text
    rest = text[-(KEPT_CHARS - len(EARLIER_CUT) - 1) :]
    newline = rest.find("\n")
    return f"{EARLIER_CUT}\n{rest[newline + 1 :] if newline >= 0 else rest}"


def without_earlier(text: str) -> tuple[bool, str]:
    """Return whether `text` (a kept stderr) starts by saying earlier lines were cut, and the
    text without that line."""
    if text == EARLIER_CUT:
        return True, ""
    if text.startswith(EARLIER_CUT + "\n"):
        return True, text[len(EARLIER_CUT) + 1 :]
    return False, text


def written_after(before: str, now: str) -> str:
    """Return the lines of the kept stderr `now` that were written after it was `before`.

    The kept stderr is its last lines: `now` is the end of `before` (maybe none of it) and
    the lines written since. The longest end of `before` that `now` starts with is taken for
    what was there; lines written again identically may so be taken for old ones.
    """
    before, now = without_earlier(before)[1], without_earlier(now)[1]
    if not before:
        return now
    if now == before:
        return ""
    old, new = before.split("\n"), now.split("\n")
    for start in range(len(old)):
        kept = len(old) - start
        if new[:kept] == old[start:]:
            return "\n".join(new[kept:])
    return now


def said(text: str) -> str:
    """Return the line of stderr `text` that says what went wrong ("" if none): the last
    meaningful line that reads as an error, else the last meaningful line; cut to LINE_CHARS
    at a word."""
    lines = meaningful_lines(text)
    if not lines:
        return ""
    line = next((line for line in reversed(lines) if _ERRORISH.search(line)), lines[-1])
    head = _GENERIC_HEAD.match(line)
    return _bounded(line[head.end() :] if head and head.end() < len(line) else line)


def last_said(text: str) -> str:
    """Return the last meaningful line of stderr `text` ("" if none), cut to LINE_CHARS."""
    lines = meaningful_lines(text)
    return _bounded(lines[-1]) if lines else ""


def meaningful_lines(text: str) -> list[str]:
    """Return the lines of stderr `text` worth reading, cleaned and stripped, in order."""
    out: list[str] = []
    excerpt_next = False  # the line after a `file:line` header is its code
    in_object = False  # the properties Node prints after a stack, `{ … }`
    in_traceback = False  # a Python traceback's frames, until its exception's line
    in_require_stack = False
    panic_next = False
    for raw in without_earlier(clean(text))[1].split("\n"):
        line = raw.strip()
        if in_object:
            in_object = line != "}"
            continue
        if excerpt_next:
            excerpt_next = False
            if line and not _CARET.fullmatch(line):
                continue
        if in_require_stack:
            if line.startswith("- "):
                continue
            in_require_stack = False
        if in_traceback:
            if not line or raw[:1].isspace():
                continue
            in_traceback = False
        if panic_next and line:
            panic_next = False
            out.append(f"panicked: {line}")
            continue
        if _FRAME.match(raw):
            in_object = line.endswith("{")
            continue
        if line.endswith(_TRACEBACK) or _PYTHON_FILE.fullmatch(line):
            in_traceback = True
            continue
        if line == "Require stack:":
            in_require_stack = True
            continue
        if _LOCATION.fullmatch(line):
            excerpt_next = True
            continue
        if _PANIC.fullmatch(line):
            panic_next = True
            continue
        if (
            not line
            or _CARET.fullmatch(line)
            or _NODE_FOOTER.fullmatch(line)
            or _BARE_ERROR.fullmatch(line)
            or _NODE_HINT.match(line)
            or _RUST_HINT.match(line)
            or _EXEC_EXIT.match(line)
            or line in _PYTHON_CHAINS
        ):
            continue
        out.append(
            _TIMESTAMP.sub("", line, count=1) if line[:1].isdigit() or line[:1] == "[" else line
        )
    return out


def _bounded(line: str) -> str:
    """Return `line` cut to LINE_CHARS, at a space when one is not too far back."""
    if len(line) <= LINE_CHARS:
        return line
    cut = line[: LINE_CHARS - 1]
    space = cut.rfind(" ")
    if space > LINE_CHARS // 2:
        cut = cut[:space]
    return f"{cut.rstrip()}…"
