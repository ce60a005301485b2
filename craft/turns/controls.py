"""The agent's own controls and what a prompt carries besides its text.

Kept out of the runner, which only calls these: what a new agent connection records in the
log (`start_events`), checks of a client's choice against the controls the agent offers
(`check_config_choice`, `check_mode`, `check_capabilities`), the titles the agent gives the
session (`agent_titles`), and what a prompt's attachments become for the agent
(`prompt_blocks`).

Every state a person sees comes from the event log, so each of these ends in events: the agent
information and controls of a new connection (`agent_info`), one `agent_restarted` per
replaced agent process, the `config_option_update` or `current_mode_update` that a change made
through Craft produced, and a `session_title` when the agent names the session.
"""

from __future__ import annotations

import posixpath
import weakref
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

from craft.commands import Attachment
from craft.errors import Refused
from craft.storage.normalise import clean_title
from sandboxes.agent.connection import AgentConnection

Events = list[tuple[str, dict[str, Any]]]

# --- a new agent connection ---------------------------------------------------------------


_announced: weakref.WeakSet[AgentConnection] = weakref.WeakSet()


def announced(connection: AgentConnection) -> bool:
    """Whether the connection's start events are stored (`announce`); until then they are
    due at each use."""
    return connection in _announced


def announce(connection: AgentConnection) -> None:
    _announced.add(connection)


def start_events(connection: AgentConnection) -> Events:
    """Return the events a newly started agent connection adds to the log.

    `agent_restarted` when the connection replaced an earlier agent process of the session
    (none at the session's first start), then `agent_info`: who the agent is, what its
    prompts may carry, and its config options and modes as it described them.
    """
    events: Events = []
    if connection.restored is not None:
        events.append(("agent_restarted", {"restored": connection.restored}))
    info: dict[str, Any] = {
        "agent": connection.agent_info,
        "promptCapabilities": connection.prompt_capabilities,
    }
    if connection.config_options is not None:
        info["configOptions"] = connection.config_options
    if connection.modes is not None:
        info["modes"] = connection.modes
    events.append(("agent_info", info))
    return events


# --- config options and modes ---------------------------------------------------------------


def _values(option: dict[str, Any]) -> Iterator[str]:
    """Yield the values a select option offers (flat, or in groups of `options`)."""
    for item in option.get("options") or []:
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("value"), str):
            yield item["value"]
        group = item.get("options")
        for grouped in group if isinstance(group, list) else []:
            if isinstance(grouped, dict) and isinstance(grouped.get("value"), str):
                yield grouped["value"]


def check_config_choice(options: list[dict[str, Any]] | None, config_id: str, value: str) -> None:
    """Raise Refused unless the agent offers config option `config_id` with `value`."""
    if not options:
        raise Refused("no_config_options", "the agent offers no config options")
    option = next((o for o in options if o.get("id") == config_id), None)
    if option is None:
        raise Refused("unknown_config", f"the agent has no config option {config_id!r}")
    if option.get("type") != "select" or value not in set(_values(option)):
        raise Refused("invalid_value", f"{value!r} is not a value of {config_id!r}")


def check_mode(modes: dict[str, Any] | None, mode_id: str) -> None:
    """Raise Refused unless the agent offers the mode `mode_id`."""
    available = (modes or {}).get("availableModes")
    if not isinstance(available, list) or not available:
        raise Refused("no_modes", "the agent offers no modes")
    if not any(isinstance(m, dict) and m.get("id") == mode_id for m in available):
        raise Refused("unknown_mode", f"the agent has no mode {mode_id!r}")


def config_event(options: list[dict[str, Any]]) -> Events:
    """Return the event that records the agent's options after a change made through Craft
    (the shape of the agent's own `config_option_update`, so that one fold serves both)."""
    return [("config_option_update", {"sessionUpdate": "config_option_update",
                                      "configOptions": options})]  # fmt: skip


def mode_event(mode_id: str) -> Events:
    """Return the event that records a mode change made through Craft."""
    return [("current_mode_update",
             {"sessionUpdate": "current_mode_update", "currentModeId": mode_id})]  # fmt: skip


# --- the session's title ----------------------------------------------------------------------


def agent_titles(events: Events) -> list[str]:
    """Return the titles the agent gave the session in these events (session_info_update)."""
    titles = (
        clean_title(data["title"])
        for kind, data in events
        if kind == "session_info_update" and isinstance(data.get("title"), str)
    )
    return [title for title in titles if title]


# --- prompt attachments -------------------------------------------------------------------


def check_capabilities(attachments: list[Attachment], capabilities: dict[str, bool]) -> None:
    """Raise Refused if the agent does not take images and the prompt has one.

    Files go as resource links, which every ACP agent must take.
    """
    if any(a.kind == "image" for a in attachments) and not capabilities.get("image"):
        raise Refused("attachments_not_supported", "this agent does not accept images")


def prompt_blocks(attachments: list[Attachment], cwd: str) -> list[dict[str, Any]]:
    """Return the ACP content blocks of a prompt's attachments, after its text block.

    A file is a `resource_link` to its absolute path in the agent's workspace: the agent
    reads it where it runs, and Craft never reads files of the sandbox.
    """
    blocks: list[dict[str, Any]] = []
    for attachment in attachments:
        if attachment.kind == "file":
            path = posixpath.join(cwd, attachment.path)
            blocks.append(
                {
                    "type": "resource_link",
                    "uri": "file://" + quote(path),
                    "name": attachment.name or posixpath.basename(attachment.path),
                }
            )
        else:
            blocks.append(
                {"type": "image", "mimeType": attachment.mime_type, "data": attachment.data}
            )
    return blocks
