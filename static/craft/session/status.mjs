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
  deleted: ["offline", "Deleted"],
};
const DELETED = "This session was deleted (in another tab or window), with its conversation and files. Start a new session to carry on.";

const SANDBOX_BANNERS = {
  provisioning: "Your sandbox is starting…",
  terminating: "This session's sandbox is stopping. The agent can't work here until it has stopped.",
  terminated: "This session's sandbox was stopped. Send a message to carry on: a new sandbox starts for this session, and the conversation stays here.",
  failed: "Your sandbox could not start, so the agent can't work here yet.",
  sleeping: "Your sandbox is asleep: it wakes with your next message, with your files as they were.",
};
const LOST_BANNER = "Your sandbox was lost (its pod or folder went away). Send a message to carry on: it is set up again for this session.";
// The detail of a sandbox waking from sleep (Sandbox.WAKING, then "waking: <step>").
const WAKING = "waking";
// The sandbox's `detail` when staff stopped it (sandboxes.models.Sandbox.STOPPED_BY_STAFF).
const STOPPED_BY_STAFF = "stopped by an administrator";
const STOPPED_BY_STAFF_BANNER = "An administrator stopped your sandbox. Send a message to carry on: a new sandbox starts for this session, and the conversation stays here.";
// ...and when it was stopped for sitting idle (Sandbox.STOPPED_IDLE).
const STOPPED_IDLE = "stopped after being idle";
const STOPPED_IDLE_BANNER = "Your sandbox was stopped after being idle. Send a message to carry on: a new sandbox starts for this session, and the conversation stays here.";

/** Return the page's status around the transcript of the session shown in `root`;
 *  turnStartedAt() tells when the running turn started (ms, or null); `paths` cuts host paths
 *  from the agent's words. */
export function createStatus({ root, turnStartedAt, paths }) {
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
  const quiet = $("agent-quiet");
  const quietText = $("agent-quiet-text");
  let workingTimer = null;
  let frameErrorTimer = null;
  const runningListeners = [];

  function announce(text) {
    announcer.textContent = "";
    setTimeout(() => (announcer.textContent = text), 50);
  }

  function showConnection(state) {
    const name = state === "reconnecting" && navigator.onLine === false ? "offline" : state;
    const [shown, text] = CONNECTION[name];
    conn.dataset.state = shown;
    conn.querySelector(".conn-text").textContent = text;
    if (name === "deleted") {
      // Nothing can be sent here any more: say so where the message would go.
      showFrameError(DELETED, true);
      promptBox.disabled = true;
      sendButton.disabled = true;
      stopButton.hidden = true;
      working.hidden = true;
      const empty = $("empty-transcript");
      if (empty) empty.hidden = true;
    }
  }

  function setRunning(value) {
    running = Boolean(value);
    root.dataset.running = running ? "true" : "false";
    // While a turn runs (or the sandbox starts) what is sent waits in the queue; nothing can
    // be sent to a sandbox that is stopped or failed.
    const lost = sandboxStatus === "failed" && sandboxDetail === "gone";
    sendButton.disabled = Boolean(sandboxStatus && !lost && !["running", "provisioning", "sleeping"].includes(sandboxStatus));
    stopButton.hidden = !running;
    working.hidden = !running;
    if (!running) showAgentStderr("");
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
    // A turn started in a session whose sandbox was stopped runs in a new one: follow it.
    if (running && sandboxStatus === "terminated") refreshSandboxLine();
    for (const listener of runningListeners) listener(running);
  }

  // The sidebar's sandbox line asks the server again; the banner follows it (below).
  function refreshSandboxLine() {
    const line = $("sandbox-status");
    if (line && window.htmx) window.htmx.trigger(line, "craft:refresh");
  }

  /** Show what the agent, quiet mid-turn, last wrote to stderr (its own words, host paths
   *  cut; the whole line in the tooltip); "" hides it. Said aloud once per quiet spell. */
  function showAgentStderr(text) {
    const line = running ? paths.scrubHostPaths(text) : "";
    if (line && quiet.hidden) announce(`The agent is quiet. Its error output says: ${line}`);
    quiet.hidden = !line;
    quietText.textContent = line;
    quiet.title = line;
  }

  /** An agent error arrived live: say so, and when the sandbox was stopped, show it. */
  function showAgentError(block) {
    // Said by its card in the transcript (with Retry under it), which a toast would repeat
    // and cover: read out to screen readers only.
    announce(block.summary);
    if (block.cause === "sandbox_stopped" || block.cause === "sandbox_stopped_by_staff") {
      const detail = block.cause === "sandbox_stopped_by_staff" ? STOPPED_BY_STAFF : "terminated";
      setSandbox({ status: "terminated", detail });
      refreshSandboxLine();
    }
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
    // The session moves to a new sandbox at its next message once its own was stopped: from
    // then on the sidebar's line (about the person's newest sandbox) follows that one.
    const moved = typeof sandbox.id === "string" && sandbox.id !== "" && sandbox.id !== root.dataset.sandbox;
    if (moved) root.dataset.sandbox = sandbox.id;
    const status = str(sandbox.status);
    sandboxStatus = status;
    sandboxDetail = str(sandbox.detail);
    sandboxChanges += 1;
    lineRetries = 0;
    if (moved) refreshSandboxLine(); // the line may still be about the old one: matchLine would skip it
    else matchLine();
    let text = SANDBOX_BANNERS[status];
    // While it starts, the banner shows how far it got (on Kubernetes: the pod's phase and
    // latest event), as the sidebar's sandbox line does.
    if (status === "provisioning" && str(sandbox.detail).startsWith(WAKING)) {
      const step = str(sandbox.detail).slice(WAKING.length).replace(/^:\s*/, "");
      text = `Waking your sandbox…${step ? ` ${step}` : ""}`;
    } else if (status === "provisioning" && str(sandbox.detail)) text = `${text} ${str(sandbox.detail)}`;
    if (status === "terminated" && str(sandbox.detail) === STOPPED_BY_STAFF) text = STOPPED_BY_STAFF_BANNER;
    if (status === "terminated" && str(sandbox.detail) === STOPPED_IDLE) text = STOPPED_IDLE_BANNER;
    // Its folder or pod vanished (Sandbox `detail` "gone"): the next message sets it up again.
    const lost = status === "failed" && str(sandbox.detail) === "gone";
    if (lost) text = LOST_BANNER;
    sandboxBanner.hidden = !text;
    sandboxBanner.dataset.status = status;
    if (text) sandboxBanner.querySelector(".sandbox-banner-text").textContent = text;
    // A stopped sandbox needs no new session: the next message carries on in a new sandbox.
    sandboxBanner.querySelector(".start-again").hidden = status !== "terminating";
    retrySandbox.hidden = status !== "failed";
    const usable = !text || lost || ["provisioning", "terminated", "sleeping"].includes(status);
    promptBox.disabled = !usable;
    const empty = $("empty-transcript");
    if (empty && !usable) empty.hidden = true;
    sendButton.disabled = !usable;
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

  /** Show a sticky error that ends with a link (what to do about it, on another page). */
  function showFrameErrorWithLink(message, href, linkText) {
    showFrameError(`${message} `, true);
    const link = document.createElement("a");
    link.href = href;
    link.textContent = linkText;
    frameError.append(link);
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
    /** Call `listener(running)` whenever the page learns whether a turn runs. */
    onRunningChange(listener) {
      runningListeners.push(listener);
    },
    announce, showConnection, setRunning, setTitle, setSandbox, showFrameError,
    showFrameErrorWithLink, hideFrameError, showAgentStderr,
    showAgentError, showLoadFailure, hideLoadFailure, start,
  };
}
