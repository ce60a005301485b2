"""The line of an agent's stderr that says what went wrong, read from real Node and Python crashes.

Each crash is produced by the real interpreter (Node, which `make test` installs, and this
Python), so that the samples are what those versions print, paths and all; a few agents'
words that cannot be produced here (a Rust panic, a retrying model call) are quoted.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxes import stderr_text

NODE = shutil.which("node")
needs_node = pytest.mark.skipif(
    NODE is None, reason="Node is not installed (make test installs it)"
)


def stderr_of(argv: list[str], cwd: Path) -> str:
    """Run a program that fails; return its stderr."""
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, done
    return done.stderr


def node(tmp_path: Path, name: str, source: str) -> str:
    (tmp_path / name).write_text(source)
    assert NODE is not None
    return stderr_of([NODE, name], tmp_path)


def python(tmp_path: Path, source: str) -> str:
    (tmp_path / "agent.py").write_text(source)
    return stderr_of([sys.executable, "agent.py"], tmp_path)


@needs_node
def test_a_missing_package_of_an_es_module_reads_as_node_s_own_sentence(tmp_path):
    # What an agent installed without its dependencies (or whose folder the jail hides) says.
    stderr = node(tmp_path, "index.mjs", 'import sdk from "@anthropic-ai/claude-agent-sdk";\n')
    assert "ERR_MODULE_NOT_FOUND" in stderr and "    at " in stderr
    assert stderr_text.said(stderr) == (
        f"Cannot find package '@anthropic-ai/claude-agent-sdk' imported from {tmp_path}/index.mjs"
    )


@needs_node
def test_a_missing_file_of_an_es_module_reads_as_cannot_find_module(tmp_path):
    stderr = node(tmp_path, "index.mjs", 'import "./dist/cli.js";\n')
    assert stderr_text.said(stderr) == (
        f"Cannot find module '{tmp_path}/dist/cli.js' imported from {tmp_path}/index.mjs"
    )


@needs_node
def test_a_missing_common_js_module_reads_without_its_require_stack(tmp_path):
    stderr = node(tmp_path, "index.js", 'require("left-pad");\n')
    assert "Require stack:" in stderr
    assert stderr_text.said(stderr) == "Cannot find module 'left-pad'"


@needs_node
def test_a_thrown_type_error_keeps_its_type_and_loses_the_excerpt_and_caret(tmp_path):
    stderr = node(tmp_path, "index.js", "function f() {\n  null.x();\n}\nf();\n")
    assert "^" in stderr and "null.x();" in stderr
    assert stderr_text.said(stderr) == "TypeError: Cannot read properties of null (reading 'x')"


@needs_node
def test_an_unhandled_rejection_after_log_lines_reads_as_the_error(tmp_path):
    source = (
        'console.error("starting the agent");\n'
        'console.error("\\x1b[33mwarning:\\x1b[0m slow disk");\n'
        'Promise.reject(new Error("ANTHROPIC_API_KEY is not set"));\n'
    )
    stderr = node(tmp_path, "index.js", source)
    assert stderr_text.said(stderr) == "ANTHROPIC_API_KEY is not set"
    assert stderr_text.meaningful_lines(stderr)[:2] == ["starting the agent", "warning: slow disk"]


def test_a_python_traceback_reads_as_its_last_exception(tmp_path):
    source = (
        "import sys\n"
        "print('loading settings', file=sys.stderr)\n"
        "try:\n"
        "    {}['model']\n"
        "except KeyError as exc:\n"
        "    raise RuntimeError('the settings name no model') from exc\n"
    )
    stderr = python(tmp_path, source)
    assert stderr.count("Traceback (most recent call last):") == 2
    assert stderr_text.said(stderr) == "RuntimeError: the settings name no model"
    assert stderr_text.meaningful_lines(stderr) == [
        "loading settings",
        "KeyError: 'model'",
        "RuntimeError: the settings name no model",
    ]


def test_a_missing_python_module_reads_as_module_not_found(tmp_path):
    stderr = python(tmp_path, "import acp_runtime_that_is_not_installed\n")
    assert stderr_text.said(stderr) == (
        "ModuleNotFoundError: No module named 'acp_runtime_that_is_not_installed'"
    )


def test_a_python_syntax_error_loses_its_excerpt(tmp_path):
    stderr = python(tmp_path, "x = (\n")
    assert stderr_text.said(stderr).startswith("SyntaxError: ")
    assert all(
        not line.startswith(("File ", "x = (")) for line in stderr_text.meaningful_lines(stderr)
    )


def test_the_tail_the_issue_quoted_no_longer_shows_a_word_cut_in_half():
    # Craft kept the last lines of a Node crash; the line cut mid-word came from quoting
    # its last 500 characters. Whole lines are read now.
    tail = (
        "Error [ERR_MODULE_NOT_FOUND]: Cannot find package '/opt/agents/node_modules/sdk/' "
        "imported from /opt/agents/node_modules/acp/dist/index.js\n"
        "    at legacyMainResolve (node:internal/modules/esm/resolve:215:26)\n"
        "    at packageResolve (node:internal/modules/esm/resolve:841:14)\n"
        "    at moduleResolve (node:internal/modules/esm/resolve:946:18)\n"
        "    at defaultResolve (node:internal/modules/esm/resolve:1188:11) {\n"
        "  code: 'ERR_MODULE_NOT_FOUND'\n"
        "}\n"
        "\n"
        "Node.js v20.20.2"
    )
    assert stderr_text.said(tail) == (
        "Cannot find package '/opt/agents/node_modules/sdk/' imported from "
        "/opt/agents/node_modules/acp/dist/index.js"
    )


def test_a_pod_agent_s_error_is_read_past_the_kubelet_s_exit_message():
    # A pod exec's stderr ends with the kubelet's word on the exit (`StderrLog.note`).
    tail = (
        "Error: ANTHROPIC_API_KEY is not set\n"
        "command terminated with non-zero exit code: error executing command "
        "[sh -c exec claude-agent-acp], exit code 1"
    )
    assert stderr_text.said(tail) == "ANTHROPIC_API_KEY is not set"


def test_a_rust_panic_reads_as_its_message():
    tail = (
        "thread 'main' panicked at src/main.rs:42:9:\n"
        "no model provider named fake\n"
        "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace"
    )
    assert stderr_text.said(tail) == "panicked: no model provider named fake"


def test_the_last_thing_said_is_the_latest_line_worth_reading():
    tail = (
        "API error (attempt 1/10): 401 invalid x-api-key · Retrying in 1 seconds…\n"
        "\x1b[2K\rwaiting\r"
        "API error (attempt 2/10): 401 invalid x-api-key · Retrying in 2 seconds…\n"
        "\n"
    )
    assert stderr_text.last_said(tail) == (
        "API error (attempt 2/10): 401 invalid x-api-key · Retrying in 2 seconds…"
    )


def test_without_an_error_the_last_line_is_what_was_said():
    assert stderr_text.said("started\nlistening on 127.0.0.1:4096\n") == (
        "listening on 127.0.0.1:4096"
    )
    assert stderr_text.said("") == stderr_text.said("\n  \n^\n") == ""


def test_a_long_line_is_cut_at_a_word_and_says_so():
    line = "Error: " + " ".join(f"word{i}" for i in range(200))
    said = stderr_text.said(line)
    assert len(said) <= stderr_text.LINE_CHARS and said.endswith("…")
    assert said[:-1].rsplit(" ", 1)[-1].startswith("word") and said[-2].isdigit()
    assert f"{said[:-1]} " in f"{line[len('Error: ') :]} ", "cut between words"


def test_the_text_is_cleaned_like_any_agent_text():
    dirty = "a\x00b \x1b[31mred\x1b[0m \x1b]8;;http://x\x07link\x1b]8;;\x07 \x07bell\t\ud800end\r\n"
    assert stderr_text.clean(dirty) == "ab red link bell\t\ufffdend"


def test_what_is_kept_is_bounded_and_cut_at_a_line():
    lines = [f"line {i:05d} " + "x" * 90 for i in range(1000)]
    kept = stderr_text.kept("\n".join(lines))
    assert len(kept) <= stderr_text.KEPT_CHARS
    first, *rest = kept.split("\n")
    assert first == stderr_text.EARLIER_CUT
    assert rest == lines[-len(rest) :], "the latest lines, each whole"
