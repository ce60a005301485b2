// The Terminal tab of the workspace panel: shells in the session's workspace, run where and as
// its agent runs (docs/workbench.md, "Terminal"; the socket is docs/websocket-api.md's).
//
// Each terminal is an xterm.js screen on a socket of its own. Its id (the server's) is kept in
// sessionStorage per session, so that a reload or a dropped socket comes back to the same
// shell: the server sends its scrollback (the screen is reset first), then live output. A
// socket that drops is reconnected with backoff; one the server closes for good (the terminal
// ended, is gone, or may not be opened) is not. Keystrokes and pastes go to the shell only;
// "Attach to message" copies the selected text into the composer, nothing else does.
//
// xterm.js and its fit addon are vendored (static/vendor/) and loaded the first time the tab is
// shown. Its DOM renderer writes its rules into <style> elements, which the page's
// Content-Security-Policy (style-src 'self') refuses: `keepStylesInSheets` gives it inert
// stand-ins whose text goes to constructed style sheets (adoptedStyleSheets), which the
// policy does not govern, as it does not govern a script's setting of an element's style.

import { $, el } from "./dom.mjs";

// Closes after which reconnecting cannot help, and what the page says of them.
const CLOSED_FOR_GOOD = {
  1000: "",
  4401: "You were signed out.",
  4403: "This session is not yours.",
  4404: "This terminal has ended.",
  4429: "",
  4503: "",
};

/** Return where the terminal socket of `session` is: a new shell of `cols` × `rows`, or back
 *  to terminal `id`. */
export function terminalUrl(location, session, id, cols, rows) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const query = id ? { terminal: id } : { cols: String(cols), rows: String(rows) };
  return `${scheme}://${location.host}/ws/sessions/${session}/terminals/?${new URLSearchParams(query)}`;
}

/** The ids of a session's terminals, kept in `storage` (sessionStorage) across reloads. */
export function terminalStore(storage, session) {
  const key = `craft.terminals.${session}`;
  const read = () => {
    try {
      const ids = JSON.parse(storage.getItem(key) || "[]");
      return Array.isArray(ids) ? ids.filter((id) => typeof id === "string") : [];
    } catch {
      return [];
    }
  };
  const write = (ids) => {
    try {
      if (ids.length) storage.setItem(key, JSON.stringify(ids));
      else storage.removeItem(key);
    } catch {
      // storage refused (full, private mode): the terminal lives on, unremembered
    }
  };
  return {
    ids: read,
    add(id) {
      const ids = read();
      if (!ids.includes(id)) write([...ids, id]);
    },
    remove(id) {
      write(read().filter((known) => known !== id));
    },
  };
}

/** How long to wait before reconnect attempt `attempt` (from 0). */
function backoff(attempt) {
  const ceiling = Math.min(10000, 500 * 2 ** attempt);
  return Math.round(ceiling / 2 + Math.random() * (ceiling / 2));
}

/** Send xterm's <style> rules to constructed style sheets (see the module's comment). */
export function keepStylesInSheets(doc = document) {
  if (doc.craftStylesInSheets) return;
  doc.craftStylesInSheets = true;
  const create = doc.createElement;
  doc.createElement = function createElement(tag, options) {
    if (String(tag).toLowerCase() !== "style") return create.call(this, tag, options);
    // Chromium checks every <style> put in the page against the policy, whatever its type
    // and even empty: an inert <template> stands in for it, and its text goes to `sheet`.
    const node = create.call(this, "template");
    node.dataset.styleOf = "xterm";
    const sheet = new CSSStyleSheet();
    let text = "";
    const take = {
      get: () => text,
      set(value) {
        text = String(value ?? "");
        sheet.replaceSync(text);
        if (!doc.adoptedStyleSheets.includes(sheet)) doc.adoptedStyleSheets = [...doc.adoptedStyleSheets, sheet];
      },
    };
    Object.defineProperties(node, {
      textContent: take,
      innerText: take,
      sheet: { get: () => sheet },
    });
    const remove = node.remove.bind(node);
    node.remove = () => {
      doc.adoptedStyleSheets = doc.adoptedStyleSheets.filter((adopted) => adopted !== sheet);
      remove();
    };
    return node;
  };
  // Cells in a colour of their own (24-bit) get a style attribute, which the policy refuses
  // too; set through the DOM, it is allowed. Only spans the page made and has not shown yet
  // (xterm's rows as it builds them); anything parsed from text is never set so.
  const setAttribute = Element.prototype.setAttribute;
  Element.prototype.setAttribute = function setStyleOrAttribute(name, value) {
    if (name === "style" && this instanceof HTMLSpanElement && this.ownerDocument === doc && !this.isConnected) {
      this.style.cssText = String(value);
      return;
    }
    setAttribute.call(this, name, value);
  };
}

function loadScript(src) {
  return new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = src;
    script.onload = resolve;
    script.onerror = () => reject(new Error(`could not load ${src}`));
    document.head.append(script);
  });
}

function loadStylesheet(href) {
  const link = document.createElement("link");
  link.rel = "stylesheet";
  link.href = href;
  document.head.append(link);
}

/** Start the Terminal tab of session `session`. `libraries` are xterm.js and its fit addon,
 *  `stylesheet` xterm's CSS; `attach(text)` puts text in the composer; `announce(text)` says
 *  it to screen readers. */
export function createTerminals({ session, libraries, stylesheet, attach, announce }) {
  const list = $("terminal-list");
  const screens = $("terminal-screens");
  const state = $("terminal-state");
  const attachButton = $("terminal-attach");
  const store = terminalStore(sessionStorage, session);
  const terminals = []; // {label, id, term, fit, host, tab, socket, attempt, timer, ended}
  let active = null;
  let loaded = null; // the libraries' promise
  let shown = false;

  function load() {
    if (!loaded) {
      keepStylesInSheets();
      loadStylesheet(stylesheet);
      loaded = libraries.reduce((done, src) => done.then(() => loadScript(src)), Promise.resolve());
    }
    return loaded;
  }

  function say(terminal, text) {
    terminal.state = text;
    if (terminal === active) state.textContent = text;
  }

  function select(terminal) {
    active = terminal;
    for (const other of terminals) {
      const chosen = other === terminal;
      other.host.hidden = !chosen;
      other.tab.setAttribute("aria-selected", String(chosen));
      other.tab.tabIndex = chosen ? 0 : -1;
    }
    state.textContent = terminal.state || "";
    attachButton.disabled = !terminal.term.hasSelection();
    fitActive();
    terminal.term.focus();
  }

  function fitActive() {
    if (!active || !shown || active.host.hidden) return;
    try {
      active.fit.fit();
    } catch {
      // not laid out yet: the next resize fits it
    }
  }

  function send(terminal, frame) {
    if (terminal.socket && terminal.socket.readyState === WebSocket.OPEN) terminal.socket.send(JSON.stringify(frame));
  }

  function connect(terminal) {
    clearTimeout(terminal.timer);
    const { cols, rows } = terminal.term;
    const socket = new WebSocket(terminalUrl(location, session, terminal.id, cols, rows));
    terminal.socket = socket;
    let endedHere = false;
    socket.onmessage = (message) => {
      if (socket !== terminal.socket) return;
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch {
        return;
      }
      if (frame.type === "ready") {
        const again = terminal.id === frame.terminal;
        terminal.id = frame.terminal;
        terminal.attempt = 0;
        store.add(terminal.id);
        if (again) terminal.term.reset(); // its scrollback comes again, whole
        send(terminal, { type: "resize", cols: terminal.term.cols, rows: terminal.term.rows });
        say(terminal, again ? "Connected again." : "");
        if (again) announce(`${terminal.label}: connected again`);
      } else if (frame.type === "output" && typeof frame.data === "string") {
        terminal.term.write(frame.data);
      } else if (frame.type === "exit") {
        endedHere = true;
        const code = frame.code === null || frame.code === undefined ? "unknown" : frame.code;
        terminal.term.write(`\r\n[The shell exited with code ${code}.]\r\n`);
        end(terminal, `The shell exited (code ${code}).`);
      } else if (frame.type === "error" && typeof frame.message === "string") {
        say(terminal, frame.message);
      }
    };
    socket.onclose = (event) => {
      if (socket !== terminal.socket || terminal.ended) return;
      terminal.socket = null;
      if (endedHere) return;
      if (event.code in CLOSED_FOR_GOOD) {
        end(terminal, CLOSED_FOR_GOOD[event.code] || terminal.state || "This terminal is closed.");
        return;
      }
      const delay = backoff(terminal.attempt++);
      say(terminal, "Connection lost. Reconnecting…");
      terminal.timer = setTimeout(() => connect(terminal), delay);
    };
  }

  function end(terminal, text) {
    terminal.ended = true;
    if (terminal.id) store.remove(terminal.id);
    terminal.tab.textContent = `${terminal.label} (ended)`;
    say(terminal, text);
    announce(`${terminal.label}: ${text}`);
  }

  function add(id) {
    const label = `Terminal ${terminals.length + 1}`;
    const tab = el("button", "terminal-tab", label);
    tab.type = "button";
    tab.setAttribute("role", "tab");
    const host = el("div", "terminal-screen");
    host.setAttribute("role", "tabpanel");
    host.setAttribute("aria-label", label);
    host.id = `terminal-screen-${terminals.length + 1}`;
    tab.setAttribute("aria-controls", host.id);
    list.append(tab);
    screens.append(host);
    const term = new globalThis.Terminal({
      cursorBlink: true,
      fontSize: 13,
      scrollback: 5000,
      fontFamily: "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace",
    });
    const fit = new globalThis.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(host);
    const terminal = { label, id, term, fit, host, tab, socket: null, attempt: 0, timer: null, ended: false, state: "" };
    terminals.push(terminal);
    term.onData((data) => send(terminal, { type: "input", data }));
    term.onResize(({ cols, rows }) => send(terminal, { type: "resize", cols, rows }));
    term.onSelectionChange(() => {
      if (terminal === active) attachButton.disabled = !term.hasSelection();
    });
    tab.addEventListener("click", () => select(terminal));
    select(terminal);
    $("terminal-empty").hidden = true;
    connect(terminal);
    return terminal;
  }

  $("terminal-new").addEventListener("click", async () => {
    try {
      await load();
    } catch (error) {
      state.textContent = `The terminal could not load: ${error.message}`;
      return;
    }
    add(null);
  });
  attachButton.addEventListener("click", () => {
    const text = active?.term.getSelection() || "";
    if (!text.trim()) return;
    attach(`Output of my terminal:\n\`\`\`\n${text.replace(/\s+$/, "")}\n\`\`\``);
  });
  list.addEventListener("keydown", (event) => {
    if (event.key !== "ArrowLeft" && event.key !== "ArrowRight") return;
    const at = terminals.indexOf(active);
    if (at < 0) return;
    const next = terminals[(at + (event.key === "ArrowRight" ? 1 : terminals.length - 1)) % terminals.length];
    select(next);
    next.tab.focus();
  });
  new ResizeObserver(fitActive).observe(screens);

  return {
    /** The tab is shown: load xterm.js, come back to the terminals this tab had. */
    async shown() {
      shown = true;
      const ids = store.ids().filter((id) => !terminals.some((t) => t.id === id));
      if (ids.length) {
        try {
          await load();
        } catch (error) {
          state.textContent = `The terminal could not load: ${error.message}`;
          return;
        }
        for (const id of ids) add(id);
      }
      fitActive();
    },
    hidden() {
      shown = false;
    },
  };
}
