// The live session page: websocket, session loads, and the transcript renderer.
//
// How a page stays exact (see docs/websocket-api.md):
// - The server renders the transcript up to `data-last-seq`. Every event leaves one element
//   with its `data-seq`; `state.lastSeq` is the highest seq rendered.
// - On every (re)connect, after the server's `hello`, the page *loads* the session: it fetches
//   the stored events after lastSeq over HTTP, renders them, then sends `resume` with the new
//   lastSeq on the socket, which streams everything after it live.
// - The load guard: `state.loadInFlight` is set before the first await, so reconnects that
//   happen while a load runs never start a second one. A failed load clears the guard, shows
//   the failure and retries with backoff (or at once with "Retry now").
// - Events are applied only in seq order: a seq already rendered is ignored, a gap triggers a
//   load. So nothing is rendered twice, whatever arrives twice.
// Model output is untrusted: text goes into the page through textContent only, never as HTML.
(() => {
  "use strict";

  const root = document.getElementById("session");
  if (!root) return;

  const $ = (id) => document.getElementById(id);
  const transcript = $("transcript");
  const promptBox = $("prompt");
  const sendButton = $("send");
  const stopButton = $("stop");
  const conn = $("conn");
  const loadError = $("load-error");
  const frameError = $("frame-error");

  const state = {
    sessionId: root.dataset.session,
    eventsUrl: root.dataset.eventsUrl,
    lastSeq: Number(root.dataset.lastSeq || 0),
    running: root.dataset.running === "true",
    ws: null,
    reconnectAttempt: 0,
    reconnectTimer: null,
    loadInFlight: false,
    loadFailures: 0,
    retryTimer: null,
    pendingPrompt: null, // {id, text} until its user_message event arrives
    closedForGood: false,
  };

  // --- connection state -------------------------------------------------------------------

  function setConn(name, text) {
    conn.dataset.state = name;
    conn.querySelector(".conn-text").textContent = text;
  }

  function backoff(attempt) {
    // Exponential with full jitter, so that many pages reconnecting after a server restart
    // do not all arrive at once.
    const ceiling = Math.min(15000, 500 * 2 ** attempt);
    return Math.round(ceiling / 2 + Math.random() * (ceiling / 2));
  }

  function connect() {
    clearTimeout(state.reconnectTimer);
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}/ws/sessions/${state.sessionId}/`);
    state.ws = ws;
    ws.onmessage = (message) => {
      if (ws !== state.ws) return; // a socket we already gave up on
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch {
        return;
      }
      onFrame(frame);
    };
    ws.onclose = (event) => {
      if (ws !== state.ws) return;
      state.ws = null;
      if (event.code === 4401 || event.code === 4403) {
        state.closedForGood = true;
        setConn("offline", event.code === 4401 ? "Signed out" : "No access");
        return;
      }
      scheduleReconnect();
    };
  }

  function scheduleReconnect() {
    if (state.closedForGood) return;
    const delay = backoff(state.reconnectAttempt++);
    setConn(navigator.onLine === false ? "offline" : "reconnecting",
      navigator.onLine === false ? "Offline" : "Reconnecting…");
    clearTimeout(state.reconnectTimer);
    state.reconnectTimer = setTimeout(connect, delay);
  }

  window.addEventListener("online", () => {
    if (!state.ws) connect();
  });
  window.addEventListener("offline", () => setConn("offline", "Offline"));

  function send(frame) {
    if (!state.ws || state.ws.readyState !== WebSocket.OPEN) return false;
    state.ws.send(JSON.stringify(frame));
    return true;
  }

  // --- frames from the server ---------------------------------------------------------------

  function onFrame(frame) {
    switch (frame.type) {
      case "hello":
        state.reconnectAttempt = 0;
        setConn("connected", "Connected");
        setRunning(frame.running);
        if (frame.sandbox) setSandbox(frame.sandbox);
        loadSession();
        break;
      case "event":
        if (frame.seq > state.lastSeq + 1) {
          loadSession(); // a gap: fetch what is missing, then resume from there
        } else {
          applyEvent(frame);
        }
        break;
      case "error":
        showFrameError(frame);
        break;
    }
  }

  // --- session loads (with the guard) -------------------------------------------------------

  async function loadSession() {
    if (state.loadInFlight) return; // a load is running: it resumes on the current socket
    state.loadInFlight = true; // set before any await: this is the guard
    clearTimeout(state.retryTimer);
    try {
      let more = true;
      while (more) {
        const response = await fetch(`${state.eventsUrl}?after=${state.lastSeq}`, {
          credentials: "same-origin",
          headers: { Accept: "application/json" },
        });
        if (!response.ok) throw new Error(`the server answered ${response.status}`);
        const body = await response.json();
        body.events.forEach(applyEvent);
        more = body.has_more;
        if (!more) {
          setRunning(body.running);
          setSandbox(body.sandbox);
        }
      }
      state.loadInFlight = false;
      state.loadFailures = 0;
      loadError.hidden = true;
      send({ type: "resume", after: state.lastSeq });
    } catch (error) {
      // Clear the guard, or no later attempt could ever run.
      state.loadInFlight = false;
      const delay = backoff(state.loadFailures++);
      loadError.hidden = false;
      loadError.querySelector(".load-error-text").textContent =
        `Couldn't load this session (${error.message}). Retrying in ${Math.ceil(delay / 1000)} s.`;
      state.retryTimer = setTimeout(loadSession, delay);
    }
  }

  $("retry-now").addEventListener("click", () => {
    clearTimeout(state.retryTimer);
    loadSession();
  });

  // --- the renderer (mirrors templates/craft/_block.html and craft/transcript.py) -----------

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function seqSpan(seq, text) {
    const span = el("span", "", text);
    span.dataset.seq = seq;
    return span;
  }

  function mark(block, seq) {
    let marks = block.querySelector(":scope > .marks");
    if (!marks) {
      marks = el("span", "marks");
      marks.hidden = true;
      block.appendChild(marks);
    }
    const i = el("i");
    i.dataset.seq = seq;
    marks.appendChild(i);
  }

  function lastBlock() {
    const blocks = transcript.querySelectorAll(":scope > [data-kind]");
    return blocks.length ? blocks[blocks.length - 1] : null;
  }

  function textOf(data) {
    const content = data && data.content;
    return content && content.type === "text" ? String(content.text ?? "") : "";
  }

  function appendBlock(block) {
    const empty = $("empty-transcript");
    if (empty) empty.remove();
    transcript.appendChild(block);
    return block;
  }

  function chunk(kind, seq, text) {
    const last = lastBlock();
    if (last && last.dataset.kind === kind) {
      last.querySelector(kind === "thought" ? ".body" : ".bubble").appendChild(seqSpan(seq, text));
      return;
    }
    if (kind === "thought") {
      const details = el("details", "thought");
      details.dataset.kind = "thought";
      details.appendChild(el("summary", "", "Thought"));
      const body = appendChildTo(details, el("div", "body"));
      body.appendChild(seqSpan(seq, text));
      appendBlock(details);
    } else {
      const message = el("div", "msg agent");
      message.dataset.kind = "agent";
      appendChildTo(message, el("div", "bubble")).appendChild(seqSpan(seq, text));
      appendBlock(message);
    }
  }

  function appendChildTo(parent, child) {
    parent.appendChild(child);
    return child;
  }

  function renderToolBody(body, content) {
    body.replaceChildren();
    for (const item of content || []) {
      if (item.type === "diff") {
        const diff = appendChildTo(body, el("div", "diff"));
        diff.appendChild(el("div", "diff-path", item.path || ""));
        if (item.oldText) diff.appendChild(el("pre", "del", item.oldText));
        diff.appendChild(el("pre", "add", item.newText ?? ""));
      } else if (item.type === "content" && item.content && item.content.type === "text") {
        body.appendChild(el("pre", "tool-text", item.content.text ?? ""));
      }
    }
  }

  function toolCall(seq, data) {
    const id = String(data.toolCallId ?? "");
    let card = [...transcript.querySelectorAll(".tool")].find((c) => c.dataset.toolCallId === id);
    if (!card) {
      card = el("div", "tool");
      card.dataset.kind = "tool";
      card.dataset.toolCallId = id;
      const head = appendChildTo(card, el("div", "tool-head"));
      head.appendChild(el("span", "tool-kind", "tool"));
      head.appendChild(el("span", "tool-title", "Tool call"));
      head.appendChild(el("span", "badge", "pending"));
      card.appendChild(el("div", "tool-body"));
      card.dataset.status = "pending";
      appendBlock(card);
    }
    // Updates carry only the fields that changed; `content` replaces the whole list.
    if (data.kind) card.querySelector(".tool-kind").textContent = data.kind;
    if (data.title) card.querySelector(".tool-title").textContent = data.title;
    if (data.status) {
      card.dataset.status = data.status;
      card.querySelector(".badge").textContent = data.status;
    }
    if (Array.isArray(data.content)) renderToolBody(card.querySelector(".tool-body"), data.content);
    mark(card, seq);
  }

  function currentPlan() {
    // One plan per turn: look back to the latest user message.
    const blocks = [...transcript.querySelectorAll(":scope > [data-kind]")].reverse();
    for (const block of blocks) {
      if (block.dataset.kind === "plan") return block;
      if (block.dataset.kind === "user") return null;
    }
    return null;
  }

  function plan(seq, data) {
    let block = currentPlan();
    if (!block) {
      block = el("div", "plan");
      block.dataset.kind = "plan";
      block.appendChild(el("div", "plan-title", "Plan"));
      block.appendChild(el("ul"));
      appendBlock(block);
    }
    const list = block.querySelector("ul");
    list.replaceChildren();
    for (const entry of data.entries || []) {
      const li = appendChildTo(list, el("li", "plan-entry"));
      li.dataset.status = entry.status || "pending";
      li.appendChild(el("span", "check"));
      li.appendChild(document.createTextNode(entry.content ?? ""));
    }
    mark(block, seq);
  }

  function permissionRequest(seq, data) {
    const block = el("div", "permission");
    block.dataset.kind = "permission";
    block.dataset.request = data.request;
    block.dataset.answer = "";
    const question = appendChildTo(block, el("div", "permission-q", "The agent asks to: "));
    question.appendChild(el("strong", "", (data.toolCall && data.toolCall.title) || "run a tool"));
    const options = appendChildTo(block, el("div", "options"));
    for (const option of data.options || []) {
      const button = appendChildTo(options, el("button", `option ${option.kind || ""}`, option.name));
      button.type = "button";
      button.dataset.option = option.optionId;
    }
    block.appendChild(el("div", "permission-answer"));
    mark(block, seq);
    appendBlock(block);
  }

  function closePermission(block, answer) {
    block.dataset.answer = answer;
    block.querySelectorAll("button").forEach((b) => (b.disabled = true));
    block.querySelector(".permission-answer").textContent = `Answer: ${answer}`;
  }

  function permissionAnswer(seq, data) {
    const block = [...transcript.querySelectorAll(".permission")].find(
      (b) => b.dataset.request === data.request,
    );
    if (!block) return other(seq, "permission_answer");
    closePermission(block, data.option || "cancelled");
    mark(block, seq);
  }

  function simple(kind, className, seq, text) {
    const block = el("div", className);
    block.dataset.kind = kind;
    block.appendChild(seqSpan(seq, text));
    return appendBlock(block);
  }

  function other(seq, kind) {
    simple("other", "unknown", seq, `Agent update: ${kind}`);
  }

  function applyEvent(event) {
    const { seq, kind, data } = event;
    if (seq <= state.lastSeq) return; // already rendered
    switch (kind) {
      case "user_message": {
        const message = el("div", "msg user");
        message.dataset.kind = "user";
        appendChildTo(message, el("div", "bubble")).appendChild(seqSpan(seq, data.text ?? ""));
        appendBlock(message);
        setRunning(true);
        if (state.pendingPrompt && state.pendingPrompt.id === data.id) {
          state.pendingPrompt = null;
          if (promptBox.value === data.text) promptBox.value = "";
        }
        break;
      }
      case "agent_message_chunk":
        chunk("agent", seq, textOf(data));
        break;
      case "agent_thought_chunk":
        chunk("thought", seq, textOf(data));
        break;
      case "tool_call":
      case "tool_call_update":
        toolCall(seq, data);
        break;
      case "plan":
        plan(seq, data);
        break;
      case "permission_request":
        permissionRequest(seq, data);
        break;
      case "permission_answer":
        permissionAnswer(seq, data);
        break;
      case "turn_end": {
        const reason = data.stop_reason || "";
        const block = simple("turn_end", "turn-end", seq,
          reason === "end_turn" ? "Done" : `Turn ended: ${reason}`);
        block.dataset.reason = reason;
        transcript.querySelectorAll('.permission[data-answer=""]').forEach((b) =>
          closePermission(b, "expired"));
        setRunning(false);
        break;
      }
      case "agent_error":
        simple("error", "agent-error", seq, data.message ?? "");
        break;
      default:
        other(seq, kind);
    }
    state.lastSeq = seq;
    root.dataset.lastSeq = seq;
    stickToBottom();
  }

  let pinned = true;
  window.addEventListener("scroll", () => {
    pinned = window.innerHeight + window.scrollY >= document.body.scrollHeight - 80;
  });
  function stickToBottom() {
    if (pinned) window.scrollTo(0, document.body.scrollHeight);
  }

  // --- the composer, stop and permission buttons -------------------------------------------

  function setRunning(running) {
    state.running = Boolean(running);
    root.dataset.running = state.running ? "true" : "false";
    sendButton.disabled = state.running;
    stopButton.hidden = !state.running;
  }

  function setSandbox(sandbox) {
    const box = $("sandbox-status");
    if (!box || !sandbox) return;
    box.dataset.status = sandbox.status;
    box.querySelector(".sandbox-state").textContent = sandbox.status;
  }

  function showFrameError(frame) {
    if (frame.code === "not_running") return; // Stop raced with the end of the turn
    frameError.textContent = frame.message;
    frameError.hidden = false;
    clearTimeout(showFrameError.timer);
    showFrameError.timer = setTimeout(() => (frameError.hidden = true), 6000);
  }

  function newId() {
    // crypto.randomUUID needs a secure context; getRandomValues does not.
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
  }

  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = promptBox.value;
    if (!text.trim() || state.running) return;
    // Re-sending the same text reuses the id, so a prompt sent just before a disconnect is
    // never run twice.
    if (!state.pendingPrompt || state.pendingPrompt.text !== text) {
      state.pendingPrompt = { id: newId(), text };
    }
    if (!send({ type: "prompt", id: state.pendingPrompt.id, text })) {
      showFrameError({ message: "Not connected. Your message is kept; send it again in a moment." });
    }
  });

  promptBox.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });

  stopButton.addEventListener("click", () => send({ type: "cancel" }));

  transcript.addEventListener("click", (event) => {
    const button = event.target.closest(".permission button[data-option]");
    if (!button || button.disabled) return;
    const block = button.closest(".permission");
    if (send({ type: "permission", request: block.dataset.request, option: button.dataset.option })) {
      block.querySelectorAll("button").forEach((b) => (b.disabled = true));
    }
  });

  setRunning(state.running);
  stickToBottom();
  connect();
})();
