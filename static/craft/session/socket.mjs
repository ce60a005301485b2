// The session's websocket (docs/websocket-api.md) and the loads that go with it: how a page
// shows every event exactly once across reconnects.
//
// - On every (re)connect, after the server's `hello`, the page *loads* the session: it fetches
//   the stored events after the last seq it applied over HTTP (history.mjs), renders them, then
//   sends `resume` with the new last seq on the socket, which streams everything after it
//   live. The page's first load does not wait for the socket: it starts as the page does, with
//   the requests the page preloaded (session.html), and the first `hello` joins it (or, if it
//   is already done, runs a second, small load before resuming).
// - The load guard: `loadInFlight` is set before the first await, so reconnects that happen
//   while a load runs never start a second one; neither do reconnects while a failed load
//   waits to retry (the retry resumes on the newest socket). A failed load clears the guard,
//   shows the failure and retries with backoff (or at once with "Retry now").
// - Live events are applied only in seq order: a seq already applied is ignored (fold.mjs), a
//   gap triggers a load. So nothing is rendered twice, whatever arrives twice.

import { isObject } from "./values.mjs";

// Closes after which reconnecting cannot help (docs/websocket-api.md), and what the page shows.
const CLOSED_FOR_GOOD = { 4401: "signed-out", 4403: "no-access", 4404: "deleted" };

// How long to wait before attempt `attempt` (from 0) to reconnect or load again.
function backoff(attempt) {
  // Exponential with full jitter, so that many pages reconnecting after a server restart do
  // not all arrive at once.
  const ceiling = Math.min(15000, 500 * 2 ** attempt);
  return Math.round(ceiling / 2 + Math.random() * (ceiling / 2));
}

/**
 * Return the connection of the session whose websocket is at `url`. `serverLastSeq` is the
 * last seq the page was rendered with; lastSeq() the highest seq applied; loadEvents({
 * controller, cache, serverLastSeq }) loads and applies the stored events after lastSeq() and
 * returns the last page's body (history.mjs). `page` is told what happens: connection(state)
 * ("connected", "reconnecting", "signed-out" or "no-access"), announce(text), hello(frame),
 * event(frame) for the next event in seq order, error(frame), notice(frame) for a `sandbox`,
 * `sessions` or `agent_stderr` frame, loaded(body) and loadFailed(message, delay).
 */
export function createConnection({ url, serverLastSeq, lastSeq, loadEvents, page }) {
  let ws = null;
  let reconnectAttempt = 0;
  let reconnectTimer = null;
  let wasConnected = false; // ever: "Connected again" is said only after a loss
  let connected = false;
  let closedForGood = false;
  let loadInFlight = false;
  let loadFailures = 0;
  let retryTimer = null;
  let retryPending = false;
  let preloaded = true; // the first load may use the page's preloaded requests
  let serverLast = serverLastSeq;

  function connect() {
    clearTimeout(reconnectTimer);
    const socket = new WebSocket(url);
    ws = socket;
    socket.onmessage = (message) => {
      if (socket !== ws) return; // a socket we already gave up on
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch {
        return;
      }
      if (isObject(frame)) onFrame(frame);
    };
    socket.onclose = (event) => {
      if (socket !== ws) return;
      ws = null;
      if (CLOSED_FOR_GOOD[event.code]) {
        closedForGood = true;
        page.connection(CLOSED_FOR_GOOD[event.code]);
        return;
      }
      if (connected) page.announce("Connection lost. Reconnecting…");
      connected = false;
      scheduleReconnect();
    };
  }

  function scheduleReconnect() {
    if (closedForGood) return;
    const delay = backoff(reconnectAttempt++);
    page.connection("reconnecting");
    clearTimeout(reconnectTimer);
    reconnectTimer = setTimeout(connect, delay);
  }

  // Back online: an open socket is still good; a closed one reconnects now, not after its
  // backoff. Either way "Offline" must not stay.
  function online() {
    if (ws && ws.readyState === WebSocket.OPEN) {
      page.connection("connected");
    } else if (!closedForGood) {
      page.connection("reconnecting");
      if (!ws) {
        reconnectAttempt = 0;
        connect();
      }
    }
  }

  /** Send a frame; return false when not connected. */
  function send(frame) {
    return sendText(JSON.stringify(frame));
  }

  function sendText(text) {
    if (!ws || ws.readyState !== WebSocket.OPEN) return false;
    ws.send(text);
    return true;
  }

  function onFrame(frame) {
    switch (frame.type) {
      case "hello":
        reconnectAttempt = 0;
        if (wasConnected && !connected) page.announce("Connected again.");
        wasConnected = true;
        connected = true;
        page.connection("connected");
        if (Number.isSafeInteger(frame.last_seq)) serverLast = frame.last_seq;
        page.hello(frame);
        if (!retryPending) load(); // else the scheduled retry loads, then resumes
        break;
      case "event":
        if (typeof frame.seq === "number" && frame.seq > lastSeq() + 1) {
          load(); // a gap: fetch what is missing, then resume from there
        } else {
          page.event(frame);
        }
        break;
      case "error":
        page.error(frame);
        break;
      case "sandbox": // the session's sandbox changed state
      case "sessions": // one of the person's sessions changed what their list shows
      case "agent_stderr": // what the quiet agent last wrote to stderr ("" once it goes on)
        page.notice(frame);
        break;
    }
  }

  /** Load the session (unless a load runs already), then resume the socket after it. */
  async function load() {
    if (loadInFlight) return; // a load is running: it resumes on the current socket
    loadInFlight = true; // set before any await: this is the guard
    clearTimeout(retryTimer);
    retryPending = false;
    const controller = new AbortController();
    const cache = preloaded ? "default" : "no-store";
    preloaded = false;
    try {
      const body = await loadEvents({ controller, cache, serverLastSeq: () => serverLast });
      loadInFlight = false;
      loadFailures = 0;
      page.loaded(body);
      send({ type: "resume", after: lastSeq() });
    } catch (error) {
      controller.abort(); // the other pages of this load
      // Clear the guard, or no later attempt could ever run.
      loadInFlight = false;
      const delay = backoff(loadFailures++);
      page.loadFailed(error.message, delay);
      retryPending = true;
      retryTimer = setTimeout(load, delay);
    }
  }

  /** Start: the first load (with what the page preloaded), joined by the socket's hello. */
  function start() {
    load();
    connect();
  }

  return { start, load, online, send, sendText };
}
