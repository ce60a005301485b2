// Going back in the conversation (docs/workbench.md): "Rewind here" and "Fork from here" on a
// message of the person's, and an earlier message edited and sent again (a fork of the
// session from just before it, with the new text as its first prompt). A rewind's result
// comes on the socket (its `rewound` event); a fork opens the new session.

// What a refusal means to the person (POST .../fork/ and .../rewind/, docs/http-api.md).
const ERRORS = {
  turn_running: "The agent is working: try again once its turn ends.",
  nothing_to_rewind: "Nothing to rewind: no turn comes after that message.",
  no_checkpoint: "There is no record of the files at that point, so the session can't go back there.",
  too_many_sessions: "You have as many sessions as one person can have: delete some first.",
  invalid: "That message can't be gone back to: a rewind set it aside.",
  sandbox_unavailable: "Your sandbox is not running: try again once it is.",
  workspace_unavailable: "The files could not be copied: try again in a moment.",
};

/** `api` is the session's API URL (/api/sessions/<id>/). */
export function createGoingBack({ api, announce, showError }) {
  async function post(how, body) {
    const token = document.querySelector("input[name=csrfmiddlewaretoken]");
    const response = await fetch(`${api}${how}/`, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRFToken": token ? token.value : "" },
      body: JSON.stringify(body),
    });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) {
      const code = answer.error ? answer.error.code : "";
      throw new Error(ERRORS[code] || (answer.error && answer.error.message) || `HTTP ${response.status}`);
    }
    return answer;
  }

  // The new session's page: this page's address with the other session's id.
  function open(id) {
    location.assign(location.pathname.replace(/[0-9a-f-]{36}\/?$/, `${id}/`));
  }

  /** Rewind to, or fork from, the turn of user message `seq` (its button confirmed it). */
  async function goBack(how, seq, button) {
    const label = button.textContent;
    button.disabled = true;
    button.textContent = how === "rewind" ? "Rewinding…" : "Forking…";
    try {
      const answer = await post(how, { seq });
      if (how === "fork") {
        announce("Forked: opening the new session…");
        open(answer.id);
      } else {
        announce("Rewound: the files and the agent are back to just after that message.");
      }
    } catch (error) {
      showError(`Not ${how === "rewind" ? "rewound" : "forked"}: ${error.message || error}`);
    } finally {
      button.disabled = false;
      button.textContent = label;
    }
  }

  /** Fork from just before user message `seq`, with `text` as the fork's first prompt, and
   *  open it; throws what went wrong. */
  async function forkEdited(seq, text) {
    const answer = await post("fork", { seq, before: true, text });
    announce("Forked with your edited message: opening the new session…");
    open(answer.id);
  }

  return { goBack, forkEdited };
}
