// Uploads into the session's workspace: the Files panel's Upload buttons, and files or folders
// dropped on the panel or anywhere on the page but the composer (the composer's drops are
// attachments.mjs's, which uploads through `send` here). Each file is one PUT of the files API
// (docs/workspace.md) with the file as its body, so the browser streams it from disk; a few go
// at once, each with its bar and a Cancel. A name that is taken is asked about (Replace, Keep
// both, Skip), once for the rest of the batch if the person says so.

import { $, el } from "./dom.mjs";
import { droppedItems, filesOf, joinPath, keepBothName, limitWords, overLimit } from "./upload-names.mjs";

const AT_ONCE = 3; // files sent at the same time
const MAX_KEEP_BOTH = 1000; // "name (n)" tried up to this n
const REFUSALS = {
  invalid_path: "not a name the workspace takes",
  is_link: "a link is on its way: links are never followed",
  not_a_file: "a folder has that name",
  repository_not_ready: "the repository is still being cloned: upload once it is ready",
  sandbox_unavailable: "the sandbox is not running",
  denied: "the agent's user may not write there",
};

/** Return the CSRF token the page's unsafe requests carry. */
function csrfToken() {
  const token = document.querySelector("input[name=csrfmiddlewaretoken]");
  return token ? token.value : "";
}

/** Start uploads for the session whose API lives at `api`; `limit` is CRAFT_UPLOAD_MAX_BYTES. */
export function createUploads({ api, limit, workspace, announce }) {
  const list = $("upload-list");
  const fileInput = $("upload-input");
  const folderInput = $("upload-folder-input");
  const target = $("upload-target");
  const rows = new WeakMap(); // a file's row (li) -> what it shows, for its Cancel

  // --- one file --------------------------------------------------------------------------------

  /** PUT `file` as `path`; `progress(sent, total)` as it goes. Return {promise, abort}; the
   *  promise gives {status, code, message, path} (status 0: not answered, or cancelled). */
  function put(file, path, overwrite, progress) {
    const xhr = new XMLHttpRequest();
    const query = new URLSearchParams({ path });
    if (overwrite) query.set("overwrite", "1");
    const promise = new Promise((resolve) => {
      xhr.open("PUT", `${api}files/raw?${query}`);
      xhr.setRequestHeader("X-CSRFToken", csrfToken());
      xhr.setRequestHeader("Content-Type", "application/octet-stream");
      xhr.upload.addEventListener("progress", (event) => progress(event.loaded, event.total || file.size));
      xhr.addEventListener("load", () => {
        let body = {};
        try {
          body = JSON.parse(xhr.responseText);
        } catch {
          // not JSON: said by its status
        }
        const error = body && body.error ? body.error : {};
        resolve({ status: xhr.status, code: error.code || "", message: error.message || "", path: body.path || path });
      });
      xhr.addEventListener("error", () => resolve({ status: 0, code: "network" }));
      xhr.addEventListener("abort", () => resolve({ status: 0, code: "cancelled" }));
      xhr.send(file);
    });
    return { promise, abort: () => xhr.abort() };
  }

  /** Upload `file` as `path`, asking `clash(path)` ("replace", "keep", "skip" or "cancel") when the name
   *  is taken; `sending(abort)` is told of each request as it starts. Return {state, path,
   *  why}: state "done", "skipped", "cancelled" or "failed". */
  async function send(file, path, { clash, progress = () => {}, sending = () => {} }) {
    if (overLimit(file.size, limit)) {
      return { state: "failed", path, why: `larger than ${limitWords(limit)}: not sent` };
    }
    let name = path;
    let overwrite = false;
    let copy = 0;
    for (;;) {
      const request = put(file, name, overwrite, progress);
      sending(request.abort);
      const answer = await request.promise;
      if (answer.status === 201) return { state: "done", path: answer.path };
      if (answer.code === "cancelled") return { state: "cancelled", path: name };
      if (answer.status === 409 && answer.code === "exists") {
        const choice = copy ? "keep" : await clash(name);
        if (choice === "skip") return { state: "skipped", path: name };
        if (choice === "cancel") return { state: "cancelled", path: name };
        if (choice === "replace") overwrite = true;
        else if (++copy > MAX_KEEP_BOTH) return { state: "failed", path, why: "no free name found" };
        else name = keepBothName(path, copy);
        continue;
      }
      return { state: "failed", path: name, why: refusal(answer, file) };
    }
  }

  function refusal(answer, file) {
    if (answer.status === 413 || (answer.status === 0 && overLimit(file.size, limit))) {
      return `larger than ${limitWords(limit)}: not uploaded`;
    }
    if (answer.status === 0) return "the connection was lost: not uploaded";
    return REFUSALS[answer.code] || answer.message || `the server answered ${answer.status}`;
  }

  // --- a batch, shown in the Files panel ---------------------------------------------------------

  /** Upload `files` ([{file, path}], `path` relative to `folder`) into `folder`, each shown with
   *  its bar; the tree is listed again once they are all done. */
  async function upload(files, folder) {
    if (!files.length) return;
    workspace.open("files");
    list.hidden = false;
    list.querySelector(":scope > li.upload-done-all")?.remove(); // shown again after this batch
    const batch = { choice: null, asking: [], left: files.length };
    const queue = files.map(({ file, path }) => ({ file, path: joinPath(folder, path), row: null }));
    for (const item of queue) item.row = row(item);
    announce(`Uploading ${files.length === 1 ? queue[0].path : `${files.length} files`}…`);
    let next = 0;
    const counts = { done: 0, failed: 0, skipped: 0, cancelled: 0 };
    async function worker() {
      while (next < queue.length) {
        const item = queue[next++];
        const result = await sendShown(item, batch);
        batch.left--;
        counts[result.state]++;
      }
    }
    await Promise.all(Array.from({ length: Math.min(AT_ONCE, queue.length) }, worker));
    workspace.changed();
    const words = [`${counts.done} uploaded`];
    if (counts.failed) words.push(`${counts.failed} not uploaded`);
    if (counts.skipped) words.push(`${counts.skipped} skipped`);
    if (counts.cancelled) words.push(`${counts.cancelled} cancelled`);
    announce(`Uploads: ${words.join(", ")}.`);
    showClear();
  }

  function row(item) {
    const li = list.appendChild(el("li", "upload"));
    li.dataset.state = "waiting";
    li.dataset.path = item.path;
    const head = li.appendChild(el("div", "upload-head"));
    head.appendChild(el("span", "upload-name", item.path));
    const state = head.appendChild(el("span", "upload-state muted", "Waiting"));
    const cancel = head.appendChild(el("button", "upload-cancel", "Cancel"));
    cancel.type = "button";
    cancel.setAttribute("aria-label", `Cancel the upload of ${item.path}`);
    const bar = li.appendChild(el("progress"));
    bar.max = Math.max(item.file.size, 1);
    bar.value = 0;
    bar.setAttribute("aria-label", item.path);
    const shown = { li, state, cancel, bar, abort: null, cancelled: false };
    rows.set(li, shown);
    return shown;
  }

  async function sendShown(item, batch) {
    const shown = item.row;
    if (shown.cancelled) return finish(shown, { state: "cancelled" });
    shown.li.dataset.state = "sending";
    shown.state.textContent = "0%";
    const result = await send(item.file, item.path, {
      clash: (name) => ask(shown, name, batch),
      progress(sent, total) {
        shown.bar.max = Math.max(total, 1);
        shown.bar.value = sent;
        shown.state.textContent = `${total ? Math.floor((100 * sent) / total) : 100}%`;
      },
      sending: (abort) => (shown.abort = abort),
    });
    return finish(shown, result);
  }

  function finish(shown, result) {
    shown.li.dataset.state = result.state;
    shown.abort = null;
    shown.cancel.remove();
    shown.li.querySelector(".clash")?.remove();
    if (result.state === "done") {
      shown.bar.value = shown.bar.max;
      shown.state.textContent = "Done";
      if (result.path !== shown.li.dataset.path) shown.state.textContent = `Done, as ${result.path.split("/").at(-1)}`;
    } else {
      shown.bar.remove();
      shown.state.textContent = { skipped: "Skipped", cancelled: "Cancelled" }[result.state] || `Not uploaded: ${result.why}`;
      shown.state.classList.toggle("bad", result.state === "failed");
    }
    return result;
  }

  // The name is taken: Replace, Keep both or Skip, asked beside the file (never a dialog of the
  // browser's); "for the rest too" answers the batch's next clashes, and those already asked.
  function ask(shown, name, batch) {
    if (batch.choice) return Promise.resolve(batch.choice);
    return new Promise((resolve) => {
      const box = shown.li.appendChild(el("div", "clash"));
      box.setAttribute("role", "group");
      box.setAttribute("aria-label", `${name} already exists`);
      box.appendChild(el("span", "clash-text", `${name.split("/").at(-1)} is already there.`));
      const answer = (choice) => {
        const at = batch.asking.indexOf(answer);
        if (at < 0) return; // answered already
        batch.asking.splice(at, 1);
        box.remove();
        shown.li.dataset.state = "sending";
        resolve(choice);
      };
      for (const [choice, label] of [["replace", "Replace"], ["keep", "Keep both"], ["skip", "Skip"]]) {
        const button = box.appendChild(el("button", `clash-${choice}`, label));
        button.type = "button";
        button.addEventListener("click", () => {
          if (!all || !all.checked) return answer(choice);
          batch.choice = choice; // this one's question, and every other open one, answered
          for (const open of [...batch.asking]) open(choice);
        });
      }
      let all = null;
      if (batch.left > 1) {
        const label = box.appendChild(el("label", "clash-all"));
        all = label.appendChild(el("input"));
        all.type = "checkbox";
        label.appendChild(document.createTextNode(" for the rest too"));
      }
      shown.li.dataset.state = "asking";
      shown.state.textContent = "Name taken";
      shown.bar.value = 0;
      shown.abort = () => answer("cancel");
      batch.asking.push(answer);
      // The keyboard comes to the question only from the panel (never out of the prompt box).
      const focused = document.activeElement;
      if (!focused || focused === document.body || focused.closest("#workspace")) {
        box.querySelector("button").focus({ preventScroll: true });
      }
    });
  }

  function showClear() {
    if (list.querySelector("li.upload-done-all")) return;
    if (list.querySelector("li.upload[data-state=waiting], li.upload[data-state=sending], li.upload[data-state=asking]")) return;
    const li = list.appendChild(el("li", "upload-done-all"));
    const clear = li.appendChild(el("button", "link", "Clear the list"));
    clear.type = "button";
    clear.addEventListener("click", () => {
      list.replaceChildren();
      list.hidden = true;
    });
  }

  list.addEventListener("click", (event) => {
    const button = event.target.closest("button.upload-cancel");
    if (!button) return;
    const li = button.closest("li.upload");
    const shown = rows.get(li);
    if (!shown) return;
    shown.cancelled = true;
    if (shown.abort) shown.abort(); // its request ends as cancelled
    else if (li.dataset.state === "waiting") finish(shown, { state: "cancelled" });
  });
  // --- where the files come from ------------------------------------------------------------

  async function chosen(input) {
    const { files } = await filesOf([...input.files].map((file) => ({ file })));
    input.value = "";
    upload(files, workspace.uploadFolder());
  }

  async function dropped(items, folder) {
    const { files, unread } = await filesOf(items);
    if (unread) announce(`${unread} of the dropped files could not be read.`);
    upload(files, folder);
  }

  // The folder a drop goes to: the tree's folder it fell on (a file's folder), or the one the
  // panel shows.
  function dropFolder(event) {
    const entry = event.target.closest && event.target.closest("#file-tree li.entry");
    if (!entry) return workspace.uploadFolder();
    if (entry.dataset.type === "folder") return entry.dataset.path;
    return entry.dataset.path.split("/").slice(0, -1).join("/");
  }

  const carriesFiles = (event) => event.dataTransfer && [...event.dataTransfer.types].includes("Files");
  const onComposer = (event) => event.target.closest && event.target.closest("#composer");
  document.addEventListener("dragover", (event) => {
    if (!carriesFiles(event) || onComposer(event)) return;
    event.preventDefault(); // a drop here is ours, not the browser's (which would open the file)
    event.dataTransfer.dropEffect = "copy";
    document.body.classList.add("dropping");
  });
  document.addEventListener("dragleave", (event) => {
    if (!event.relatedTarget) document.body.classList.remove("dropping");
  });
  document.addEventListener("drop", (event) => {
    document.body.classList.remove("dropping");
    if (event.defaultPrevented || !carriesFiles(event) || onComposer(event)) return;
    event.preventDefault();
    dropped(droppedItems(event.dataTransfer), dropFolder(event));
  });
  $("upload-files").addEventListener("click", () => fileInput.click());
  $("upload-folder").addEventListener("click", () => folderInput.click());
  fileInput.addEventListener("change", () => chosen(fileInput));
  folderInput.addEventListener("change", () => chosen(folderInput));
  workspace.onFolder((folder) => {
    target.textContent = `Uploads, and files dropped on the page, go to ${folder ? `${folder}/` : "the top of the workspace"}.`;
  });

  return {
    /** Upload `file` as `path` for an attachment: a taken name is kept as "name (n)". */
    send: (file, path, options = {}) => send(file, path, { ...options, clash: async () => "keep" }),
    limit,
  };
}
