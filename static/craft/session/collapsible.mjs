// Text that may be long starts as a preview with "Show all" (aria-expanded tells which is shown).

import { el } from "./dom.mjs";
import { formatNumber, formatSize } from "./words.mjs";

export const PREVIEW_LINES = 16; // longer text starts collapsed
const PREVIEW_CHARS = 20000;

let ids = 0;
const collapsedTexts = new WeakMap(); // toggle button -> what it shows

/** Return a new element id for a collapsible body (the toggle's aria-controls). */
export function collapsibleId() {
  return `collapsible-${++ids}`;
}

export function lineCount(text) {
  let count = text.endsWith("\n") ? 0 : 1; // a final newline ends a line, not starts one
  for (let i = text.indexOf("\n"); i !== -1; i = text.indexOf("\n", i + 1)) count++;
  return count;
}

// The first PREVIEW_LINES lines (at most PREVIEW_CHARS characters), or null if that is all.
function preview(text) {
  let end = 0;
  for (let line = 0; line < PREVIEW_LINES; line++) {
    end = text.indexOf("\n", end) + 1;
    if (end === 0) break;
  }
  const cut = end === 0 ? text.length : end - 1;
  const short = Math.min(cut, PREVIEW_CHARS);
  return short < text.length ? text.slice(0, short) : null;
}

function showAllLabel(text) {
  return `Show all (${formatNumber(lineCount(text))} lines, ${formatSize(text.length)})`;
}

/** Draw `text` into `box` with `renderText(body, text)`: all of it, or a preview and a toggle. */
export function fillCollapsible(box, text, renderText) {
  box.replaceChildren();
  const short = preview(text);
  const body = el("div", "collapsible-body");
  body.id = collapsibleId();
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

/** Show all of a collapsible's text, or its preview again. */
export function toggleCollapsible(toggle) {
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

// Text renderers for fillCollapsible: as a paragraph of plain text, or preformatted.
export const writePlain = (body, text) => body.appendChild(el("div", "plain", text));
export const writePre = (className) => (body, text) => body.appendChild(el("pre", className, text));
