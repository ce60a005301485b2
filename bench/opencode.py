"""A real agent's first answer: opencode's new session with and without a warm agent.

Runs when `make realagent` installed opencode (tests/realagent); prints nothing otherwise.
opencode talks to the fake OpenAI-compatible model of the tests on loopback
(tests/agents/fake_model.py, allowed through the sandbox network rule with
CRAFT_SANDBOX_ALLOW), configured by OPENCODE_CONFIG_CONTENT in its catalog entry, so every
figure includes the same model round trips. Sandbox users are off for these servers: opencode
1.18 cannot open a session inside the local backend's jail (docs/acp.md).

* cached follow-up: a prompt to a session whose opencode already answered once (the
  reference);
* new session, first prompt, warm agent: as in `bench.hotpath` (`start_agent`, a person's
  pause, then the prompt; each sample waits, untimed, for the sandbox's warm opencode to
  have started and initialized, and checks afterwards that it answered); held to twice the
  cached follow-up, as the demo agent is;
* the same with warm agents off (CRAFT_WARM_AGENTS=0, a server of its own): opencode's
  spawn, `initialize` and `session/new` on the first prompt's path.

    .venv/bin/python -m bench.opencode [--runs 5]
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

from .harness import Client, Figure, Site, median, run_alone
from .hotpath import uncached, warm_firsts

ROOT = Path(__file__).resolve().parent.parent
OPENCODE = ROOT / "tests" / "realagent" / "node_modules" / ".bin" / "opencode"
PROMPT = "hello"
# opencode's start (a 180 MB binary, its config and providers) takes a second or two.
SETTLE = 4.0


def catalog(model_url: str) -> str:
    from tests.agents.fake_model import opencode_config

    env = {
        "OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(model_url)),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    }
    entries = ", ".join(f"{json.dumps(f'{k}={v}')}" for k, v in env.items())
    command = json.dumps(f"{OPENCODE} acp")  # a JSON string is a TOML basic string
    return "\n".join([
        "[[agents]]", 'id = "default"', 'title = "opencode"', f"command = {command}",
        f"env = [{entries}]", "",
    ])  # fmt: skip


async def run(site: Site, runs: int) -> list[Figure]:
    if not OPENCODE.exists():
        print("opencode is not installed (`make realagent`): skipped", file=sys.stderr)
        return []
    from tests.agents.fake_model import FakeModel

    user, cookie = site.user(f"oc-{uuid.uuid4().hex[:6]}")
    follow_id = site.session(user)
    firsts = [site.session(user) for _ in range(runs)]
    colds = [site.session(user) for _ in range(runs)]
    home = site.home_of(user)
    with FakeModel() as model:
        agents = site.workdir / "opencode-agents.toml"
        agents.write_text(catalog(model.url))
        env = {
            "CRAFT_AGENTS_FILE": str(agents),
            "CRAFT_SANDBOX_ALLOW": f"127.0.0.1:{model.port}",
            # opencode 1.18 fails `session/new` inside the local jail ("OpenCode service
            # failure", service "directory"): its figures are taken without sandbox users.
            "CRAFT_SANDBOX_UIDS": "off",
        }
        with site.serve(**env) as server:
            client = await Client.open(server, cookie, follow_id)
            await client.send({"type": "resume", "after": 0})
            await client.prompt(PROMPT)  # opencode starts here
            cached = median([await client.prompt(PROMPT) for _ in range(3 * runs)])
            await client.close()
            warm = await warm_firsts(server, cookie, home, firsts, text=PROMPT, settle=SETTLE)
        with site.serve(CRAFT_WARM_AGENTS="0", **env) as server:
            cold = await uncached(server, cookie, colds, text=PROMPT)
    warm_ms, limit = warm["median"] * 1000, 2 * cached * 1000
    return [
        Figure(
            "opencode: cached follow-up",
            cached * 1000,
            "ms",
            "-",
            None,
            "the fake model's round trips included",
        ),
        Figure(
            "opencode: new session, first prompt, warm agent",
            warm_ms,
            "ms",
            f"<= 2x cached ({limit:.0f} ms)",
            warm_ms <= limit and warm["warm"] == warm["samples"],
            f"{warm['warm']}/{warm['samples']} served by the warm agent, after start_agent",
        ),
        Figure(
            "opencode: the same, warm agents off",
            cold * 1000,
            "ms",
            "-",
            None,
            "spawn, initialize, session/new on the prompt's path",
        ),
    ]


def main(argv: object = None) -> None:
    run_alone(__doc__.splitlines()[0], run, argv, runs=5)


if __name__ == "__main__":
    main()
