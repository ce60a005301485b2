// The composer's palette: the agent's commands after a leading "/", files the session has
// seen after "@".

import { $, el } from "./dom.mjs";
import { isObject, str } from "./values.mjs";

const MAX_SUGGESTIONS = 12;

/** Start the palette of the prompt box, offering what `fold` knows of commands and files. */
export function createPalette({ fold }) {
  const promptBox = $("prompt");
  const palette = $("palette");
  const suggestions = { items: [], active: -1, start: 0, end: 0, kind: "" };

  function currentToken() {
    const caret = promptBox.selectionStart ?? promptBox.value.length;
    const before = promptBox.value.slice(0, caret);
    const command = /^\/(\S*)$/.exec(before);
    if (command && fold.agent.commands.length) return { kind: "command", query: command[1], start: 0, end: caret };
    const mention = /(?:^|\s)@([^\s@]*)$/.exec(before);
    if (mention && fold.knownPaths.size) return { kind: "file", query: mention[1], start: caret - mention[1].length - 1, end: caret };
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
      const query = token.query.toLowerCase();
      items = [...fold.knownPaths].filter((p) => p.toLowerCase().includes(query)).sort().slice(0, MAX_SUGGESTIONS)
        .map((p) => ({ label: `@${p}`, about: "", insert: `@${p} ` }));
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
