// The composer's palette: the agent's commands after a leading "/", after "@" the files of the
// workspace (folder by folder, through the workspace panel's listings) and those the session
// has mentioned.

import { $, el } from "./dom.mjs";
import { isObject, str } from "./values.mjs";

const MAX_SUGGESTIONS = 12;

/** Start the palette of the prompt box, offering what `fold` knows of commands and files and
 *  the files `workspace` lists. */
export function createPalette({ fold, workspace }) {
  const promptBox = $("prompt");
  const palette = $("palette");
  const suggestions = { items: [], active: -1, start: 0, end: 0, kind: "" };

  function currentToken() {
    const caret = promptBox.selectionStart ?? promptBox.value.length;
    const before = promptBox.value.slice(0, caret);
    const command = /^\/(\S*)$/.exec(before);
    if (command && fold.agent.commands.length) return { kind: "command", query: command[1], start: 0, end: caret };
    const mention = /(?:^|\s)@([^\s@]*)$/.exec(before);
    if (mention) return { kind: "file", query: mention[1], start: caret - mention[1].length - 1, end: caret };
    return null;
  }

  function update() {
    const token = currentToken();
    let items = [];
    if (token && token.kind === "command") {
      const query = token.query.toLowerCase();
      items = fold.agent.commands
        .filter((c) => c.name.toLowerCase().startsWith(query))
        .slice(0, MAX_SUGGESTIONS)
        .map((c) => ({ label: `/${c.name}`, about: str(c.description), insert: `/${c.name} `,
          hint: isObject(c.input) ? str(c.input.hint) : "" }));
    } else if (token && token.kind === "file") {
      items = fileSuggestions(token);
    }
    if (!items.length) return close();
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
    select(0);
  }

  // The entries of the folder typed so far ("@src/ap": src's, starting with "ap"), then the
  // paths the session mentioned that contain the query. A folder not listed yet is asked for,
  // and the palette updated when it comes (if the person is still typing there).
  function fileSuggestions(token) {
    const slash = token.query.lastIndexOf("/");
    const folder = token.query.slice(0, Math.max(slash, 0));
    const start = token.query.slice(slash + 1).toLowerCase();
    const { entries, later } = workspace.entriesOf(folder);
    if (later) later.then(() => {
      const now = currentToken();
      if (now && now.kind === "file" && now.query === token.query) update();
    }).catch(() => {});
    const listed = entries
      .filter((e) => (e.type === "file" || e.type === "folder") && e.name.toLowerCase().startsWith(start))
      .map((e) => {
        const path = folder ? `${folder}/${e.name}` : e.name;
        return e.type === "folder"
          ? { label: `@${path}/`, about: "folder", insert: `@${path}/`, reopen: true }
          : { label: `@${path}`, about: "", insert: `@${path} ` };
      });
    const query = token.query.toLowerCase();
    const seen = new Set(listed.map((item) => item.label));
    const mentioned = [...fold.knownPaths].filter((p) => p.toLowerCase().includes(query) && !seen.has(`@${p}`)).sort()
      .map((p) => ({ label: `@${p}`, about: "mentioned", insert: `@${p} ` }));
    return [...listed, ...mentioned].slice(0, MAX_SUGGESTIONS);
  }

  function select(index) {
    suggestions.active = index;
    palette.querySelectorAll("li").forEach((li, i) => li.setAttribute("aria-selected", String(i === index)));
    const active = palette.children[index];
    if (active) {
      promptBox.setAttribute("aria-activedescendant", active.id);
      active.scrollIntoView({ block: "nearest" });
    }
  }

  function close() {
    suggestions.items = [];
    palette.hidden = true;
    palette.replaceChildren();
    promptBox.removeAttribute("aria-activedescendant");
  }

  function choose(index) {
    const item = suggestions.items[index];
    if (!item) return;
    const value = promptBox.value;
    promptBox.value = value.slice(0, suggestions.start) + item.insert + value.slice(suggestions.end);
    const caret = suggestions.start + item.insert.length;
    promptBox.setSelectionRange(caret, caret);
    if (item.hint) promptBox.placeholder = item.hint;
    close();
    promptBox.focus();
    if (item.reopen) update(); // a folder: its entries next
  }

  // Whether the box holds exactly the command `item` would complete to (nothing to complete).
  function typedInFull(item) {
    return Boolean(item) && suggestions.kind === "command"
      && promptBox.value.slice(suggestions.start, suggestions.end) === item.label;
  }

  /** Handle a key pressed in the prompt box while the palette is open; return whether it did. */
  function handleKey(event) {
    if (palette.hidden || !suggestions.items.length) return false;
    const count = suggestions.items.length;
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      select((suggestions.active + (event.key === "ArrowDown" ? 1 : count - 1)) % count);
      return true;
    }
    if ((event.key === "Enter" && !event.shiftKey && !event.isComposing) || event.key === "Tab") {
      if (event.key === "Enter" && typedInFull(suggestions.items[suggestions.active])) {
        close();
        return false; // "/recall" typed whole: Enter sends it, as it would without the palette
      }
      event.preventDefault();
      choose(suggestions.active);
      return true;
    }
    if (event.key === "Escape") {
      event.preventDefault(); // closes the palette; a second Esc stops the agent
      event.stopPropagation();
      close();
      return true;
    }
    return false;
  }

  promptBox.addEventListener("input", () => {
    promptBox.placeholder = "Ask the agent…";
    update();
  });
  // Closed a moment after the box loses focus, unless it has it again by then: a quick
  // blur and refocus (answering a permission, then typing "@") must not close the palette
  // that the new typing opened.
  promptBox.addEventListener("blur", () => setTimeout(() => {
    if (document.activeElement !== promptBox) close();
  }, 150));
  palette.addEventListener("mousedown", (event) => event.preventDefault()); // keep the focus
  palette.addEventListener("click", (event) => {
    const li = event.target.closest("li[role=option]");
    if (li) choose([...palette.children].indexOf(li));
  });

  return { handleKey };
}
