// What the page shows around the transcript: the connection, whether the agent is working,
// the session's title, the sandbox banner, errors, and what a screen reader is told.

import { $ } from "./dom.mjs";
import { str } from "./values.mjs";

const CONNECTION = {
  connected: ["connected", "Connected"],
  reconnecting: ["reconnecting", "Reconnecting…"],
  offline: ["offline", "Offline"],
  "signed-out": ["offline", "Signed out: reload to sign in"],
  "no-access": ["offline", "No access"],
};

const SANDBOX_BANNERS = {
  provisioning: "Your sandbox is starting…",
  terminating: "This session's sandbox is stopping. The agent can't work here any more.",
  terminated: "This session's sandbox was stopped, so the agent can't work here any more. Start a new session to carry on.",
  failed: "Your sandbox could not start, so the agent can't work here yet.",
};

/** Return the page's status around the transcript of the session shown in `root`;
 *  turnStartedAt() tells when the running turn started (ms, or null). */
export function createStatus({ root, turnStartedAt }) {
  const sessionId = root.dataset.session;
  const conn = $("conn");
  const announcer = $("announcer");
  const working = $("working");
  const workingTime = $("working-time");
  const favicon = $("favicon");
  const promptBox = $("prompt");
  const sendButton = $("send");
  const stopButton = $("stop");
  const frameError = $("frame-error");
  const loadError = $("load-error");
  const sandboxBanner = $("sandbox-banner");
  const retrySandbox = $("retry-sandbox");
  let running = root.dataset.running === "true";
  let sandboxStatus = root.dataset.sandboxStatus || "";
  let sandboxDetail = root.dataset.sandboxDetail || "";
  let workingTimer = null;
  let frameErrorTimer = null;

  function announce(text) {
    announcer.textContent = "";
    setTimeout(() => (announcer.textContent = text), 50);
  }

  function showConnection(state) {
    const name = state === "reconnecting" && navigator.onLine === false ? "offline" : state;
    const [shown, text] = CONNECTION[name];
    conn.dataset.state = shown;
    conn.querySelector(".conn-text").textContent = text;
  }

  function setRunning(value) {
    running = Boolean(value);
    root.dataset.running = running ? "true" : "false";
    // Nothing can be sent while a turn runs, or while the sandbox is not running.
    sendButton.disabled = running || Boolean(sandboxStatus && sandboxStatus !== "running");
    stopButton.hidden = !running;
    working.hidden = !running;
    clearInterval(workingTimer);
    if (running) {
      const started = turnStartedAt() ?? Date.now();
      const tick = () => {
        const seconds = Math.max(0, Math.floor((Date.now() - started) / 1000));
        workingTime.textContent = `${Math.floor(seconds / 60)}:${String(seconds % 60).padStart(2, "0")}`;
      };
      tick();
      workingTimer = setInterval(tick, 1000);
    }
    favicon.href = favicon.href.replace(/favicon(-busy)?\.svg/, running ? "favicon-busy.svg" : "favicon.svg");
  }

  function setTitle(title) {
    $("session-title").textContent = title;
    document.title = `${title} · Craft`;
    const item = document.getElementById(`session-${sessionId}`);
    if (!item) return;
    const name = item.querySelector(".session-name");
    if (name) name.textContent = title;
    const link = item.querySelector(".session-link");
    if (link) link.title = title;
    const input = item.querySelector("input[name=title]");
    if (input && document.activeElement !== input) input.value = title;
  }

  // The sidebar's line, when it is about the same sandbox, is fetched again until it matches
  // (htmx drops a trigger while the line's previous request is in flight), a few times at most.
  let lineRetries = 0;
  let sandboxChanges = 0;
  function matchLine() {
    const line = $("sandbox-status");
    if (!line || line.dataset.sandbox !== root.dataset.sandbox || !window.htmx) return;
    if (line.dataset.status === sandboxStatus && line.dataset.detail === sandboxDetail) return;
    if (lineRetries++ < 3) window.htmx.trigger(line, "craft:refresh");
  }
  document.addEventListener("htmx:afterSettle", matchLine);

  /** Show the session's sandbox as the server says it is now: the page's own data, then the
   *  socket's `hello` and `sandbox` frames (pushed as it changes, never polled). */
  function setSandbox(sandbox) {
    const status = str(sandbox.status);
    sandboxStatus = status;
    sandboxDetail = str(sandbox.detail);
    sandboxChanges += 1;
    lineRetries = 0;
    matchLine();
    let text = SANDBOX_BANNERS[status];
    // While it starts, the banner shows how far it got (on Kubernetes: the pod's phase and
    // latest event), as the sidebar's sandbox line does.
    if (status === "provisioning" && str(sandbox.detail)) text = `${text} ${str(sandbox.detail)}`;
    sandboxBanner.hidden = !text;
    sandboxBanner.dataset.status = status;
    if (text) sandboxBanner.querySelector(".sandbox-banner-text").textContent = text;
    sandboxBanner.querySelector(".start-again").hidden = status === "provisioning" || status === "failed";
    retrySandbox.hidden = status !== "failed";
    const usable = !text || status === "provisioning";
    promptBox.disabled = !usable;
    const empty = $("empty-transcript");
    if (empty && !usable) empty.hidden = true;
    if (!usable || status === "provisioning") sendButton.disabled = true;
    else sendButton.disabled = running;
  }

  // "Try again" on a failed sandbox: set it up again for this session (POST /api/sandbox/);
  // the socket's `sandbox` frames follow its progress.
  retrySandbox.addEventListener("click", async () => {
    retrySandbox.disabled = true;
    const token = sandboxBanner.querySelector("input[name=csrfmiddlewaretoken]");
    const seen = sandboxChanges;
    try {
      const response = await fetch(retrySandbox.dataset.url, {
        method: "POST", credentials: "same-origin",
        headers: { "X-CSRFToken": token ? token.value : "" },
      });
      if (!response.ok) throw new Error(`the server refused (${response.status})`);
      const answer = await response.json();
      // A frame that came meanwhile is newer than this answer (it may say "running").
      if (sandboxChanges === seen) setSandbox(answer);
    } catch (error) {
      showFrameError(`Your sandbox could not be set up again: ${error.message}. Try again in a moment.`);
    } finally {
      retrySandbox.disabled = false;
    }
  });

  function showFrameError(message, sticky = false) {
    frameError.textContent = message;
    frameError.hidden = false;
    clearTimeout(frameErrorTimer);
    if (!sticky) frameErrorTimer = setTimeout(() => (frameError.hidden = true), 8000);
  }

  function hideFrameError() {
    frameError.hidden = true;
  }

  function showLoadFailure(message, delay) {
    loadError.querySelector(".load-error-text").textContent =
      `Couldn't load this session: ${message}. Retrying in ${Math.ceil(delay / 1000)} s.`;
    loadError.hidden = false;
  }

  function hideLoadFailure() {
    loadError.hidden = true;
  }

  /** Show what the page was rendered with (running, the sandbox). */
  function start() {
    setRunning(running);
    setSandbox({ status: sandboxStatus, detail: sandboxDetail });
  }

  return {
    get running() {
      return running;
    },
    get sandboxStatus() {
      return sandboxStatus;
    },
    announce, showConnection, setRunning, setTitle, setSandbox, showFrameError, hideFrameError,
    showLoadFailure, hideLoadFailure, start,
  };
}
