// The body of a tool call, as its card and a permission request show it: the command, the
// output, diffs, and the files it touches.

import { collapsibleId, fillCollapsible, PREVIEW_LINES, writePre } from "./collapsible.mjs";
import { el } from "./dom.mjs";
import { isObject, str } from "./values.mjs";
import { formatBytes } from "./words.mjs";

/** Draw what is known of a tool call (`call`: ACP's kind, title, content, locations, rawInput;
 *  `terminal`: its live command output, as fold.mjs keeps it from the call's `_meta`). */
export function renderToolBody(body, call, paths, terminal = null, { terminals = true } = {}) {
  body.replaceChildren();
  const command = commandOf(call, paths);
  if (command) body.appendChild(el("pre", "command", `$ ${command}`));
  if (terminal) body.appendChild(terminalView(terminal, paths));
  const items = Array.isArray(call.content) ? call.content : [];
  let shown = terminal ? 1 : 0;
  for (const item of items) {
    // Drawn above; and a permission card leaves it to its tool card (`terminals` false).
    if ((terminal || !terminals) && isObject(item) && item.type === "terminal") continue;
    const node = contentItem(item, paths);
    if (node) {
      body.appendChild(node);
      shown++;
    }
  }
  const locations = (Array.isArray(call.locations) ? call.locations : [])
    .filter((l) => isObject(l) && typeof l.path === "string")
    .map((l) => paths.relPath(l.path) + (Number.isInteger(l.line) ? `:${l.line}` : ""));
  // Locations the title already names add nothing (a one-file edit or read).
  const title = typeof call.title === "string" ? paths.scrub(call.title) : "";
  if (locations.length && !shown && !locations.every((p) => title.includes(p.replace(/:\d+$/, "")))) {
    const list = body.appendChild(el("ul", "locations"));
    for (const path of locations) list.appendChild(el("li", "", path));
  }
}

function commandOf(call, paths) {
  const raw = call.rawInput;
  if (!isObject(raw) || (call.kind && call.kind !== "execute")) return "";
  if (typeof raw.command === "string") return paths.scrub(raw.command);
  if (Array.isArray(raw.command)) return paths.scrub(raw.command.map(str).join(" "));
  return "";
}

function contentItem(item, paths) {
  if (!isObject(item)) return null;
  if (item.type === "diff") return diffView(item, paths);
  if (item.type === "content" && isObject(item.content)) {
    if (item.content.type === "text") {
      const box = el("div", "tool-output");
      fillCollapsible(box, paths.scrub(str(item.content.text)), writePre("tool-text"));
      return box;
    }
    return el("p", "muted", "The agent attached something this page can't show.");
  }
  if (item.type === "terminal") return el("p", "muted", "Terminal output is not shown here.");
  return null;
}

// A command's live output, bounded like other output (a preview, then "Show all"), and how
// it ended.
function terminalView(terminal, paths) {
  const box = el("div", "terminal");
  const output = box.appendChild(el("div", "tool-output"));
  if (terminal.output) fillCollapsible(output, paths.scrub(terminal.output), writePre("terminal-output"));
  else output.appendChild(el("p", "muted", terminal.exit ? "No output." : "Waiting for output…"));
  if (terminal.limit || terminal.cut) {
    const kept = terminal.limit ? ` past ${formatBytes(terminal.limit)}` : "";
    box.appendChild(el("p", "muted terminal-limited", `Output${kept} was not kept.`));
  }
  if (terminal.exit) {
    const { code, signal } = terminal.exit;
    const text = signal ? `Stopped by signal ${signal}` : code === null ? "Exited" : `Exited with code ${code}`;
    const end = box.appendChild(el("p", "terminal-exit", text));
    end.dataset.ok = String(code === 0 && !signal);
  }
  return box;
}

function splitLines(text) {
  if (typeof text !== "string" || text === "") return [];
  const lines = text.split("\n");
  if (lines[lines.length - 1] === "") lines.pop();
  return lines;
}

/** Return whether line `i` of `lines` (split from `text`) is a last line with no newline. */
function lastOpen(text, lines, i) {
  return i === lines.length - 1 && typeof text === "string" && !text.endsWith("\n");
}

function diffView(item, paths) {
  const box = el("div", "diff");
  box.appendChild(el("div", "diff-path", paths.relPath(item.path) || "file"));
  const before = splitLines(item.oldText);
  const after = splitLines(item.newText);
  // A last line without a newline differs from the same line with one, as git counts it (so
  // the card and the Changes panel count an edit alike: "b" then "b\nc" is +2 −1).
  const same = (i, j) => before[i] === after[j] && lastOpen(item.oldText, before, i) === lastOpen(item.newText, after, j);
  // Common lines at both ends are context; what lies between changed. Cheap (linear) and
  // exact for the one-hunk edits agents usually propose.
  let start = 0;
  while (start < before.length && start < after.length && same(start, start)) start++;
  let endBefore = before.length;
  let endAfter = after.length;
  while (endBefore > start && endAfter > start && same(endBefore - 1, endAfter - 1)) {
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
    pre.tabIndex = 0; // it may scroll: keyboard users scroll it too
    for (const [kind, line] of rows.slice(0, count)) pre.appendChild(el("span", kind, `${line}\n`));
  };
  const body = el("div", "collapsible-body");
  box.appendChild(body);
  renderRows(body, limit);
  if (rows.length > limit) {
    const toggle = el("button", "toggle-more", `Show all (${rows.length} lines)`);
    toggle.type = "button";
    toggle.setAttribute("aria-expanded", "false");
    body.id = collapsibleId();
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
