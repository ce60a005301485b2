// The open permission request (or request for information), pinned beside the composer: the
// agent waits on the person, and however long the turn (or however far they scrolled), one
// press takes them to the card.

import { $ } from "./dom.mjs";

/** Start the pin; `reveal(element)` brings an element into view (scroll.mjs). */
export function createPermissionPin({ reveal }) {
  const pin = $("permission-pin");
  const title = $("permission-pin-title");
  const more = $("permission-pin-more");
  const open = new Set(); // permission and elicitation blocks (fold.mjs) not answered yet, oldest first
  let shown = null;

  function card(block) {
    const question = $(`${block.kind}-${block.seq}`);
    return question ? question.closest(`.${block.kind}`) : null;
  }

  function draw() {
    const first = open.values().next().value || null;
    pin.hidden = !first;
    if (!first || (first === shown && more.dataset.count === String(open.size))) return;
    shown = first;
    title.textContent = first.kind === "elicitation" ? first.message || "a question" : first.title;
    more.dataset.count = String(open.size);
    more.textContent = open.size > 1 ? ` (and ${open.size - 1} more)` : "";
  }

  pin.addEventListener("click", () => {
    const element = shown && card(shown);
    if (!element) return;
    reveal(element);
    const control = element.querySelector("input:not(:disabled), select:not(:disabled), .options button:not(:disabled)");
    (control || element.querySelector(".permission-answer, .elicitation-answer")).focus({ preventScroll: true });
  });

  return {
    /** A step of the fold was applied: a request may have opened, been answered or expired. */
    seen(step) {
      const block = step.block;
      if ((block.kind === "permission" || block.kind === "elicitation") && block.answer === "") open.add(block);
      if (!open.size && pin.hidden) return;
      for (const asked of open) if (asked.answer !== "") open.delete(asked);
      draw();
    },
  };
}
