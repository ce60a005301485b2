// The composer: sending a prompt (with its @ mentions and images), and stopping the agent.

import { $ } from "./dom.mjs";

// daphne's default websocket frame limit: a bigger frame closes the socket (close 1009).
const MAX_FRAME_BYTES = 1024 * 1024;
// A prompt with images may be bigger: the server takes frames of up to 4 MiB (as `make run`
// starts daphne) and limits the images themselves.
const MAX_ATTACHED_FRAME_BYTES = 4 * 1024 * 1024 - 4096;
const MAX_MENTIONS = 10;

function newId() {
  // crypto.randomUUID needs a secure context; getRandomValues does not.
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}

// @ mentions: `@path` names a file of the workspace, sent as a link the agent can read.
function mentionedFiles(text) {
  const paths = new Set();
  for (const match of text.matchAll(/(?:^|\s)@([^\s@]+)/g)) {
    const path = match[1].replace(/[.,;:!?)]+$/, "");
    if (!path || path.startsWith("/") || path.includes("://") || path.split("/").includes("..")) continue;
    paths.add(path);
    if (paths.size >= MAX_MENTIONS) break;
  }
  return [...paths].map((path) => ({ type: "file", path }));
}

/** Keep what is typed in `box` in this tab's sessionStorage under `key` until it is sent, so
 *  that leaving the page (to store a key on the Keys page, say) and coming back finds it
 *  there; put it back now if the box is empty. */
function createDraft(key, box) {
  try {
    const kept = sessionStorage.getItem(key);
    if (kept && !box.value) box.value = kept;
  } catch {
    // storage refused (private mode, quota): drafts are not kept
  }
  return {
    keep() {
      try {
        if (box.value) sessionStorage.setItem(key, box.value);
        else sessionStorage.removeItem(key);
      } catch {
        // as above
      }
    },
  };
}

/** Start the composer; `connection` sends frames (socket.mjs). While the agent works (or the
 *  sandbox starts), what is sent waits in the session's queue (queue.mjs). */
export function createComposer({ connection, status, attachments, palette, fold, workspace, sessionId, forkEdited }) {
  const form = $("composer");
  const promptBox = $("prompt");
  const draft = createDraft(`craft.draft.${sessionId}`, promptBox);
  // An earlier message being edited (its seq): sending it forks the session from just before
  // it (going-back.mjs). Said above the box, with a way out.
  let editing = null;
  const editingNote = document.createElement("p");
  editingNote.className = "editing-note";
  editingNote.hidden = true;
  editingNote.textContent = "Editing an earlier message: sending it starts a fork of this session from just before it. ";
  const stopEditing = editingNote.appendChild(document.createElement("button"));
  stopEditing.type = "button";
  stopEditing.textContent = "Send as a new message instead";
  form.querySelector(".composer-notices").appendChild(editingNote);
  function setEditing(seq) {
    editing = seq;
    editingNote.hidden = seq === null;
  }
  stopEditing.addEventListener("click", () => {
    setEditing(null);
    promptBox.focus();
  });
  let pendingPrompt = null; // {id, text, key} until its user_message (or prompt_queued) arrives
  let recalled = null; // ↑ and ↓ through your earlier prompts: {index, draft}
  let checking = false; // the mentioned files are being looked up

  // The files `text` mentions that are in the workspace, and those that are not (which are not
  // sent: the agent would get a link to nothing); null while an earlier look-up is under way.
  async function mentionsOf(text) {
    const files = mentionedFiles(text);
    if (!files.length) return { files, missing: [] };
    if (checking) return null;
    checking = true;
    try {
      const missing = await workspace.missing(files.map((file) => file.path));
      return { files: files.filter((file) => !missing.includes(file.path)), missing };
    } finally {
      checking = false;
    }
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = promptBox.value;
    if (!text.trim()) {
      status.showFrameError("Type a message first.");
      return;
    }
    if (attachments.uploading()) {
      status.showFrameError("A file for this message is still uploading: send it once it is attached.");
      return;
    }
    if (editing !== null) {
      const seq = editing;
      try {
        await forkEdited(seq, text);
        setEditing(null);
        promptBox.value = "";
        draft.keep();
      } catch (error) {
        status.showFrameError(`Not sent: ${error.message || error} Your message is still in the box.`);
      }
      return;
    }
    const mentions = await mentionsOf(text);
    if (!mentions) return; // a second Enter while the first one looks the files up
    const images = attachments.images();
    const uploaded = attachments.files().filter((path) => !mentions.files.some((file) => file.path === path));
    const attached = [...mentions.files, ...uploaded.map((path) => ({ type: "file", path })),
      ...images.map((image) => ({ type: "image", mimeType: image.mimeType, data: image.data, name: image.name }))];
    // Re-sending the same message reuses the id, so a prompt sent just before a disconnect
    // is never run twice.
    const key = `${images.map((i) => i.id).join(",")}\n${uploaded.join(",")}\n${text}`;
    if (!pendingPrompt || pendingPrompt.key !== key) {
      pendingPrompt = { id: newId(), text, key };
    }
    const message = { type: "prompt", id: pendingPrompt.id, text };
    if (attached.length) message.attachments = attached;
    const frame = JSON.stringify(message);
    const bytes = new TextEncoder().encode(frame).length;
    const limit = attached.length ? MAX_ATTACHED_FRAME_BYTES : MAX_FRAME_BYTES;
    if (bytes > limit) {
      pendingPrompt = null;
      const size = `(${(bytes / 1048576).toFixed(1)} MB; the limit is ${Math.round(limit / 1048576)} MB)`;
      status.showFrameError(
        attached.length
          ? `This message and its attachments are too large to send ${size}. It's still in the box: remove an image, or shorten the text.`
          : `This message is too long to send ${size}. It's still in the box: shorten it, or put the long part in a file in the workspace.`,
        true,
      );
      return;
    }
    status.hideFrameError();
    if (!connection.sendText(frame)) {
      status.showFrameError("Not connected. Your message is kept; send it again in a moment.");
    } else if (mentions.missing.length) {
      const [names, are, them] = mentions.missing.length > 1
        ? [mentions.missing.join(", "), "are", "them"] : [mentions.missing[0], "is", "it"];
      status.showFrameError(`Not attached: ${names} ${are} not in the workspace. Your message was sent without ${them}.`);
    }
  });

  // ↑ at the start of the box recalls your earlier prompts (newest first), ↓ goes back.
  function recall(event) {
    if (event.shiftKey || event.altKey || event.ctrlKey || event.metaKey || event.isComposing) return false;
    const up = event.key === "ArrowUp";
    if (!up && event.key !== "ArrowDown") return false;
    const atEdge = up
      ? promptBox.selectionStart === 0 && promptBox.selectionEnd === 0
      : promptBox.selectionStart === promptBox.value.length;
    if (!atEdge || (!up && recalled === null)) return false;
    const prompts = fold.blocks.filter((block) => block.kind === "user").map((block) => block.text);
    if (!prompts.length) return false;
    if (recalled === null) recalled = { index: prompts.length, draft: promptBox.value };
    const index = recalled.index + (up ? -1 : 1);
    if (index < 0) return true; // at the oldest: stay
    event.preventDefault();
    recalled.index = index;
    promptBox.value = index >= prompts.length ? recalled.draft : prompts[index];
    if (index >= prompts.length) recalled = null;
    const end = up ? 0 : promptBox.value.length;
    promptBox.setSelectionRange(end, end);
    return true;
  }
  promptBox.addEventListener("input", () => {
    recalled = null;
    if (!promptBox.value) setEditing(null);
    draft.keep();
  });

  promptBox.addEventListener("keydown", (event) => {
    if (palette.handleKey(event)) return;
    if (recall(event)) return;
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });

  function stop() {
    if (!status.running) return;
    if (connection.send({ type: "cancel" })) status.announce("Stopping…");
    else status.showFrameError("Not connected: the agent could not be stopped yet.");
  }
  $("stop").addEventListener("click", () => {
    stop();
    promptBox.focus(); // the button goes away with the turn: the keyboard stays in the composer
  });
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || event.defaultPrevented || !status.running) return;
    if (event.target.closest && event.target.closest(".sidebar, details[open] > summary, .terminal-screen")) return;
    event.preventDefault();
    stop();
  });

  /** Send `text` (and workspace files) as a new prompt: "Retry" after a turn that failed. */
  function resend(text, files) {
    const message = { type: "prompt", id: newId(), text };
    if (files && files.length) message.attachments = files.map((path) => ({ type: "file", path }));
    if (connection.send(message)) status.announce("Sent again.");
    else status.showFrameError("Not connected. Try again in a moment.");
  }

  /** Put an earlier prompt (user message `seq`) in the box to be edited: sent, it starts a
   *  fork of the session from just before that message, with the edited text. */
  function edit(text, seq) {
    promptBox.value = text;
    draft.keep();
    setEditing(Number.isSafeInteger(seq) ? seq : null);
    promptBox.focus();
    promptBox.setSelectionRange(text.length, text.length);
    status.announce(editing === null
      ? "Your message is in the box: change it, then send it as a new message."
      : "Your message is in the box: change it, then send it. That starts a fork of this session from just before it.");
  }

  return {
    resend,
    edit,
    /** A user message was stored (a block of the fold): the prompt it carries is sent. */
    promptStored(block) {
      recalled = null;
      if (!pendingPrompt || pendingPrompt.id !== block.promptId) return;
      pendingPrompt = null;
      if (promptBox.value === block.text) promptBox.value = "";
      draft.keep();
      attachments.clear();
    },
  };
}
