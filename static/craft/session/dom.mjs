// The two DOM helpers every part of the page uses.

export const $ = (id) => document.getElementById(id);

/** Return a new element; `text` goes in as text (textContent), never as HTML. */
export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = text;
  return node;
}
