"""The agents a deployment offers (CRAFT_AGENTS_FILE, docs/agents.md) and how one is launched.

The catalog is read from settings each time it is asked for, so that what the settings say
now is what a new agent start uses. Without a catalog file there is one agent, `default`,
made of CRAFT_AGENT_COMMAND and CRAFT_AGENT_ENV.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings

DEFAULT_AGENT = "default"


@dataclass(frozen=True)
class Credential:
    """A key an agent needs in its environment, stored by each person for themselves."""

    name: str  # the environment variable
    label: str
    help: str = ""


@dataclass(frozen=True)
class Agent:
    """One entry of the catalog: what runs, with what environment, needing which keys."""

    id: str
    title: str
    command: list[str]
    # NAME: value, or None to copy NAME from the server's environment at the start.
    env: dict[str, str | None] = field(default_factory=dict)
    credentials: tuple[Credential, ...] = ()

    @property
    def credential_names(self) -> list[str]:
        return [credential.name for credential in self.credentials]

    @property
    def is_demo(self) -> bool:
        """Whether it runs Craft's demo agent (`sandboxes.in_sandbox.demo_agent`,
        `craft-demo-agent`)."""
        return any(
            part == "sandboxes.in_sandbox.demo_agent"
            or part.rsplit("/", 1)[-1] == "craft-demo-agent"
            for part in self.command
        )


@dataclass(frozen=True)
class Launch:
    """What one agent start runs: the catalog entry, and the values of its credentials (its
    owner's, decrypted just now). `secrets` reach the agent's environment only: never its
    command line, a log or an exec URL."""

    agent: Agent
    secrets: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # never the values, whoever prints it
        return f"Launch(agent={self.agent.id!r}, secrets={sorted(self.secrets)})"


def agents() -> list[Agent]:
    """Return the catalog, in the file's order (the first is the default choice)."""
    configured = settings.CRAFT_AGENTS
    if not configured:
        return [
            Agent(
                id=DEFAULT_AGENT,
                title="Agent",
                command=list(settings.CRAFT_AGENT_COMMAND),
                env=dict(settings.CRAFT_AGENT_ENV),
            )
        ]
    return [
        Agent(
            id=entry["id"],
            title=entry["title"],
            command=list(entry["command"]),
            env=dict(entry["env"]),
            credentials=tuple(Credential(**c) for c in entry["credentials"]),
        )
        for entry in configured
    ]


def agent(agent_id: str) -> Agent | None:
    """Return the catalog's agent `agent_id`, or None when the catalog has none by that id."""
    return next((a for a in agents() if a.id == agent_id), None)


def default_agent() -> Agent:
    return agents()[0]


def credential_names() -> set[str]:
    """Return the names of every credential some agent of the catalog asks for."""
    return {c.name for a in agents() for c in a.credentials}
