// The workspace panel's Preview tab: an app the sandbox serves, shown in a frame of the
// preview origin (docs/workbench.md, "Preview"). The ports listening in the sandbox are asked
// for when the tab is shown, on Refresh and when a turn ends while it is shown; choosing one
// asks Craft for a link with a one-use token (POST .../preview/), which the frame opens: the
// preview origin trades it for a cookie of its own. Reload loads the app again; "Open in new
// tab" asks for a link of its own, opened without an opener (the app is the agent's code).

import { $, el } from "./dom.mjs";

const OFF = "Previews are off on this server: its operator sets CRAFT_PREVIEW_ORIGIN to turn them on.";
const NOTHING = "Nothing listens in the sandbox yet. When the agent (or you, in a terminal) serves an app on a port, it shows up here: Refresh. The demo agent's “serve” starts one.";

function option(port, text) {
  const node = el("option", "", text);
  node.value = String(port);
  return node;
}

/** Start the Preview tab; `announce(text)` says something to screen readers. */
export function createPreview({ announce }) {
  const panel = $("panel-preview");
  const url = panel.dataset.url;
  const select = $("preview-port");
  const state = $("preview-state");
  const frame = $("preview-frame");
  const buttons = { refresh: $("preview-refresh"), reload: $("preview-reload"), open: $("preview-open") };
  let shown = null; // the port the frame shows
  let asking = false;

  function say(text, bad = false) {
    state.textContent = text;
    state.classList.toggle("bad", bad);
    state.hidden = !text;
  }

  function draw(ports) {
    const chosen = shown ?? (ports.length ? ports[0] : null);
    select.replaceChildren(...ports.map((port) => option(port, String(port))));
    if (chosen !== null && !ports.includes(chosen)) select.prepend(option(chosen, `${chosen} (not listening)`));
    if (chosen !== null) select.value = String(chosen);
    select.disabled = chosen === null;
    buttons.reload.disabled = buttons.open.disabled = shown === null;
  }

  async function refresh() {
    if (asking) return;
    asking = true;
    buttons.refresh.disabled = true;
    try {
      const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      const answer = await response.json().catch(() => ({}));
      if (!response.ok) {
        const message = answer && answer.error && answer.error.message;
        say(message ? `Cannot list the sandbox's ports: ${message}.` : `Cannot list the sandbox's ports (HTTP ${response.status}).`, true);
        return;
      }
      if (!answer.enabled) {
        draw([]);
        say(OFF);
        return;
      }
      const ports = Array.isArray(answer.ports) ? answer.ports.filter(Number.isInteger) : [];
      draw(ports);
      if (shown !== null && !ports.includes(shown)) {
        say(`The app on port ${shown} is down: nothing listens there now. Start it again, then Reload.`, true);
      } else if (shown === null && ports.length) {
        show(ports[0]);
      } else if (!ports.length) {
        say(NOTHING);
      }
    } catch {
      say("Cannot list the sandbox's ports: the connection failed.", true);
    } finally {
      asking = false;
      buttons.refresh.disabled = false;
    }
  }

  async function link(port) {
    const token = document.querySelector("input[name=csrfmiddlewaretoken]");
    const response = await fetch(url, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": token ? token.value : "" },
      body: JSON.stringify({ port }),
    });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok || typeof answer.url !== "string") {
      throw new Error((answer.error && answer.error.message) || `HTTP ${response.status}`);
    }
    return answer.url;
  }

  async function show(port) {
    try {
      const address = await link(port);
      shown = port;
      frame.src = address;
      frame.hidden = false;
      say("");
      buttons.reload.disabled = buttons.open.disabled = false;
      announce(`Showing the app on port ${port}.`);
    } catch (error) {
      say(`Cannot open the preview of port ${port}: ${error.message}`, true);
    }
  }

  select.addEventListener("change", () => show(Number(select.value)));
  buttons.refresh.addEventListener("click", refresh);
  buttons.reload.addEventListener("click", async () => {
    if (shown === null) return;
    await show(shown); // a new link: the frame's cookie may have gone with the session's
    refresh();
  });
  buttons.open.addEventListener("click", async () => {
    if (shown === null) return;
    try {
      window.open(await link(shown), "_blank", "noopener,noreferrer");
    } catch (error) {
      say(`Cannot open the preview of port ${shown}: ${error.message}`, true);
    }
  });
  $("workspace").addEventListener("workspace-tab", (event) => {
    if (event.detail === "preview") refresh();
  });

  return {
    /** A turn ended: an app may have started or stopped. */
    turnEnded() {
      if (!panel.hidden) refresh();
    },
  };
}
