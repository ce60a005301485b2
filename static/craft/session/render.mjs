// The transcript: the fold's blocks (fold.mjs) drawn as elements, and the clicks in them.
//
// Every event leaves exactly one hidden `<i data-seq>` mark in the element of the block it
// folded into, even one that cannot be shown: a failure to draw becomes a quiet note, never a
// wedged page. New blocks are drawn at once; bodies that updates keep changing (message text,
// tool bodies, plans) once per frame for live events and once per page of a load. Messages
// from a load are shown as plain text and get their Markdown when they come near the screen.

import { blockDrawing } from "./blocks.mjs";
import { fillCollapsible, lineCount, toggleCollapsible, writePlain } from "./collapsible.mjs";
import { $, el } from "./dom.mjs";
import { copyText, getMarkdown, highlight, loadLibraries, renderMarkdown } from "./markdown.mjs";

const MARKDOWN_MAX_CHARS = 200000; // longer messages are shown as plain text
const EAGER_BLOCKS = 12; // after the first load, the last messages get Markdown at once

/**
 * Return the view of `fold` in `transcript`. `hooks` are what the transcript asks of the rest
 * of the page: beforeFlush() (draw what goes with it), answer(request, option) (send a
 * permission answer; false when not connected), answerElicitation(request, action, content)
 * (the same for an elicitation), announce(text), showError(text),
 * fetchEvent(seq) (the whole of an event), openChanges(seq) (a change's chip was clicked),
 * openFile(path) (a file an update left in conflict was clicked), edit(text, seq) (a message's
 * Edit) and goBack(how, seq, button) ("rewind" or "fork" from the turn of user message `seq`).
 */
export function createView({ transcript, fold, paths, staff, keysUrl, scroll, libraries, hooks }) {
  const drawing = blockDrawing({ paths, staff, keysUrl });
  const drawn = new WeakMap(); // block -> the record of its drawing (blocks.mjs)
  const blockOf = new WeakMap(); // element -> block
  let target = transcript; // a DocumentFragment while a loaded page is drawn
  let count = 0; // how many of fold.blocks are drawn
  const dirty = new Set(); // blocks whose body changed since the last flush
  let flushScheduled = false;
  let loaded = false;
  const waitingForMarkdown = new Set();
  const markPrototype = document.createElement("i");

  // Messages from history get Markdown when they come near the screen.
  const lazy = "IntersectionObserver" in window
    ? new IntersectionObserver((entries) => {
      for (const entry of entries) {
        if (!entry.isIntersecting) continue;
        lazy.unobserve(entry.target);
        renderMessage(blockOf.get(entry.target), true);
      }
    }, { rootMargin: "1200px 0px" })
    : null;

  // Draw a step of the fold: new blocks, changed heads, its mark. Never throws.
  function draw(step) {
    try {
      drawNewBlocks();
      for (const block of step.updated) drawing.update(block, drawn.get(block));
      for (const block of step.stale) dirty.add(block);
      mark(step);
    } catch (error) {
      console.error("could not render event", step.seq, error);
      try {
        fold.fail(step);
        drawNewBlocks();
        mark(step);
      } catch {
        // nothing more to do: the seq still counts as applied
      }
    }
  }

  function drawNewBlocks() {
    while (count < fold.blocks.length) {
      const block = fold.blocks[count++];
      const record = drawing.build(block);
      drawn.set(block, record);
      blockOf.set(record.element, block);
      if (block.kind !== "quiet") {
        const empty = $("empty-transcript");
        if (empty) empty.remove();
      }
      target.appendChild(record.element);
    }
  }

  function mark(step) {
    const { element, marks } = drawn.get(step.block);
    const i = markPrototype.cloneNode();
    i.setAttribute("data-seq", step.seq);
    marks.appendChild(i);
    if (step.truncated) addShowAll(element, step.seq);
  }

  // Render an agent's message or thought: Markdown when asked (or when it is small enough and live),
  // plain text for long ones; history waits for the lazy observer.
  function renderMessage(block, rich) {
    const m = drawn.get(block);
    if (!m || !m.body) return;
    const agent = block.kind === "agent";
    const text = agent ? paths.scrub(block.text) : block.text;
    let useMarkdown = rich && agent && text.length <= MARKDOWN_MAX_CHARS;
    if (useMarkdown && !getMarkdown()) {
      waitingForMarkdown.add(block);
      useMarkdown = false;
    }
    const mode = useMarkdown ? "markdown" : "plain";
    if (m.shown === text && m.mode === mode) return;
    if (useMarkdown) {
      renderMarkdown(m.body, text);
    } else if (text.length > MARKDOWN_MAX_CHARS || lineCount(text) > 400) {
      fillCollapsible(m.body, text, writePlain);
    } else {
      m.body.replaceChildren(el("div", "plain", text));
    }
    m.shown = text;
    m.mode = mode;
    if (!useMarkdown && agent && text.length <= MARKDOWN_MAX_CHARS && lazy) lazy.observe(m.element);
  }

  // Draw the bodies that changed since the last flush.
  function flush(rich) {
    flushScheduled = false;
    hooks.beforeFlush();
    for (const block of dirty) {
      if (block.kind === "agent" || block.kind === "thought") renderMessage(block, rich);
      else drawing.renderBody(block, drawn.get(block));
    }
    dirty.clear();
  }

  // Live events are drawn once per frame, with Markdown at once.
  function scheduleFlush() {
    if (flushScheduled) return;
    flushScheduled = true;
    requestAnimationFrame(() => {
      flush(true);
      scroll.stick();
    });
  }

  // --- loads ----------------------------------------------------------------------------------

  // A load's pages: each is applied (by `applyEvent`) into a fragment, and drawn. The first
  // load goes on the page in one piece (show()): the page opens at the bottom, so drawing the
  // older pages first would only cost frames nobody sees. Later loads go page by page.
  function startLoad(applyEvent) {
    const first = !loaded;
    const fragment = document.createDocumentFragment();
    return {
      page(events) {
        target = fragment;
        try {
          for (const event of events) applyEvent(event);
        } finally {
          target = transcript;
        }
        flush(!lazy);
        if (!first) transcript.appendChild(fragment);
      },
      show() {
        transcript.appendChild(fragment);
      },
    };
  }

  // The first load is on screen: load the Markdown libraries, give the messages people see
  // first their Markdown (the rest when scrolled near), and open at the bottom. Return false
  // when that was done already.
  function firstLoadDone() {
    if (loaded) return false;
    loaded = true;
    loadLibraries(libraries, librariesArrived);
    const messages = transcript.querySelectorAll(":scope > .msg.agent");
    for (let i = Math.max(0, messages.length - EAGER_BLOCKS); i < messages.length; i++) {
      renderMessage(blockOf.get(messages[i]), true);
    }
    scroll.toBottom();
    return true;
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

  // --- truncated events: "Show all" fetches the whole event ------------------------------------

  function addShowAll(element, seq) {
    const box = el("div", "truncated");
    box.appendChild(el("span", "", "Part of this was too large to send live. "));
    const button = box.appendChild(el("button", "show-all", "Show all"));
    button.type = "button";
    button.dataset.seq = seq;
    element.appendChild(box);
  }

  async function showAll(button) {
    const seq = Number(button.dataset.seq);
    const element = button.closest("[data-kind]");
    button.disabled = true;
    button.textContent = "Loading…";
    try {
      const event = await hooks.fetchEvent(seq);
      const block = blockOf.get(element);
      if (fold.refold(block, event)) redraw(block);
      else drawing.technicalDetails(element, JSON.stringify(event.data, null, 2));
      button.parentElement.remove();
    } catch (error) {
      button.disabled = false;
      button.textContent = "Show all (try again)";
      hooks.showError(`Couldn't load the rest: ${error.message}.`);
    }
  }

  function redraw(block) {
    const m = drawn.get(block);
    if (block.kind === "agent" || block.kind === "thought") {
      m.shown = null;
      renderMessage(block, true);
    } else {
      drawing.renderBody(block, m);
    }
  }

  // --- clicks in the transcript ------------------------------------------------------------------

  transcript.addEventListener("click", (event) => {
    const clicked = event.target;
    const option = clicked.closest(".permission .options button[data-option]");
    if (option && !option.disabled) {
      const element = option.closest(".permission");
      if (hooks.answer(element.dataset.request, option.dataset.option)) {
        element.querySelectorAll(".options button").forEach((b) => (b.disabled = true));
        option.classList.add("chosen");
        // The buttons are disabled now: keep the keyboard where the answer is shown.
        const answer = drawn.get(blockOf.get(element)).answer;
        answer.textContent = "Sending your answer…";
        answer.focus();
      } else {
        hooks.showError("Not connected. Answer again in a moment.");
      }
      return;
    }
    const action = clicked.closest(".elicitation .options button[data-action]");
    if (action && !action.disabled && action.dataset.action !== "accept") {
      answerElicitation(action.closest(".elicitation"), action.dataset.action);
      return;
    }
    const chip = clicked.closest(".changes-chip");
    if (chip) return hooks.openChanges(Number(chip.dataset.change));
    const conflict = clicked.closest(".repo-conflict");
    if (conflict) return hooks.openFile(conflict.dataset.path);
    const toggle = clicked.closest(".toggle-more:not(.diff-toggle)");
    if (toggle) return toggleCollapsible(toggle);
    const copy = clicked.closest(".code-block .copy");
    if (copy) return copyText(copy, copy.closest(".code-block").querySelector("code").textContent, hooks.announce);
    const back = clicked.closest(".msg-rewind, .msg-fork");
    if (back && !back.disabled) return goBack(back);
    const shown = clicked.closest(".rewound-toggle");
    if (shown) return showRewound(shown);
    const message = clicked.closest(".msg-copy, .msg-edit, .turn-retry");
    if (message) {
      const block = blockOf.get(message.closest(".msg, .turn-end"));
      if (!block) return;
      if (message.classList.contains("msg-copy")) return copyText(message, block.text, hooks.announce);
      if (message.classList.contains("msg-edit")) return hooks.edit(block.text, block.seq);
      return hooks.retry(block.retry.text, block.retry.files);
    }
    const more = clicked.closest(".show-all");
    if (more && !more.disabled) return showAll(more);
    const summary = clicked.closest(".thought > summary");
    if (summary) drawn.get(blockOf.get(summary.parentElement)).userOpened = true;
  });

  // "Rewind here" and "Fork from here" ask once more before they act, as a revert does: the
  // first click arms the button, the second acts; leaving it disarms it.
  function goBack(button) {
    const block = blockOf.get(button.closest(".msg"));
    if (!block) return;
    if (button.dataset.armed !== "true") {
      button.dataset.label = button.textContent;
      button.dataset.description = button.getAttribute("aria-label") || "";
      button.dataset.armed = "true";
      button.textContent = `Confirm: ${button.textContent.toLowerCase()}`;
      button.setAttribute("aria-label", button.textContent);
      return;
    }
    disarm(button);
    hooks.goBack(button.classList.contains("msg-rewind") ? "rewind" : "fork", block.seq, button);
  }

  function disarm(button) {
    if (button.dataset.armed !== "true") return;
    button.dataset.armed = "false";
    button.textContent = button.dataset.label;
    button.setAttribute("aria-label", button.dataset.description);
  }
  transcript.addEventListener("focusout", (event) => {
    const button = event.target.closest?.(".msg-rewind, .msg-fork");
    if (button) disarm(button);
  });

  // The turns a rewind set aside are collapsed; its button shows (or hides) them all.
  function showRewound(toggle) {
    const open = toggle.getAttribute("aria-expanded") !== "true";
    transcript.classList.toggle("show-rewound", open);
    for (const each of transcript.querySelectorAll(".rewound-toggle")) {
      each.setAttribute("aria-expanded", String(open));
      each.textContent = open ? "Hide them" : "Show them";
    }
  }

  // A form's Send is its submit (Enter in a field sends it too), after the browser has checked
  // what the form asks (required, minimum, maximum, lengths).
  transcript.addEventListener("submit", (event) => {
    const form = event.target.closest(".elicitation-form");
    if (!form) return;
    event.preventDefault();
    const element = form.closest(".elicitation");
    if (element.dataset.answer === "" && form.reportValidity()) answerElicitation(element, "accept");
  });

  function answerElicitation(element, action) {
    const block = blockOf.get(element);
    if (!block || block.answer !== "") return;
    const content = action === "accept" && block.mode === "form" ? formValues(element, block) : null;
    if (hooks.answerElicitation(block.request, action, content)) {
      element.querySelectorAll("input, select, button").forEach((c) => (c.disabled = true));
      const answer = drawn.get(block).answer;
      answer.textContent = "Sending your answer…";
      answer.focus();
    } else {
      hooks.showError("Not connected. Answer again in a moment.");
    }
  }

  // The form's values as the agent's schema types them; an empty optional field is left out.
  function formValues(element, block) {
    const content = {};
    block.fields.forEach((field, index) => {
      const input = element.querySelector(`#elicitation-${block.seq}-${index}`);
      if (!input) return;
      if (field.type === "boolean") content[field.name] = input.checked;
      else if (input.value === "") return;
      else if (field.type === "number" || field.type === "integer") content[field.name] = Number(input.value);
      else content[field.name] = input.value;
    });
    return content;
  }

  /** Let the person change the answers of open forms again (the server refused some). */
  function reopenElicitations() {
    for (const element of transcript.querySelectorAll('.elicitation[data-answer=""]')) {
      const block = blockOf.get(element);
      if (!block) continue;
      element.querySelectorAll("input, select, button").forEach((c) => {
        c.disabled = c.dataset.action === "accept" && !block.answerable;
      });
      drawn.get(block).answer.textContent = "";
    }
  }

  /** Bring the block that holds event `seq` (a message, a reply's chunk, a tool card's first
   *  event) into view, marked for a moment and focused; false when no block holds it. */
  function jumpTo(seq) {
    const block = fold.blocks.find((b) => b.firstSeq === seq || b.seq === seq
      || (Array.isArray(b.parts) && b.parts.some((part) => part.seq === seq)));
    const record = block && drawn.get(block);
    if (!record) return false;
    const element = record.element;
    if (block.kind === "agent") renderMessage(block, true); // its Markdown, before it is seen
    element.scrollIntoView({ block: "center" });
    scroll.reveal(element); // and the page stops following the newest event
    element.classList.add("jumped");
    setTimeout(() => element.classList.remove("jumped"), 2500);
    if (!element.hasAttribute("tabindex")) element.tabIndex = -1;
    element.focus({ preventScroll: true });
    return true;
  }

  return {
    draw, scheduleFlush, startLoad, firstLoadDone, reopenElicitations, jumpTo,
    get loaded() {
      return loaded;
    },
  };
}
