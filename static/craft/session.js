// The live session page: websocket, session loads, and the one transcript renderer.
//
// The server renders no transcript: this script folds the session's event log (the same JSON
// every API client reads, docs/websocket-api.md) into what a person reads. See "One renderer"
// in docs/architecture.md for why.
//
// How a page stays exact:
// - Every event leaves exactly one hidden `<i data-seq>` mark in the block it folded into;
//   `state.lastSeq` is the highest seq applied, and it advances for every event, even one that
//   cannot be shown (a guard turns a failure into a quiet note, never a wedged page).
// - On every (re)connect, after the server's `hello`, the page *loads* the session: it fetches
//   the stored events after lastSeq over HTTP (every page up to the last seq it knows of
//   requested at once, applied in order as they arrive, each fetch with a timeout), renders
//   them, then sends `resume` with the new lastSeq on the socket, which streams everything
//   after it live. The page's first load does not wait for the socket: it starts as the script
//   does, with the requests the page preloaded (session.html), and the first `hello` joins it
//   (or, if it is already done, runs a second, small load before resuming).
// - The load guard: `state.loadInFlight` is set before the first await, so reconnects that
//   happen while a load runs never start a second one; neither do reconnects while a failed
//   load waits to retry (the retry resumes on the newest socket). A failed load clears the
//   guard, shows the failure and retries with backoff (or at once with "Retry now").
// - Live events are applied only in seq order: a seq already applied is ignored, a gap
//   triggers a load. So nothing is rendered twice, whatever arrives twice.
//
// Agent output is untrusted: text goes in through textContent; Markdown is parsed by marked
// with raw HTML turned into text, then sanitised by DOMPurify before it touches the page.
(() => {
  "use strict";

  const root = document.getElementById("session");
  if (!root) return;

  // daphne's default websocket frame limit: a bigger frame closes the socket (close 1009).
  const MAX_FRAME_BYTES = 1024 * 1024;
  // A prompt with images may be bigger: the server takes frames of up to 4 MiB (as `make run`
  // starts daphne) and limits the images themselves.
  const MAX_ATTACHED_FRAME_BYTES = 4 * 1024 * 1024 - 4096;
  const LOAD_TIMEOUT_MS = 8000; // per history request; a hung load must not hold the guard
  const PAGE_SIZE = Number(root.dataset.pageSize || 1000); // the events API's largest page
  const MAX_PARALLEL_PAGES = 8;
  const MARKDOWN_MAX_CHARS = 200000; // longer messages are shown as plain text
  const PREVIEW_LINES = 16; // longer text starts collapsed, with "Show all"
  const PREVIEW_CHARS = 20000;
  const EAGER_BLOCKS = 12; // after a load, the last blocks get Markdown at once; others lazily
  const HIGHLIGHT_MAX_CHARS = 20000;

  const $ = (id) => document.getElementById(id);
  const transcript = $("transcript");
  const promptBox = $("prompt");
  const sendButton = $("send");
  const stopButton = $("stop");
  const conn = $("conn");
  const loadError = $("load-error");
  const frameError = $("frame-error");
  const announcer = $("announcer");
  const jumpButton = $("jump");
  const working = $("working");
  const workingTime = $("working-time");
  const sandboxBanner = $("sandbox-banner");
  const favicon = $("favicon");
  const agentControls = $("agent-controls");
  const pickers = $("pickers");
  const usageBox = $("usage");
  const attachmentList = $("attachments");
  const palette = $("palette");
  const attachImage = $("attach-image");
  const imageInput = $("image-input");

  const state = {
    sessionId: root.dataset.session,
    eventsUrl: root.dataset.eventsUrl,
    eventUrl: root.dataset.eventUrl,
    workspace: (root.dataset.workspace || "").replace(/\/+$/, ""),
    staff: root.dataset.staff === "true",
    lastSeq: 0,
    serverLastSeq: Number(root.dataset.lastSeq || 0),
    running: root.dataset.running === "true",
    sandboxStatus: root.dataset.sandboxStatus || "",
    sandboxDetail: root.dataset.sandboxDetail || "",
    ws: null,
    reconnectAttempt: 0,
    reconnectTimer: null,
    wasConnected: false, // ever: "Connected again" is said only after a loss
    connected: false,
    loadInFlight: false,
    loaded: false,
    loadFailures: 0,
    retryTimer: null,
    retryPending: false,
    preloaded: true, // the first load may use the page's preloaded requests
    pendingPrompt: null, // {id, text} until its user_message event arrives
    closedForGood: false,
    // What the agent offers, as the log last said (agent_info and the updates after it).
    agent: { prompt: {}, configOptions: null, modes: null, commands: [], usage: null },
    controlsDirty: false,
    images: [], // {name, mimeType, data, bytes} to go with the next prompt
    knownPaths: new Set(), // workspace paths seen in this session, for @ mentions
  };

  // --- words a person reads --------------------------------------------------------------

  const TOOL_KINDS = {
    read: "Read", edit: "Edit", delete: "Delete", move: "Move", search: "Search",
    execute: "Run", think: "Think", fetch: "Fetch", switch_mode: "Mode", other: "Tool",
  };
  const TOOL_STATUS = { pending: "Waiting", in_progress: "Running", completed: "Done", failed: "Failed" };
  const PLAN_STATUS = { pending: "to do", in_progress: "in progress", completed: "done" };
  const STOP_REASONS = {
    end_turn: "Done",
    cancelled: "Stopped",
    max_tokens: "Stopped: the reply reached its length limit",
    max_turn_requests: "Stopped: the agent took too many steps in one turn",
    refusal: "The agent declined to continue",
    error: "Ended with an error",
    interrupted: "Interrupted",
  };
  const ANSWERS = {
    allow_once: "You allowed this once",
    allow_always: "You allowed this from now on",
    reject_once: "You rejected this",
    reject_always: "You rejected this from now on",
  };
  const FRAME_ERRORS = {
    turn_running: "The agent is still working on your previous message. Wait for it, or press Stop.",
    sandbox_starting: "Your sandbox is still starting. Your message is kept: send it when the sandbox is ready.",
    empty_prompt: "Type a message first.",
    prompt_too_long: "That message is too long for the agent. It's still in the box: shorten it and send again.",
    unknown_request: "That question is no longer open: the agent has moved on.",
    invalid_option: "That answer isn't one the agent offered.",
    bad_attachment: "One of the attachments can't be sent: files must be inside the workspace, images PNG, JPEG, GIF or WebP.",
    too_many_attachments: "That's too many attachments for one message (at most 10).",
    attachment_too_large: "The images are too large to send (at most 2 MB each).",
    attachments_not_supported: "This agent does not accept images.",
    no_config_options: "The agent doesn't offer that setting any more.",
    unknown_config: "The agent doesn't offer that setting any more.",
    invalid_value: "The agent doesn't offer that choice any more.",
    no_modes: "The agent doesn't offer modes any more.",
    unknown_mode: "The agent doesn't offer that mode any more.",
    agent_refused: "The agent did not accept that change.",
    agent_starting: "The agent is starting. Try again in a moment.",
    agent_unavailable: "The agent could not start, so the change was not made.",
  };
  const RESTARTS = {
    resume: "Agent restarted — context restored",
    load: "Agent restarted — context restored",
    none: "Agent restarted — the agent starts fresh",
  };
  const MAX_IMAGE_BYTES = 2 * 1024 * 1024;
  const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"];
  // ACP updates with no block of their own: the controls around the composer show them.
  const QUIET_KINDS = new Set([
    "available_commands_update", "current_mode_update", "config_option_update",
    "config_options_update", "session_info_update", "usage_update", "agent_info",
    // The person's own words: the page shows the prompt from Craft's user_message.
    "user_message_chunk",
  ]);

  function agentErrorSummary(message) {
    const text = String(message || "").toLowerCase();
    if (text.startsWith("agent exited") || text.includes("agent is not running"))
      return "The agent stopped unexpectedly.";
    if (text.startsWith("agent did not start")) return "The agent could not start.";
    if (text.includes("sandbox is "))
      return "This session's sandbox is not running, so the agent can't work here.";
    if (text.includes("no answer within") || text.includes("no message from the agent"))
      return "The agent stopped responding.";
    if (text.startsWith("internal error")) return "Something went wrong in Craft.";
    return "The agent ran into a problem.";
  }

  // --- paths: relative to the session's workspace, never the host's ---------------------

  const sessionPathPattern = new RegExp(`(?:/[^\\s"'\`()]*)?/sessions/${state.sessionId}(?=/|\\b)/?`, "g");

  function relPath(path) {
    if (typeof path !== "string") return "";
    if (state.workspace && path === state.workspace) return ".";
    if (state.workspace && path.startsWith(`${state.workspace}/`)) {
      return path.slice(state.workspace.length + 1);
    }
    return path.replace(sessionPathPattern, "") || ".";
  }

  function scrub(text) {
    if (typeof text !== "string") return "";
    let out = text;
    if (state.workspace && out.includes(state.workspace)) {
      out = out.split(`${state.workspace}/`).join("").split(state.workspace).join(".");
    }
    return out.includes(state.sessionId) ? out.replace(sessionPathPattern, "") : out;
  }

  function scrubHostPaths(text) {
    // Staff details: workspace paths relative, any other absolute path cut to its last part.
    return scrub(text).replace(/(^|[\s'"(=:])\/(?:[\w.@+-]+\/)+([\w.@+-]+)/g, "$1…/$2");
  }

  // --- small DOM functions ------------------------------------------------------------------

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  function str(value) {
    return typeof value === "string" ? value : typeof value === "number" ? String(value) : "";
  }

  function isObject(value) {
    return value !== null && typeof value === "object" && !Array.isArray(value);
  }

  function lineCount(text) {
    let count = text.endsWith("\n") ? 0 : 1; // a final newline ends a line, not starts one
    for (let i = text.indexOf("\n"); i !== -1; i = text.indexOf("\n", i + 1)) count++;
    return count;
  }

  function preview(text) {
    // The first PREVIEW_LINES lines (at most PREVIEW_CHARS characters), or null if that is all.
    let end = 0;
    for (let line = 0; line < PREVIEW_LINES; line++) {
      end = text.indexOf("\n", end) + 1;
      if (end === 0) break;
    }
    const cut = end === 0 ? text.length : end - 1;
    const short = Math.min(cut, PREVIEW_CHARS);
    return short < text.length ? text.slice(0, short) : null;
  }

  function formatSize(chars) {
    if (chars >= 1e6) return `${(chars / 1e6).toFixed(1)} MB`;
    if (chars >= 1e3) return `${Math.round(chars / 1e3)} kB`;
    return `${chars} characters`;
  }

  const numberFormat = new Intl.NumberFormat(); // once: toLocaleString builds one per call

  function formatBytes(bytes) {
    if (bytes >= 1e6) return `${(bytes / 1e6).toFixed(1)} MB`;
    if (bytes >= 1e3) return `${Math.round(bytes / 1e3)} kB`;
    return `${bytes} bytes`;
  }

  function showAllLabel(text) {
    return `Show all (${numberFormat.format(lineCount(text))} lines, ${formatSize(text.length)})`;
  }

  // Text that may be long: a preview with "Show all" (aria-expanded tells which is shown).
  let collapsibleIds = 0;
  function fillCollapsible(box, text, renderText) {
    box.replaceChildren();
    const short = preview(text);
    const body = el("div", "collapsible-body");
    body.id = `collapsible-${++collapsibleIds}`;
    box.appendChild(body);
    renderText(body, short === null ? text : short);
    if (short === null) return;
    const toggle = el("button", "toggle-more", showAllLabel(text));
    toggle.type = "button";
    toggle.setAttribute("aria-expanded", "false");
    toggle.setAttribute("aria-controls", body.id);
    box.classList.add("collapsed");
    collapsedTexts.set(toggle, { box, body, text, short, renderText });
    box.appendChild(toggle);
  }
  const collapsedTexts = new WeakMap();

  function toggleCollapsible(toggle) {
    const c = collapsedTexts.get(toggle);
    if (!c) return;
    const expand = toggle.getAttribute("aria-expanded") !== "true";
    c.body.replaceChildren();
    c.renderText(c.body, expand ? c.text : c.short);
    toggle.setAttribute("aria-expanded", String(expand));
    toggle.textContent = expand ? "Show less" : showAllLabel(c.text);
    c.box.classList.toggle("collapsed", !expand);
    if (!expand) c.box.scrollIntoView({ block: "nearest" });
  }

  function plainInto(className) {
    return (body, text) => body.appendChild(el("pre", className, text));
  }

  // --- Markdown --------------------------------------------------------------------------

  // marked, DOMPurify and highlight.js are loaded once the first load is on screen (live
  // events come only after it), so that they never compete with it: until marked and
  // DOMPurify are both there, messages that want Markdown are shown as text and wait here.
  let markdown = null; // {parse(text) -> sanitised HTML}, built on first use
  const waitingForMarkdown = new Set();
  function getMarkdown() {
    if (markdown) return markdown;
    if (!window.marked || !window.DOMPurify) return null; // not loaded (yet): plain text
    const escape = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;");
    const parser = new window.marked.Marked({
      gfm: true,
      async: false,
      renderer: {
        // Never raw HTML from the agent: show it as the text it is.
        html: (token) => (token.block ? `<p>${escape(token.text)}</p>` : escape(token.text)),
        // Agent headings sit below the page's own (h1 title).
        heading(token) {
          const level = Math.min(6, token.depth + 2);
          return `<h${level}>${this.parser.parseInline(token.tokens)}</h${level}>`;
        },
        // No remote images (they would tell a third party that the page was read).
        image: (token) => `<a href="${escape(token.href)}">${escape(token.text || "image")}</a>`,
        checkbox: (token) => (token.checked ? "☑ " : "☐ "),
      },
    });
    window.DOMPurify.addHook("afterSanitizeAttributes", (node) => {
      if (node.tagName === "A") {
        node.setAttribute("target", "_blank");
        node.setAttribute("rel", "noopener noreferrer nofollow");
      }
    });
    const config = {
      ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#)/i,
      FORBID_TAGS: ["style", "img", "svg", "math", "form", "input", "button", "textarea", "select", "iframe"],
      FORBID_ATTR: ["style", "id"],
    };
    markdown = { parse: (text) => window.DOMPurify.sanitize(parser.parse(text), config) };
    return markdown;
  }

  function renderMarkdown(body, text) {
    const md = getMarkdown();
    if (!md) {
      body.replaceChildren(el("div", "plain", text));
      return;
    }
    body.innerHTML = md.parse(text);
    for (const code of body.querySelectorAll("pre > code")) decorateCode(code);
  }

  function decorateCode(code) {
    const pre = code.parentElement;
    const language = (/(?:^|\s)language-([\w+#.-]+)/.exec(code.getAttribute("class") || "") || [])[1] || "";
    const box = el("div", "code-block");
    const bar = el("div", "code-bar");
    bar.appendChild(el("span", "code-lang", language || "text"));
    const copy = el("button", "copy", "Copy");
    copy.type = "button";
    copy.setAttribute("aria-label", `Copy ${language || "text"} code`);
    bar.appendChild(copy);
    pre.replaceWith(box);
    box.append(bar, pre);
    code.dataset.language = language;
    highlight(code);
  }

  function highlight(code) {
    const hljs = window.hljs; // loaded async: code shown before it arrives is done on load
    const language = code.dataset.language;
    if (!hljs || !language || !hljs.getLanguage(language)) return;
    if (code.textContent.length > HIGHLIGHT_MAX_CHARS) return;
    try {
      const result = hljs.highlight(code.textContent, { language, ignoreIllegals: true });
      code.innerHTML = result.value; // hljs escapes the text it wraps in its spans
      code.classList.add("hljs");
    } catch {
      // unhighlighted is fine
    }
  }

  let librariesRequested = false;
  function loadLibraries() {
    if (librariesRequested) return;
    librariesRequested = true;
    for (const src of (root.dataset.libraries || "").split(" ").filter(Boolean)) {
      const script = document.createElement("script");
      script.src = src;
      script.async = true;
      script.addEventListener("load", librariesArrived);
      document.head.appendChild(script);
    }
  }

  function librariesArrived() {
    if (getMarkdown()) {
      for (const block of waitingForMarkdown) renderMessage(block, true);
      waitingForMarkdown.clear();
    }
    if (window.hljs) {
      transcript.querySelectorAll(".code-block code[data-language]:not(.hljs)").forEach(highlight);
    }
  }

  async function copyText(button, text) {
    try {
      if (navigator.clipboard && window.isSecureContext) {
        await navigator.clipboard.writeText(text);
      } else {
        const area = el("textarea");
        area.value = text;
        area.setAttribute("readonly", "");
        area.style.position = "fixed";
        area.style.opacity = "0";
        document.body.appendChild(area);
        area.select();
        document.execCommand("copy");
        area.remove();
      }
      button.textContent = "Copied";
      announce("Copied to the clipboard.");
    } catch {
      button.textContent = "Copy failed";
    }
    setTimeout(() => (button.textContent = "Copy"), 2000);
  }

  // Messages from history get Markdown when they come near the screen.
  const lazy = "IntersectionObserver" in window
    ? new IntersectionObserver((entries) => {
      for (const entry of entries) {
        if (!entry.isIntersecting) continue;
        lazy.unobserve(entry.target);
        renderMessage(entry.target, true);
      }
    }, { rootMargin: "1200px 0px" })
    : null;

  // --- the fold: events into blocks --------------------------------------------------------

  const meta = new WeakMap(); // block element -> what the fold knows about it
  const fold = {
    target: transcript, // a DocumentFragment while a loaded page is applied
    live: false, // true for events from the socket (announced, timed by arrival)
    turn: 0, // user messages so far: tool call ids restart with every agent process
    last: null, // the last block, for chunks that continue it
    tools: new Map(), // `${turn}:${toolCallId}` -> card
    turnCards: [], // this turn's tool cards
    permissions: new Map(), // request id -> card
    plan: null, // this turn's plan
    turnStartedAt: null,
    quiet: null, // the hidden block that holds marks of events without a visible block
  };
  const dirty = new Set(); // blocks whose text, body or list changed since the last flush
  let flushScheduled = false;

  function newBlock(tag, className, kind) {
    const block = el(tag, className);
    block.setAttribute("data-kind", kind);
    const marks = el("span", "marks");
    marks.hidden = true;
    block.appendChild(marks);
    meta.set(block, { marks });
    return block;
  }

  function appendBlock(block) {
    const empty = $("empty-transcript");
    if (empty) empty.remove();
    const previous = fold.last;
    fold.target.appendChild(block);
    fold.last = block;
    if (previous && previous.dataset.kind === "thought") settleThought(previous);
    return block;
  }

  const markPrototype = document.createElement("i");
  function mark(block, seq, event) {
    const i = markPrototype.cloneNode();
    i.setAttribute("data-seq", seq);
    meta.get(block).marks.appendChild(i);
    if (event.truncated === true) addShowAll(block, seq);
  }

  function quietBlock() {
    if (!fold.quiet) {
      fold.quiet = newBlock("div", "quiet", "quiet");
      fold.quiet.hidden = true;
      fold.target.appendChild(fold.quiet);
    }
    return fold.quiet;
  }

  function textOf(data) {
    return isObject(data) && isObject(data.content) && data.content.type === "text"
      ? str(data.content.text)
      : "";
  }

  function timeOf(event) {
    const parsed = event.created_at ? Date.parse(event.created_at) : NaN;
    return Number.isNaN(parsed) ? Date.now() : parsed;
  }

  // Built once: creating a formatter per call (toLocaleTimeString) is slow in long sessions.
  const clockFormat = new Intl.DateTimeFormat([], { hour: "2-digit", minute: "2-digit" });
  const dateFormat = new Intl.DateTimeFormat([], { dateStyle: "medium", timeStyle: "short" });

  function timeElement(ms, className) {
    const date = new Date(ms);
    const node = el("time", className, clockFormat.format(date));
    node.dateTime = date.toISOString();
    node.title = dateFormat.format(date);
    return node;
  }

  function userMessage(event, data) {
    fold.turn += 1;
    fold.plan = null;
    fold.turnCards = [];
    fold.turnStartedAt = timeOf(event);
    const text = str(data.text);
    const block = newBlock("div", "msg user", "user");
    const bubble = block.appendChild(el("div", "bubble"));
    meta.get(block).parts = [{ seq: event.seq, text }];
    fillCollapsible(bubble, text, (body, t) => body.appendChild(el("div", "plain", t)));
    const attached = Array.isArray(data.attachments) ? data.attachments.filter(isObject) : [];
    if (attached.length) {
      const names = attached.map((a) => {
        if (a.type === "file" && typeof a.path === "string") {
          state.knownPaths.add(a.path);
          return a.path;
        }
        const size = Number.isFinite(a.bytes) ? ` (${formatBytes(a.bytes)})` : "";
        return `${str(a.name) || "image"}${size}`;
      });
      block.appendChild(el("p", "msg-attachments", `Attached: ${names.join(", ")}`));
    }
    block.appendChild(el("div", "msg-meta")).appendChild(timeElement(fold.turnStartedAt));
    appendBlock(block);
    if (state.pendingPrompt && state.pendingPrompt.id === data.id) {
      state.pendingPrompt = null;
      if (promptBox.value === text) promptBox.value = "";
      state.images = [];
      renderImages();
    }
    if (fold.live) {
      setRunning(true);
      announce("The agent is working.");
      document.dispatchEvent(new CustomEvent("craft:sessions-changed"));
    }
    return block;
  }

  function chunk(kind, event, data) {
    let block = fold.last;
    if (!block || block.dataset.kind !== kind) {
      if (kind === "thought") {
        block = newBlock("details", "thought", "thought");
        block.appendChild(el("summary", "", fold.live ? "Thinking…" : "Thought"));
        if (fold.live) block.open = true;
        meta.get(block).body = block.appendChild(el("div", "body"));
      } else {
        block = newBlock("div", "msg agent", "agent");
        meta.get(block).body = block.appendChild(el("div", "bubble"));
      }
      Object.assign(meta.get(block), { parts: [], text: "", shown: null });
      appendBlock(block);
    }
    const m = meta.get(block);
    const text = textOf(data);
    m.parts.push({ seq: event.seq, text });
    m.text += text;
    dirty.add(block);
    return block;
  }

  function settleThought(block) {
    const summary = block.querySelector("summary");
    if (summary) summary.textContent = "Thought";
    if (!meta.get(block).userOpened) block.open = false;
  }

  // Render a message's text: Markdown when asked (or when it is small enough and live),
  // plain text for long ones; history waits for the lazy observer.
  function renderMessage(block, rich) {
    const m = meta.get(block);
    if (!m || !m.body) return;
    const text = block.dataset.kind === "agent" ? scrub(m.text) : m.text;
    let useMarkdown = rich && block.dataset.kind === "agent" && text.length <= MARKDOWN_MAX_CHARS;
    if (useMarkdown && !getMarkdown()) {
      waitingForMarkdown.add(block);
      useMarkdown = false;
    }
    const mode = useMarkdown ? "markdown" : "plain";
    if (m.shown === text && m.mode === mode) return;
    if (useMarkdown) {
      renderMarkdown(m.body, text);
    } else if (text.length > MARKDOWN_MAX_CHARS || lineCount(text) > 400) {
      fillCollapsible(m.body, text, (body, t) => body.appendChild(el("div", "plain", t)));
    } else {
      m.body.replaceChildren(el("div", "plain", text));
    }
    m.shown = text;
    m.mode = mode;
    if (!useMarkdown && block.dataset.kind === "agent" && text.length <= MARKDOWN_MAX_CHARS && lazy) {
      lazy.observe(block);
    }
  }

  // Draw what changed since the last flush: message text, tool bodies, plans. Live events are
  // drawn once per frame; a loaded page once, however many updates it folded.
  function flush(rich) {
    flushScheduled = false;
    try {
      renderControls();
    } catch (error) {
      console.error("could not show the agent's controls", error);
    }
    for (const block of dirty) {
      const kind = block.dataset.kind;
      if (kind === "tool") renderToolBody(block.querySelector(".tool-body"), meta.get(block));
      else if (kind === "plan") renderPlan(block);
      else renderMessage(block, rich);
    }
    dirty.clear();
  }

  function scheduleFlush() {
    if (flushScheduled) return;
    flushScheduled = true;
    requestAnimationFrame(() => {
      flush(true); // live text: Markdown at once
      stickToBottom();
    });
  }

  // Tool calls -------------------------------------------------------------------------------

  function toolKey(id) {
    return `${fold.turn}:${id}`;
  }

  function toolCall(event, data) {
    const id = str(data.toolCallId);
    let card = fold.tools.get(toolKey(id));
    if (!card) {
      card = newBlock("div", "tool", "tool");
      card.dataset.toolCallId = id;
      card.dataset.status = "pending";
      const head = card.appendChild(el("div", "tool-head"));
      head.appendChild(el("span", "tool-kind", "Tool"));
      head.appendChild(el("span", "tool-title", "Tool call"));
      head.appendChild(el("span", "badge", TOOL_STATUS.pending));
      card.appendChild(el("div", "tool-body"));
      fold.tools.set(toolKey(id), card);
      fold.turnCards.push(card);
      appendBlock(card);
    }
    // Updates carry only the fields that changed; `content` replaces the whole list.
    const m = meta.get(card);
    if (typeof data.kind === "string") {
      card.querySelector(".tool-kind").textContent = TOOL_KINDS[data.kind] || "Tool";
      m.kind = data.kind;
    }
    if (typeof data.title === "string" && data.title) {
      card.querySelector(".tool-title").textContent = scrub(data.title);
      m.title = data.title;
    }
    if (typeof data.status === "string") {
      card.dataset.status = data.status;
      const badge = card.querySelector(".badge");
      badge.textContent = TOOL_STATUS[data.status] || "Updated";
    }
    if (Array.isArray(data.locations)) {
      m.locations = data.locations;
      for (const l of data.locations) {
        if (isObject(l) && typeof l.path === "string" && state.knownPaths.size < 2000) {
          const path = relPath(l.path);
          if (path && path !== "." && !path.startsWith("/")) state.knownPaths.add(path);
        }
      }
    }
    if (isObject(data.rawInput)) m.rawInput = data.rawInput;
    if (Array.isArray(data.content)) {
      m.content = data.content;
      m.contentSeq = event.seq;
    }
    if (Array.isArray(data.content) || Array.isArray(data.locations) || isObject(data.rawInput)) {
      dirty.add(card); // drawn at the next flush: in a loaded page, only its last content
    }
    return card;
  }

  function renderToolBody(body, call) {
    body.replaceChildren();
    const command = commandOf(call);
    if (command) body.appendChild(el("pre", "command", `$ ${command}`));
    const items = Array.isArray(call.content) ? call.content : [];
    let shown = 0;
    for (const item of items) {
      const node = contentItem(item);
      if (node) {
        body.appendChild(node);
        shown++;
      }
    }
    const paths = (Array.isArray(call.locations) ? call.locations : [])
      .filter((l) => isObject(l) && typeof l.path === "string")
      .map((l) => relPath(l.path) + (Number.isInteger(l.line) ? `:${l.line}` : ""));
    // Locations the title already names add nothing (a one-file edit or read).
    const title = typeof call.title === "string" ? scrub(call.title) : "";
    if (paths.length && !shown && !paths.every((p) => title.includes(p.replace(/:\d+$/, "")))) {
      const list = body.appendChild(el("ul", "locations"));
      for (const path of paths) list.appendChild(el("li", "", path));
    }
  }

  function commandOf(call) {
    const raw = call.rawInput;
    if (!isObject(raw) || (call.kind && call.kind !== "execute")) return "";
    if (typeof raw.command === "string") return scrub(raw.command);
    if (Array.isArray(raw.command)) return scrub(raw.command.map(str).join(" "));
    return "";
  }

  function contentItem(item) {
    if (!isObject(item)) return null;
    if (item.type === "diff") return diffView(item);
    if (item.type === "content" && isObject(item.content)) {
      if (item.content.type === "text") {
        const box = el("div", "tool-output");
        fillCollapsible(box, scrub(str(item.content.text)), plainInto("tool-text"));
        return box;
      }
      return el("p", "muted", "The agent attached something this page can't show.");
    }
    if (item.type === "terminal") return el("p", "muted", "Terminal output is not shown here.");
    return null;
  }

  function splitLines(text) {
    if (typeof text !== "string" || text === "") return [];
    const lines = text.split("\n");
    if (lines[lines.length - 1] === "") lines.pop();
    return lines;
  }

  function diffView(item) {
    const box = el("div", "diff");
    box.appendChild(el("div", "diff-path", relPath(item.path) || "file"));
    const before = splitLines(item.oldText);
    const after = splitLines(item.newText);
    // Common lines at both ends are context; what lies between changed. Cheap (linear) and
    // exact for the one-hunk edits agents usually propose.
    let start = 0;
    while (start < before.length && start < after.length && before[start] === after[start]) start++;
    let endBefore = before.length;
    let endAfter = after.length;
    while (endBefore > start && endAfter > start && before[endBefore - 1] === after[endAfter - 1]) {
      endBefore--;
      endAfter--;
    }
    const rows = [];
    for (let i = Math.max(0, start - 3); i < start; i++) rows.push(["ctx", before[i]]);
    for (let i = start; i < endBefore; i++) rows.push(["del", before[i]]);
    for (let i = start; i < endAfter; i++) rows.push(["add", after[i]]);
    for (let i = endBefore; i < Math.min(before.length, endBefore + 3); i++) rows.push(["ctx", before[i]]);
    if (!rows.length) {
      box.appendChild(el("p", "muted", after.length ? "No changes." : "An empty file."));
      return box;
    }
    const label = `${endBefore - start} line${endBefore - start === 1 ? "" : "s"} removed, ${endAfter - start} added`;
    box.firstChild.appendChild(el("span", "diff-stat", ` · ${label}`));
    const limit = PREVIEW_LINES * 2;
    const renderRows = (body, count) => {
      const pre = body.appendChild(el("pre", "diff-lines"));
      for (const [kind, line] of rows.slice(0, count)) pre.appendChild(el("span", kind, `${line}\n`));
    };
    const body = el("div", "collapsible-body");
    box.appendChild(body);
    renderRows(body, limit);
    if (rows.length > limit) {
      const toggle = el("button", "toggle-more", `Show all (${rows.length} lines)`);
      toggle.type = "button";
      toggle.setAttribute("aria-expanded", "false");
      body.id = `collapsible-${++collapsibleIds}`;
      toggle.setAttribute("aria-controls", body.id);
      toggle.addEventListener("click", () => {
        const expand = toggle.getAttribute("aria-expanded") !== "true";
        body.replaceChildren();
        renderRows(body, expand ? rows.length : limit);
        toggle.setAttribute("aria-expanded", String(expand));
        toggle.textContent = expand ? "Show less" : `Show all (${rows.length} lines)`;
      });
      toggle.classList.add("diff-toggle");
      box.appendChild(toggle);
    }
    return box;
  }

  // Plans --------------------------------------------------------------------------------------

  function plan(event, data) {
    if (!fold.plan) {
      fold.plan = newBlock("div", "plan", "plan");
      const title = fold.plan.appendChild(el("div", "plan-title", "Plan"));
      title.appendChild(el("span", "plan-progress"));
      fold.plan.appendChild(el("ul"));
      appendBlock(fold.plan);
    }
    if (!Array.isArray(data.entries)) return fold.plan; // malformed: keep the last good list
    meta.get(fold.plan).entries = data.entries.filter(isObject);
    dirty.add(fold.plan); // drawn at the next flush: in a loaded page, only the turn's last plan
    return fold.plan;
  }

  function renderPlan(block) {
    const entries = meta.get(block).entries || [];
    const list = block.querySelector("ul");
    list.replaceChildren();
    let done = 0;
    for (const entry of entries) {
      const status = PLAN_STATUS[entry.status] ? entry.status : "pending";
      if (status === "completed") done++;
      const li = list.appendChild(el("li", "plan-entry"));
      li.setAttribute("data-status", status);
      li.appendChild(el("span", "check")).setAttribute("aria-hidden", "true");
      li.appendChild(el("span", "plan-text", scrub(str(entry.content))));
      li.appendChild(el("span", "sr-only", ` (${PLAN_STATUS[status]})`));
    }
    block.querySelector(".plan-progress").textContent =
      entries.length ? ` · ${done} of ${entries.length} done` : "";
  }

  // Permission requests ---------------------------------------------------------------------

  function permissionRequest(event, data) {
    const call = isObject(data.toolCall) ? data.toolCall : {};
    const block = newBlock("div", "permission", "permission");
    const request = str(data.request);
    block.dataset.request = request;
    block.dataset.answer = "";
    const question = block.appendChild(el("div", "permission-q"));
    question.id = `permission-${event.seq}`;
    question.appendChild(el("span", "permission-label", "The agent asks for permission: "));
    question.appendChild(el("strong", "", scrub(str(call.title)) || "use a tool"));
    // What is being approved: the proposed content, the command, the files it touches. A
    // request may omit content that an earlier tool_call of this turn carried.
    const card = fold.tools.get(toolKey(str(call.toolCallId)));
    const known = card ? meta.get(card) : {};
    const details = {
      title: call.title,
      kind: typeof call.kind === "string" ? call.kind : known.kind,
      content: Array.isArray(call.content) && call.content.length ? call.content : known.content,
      locations: Array.isArray(call.locations) ? call.locations : known.locations,
      rawInput: isObject(call.rawInput) ? call.rawInput : known.rawInput,
    };
    const body = block.appendChild(el("div", "permission-body"));
    renderToolBody(body, details);
    const options = block.appendChild(el("div", "options"));
    options.setAttribute("role", "group");
    options.setAttribute("aria-labelledby", question.id);
    const offered = [];
    for (const option of Array.isArray(data.options) ? data.options : []) {
      if (!isObject(option) || typeof option.optionId !== "string") continue;
      const kind = typeof option.kind === "string" ? option.kind : "";
      const button = options.appendChild(el("button", "option", str(option.name) || option.optionId));
      if (ANSWERS[kind]) button.classList.add(kind);
      button.type = "button";
      button.dataset.option = option.optionId;
      offered.push({ id: option.optionId, kind, name: str(option.name) || option.optionId });
    }
    const answer = block.appendChild(el("div", "permission-answer"));
    answer.tabIndex = -1;
    Object.assign(meta.get(block), { offered, answer });
    if (request) fold.permissions.set(request, block);
    appendBlock(block);
    if (fold.live) announce(`The agent asks for permission: ${scrub(str(call.title)) || "use a tool"}.`);
    return block;
  }

  function closePermission(block, answerId, text) {
    block.dataset.answer = answerId;
    block.querySelectorAll(".options button").forEach((b) => (b.disabled = true));
    meta.get(block).answer.textContent = text;
  }

  function permissionAnswer(event, data) {
    const block = fold.permissions.get(str(data.request));
    if (!block) return note(event, "An answer to a question this page never showed.");
    const optionId = typeof data.option === "string" ? data.option : "";
    if (!optionId) {
      closePermission(block, "cancelled", "Cancelled: the turn was stopped.");
    } else {
      const offered = meta.get(block).offered.find((o) => o.id === optionId);
      // The agent's own name for the option, after what choosing it means when ACP says.
      const text = !offered ? "Answered."
        : ANSWERS[offered.kind] ? `${ANSWERS[offered.kind]} (${offered.name})`
          : `You chose: ${offered.name}`;
      closePermission(block, optionId, text);
      const chosen = block.querySelector(`.options button[data-option="${CSS.escape(optionId)}"]`);
      if (chosen) chosen.classList.add("chosen");
    }
    return block;
  }

  // Turn ends, errors, everything else --------------------------------------------------------

  function turnEnd(event, data) {
    const reason = str(data.stop_reason);
    const block = newBlock("div", "turn-end", "turn_end");
    block.dataset.reason = reason;
    block.appendChild(el("span", "label", STOP_REASONS[reason] || "The turn ended"));
    const ended = timeOf(event);
    if (fold.turnStartedAt !== null && ended - fold.turnStartedAt >= 1000) {
      block.appendChild(el("span", "turn-meta", ` · ${duration(ended - fold.turnStartedAt)}`));
    }
    for (const card of fold.permissions.values()) {
      if (card.dataset.answer === "") closePermission(card, "expired", "No longer open: the turn ended.");
    }
    // A tool the agent never finished must not look like it is still running.
    for (const card of fold.turnCards) {
      const status = card.getAttribute("data-status");
      if (status === "pending" || status === "in_progress") {
        card.querySelector(".badge").textContent = "Not finished";
      }
    }
    appendBlock(block);
    if (fold.live) {
      setRunning(false);
      announce(STOP_REASONS[reason] || "The turn ended.");
      document.dispatchEvent(new CustomEvent("craft:sessions-changed"));
    }
    return block;
  }

  function duration(ms) {
    const seconds = Math.round(ms / 1000);
    if (seconds < 60) return `${seconds} s`;
    return `${Math.floor(seconds / 60)} min ${seconds % 60} s`;
  }

  function technicalDetails(parent, text) {
    if (!state.staff || !text) return;
    const details = parent.appendChild(el("details", "tech"));
    details.appendChild(el("summary", "", "Details"));
    details.appendChild(el("pre", "", scrubHostPaths(text)));
  }

  function agentError(event, data) {
    const message = str(data.message);
    const block = newBlock("div", "agent-error", "error");
    const summary = agentErrorSummary(message);
    block.appendChild(el("p", "", summary));
    technicalDetails(block, message);
    appendBlock(block);
    if (fold.live) showFrameError(summary);
    return block;
  }

  function note(event, text, detail) {
    const block = newBlock("div", "note", "other");
    block.appendChild(el("span", "", text));
    technicalDetails(block, detail);
    return appendBlock(block);
  }

  function agentRestarted(event, data) {
    const block = newBlock("p", "divider", "restart");
    block.dataset.restored = str(data.restored);
    block.appendChild(el("span", "", RESTARTS[str(data.restored)] || "Agent restarted"));
    appendBlock(block);
    if (fold.live) announce(RESTARTS[str(data.restored)] || "Agent restarted");
    return block;
  }

  // The agent's controls: the fold keeps the newest state, renderControls() shows it.
  function followControls(kind, data) {
    const agent = state.agent;
    if (kind === "agent_info") {
      agent.prompt = isObject(data.promptCapabilities) ? data.promptCapabilities : {};
      agent.configOptions = Array.isArray(data.configOptions) ? data.configOptions.filter(isObject) : null;
      agent.modes = isObject(data.modes) ? data.modes : null;
    } else if ((kind === "config_option_update" || kind === "config_options_update") && Array.isArray(data.configOptions)) {
      agent.configOptions = data.configOptions.filter(isObject);
    } else if (kind === "current_mode_update") {
      const mode = typeof data.currentModeId === "string" ? data.currentModeId : data.modeId;
      if (agent.modes && typeof mode === "string") agent.modes = { ...agent.modes, currentModeId: mode };
    } else if (kind === "available_commands_update" && Array.isArray(data.availableCommands)) {
      agent.commands = data.availableCommands.filter((c) => isObject(c) && typeof c.name === "string" && c.name);
    } else if (kind === "usage_update") {
      agent.usage = data;
    }
    state.controlsDirty = true;
  }

  function selectOptions(option) {
    // A select's values, flat or in groups ({group, name, options}).
    const values = [];
    for (const item of Array.isArray(option.options) ? option.options : []) {
      if (!isObject(item)) continue;
      if (typeof item.value === "string") values.push(item);
      for (const inner of Array.isArray(item.options) ? item.options : []) {
        if (isObject(inner) && typeof inner.value === "string") values.push(inner);
      }
    }
    return values;
  }

  function picker(label, current, values, data) {
    const box = el("span", "picker");
    const name = box.appendChild(el("label", "", label));
    const select = box.appendChild(el("select"));
    select.id = `picker-${pickers.childElementCount}`;
    name.htmlFor = select.id;
    Object.assign(select.dataset, data);
    for (const value of values) {
      const option = select.appendChild(el("option", "", str(value.name) || value.value));
      option.value = value.value;
      if (typeof value.description === "string") option.title = value.description;
    }
    if (!values.some((v) => v.value === current)) {
      select.insertBefore(el("option", "", current || "—"), select.firstChild).value = current;
    }
    select.value = current;
    return box;
  }

  function renderControls() {
    if (!state.controlsDirty) return;
    state.controlsDirty = false;
    const agent = state.agent;
    const focused = document.activeElement && pickers.contains(document.activeElement)
      ? document.activeElement.dataset : null;
    pickers.replaceChildren();
    // Config options are preferred: modes only for agents that offer nothing else.
    if (agent.configOptions && agent.configOptions.length) {
      for (const option of agent.configOptions) {
        if (option.type !== "select" || typeof option.id !== "string") continue; // unknown types are ignored
        const values = selectOptions(option);
        if (!values.length) continue;
        pickers.appendChild(picker(str(option.name) || option.id, str(option.currentValue), values, { config: option.id }));
      }
    } else if (agent.modes && Array.isArray(agent.modes.availableModes)) {
      const values = agent.modes.availableModes
        .filter((m) => isObject(m) && typeof m.id === "string")
        .map((m) => ({ value: m.id, name: m.name, description: m.description }));
      if (values.length) pickers.appendChild(picker("Mode", str(agent.modes.currentModeId), values, { mode: "1" }));
    }
    if (focused) {
      const again = [...pickers.querySelectorAll("select")].find(
        (s) => s.dataset.config === focused.config && s.dataset.mode === focused.mode);
      if (again) again.focus();
    }
    const usage = agent.usage;
    const used = usage && Number(usage.used);
    const size = usage && Number(usage.size);
    if (usage && Number.isFinite(used) && Number.isFinite(size) && size > 0) {
      const meter = $("usage-meter");
      meter.value = Math.min(1, Math.max(0, used / size));
      let text = `Context ${Math.round((100 * used) / size)}% (${numberFormat.format(used)} of ${numberFormat.format(size)} tokens)`;
      const cost = isObject(usage.cost) ? usage.cost : null;
      if (cost && Number.isFinite(cost.amount) && typeof cost.currency === "string") {
        try {
          text += ` · ${new Intl.NumberFormat(undefined, { style: "currency", currency: cost.currency, maximumFractionDigits: 4 }).format(cost.amount)}`;
        } catch {
          text += ` · ${cost.amount} ${cost.currency}`;
        }
      }
      $("usage-text").textContent = text;
      usageBox.hidden = false;
    } else {
      usageBox.hidden = true;
    }
    agentControls.hidden = !pickers.childElementCount && usageBox.hidden;
    attachImage.hidden = agent.prompt.image !== true;
    $("composer-hint-more").hidden = !agent.commands.length;
  }

  pickers.addEventListener("change", (event) => {
    const select = event.target.closest("select");
    if (!select) return;
    const frame = select.dataset.config
      ? { type: "set_config_option", config: select.dataset.config, value: select.value }
      : { type: "set_mode", mode: select.value };
    if (send(frame)) {
      announce("Asking the agent to change that…");
    } else {
      showFrameError("Not connected. Change it again in a moment.");
      state.controlsDirty = true;
      renderControls(); // back to what the agent last said
    }
  });

  function sessionTitle(event, data) {
    if (typeof data.title === "string" && data.title.trim()) setTitle(data.title);
    if (fold.live) document.dispatchEvent(new CustomEvent("craft:sessions-changed"));
    return quietBlock();
  }

  function foldEvent(event) {
    const data = isObject(event.data) ? event.data : {};
    switch (event.kind) {
      case "user_message": return userMessage(event, data);
      case "agent_message_chunk": return chunk("agent", event, data);
      case "agent_thought_chunk": return chunk("thought", event, data);
      case "tool_call":
      case "tool_call_update": return toolCall(event, data);
      case "plan": return plan(event, data);
      case "permission_request": return permissionRequest(event, data);
      case "permission_answer": return permissionAnswer(event, data);
      case "turn_end": return turnEnd(event, data);
      case "agent_error": return agentError(event, data);
      case "session_title": return sessionTitle(event, data);
      case "agent_restarted": return agentRestarted(event, data);
      case "agent_info":
      case "config_option_update":
      case "config_options_update":
      case "current_mode_update":
      case "available_commands_update":
      case "usage_update":
        followControls(event.kind, data);
        return quietBlock();
      default:
        if (QUIET_KINDS.has(event.kind)) return quietBlock();
        return note(event, "The agent sent an update this page can't show.", `kind: ${str(event.kind)}`);
    }
  }

  // Apply one event: never throws, and lastSeq always advances past it.
  function applyEvent(event) {
    if (!isObject(event)) return;
    const seq = event.seq;
    if (!Number.isSafeInteger(seq) || seq <= state.lastSeq) return; // already applied
    try {
      mark(foldEvent(event), seq, event);
    } catch (error) {
      console.error("could not render event", seq, error);
      try {
        mark(note(event, "Something the agent sent could not be shown."), seq, {});
      } catch {
        // nothing more to do: the seq still counts as applied
      }
    }
    state.lastSeq = seq;
  }

  function applyLive(event) {
    fold.live = true;
    applyEvent(event);
    fold.live = false;
    scheduleFlush();
  }

  // Apply a page of loaded events into `fragment` (new blocks go there; blocks already on the
  // page are updated in place), and draw it: plain text now, Markdown when it comes near the
  // screen. The caller puts the fragment on the page.
  function applyPage(events, fragment) {
    fold.target = fragment;
    try {
      for (const event of events) applyEvent(event);
    } finally {
      fold.target = transcript;
    }
    flush(!lazy);
  }

  // Truncated events: "Show all" fetches the whole event ---------------------------------------

  function addShowAll(block, seq) {
    if (block === fold.quiet) return;
    const box = el("div", "truncated");
    box.appendChild(el("span", "", "Part of this was too large to send live. "));
    const button = box.appendChild(el("button", "show-all", "Show all"));
    button.type = "button";
    button.dataset.seq = seq;
    block.appendChild(box);
  }

  async function showAll(button) {
    const seq = Number(button.dataset.seq);
    const block = button.closest("[data-kind]");
    button.disabled = true;
    button.textContent = "Loading…";
    try {
      const event = await fetchJson(state.eventUrl.replace(/0\/$/, `${seq}/`));
      refold(block, event);
      button.parentElement.remove();
    } catch (error) {
      button.disabled = false;
      button.textContent = "Show all (try again)";
      showFrameError(`Couldn't load the rest: ${error.message}.`);
    }
  }

  function refold(block, event) {
    const m = meta.get(block);
    const data = isObject(event.data) ? event.data : {};
    if (m.parts) {
      const part = m.parts.find((p) => p.seq === event.seq);
      const text = event.kind === "user_message" ? str(data.text) : textOf(data);
      if (part) part.text = text;
      m.text = m.parts.map((p) => p.text).join("");
      if (block.dataset.kind === "user") {
        fillCollapsible(block.querySelector(".bubble"), m.text, (b, t) => b.appendChild(el("div", "plain", t)));
      } else {
        m.shown = null;
        renderMessage(block, true);
      }
    } else if (block.dataset.kind === "tool" && Array.isArray(data.content) && m.contentSeq === event.seq) {
      m.content = data.content;
      renderToolBody(block.querySelector(".tool-body"), m);
    } else if (block.dataset.kind === "permission" && isObject(data.toolCall)) {
      renderToolBody(block.querySelector(".permission-body"), data.toolCall);
    } else if (block.dataset.kind === "plan" && Array.isArray(data.entries)) {
      m.entries = data.entries.filter(isObject);
      renderPlan(block);
    } else if (state.staff) {
      technicalDetails(block, JSON.stringify(event.data, null, 2));
    }
  }

  // --- the connection ------------------------------------------------------------------------

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
      if (isObject(frame)) onFrame(frame);
    };
    ws.onclose = (event) => {
      if (ws !== state.ws) return;
      state.ws = null;
      if (event.code === 4401 || event.code === 4403) {
        state.closedForGood = true;
        setConn("offline", event.code === 4401 ? "Signed out: reload to sign in" : "No access");
        return;
      }
      if (state.connected) announce("Connection lost. Reconnecting…");
      state.connected = false;
      scheduleReconnect();
    };
  }

  function scheduleReconnect() {
    if (state.closedForGood) return;
    const delay = backoff(state.reconnectAttempt++);
    if (navigator.onLine === false) setConn("offline", "Offline");
    else setConn("reconnecting", "Reconnecting…");
    clearTimeout(state.reconnectTimer);
    state.reconnectTimer = setTimeout(connect, delay);
  }

  window.addEventListener("offline", () => setConn("offline", "Offline"));
  window.addEventListener("online", () => {
    // Back online: an open socket is still good; a closed one reconnects now, not after its
    // backoff. Either way "Offline" must not stay.
    if (state.ws && state.ws.readyState === WebSocket.OPEN) {
      setConn("connected", "Connected");
    } else if (!state.closedForGood) {
      setConn("reconnecting", "Reconnecting…");
      if (!state.ws) {
        state.reconnectAttempt = 0;
        connect();
      }
    }
  });

  function send(frame) {
    return sendText(JSON.stringify(frame));
  }

  function sendText(text) {
    if (!state.ws || state.ws.readyState !== WebSocket.OPEN) return false;
    state.ws.send(text);
    return true;
  }

  function onFrame(frame) {
    switch (frame.type) {
      case "hello":
        state.reconnectAttempt = 0;
        if (state.wasConnected && !state.connected) announce("Connected again.");
        state.wasConnected = true;
        state.connected = true;
        setConn("connected", "Connected");
        setRunning(frame.running);
        if (Number.isSafeInteger(frame.last_seq)) state.serverLastSeq = frame.last_seq;
        if (isObject(frame.sandbox)) setSandbox(frame.sandbox);
        if (!state.retryPending) loadSession(); // else the scheduled retry loads, then resumes
        break;
      case "event":
        if (typeof frame.seq === "number" && frame.seq > state.lastSeq + 1) {
          loadSession(); // a gap: fetch what is missing, then resume from there
        } else {
          applyLive(frame);
        }
        break;
      case "error":
        showFrameErrorFrame(frame);
        break;
    }
  }

  // --- session loads (with the guard) ---------------------------------------------------------

  async function fetchJson(url, controller = new AbortController(), cache = "no-store") {
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      controller.abort();
    }, LOAD_TIMEOUT_MS);
    try {
      // With cache "default", a GET the page preloaded (session.html) uses that response; every
      // other request goes to the server ("no-store"), or a retry could join a hung preload.
      const response = await fetch(url, { credentials: "same-origin", signal: controller.signal, cache });
      if (!response.ok) {
        throw new Error(response.status >= 500 ? `the server had a problem (${response.status})` : `the server refused (${response.status})`);
      }
      return await response.json();
    } catch (error) {
      if (timedOut) throw new Error("the server took too long to answer");
      if (error.name === "AbortError") throw new Error("the request was stopped");
      if (error instanceof TypeError) throw new Error("the connection failed");
      throw error;
    } finally {
      clearTimeout(timer);
    }
  }

  async function loadSession() {
    if (state.loadInFlight) return; // a load is running: it resumes on the current socket
    state.loadInFlight = true; // set before any await: this is the guard
    clearTimeout(state.retryTimer);
    state.retryPending = false;
    const controller = new AbortController();
    const cache = state.preloaded ? "default" : "no-store";
    state.preloaded = false;
    // The first load goes on the page in one piece: the page opens at the bottom, so drawing
    // the older pages first would only cost frames nobody sees. Later loads go page by page.
    const first = !state.loaded;
    let fragment = document.createDocumentFragment();
    try {
      let body = null;
      while (body === null || body.has_more) {
        // Ask for every page up to the last seq the server told us about at once; the seqs
        // have no gaps, so page k starts after lastSeq + k * PAGE_SIZE. Apply them in order.
        const from = state.lastSeq;
        const pages = [];
        for (
          let after = from;
          pages.length === 0 || (after < state.serverLastSeq && pages.length < MAX_PARALLEL_PAGES);
          after += PAGE_SIZE
        ) {
          pages.push(fetchJson(`${state.eventsUrl}?after=${after}&limit=${PAGE_SIZE}`, controller, cache));
        }
        pages.forEach((p) => p.catch(() => {})); // awaited below, in order
        for (const page of pages) {
          body = await page;
          const events = Array.isArray(body.events) ? body.events : [];
          if (events.length && events[0].seq > state.lastSeq + 1) {
            body = { has_more: true }; // an earlier page was short: continue from lastSeq
            break;
          }
          applyPage(events, fragment);
          if (!first) transcript.appendChild(fragment);
        }
        if (state.lastSeq === from && body.has_more) throw new Error("the server sent no events");
      }
      transcript.appendChild(fragment);
      fragment = null;
      state.loadInFlight = false;
      state.loadFailures = 0;
      loadError.hidden = true;
      setRunning(body.running);
      if (isObject(body.sandbox)) setSandbox(body.sandbox);
      if (!state.loaded) requestAnimationFrame(firstLoadDone);
      send({ type: "resume", after: state.lastSeq });
    } catch (error) {
      if (fragment) transcript.appendChild(fragment); // what was applied counts: show it
      controller.abort(); // the other pages of this load
      // Clear the guard, or no later attempt could ever run.
      state.loadInFlight = false;
      const delay = backoff(state.loadFailures++);
      loadError.querySelector(".load-error-text").textContent =
        `Couldn't load this session: ${error.message}. Retrying in ${Math.ceil(delay / 1000)} s.`;
      loadError.hidden = false;
      state.retryPending = true;
      state.retryTimer = setTimeout(loadSession, delay);
    }
  }

  function firstLoadDone() {
    if (state.loaded) return;
    state.loaded = true;
    loadLibraries();
    // The blocks people see first get Markdown now; the rest when scrolled near.
    const blocks = transcript.querySelectorAll(":scope > .msg.agent");
    for (let i = Math.max(0, blocks.length - EAGER_BLOCKS); i < blocks.length; i++) {
      renderMessage(blocks[i], true);
    }
    scrollToBottom();
    if (!state.lastSeq || document.activeElement === document.body) promptBox.focus({ preventScroll: true });
  }

  $("retry-now").addEventListener("click", () => {
    clearTimeout(state.retryTimer);
    loadSession();
  });

  // --- what the page shows around the transcript ----------------------------------------------

  function announce(text) {
    announcer.textContent = "";
    setTimeout(() => (announcer.textContent = text), 50);
  }

  let workingTimer = null;
  function setRunning(running) {
    state.running = Boolean(running);
    root.dataset.running = state.running ? "true" : "false";
    // Nothing can be sent while a turn runs, or while the sandbox is not running.
    sendButton.disabled = state.running || Boolean(state.sandboxStatus && state.sandboxStatus !== "running");
    stopButton.hidden = !state.running;
    working.hidden = !state.running;
    clearInterval(workingTimer);
    if (state.running) {
      const started = fold.turnStartedAt ?? Date.now();
      const tick = () => {
        const seconds = Math.max(0, Math.floor((Date.now() - started) / 1000));
        workingTime.textContent = `${Math.floor(seconds / 60)}:${String(seconds % 60).padStart(2, "0")}`;
      };
      tick();
      workingTimer = setInterval(tick, 1000);
    }
    favicon.href = favicon.href.replace(/favicon(-busy)?\.svg/, state.running ? "favicon-busy.svg" : "favicon.svg");
  }

  function setTitle(title) {
    $("session-title").textContent = title;
    document.title = `${title} · Craft`;
    const item = document.getElementById(`session-${state.sessionId}`);
    if (!item) return;
    const name = item.querySelector(".session-name");
    if (name) name.textContent = title;
    const link = item.querySelector(".session-link");
    if (link) link.title = title;
    const input = item.querySelector("input[name=title]");
    if (input && document.activeElement !== input) input.value = title;
  }

  const SANDBOX_BANNERS = {
    provisioning: "Your sandbox is starting…",
    terminating: "This session's sandbox is stopping. The agent can't work here any more.",
    terminated: "This session's sandbox was stopped, so the agent can't work here any more. Start a new session to carry on.",
    failed: "Your sandbox could not start, so the agent can't work here yet.",
  };

  // "Try again" on a failed sandbox: set it up again for this session (POST /api/sandbox/),
  // then follow its progress as the sidebar's sandbox line polls it.
  const retrySandbox = $("retry-sandbox");
  retrySandbox.addEventListener("click", async () => {
    retrySandbox.disabled = true;
    const token = sandboxBanner.querySelector("input[name=csrfmiddlewaretoken]");
    try {
      const response = await fetch(retrySandbox.dataset.url, {
        method: "POST", credentials: "same-origin",
        headers: { "X-CSRFToken": token ? token.value : "" },
      });
      if (!response.ok) throw new Error(`the server refused (${response.status})`);
      setSandbox(await response.json());
      const line = $("sandbox-status");
      if (line && window.htmx) window.htmx.trigger(line, "craft:refresh");
    } catch (error) {
      showFrameError(`Your sandbox could not be set up again: ${error.message}. Try again in a moment.`);
    } finally {
      retrySandbox.disabled = false;
    }
  });

  function setSandbox(sandbox) {
    const status = str(sandbox.status);
    state.sandboxStatus = status;
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
    else sendButton.disabled = state.running;
  }

  // The sidebar's sandbox line polls the sandbox while it starts (sidebar.js): the banner and
  // the composer follow each new answer.
  document.addEventListener("htmx:afterSettle", () => {
    const line = $("sandbox-status");
    if (!line || !line.dataset.status || line.dataset.status === "none") return;
    if (line.dataset.status === state.sandboxStatus && line.dataset.detail === state.sandboxDetail) return;
    state.sandboxDetail = line.dataset.detail || "";
    setSandbox({ status: line.dataset.status, detail: state.sandboxDetail });
  });

  function showFrameError(message, sticky = false) {
    frameError.textContent = message;
    frameError.hidden = false;
    clearTimeout(showFrameError.timer);
    if (!sticky) showFrameError.timer = setTimeout(() => (frameError.hidden = true), 8000);
  }

  function showFrameErrorFrame(frame) {
    if (frame.code === "not_running") return; // Stop raced with the end of the turn
    state.controlsDirty = true; // a refused change: the pickers go back to what the agent said
    try {
      renderControls();
    } catch (error) {
      console.error("could not show the agent's controls", error);
    }
    showFrameError(FRAME_ERRORS[frame.code] || "The server did not accept that. Try again in a moment.");
  }

  // Scrolling: follow the newest event unless the reader scrolled up.
  let pinned = true;
  function atBottom() {
    return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 80;
  }
  window.addEventListener("scroll", () => {
    pinned = atBottom();
    jumpButton.hidden = pinned;
  }, { passive: true });
  function scrollToBottom() {
    window.scrollTo(0, document.documentElement.scrollHeight);
    pinned = true;
    jumpButton.hidden = true;
  }
  function stickToBottom() {
    if (pinned) scrollToBottom();
    else jumpButton.hidden = false;
  }
  jumpButton.addEventListener("click", () => {
    scrollToBottom();
    promptBox.focus({ preventScroll: true });
  });
  // Whatever makes the transcript taller while the reader is at the bottom (Markdown rendered
  // late, off-screen blocks laid out for the first time, which content-visibility defers),
  // keep the bottom in view.
  if ("ResizeObserver" in window) {
    new ResizeObserver(() => {
      if (pinned) scrollToBottom();
    }).observe(transcript);
  }

  // --- the composer, stop, and clicks in the transcript ----------------------------------------

  function newId() {
    // crypto.randomUUID needs a secure context; getRandomValues does not.
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
  }

  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = promptBox.value;
    if (!text.trim()) {
      showFrameError("Type a message first.");
      return;
    }
    if (state.running) {
      showFrameError(FRAME_ERRORS.turn_running);
      return;
    }
    if (state.sandboxStatus === "provisioning") {
      showFrameError(FRAME_ERRORS.sandbox_starting);
      return;
    }
    const attachments = [...mentionedFiles(text), ...state.images.map((image) => ({
      type: "image", mimeType: image.mimeType, data: image.data, name: image.name,
    }))];
    // Re-sending the same message reuses the id, so a prompt sent just before a disconnect
    // is never run twice.
    const key = `${state.images.map((i) => i.id).join(",")}\n${text}`;
    if (!state.pendingPrompt || state.pendingPrompt.key !== key) {
      state.pendingPrompt = { id: newId(), text, key };
    }
    const message = { type: "prompt", id: state.pendingPrompt.id, text };
    if (attachments.length) message.attachments = attachments;
    const frame = JSON.stringify(message);
    const bytes = new TextEncoder().encode(frame).length;
    const limit = attachments.length ? MAX_ATTACHED_FRAME_BYTES : MAX_FRAME_BYTES;
    if (bytes > limit) {
      state.pendingPrompt = null;
      const size = `(${(bytes / 1048576).toFixed(1)} MB; the limit is ${Math.round(limit / 1048576)} MB)`;
      showFrameError(
        attachments.length
          ? `This message and its attachments are too large to send ${size}. It's still in the box: remove an image, or shorten the text.`
          : `This message is too long to send ${size}. It's still in the box: shorten it, or put the long part in a file in the workspace.`,
        true,
      );
      return;
    }
    frameError.hidden = true;
    if (!sendText(frame)) {
      showFrameError("Not connected. Your message is kept; send it again in a moment.");
    }
  });

  // @ mentions: `@path` names a file of the workspace, sent as a link the agent can read.
  function mentionedFiles(text) {
    const paths = new Set();
    for (const match of text.matchAll(/(?:^|\s)@([^\s@]+)/g)) {
      const path = match[1].replace(/[.,;:!?)]+$/, "");
      if (!path || path.startsWith("/") || path.includes("://") || path.split("/").includes("..")) continue;
      paths.add(path);
      if (paths.size >= 10) break;
    }
    return [...paths].map((path) => ({ type: "file", path }));
  }

  // The palette: the agent's commands after a leading "/", known files after "@". -----------

  const suggestions = { items: [], active: -1, start: 0, end: 0, kind: "" };

  function currentToken() {
    const caret = promptBox.selectionStart ?? promptBox.value.length;
    const before = promptBox.value.slice(0, caret);
    const command = /^\/(\S*)$/.exec(before);
    if (command && state.agent.commands.length) return { kind: "command", query: command[1], start: 0, end: caret };
    const mention = /(?:^|\s)@([^\s@]*)$/.exec(before);
    if (mention && state.knownPaths.size) return { kind: "file", query: mention[1], start: caret - mention[1].length - 1, end: caret };
    return null;
  }

  function updatePalette() {
    const token = currentToken();
    let items = [];
    if (token && token.kind === "command") {
      const query = token.query.toLowerCase();
      items = state.agent.commands
        .filter((c) => c.name.toLowerCase().startsWith(query))
        .slice(0, 12)
        .map((c) => ({ label: `/${c.name}`, about: str(c.description), insert: `/${c.name} `,
          hint: isObject(c.input) ? str(c.input.hint) : "" }));
    } else if (token && token.kind === "file") {
      const query = token.query.toLowerCase();
      items = [...state.knownPaths].filter((p) => p.toLowerCase().includes(query)).sort().slice(0, 12)
        .map((p) => ({ label: `@${p}`, about: "", insert: `@${p} ` }));
    }
    if (!items.length) return closePalette();
    Object.assign(suggestions, { items, active: 0, start: token.start, end: token.end, kind: token.kind });
    palette.replaceChildren();
    items.forEach((item, i) => {
      const li = palette.appendChild(el("li"));
      li.id = `suggestion-${i}`;
      li.setAttribute("role", "option");
      li.appendChild(el("span", "name", item.label));
      if (item.about || item.hint) li.appendChild(el("span", "about", [item.about, item.hint && `(${item.hint})`].filter(Boolean).join(" ")));
    });
    palette.hidden = false;
    highlightSuggestion(0);
  }

  function highlightSuggestion(index) {
    suggestions.active = index;
    palette.querySelectorAll("li").forEach((li, i) => li.setAttribute("aria-selected", String(i === index)));
    const active = palette.children[index];
    if (active) {
      promptBox.setAttribute("aria-activedescendant", active.id);
      active.scrollIntoView({ block: "nearest" });
    }
  }

  function closePalette() {
    suggestions.items = [];
    palette.hidden = true;
    palette.replaceChildren();
    promptBox.removeAttribute("aria-activedescendant");
  }

  function chooseSuggestion(index) {
    const item = suggestions.items[index];
    if (!item) return;
    const value = promptBox.value;
    promptBox.value = value.slice(0, suggestions.start) + item.insert + value.slice(suggestions.end);
    const caret = suggestions.start + item.insert.length;
    promptBox.setSelectionRange(caret, caret);
    if (item.hint) promptBox.placeholder = item.hint;
    closePalette();
    promptBox.focus();
  }

  promptBox.addEventListener("input", () => {
    promptBox.placeholder = "Ask the agent…";
    updatePalette();
  });
  // Closed a moment after the box loses focus, unless it has it again by then: a quick
  // blur and refocus (answering a permission, then typing "@") must not close the palette
  // that the new typing opened.
  promptBox.addEventListener("blur", () => setTimeout(() => {
    if (document.activeElement !== promptBox) closePalette();
  }, 150));
  palette.addEventListener("mousedown", (event) => event.preventDefault()); // keep the focus
  palette.addEventListener("click", (event) => {
    const li = event.target.closest("li[role=option]");
    if (li) chooseSuggestion([...palette.children].indexOf(li));
  });

  promptBox.addEventListener("keydown", (event) => {
    if (!palette.hidden && suggestions.items.length) {
      const count = suggestions.items.length;
      if (event.key === "ArrowDown" || event.key === "ArrowUp") {
        event.preventDefault();
        highlightSuggestion((suggestions.active + (event.key === "ArrowDown" ? 1 : count - 1)) % count);
        return;
      }
      if ((event.key === "Enter" && !event.shiftKey && !event.isComposing) || event.key === "Tab") {
        event.preventDefault();
        chooseSuggestion(suggestions.active);
        return;
      }
      if (event.key === "Escape") {
        event.preventDefault(); // closes the palette; a second Esc stops the agent
        event.stopPropagation();
        closePalette();
        return;
      }
    }
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });

  // Images: pasted, dropped or chosen, for agents that take them (promptCapabilities.image). --

  let imageIds = 0;
  function addImages(files) {
    const images = [...files].filter((f) => f && typeof f.type === "string" && f.type.startsWith("image/"));
    if (!images.length) return false;
    if (state.agent.prompt.image !== true) {
      showFrameError("This agent does not accept images.");
      return true;
    }
    for (const file of images) {
      if (!IMAGE_TYPES.includes(file.type)) {
        showFrameError(`${file.name || "That image"} can't be sent: use PNG, JPEG, GIF or WebP.`);
        continue;
      }
      if (file.size > MAX_IMAGE_BYTES) {
        showFrameError(`${file.name || "That image"} is too large (${formatBytes(file.size)}; at most 2 MB).`);
        continue;
      }
      if (state.images.length >= 10) {
        showFrameError("At most 10 attachments go with one message.");
        break;
      }
      const reader = new FileReader();
      reader.addEventListener("load", () => {
        const url = String(reader.result || "");
        const comma = url.indexOf(",");
        if (comma < 0) return;
        state.images.push({ id: ++imageIds, name: file.name || `image-${imageIds}`, mimeType: file.type,
          data: url.slice(comma + 1), bytes: file.size });
        renderImages();
      });
      reader.readAsDataURL(file);
    }
    return true;
  }

  function renderImages() {
    attachmentList.replaceChildren();
    for (const image of state.images) {
      const li = attachmentList.appendChild(el("li", "", `${image.name} (${formatBytes(image.bytes)})`));
      const remove = li.appendChild(el("button", "", "×"));
      remove.type = "button";
      remove.dataset.image = image.id;
      remove.setAttribute("aria-label", `Remove ${image.name}`);
    }
    attachmentList.hidden = !state.images.length;
  }

  attachmentList.addEventListener("click", (event) => {
    const remove = event.target.closest("button[data-image]");
    if (!remove) return;
    state.images = state.images.filter((i) => String(i.id) !== remove.dataset.image);
    renderImages();
    promptBox.focus();
  });
  promptBox.addEventListener("paste", (event) => {
    const files = event.clipboardData ? event.clipboardData.files : null;
    if (files && files.length && addImages(files)) event.preventDefault();
  });
  $("composer").addEventListener("dragover", (event) => {
    if (event.dataTransfer && [...event.dataTransfer.types].includes("Files")) event.preventDefault();
  });
  $("composer").addEventListener("drop", (event) => {
    if (event.dataTransfer && event.dataTransfer.files.length && addImages(event.dataTransfer.files)) {
      event.preventDefault();
    }
  });
  attachImage.addEventListener("click", () => imageInput.click());
  imageInput.addEventListener("change", () => {
    addImages(imageInput.files);
    imageInput.value = "";
  });

  function stop() {
    if (!state.running) return;
    if (send({ type: "cancel" })) announce("Stopping…");
    else showFrameError("Not connected: the agent could not be stopped yet.");
  }
  stopButton.addEventListener("click", stop);

  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || event.defaultPrevented || !state.running) return;
    if (event.target.closest && event.target.closest(".sidebar, details[open] > summary")) return;
    event.preventDefault();
    stop();
  });

  transcript.addEventListener("click", (event) => {
    const target = event.target;
    const option = target.closest(".permission .options button[data-option]");
    if (option && !option.disabled) {
      const block = option.closest(".permission");
      if (send({ type: "permission", request: block.dataset.request, option: option.dataset.option })) {
        block.querySelectorAll(".options button").forEach((b) => (b.disabled = true));
        option.classList.add("chosen");
        // The buttons are disabled now: keep the keyboard where the answer is shown.
        const answer = meta.get(block).answer;
        answer.textContent = "Sending your answer…";
        answer.focus();
      } else {
        showFrameError("Not connected. Answer again in a moment.");
      }
      return;
    }
    const toggle = target.closest(".toggle-more:not(.diff-toggle)");
    if (toggle) return toggleCollapsible(toggle);
    const copy = target.closest(".code-block .copy");
    if (copy) return copyText(copy, copy.closest(".code-block").querySelector("code").textContent);
    const more = target.closest(".show-all");
    if (more && !more.disabled) return showAll(more);
    const summary = target.closest(".thought > summary");
    if (summary) meta.get(summary.parentElement).userOpened = true;
  });

  setRunning(state.running);
  setSandbox({ status: state.sandboxStatus, detail: state.sandboxDetail });
  loadSession(); // the first load: it uses what the page preloaded, and the socket joins it
  connect();
})();
