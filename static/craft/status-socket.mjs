// The status socket of a page without a session socket (the home page): keeps its list of
// sessions and its sandbox line live, as a session's page keeps its own (docs/websocket-api.md,
// "The status socket"). A `sessions` frame has sidebar.js fetch the named items again (or the
// whole list), a `sandbox` frame the sandbox line. After a drop it opens again with backoff and
// fetches the whole list, since changes may have come meanwhile; signed out (4401), it stops.

const URL_OF_SOCKET = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/status/`;
const SIGNED_OUT = 4401;
const MAX_DELAY = 30_000;

function sessionsChanged(sessions) {
  const detail = Array.isArray(sessions) ? { sessions } : {};
  document.dispatchEvent(new CustomEvent("craft:sessions-changed", { detail }));
}

function refreshSandboxLine() {
  const line = document.getElementById("sandbox-status");
  if (line && window.htmx) window.htmx.trigger(line, "craft:refresh");
}

let delay = 1000;
let opened = false; // once: a later hello follows a drop

function open() {
  const socket = new WebSocket(URL_OF_SOCKET);
  socket.addEventListener("message", (message) => {
    let frame;
    try {
      frame = JSON.parse(message.data);
    } catch {
      return;
    }
    if (frame.type === "hello") {
      delay = 1000;
      if (opened) {
        sessionsChanged(null);
        refreshSandboxLine();
      }
      opened = true;
    } else if (frame.type === "sessions") {
      sessionsChanged(frame.sessions);
    } else if (frame.type === "sandbox") {
      refreshSandboxLine();
    }
  });
  socket.addEventListener("close", (event) => {
    if (event.code === SIGNED_OUT) return; // the next click finds the sign-in page
    setTimeout(open, delay);
    delay = Math.min(delay * 2, MAX_DELAY);
  });
}

if (document.getElementById("session-list")) open();
