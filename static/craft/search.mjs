// Search (docs/workbench.md, "Search"): Ctrl/Cmd+K, or the sidebar's Search button, opens a
// dialog that finds the person's sessions by title and text (GET /api/search/) and, on a
// session's page, the matches in that session first (GET /api/sessions/<id>/search/). A match
// in this session is jumped to (`craft:jump`, session/main.mjs); another session opens at its
// match (`#event-<seq>`). Arrow keys move through the results, Enter opens one, Esc closes.

const dialog = document.getElementById("search-dialog");
const KINDS = { prompt: "You asked", reply: "The agent said", tool: "Tool" };
const WAIT_MS = 150; // after the last key, before asking

if (dialog) {
  const input = document.getElementById("search-input");
  const list = document.getElementById("search-results");
  const said = document.getElementById("search-status");
  const sessionId = document.getElementById("session")?.dataset.session || "";
  let timer = null;
  let asking = null; // the AbortController of the requests under way
  let active = -1;

  const open = () => {
    if (!dialog.open) dialog.showModal();
    input.select();
  };
  document.getElementById("search-open")?.addEventListener("click", open);
  const hint = document.querySelector("#search-open kbd");
  if (hint && /Mac|iPhone|iPad/.test(navigator.platform)) hint.textContent = "⌘ K";
  document.addEventListener("keydown", (event) => {
    if ((event.ctrlKey || event.metaKey) && !event.altKey && event.key.toLowerCase() === "k") {
      event.preventDefault();
      open();
    }
  });
  dialog.addEventListener("click", (event) => {
    if (event.target === dialog) dialog.close(); // a click on the backdrop
  });

  input.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => run(input.value), WAIT_MS);
  });
  input.addEventListener("keydown", (event) => {
    const items = options();
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      if (!items.length) return;
      select((active + (event.key === "ArrowDown" ? 1 : -1) + items.length) % items.length);
    } else if (event.key === "Enter") {
      event.preventDefault();
      const item = items[Math.max(active, 0)];
      if (item) activate(item);
    } else if (event.key === "Escape") {
      event.preventDefault(); // a search field would only be emptied: the dialog closes
      dialog.close();
    }
  });
  list.addEventListener("click", (event) => {
    const item = event.target.closest("[role=option]");
    if (item) activate(item);
  });

  function options() {
    return [...list.querySelectorAll("[role=option]")];
  }

  function select(index) {
    const items = options();
    items.forEach((item, n) => item.setAttribute("aria-selected", String(n === index)));
    active = index;
    if (items[index]) {
      input.setAttribute("aria-activedescendant", items[index].id);
      items[index].scrollIntoView({ block: "nearest" });
    }
  }

  function activate(item) {
    if (item.dataset.seq) {
      dialog.close();
      document.dispatchEvent(new CustomEvent("craft:jump", { detail: { seq: Number(item.dataset.seq) } }));
    } else {
      location.href = item.dataset.href;
    }
  }

  async function run(query) {
    asking?.abort();
    const words = query.toLowerCase().match(/[\p{L}\p{N}]+/gu) || [];
    list.replaceChildren();
    input.removeAttribute("aria-activedescendant");
    active = -1;
    if (!words.length) {
      said.textContent = "";
      return;
    }
    asking = new AbortController();
    said.textContent = "Searching…";
    const q = new URLSearchParams({ q: query.slice(0, 200) });
    const get = (url) => fetch(`${url}?${q}`, { signal: asking.signal, credentials: "same-origin" })
      .then((answer) => (answer.ok ? answer.json() : Promise.reject(new Error(`the server answered ${answer.status}`))));
    try {
      const [here, all] = await Promise.all([
        sessionId ? get(`/api/sessions/${sessionId}/search/`) : Promise.resolve({ matches: [] }),
        get("/api/search/"),
      ]);
      show(here.matches, all.results.filter((r) => r.session !== sessionId), words);
    } catch (error) {
      if (error.name !== "AbortError") said.textContent = `Search failed: ${error.message}. Try again.`;
    }
  }

  function show(matches, sessions, words) {
    let n = 0;
    if (matches.length) {
      list.appendChild(heading("In this session"));
      for (const match of matches) {
        const item = option(`search-${n++}`, KINDS[match.kind] || "", match.snippet, words);
        item.dataset.seq = String(match.seq);
        list.appendChild(item);
      }
    }
    if (sessions.length) {
      list.appendChild(heading("Sessions"));
      for (const result of sessions) {
        const first = result.matches[0];
        const item = option(`search-${n++}`, result.title, first ? first.snippet : "", words);
        item.dataset.href = `/sessions/${result.session}/${first ? `#event-${first.seq}` : ""}`;
        list.appendChild(item);
      }
    }
    said.textContent = n ? `${n} result${n === 1 ? "" : "s"}. Arrow keys to choose, Enter to open.` : "No matches.";
    if (n) select(0);
  }

  function heading(text) {
    const li = document.createElement("li");
    li.className = "search-heading";
    li.setAttribute("role", "presentation");
    li.textContent = text;
    return li;
  }

  function option(id, title, snippet, words) {
    const li = document.createElement("li");
    li.id = id;
    li.setAttribute("role", "option");
    li.setAttribute("aria-selected", "false");
    const head = li.appendChild(document.createElement("span"));
    head.className = "search-title";
    marked(head, title, words);
    if (snippet) {
      const body = li.appendChild(document.createElement("span"));
      body.className = "search-snippet";
      marked(body, snippet, words);
    }
    return li;
  }

  // The text, each word that starts like one of `words` in a <mark> (nodes, never HTML).
  function marked(into, text, words) {
    const pattern = new RegExp(`(?<![\\p{L}\\p{N}])(${words.map(escape).join("|")})`, "giu");
    let at = 0;
    for (const found of text.matchAll(pattern)) {
      into.append(text.slice(at, found.index));
      const mark = into.appendChild(document.createElement("mark"));
      mark.textContent = found[0];
      at = found.index + found[0].length;
    }
    into.append(text.slice(at));
  }

  function escape(word) {
    return word.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  }
}
