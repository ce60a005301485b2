"""A tiny MCP server on stdio with one tool, `run_command`, for agents that ask a person
before they use an MCP server's tools (fast-agent does; its own shell does not).

Standard library only, so that it runs wherever the agent runs (as the sandbox's user, in the
jail): `python3 mcp_tools.py`. It speaks JSON-RPC 2.0, one message per line: `initialize`,
`tools/list`, `tools/call`; notifications are read and ignored.
"""

from __future__ import annotations

import json
import subprocess
import sys

TOOL = {
    "name": "run_command",
    "description": "Run a shell command in the working directory; return its output.",
    "inputSchema": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The command to run."}},
        "required": ["command"],
    },
}


def answer(request: dict) -> dict:
    method = request.get("method")
    if method == "initialize":
        version = (request.get("params") or {}).get("protocolVersion", "2025-06-18")
        return {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "craft-test-tools", "version": "1.0.0"},
        }
    if method == "tools/list":
        return {"tools": [TOOL]}
    if method == "tools/call":
        command = ((request.get("params") or {}).get("arguments") or {}).get("command", "")
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
        text = (done.stdout + done.stderr).strip()
        return {"content": [{"type": "text", "text": text}], "isError": done.returncode != 0}
    if method == "ping":
        return {}
    raise LookupError(method)


def main() -> None:
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        if "id" not in request:
            continue  # a notification
        try:
            reply = {"jsonrpc": "2.0", "id": request["id"], "result": answer(request)}
        except LookupError as exc:
            reply = {"jsonrpc": "2.0", "id": request["id"],
                     "error": {"code": -32601, "message": f"no method {exc}"}}  # fmt: skip
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
