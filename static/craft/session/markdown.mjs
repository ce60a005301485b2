// Agent text as Markdown: parsed by marked with raw HTML turned into text, then sanitised by
// DOMPurify before it touches the page; code blocks highlighted by highlight.js, with a copy
// button. The three libraries (static/vendor/, classic scripts that set window.marked,
// window.DOMPurify and window.hljs) are loaded once the first load is on screen, so that they
// never compete with it: until marked and DOMPurify are both there, text is shown plain.

import { el } from "./dom.mjs";

const HIGHLIGHT_MAX_CHARS = 20000;

let markdown = null; // {parse(text) -> sanitised HTML}, built on first use
let librariesRequested = false;

/** Return the Markdown parser, or null while its libraries are not loaded. */
export function getMarkdown() {
  if (markdown) return markdown;
  if (!window.marked || !window.DOMPurify) return null; // not loaded (yet): plain text
  const escape = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;");
  const parser = new window.marked.Marked({
    gfm: true,
    // A single line break is a line break, as in GitHub's comments: agents write lists of
    // lines ("1\n2\n3") that would otherwise run together into one.
    breaks: true,
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

/** Draw `text` as Markdown into `body` (as plain text while the libraries are missing). */
export function renderMarkdown(body, text) {
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

/** Highlight a code block, if highlight.js is there and knows its language. */
export function highlight(code) {
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

/** Load the libraries (their URLs) once; `arrived` runs as each one has loaded. */
export function loadLibraries(sources, arrived) {
  if (librariesRequested) return;
  librariesRequested = true;
  for (const src of sources) {
    const script = document.createElement("script");
    script.src = src;
    script.async = true;
    script.addEventListener("load", arrived);
    document.head.appendChild(script);
  }
}

/** Copy a code block's text for its Copy button; `announce` tells a screen reader. */
export async function copyText(button, text, announce) {
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
