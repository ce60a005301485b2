// The queue: prompts sent while the agent works, waiting their turn above the composer. Each can
// be edited or removed until it starts, or sent now (steer: the running turn is stopped and
// this prompt goes next). The fold keeps the queue (fold.queue); the server keeps the truth
// (docs/websocket-api.md, "Queued prompts").

import { $, el } from "./dom.mjs";

/** Start the queue's view; `send(frame)` sends a frame (false when not connected);
 *  `waitReason()` says why prompts wait besides a running turn ("" when nothing else). */
export function createQueue({ fold, send, status, waitReason = () => "" }) {
  const section = $("queue");
  const list = $("queue-list");
  const count = $("queue-count");
  const why = $("queue-why");
  let editing = null; // {id, text}: the prompt being edited, and its text as typed so far
  let lastEdit = null; // {id, text}: the last edit sent, given back if the prompt started first

  function draw() {
    const queue = fold.queue;
    section.hidden = queue.length === 0;
    count.textContent = queue.length === 1 ? "1 message waits" : `${queue.length} messages wait`;
    const reason = waitReason();
    why.textContent = reason ? `· ${reason}` : "· sent in order when the agent is done";
    section.dataset.waitsFor = reason ? "repository" : "turn";
    if (editing && !queue.some((queued) => queued.id === editing.id)) editing = null;
    const focused = document.activeElement && list.contains(document.activeElement)
      ? { id: document.activeElement.closest("li")?.dataset.id, action: document.activeElement.dataset.action }
      : null;
    list.replaceChildren(...queue.map((queued, index) => item(queued, index)));
    if (focused) {
      const again = list.querySelector(`li[data-id="${CSS.escape(focused.id || "")}"] [data-action="${focused.action}"]`);
      (again || list.querySelector("button") || $("prompt")).focus();
    }
  }

  function item(queued, index) {
    const li = el("li", "queued");
    li.dataset.id = queued.id;
    if (editing && editing.id === queued.id) {
      const box = li.appendChild(el("textarea", "queued-editor"));
      box.value = editing.text;
      box.rows = 2;
      box.setAttribute("aria-label", "Edit this waiting message");
      box.dataset.action = "text";
      box.addEventListener("input", () => (editing.text = box.value));
      box.addEventListener("keydown", (event) => {
        if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
          event.preventDefault();
          save(queued.id);
        } else if (event.key === "Escape") {
          event.preventDefault();
          event.stopPropagation();
          editing = null;
          draw();
          li.querySelector("[data-action=edit]")?.focus();
        }
      });
      queueMicrotask(() => box.focus());
      li.appendChild(button("Save", "save", queued));
      li.appendChild(button("Cancel", "cancel", queued));
      return li;
    }
    const text = li.appendChild(el("span", "queued-text", queued.text));
    text.title = queued.text;
    if (queued.attachments.length) li.appendChild(el("span", "queued-attached", ` + ${queued.attachments.join(", ")}`));
    li.appendChild(el("span", "sr-only", index === 0 ? " (next)" : ` (number ${index + 1})`));
    li.appendChild(button("Edit", "edit", queued));
    li.appendChild(button("Remove", "remove", queued));
    li.appendChild(button("Send now", "send-now", queued));
    return li;
  }

  function button(label, action, queued) {
    const b = el("button", `queued-${action}`, label);
    b.type = "button";
    b.dataset.action = action;
    const short = queued.text.length > 40 ? `${queued.text.slice(0, 39)}…` : queued.text;
    b.setAttribute("aria-label", `${label}: ${short}`);
    return b;
  }

  function save(id) {
    const text = editing ? editing.text : "";
    if (!text.trim()) {
      status.showFrameError("A waiting message needs some text: remove it instead.");
      return;
    }
    lastEdit = { id, text };
    if (!send({ type: "edit_queued", id, text })) {
      status.showFrameError("Not connected. Save again in a moment.");
      return;
    }
    editing = null;
    status.announce("Saved.");
    draw();
  }

  list.addEventListener("click", (event) => {
    const target = event.target.closest("button[data-action]");
    if (!target) return;
    const id = target.closest("li").dataset.id;
    const queued = fold.queue.find((q) => q.id === id);
    if (!queued) return;
    switch (target.dataset.action) {
      case "edit":
        editing = { id, text: queued.text };
        draw();
        break;
      case "save":
        save(id);
        break;
      case "cancel":
        editing = null;
        draw();
        break;
      case "remove":
        if (!send({ type: "remove_queued", id })) status.showFrameError("Not connected. Remove it again in a moment.");
        break;
      case "send-now":
        if (send({ type: "send_now", id })) status.announce("Stopping the agent to send this now…");
        else status.showFrameError("Not connected. Try again in a moment.");
        break;
    }
  });

  return {
    draw,
    /** The server refused a change: the prompt had started. Give back an edit's text. */
    notQueued() {
      if (!lastEdit) return false;
      const prompt = $("prompt");
      prompt.value = prompt.value ? `${prompt.value}\n${lastEdit.text}` : lastEdit.text;
      lastEdit = null;
      return true;
    },
  };
}
