// The workspace panel beside the transcript (a sheet on phones): what the agent did to the
// session's files, and shells in its workspace. Its tabs (others, Preview say, are their modules'):
//
//   Files    a tree loaded folder by folder, a preview of the file picked (text highlighted,
//            Markdown rendered and sanitised, images), download of one file or of all
//   Changes  each change (a turn's turn_changes, a revert's workspace_reverted) with its
//            files, each file's diff in hunks, and "revert hunk", "revert file" and "revert
//            turn", each behind a second click that confirms it
//   Terminal shells in the workspace (terminal.mjs)
//
// Everything is read through the workspace API (docs/workspace.md), which reads the files
// where the agent runs; names are shown as the API spells them. File content is untrusted:
// text goes in through textContent, Markdown through the same sanitiser as the chat.

import { $, el } from "./dom.mjs";
import { hunkCounts, parseDiff } from "./diff.mjs";
import { revertedFile, revertedWhole } from "./fold.mjs";
import { fetchJson } from "./history.mjs";
import { highlight, renderMarkdown } from "./markdown.mjs";
import { formatBytes } from "./words.mjs";

const PREVIEW_MAX_BYTES = 512 * 1024; // bigger files are downloaded, not shown
const PAGE = 500; // entries of a folder asked at once
const IMAGE = /\.(png|jpe?g|gif|webp|avif|svg)$/i;
const LANGUAGES = {
  py: "python", js: "javascript", mjs: "javascript", ts: "typescript", json: "json", html: "xml",
  xml: "xml", css: "css", sh: "bash", yml: "yaml", yaml: "yaml", toml: "ini", rs: "rust",
  go: "go", java: "java", c: "c", h: "c", cpp: "cpp", rb: "ruby", sql: "sql", diff: "diff",
};
const REVERT_ERRORS = {
  turn_running: "The agent is working: revert once its turn ends.",
  conflict: "That file changed since: this part no longer applies. Revert the whole file instead.",
  no_checkpoint: "There is no checkpoint of the files from before that turn.",
  nothing_to_revert: "Already reverted: the files are as they were before that change.",
};

/** Start the panel of the session whose API lives at `api` (".../api/sessions/<id>/").
 *  `fold` holds the changes; `tell(text)` puts text in the prompt box for the person to send;
 *  `changesShown()` is called whenever the Changes tab is shown (its Repository section, for a
 *  session on a repository, is repository.mjs's). */
export function createWorkspace({ api, fold, announce, tell, changesShown = () => {}, terminal = null }) {
  const panel = $("workspace");
  const toggle = $("workspace-toggle");
  const tree = $("file-tree");
  const preview = $("file-preview");
  const changeList = $("change-list");
  const problem = $("workspace-error");
  const revertNote = $("revert-note");
  // Every tab of the panel, by name ("tab-<name>"): Files and Changes are this module's; the
  // others' modules hear "workspace-tab" on the panel when theirs is shown.
  const tabs = Object.fromEntries(
    [...$("workspace-tabs").querySelectorAll('[role="tab"]')].map((tab) => [tab.id.replace(/^tab-/, ""), tab]),
  );
  const listings = new Map(); // folder path -> {entries, at}: for "@" suggestions
  let shownChanges = 0;
  let stale = true; // the tree must be loaded (again) when next shown
  // The folder the panel shows, where uploads go: the folder last opened in the tree (its
  // parent once closed), or the folder of the file last shown; "" is the workspace itself.
  let folder = "";
  const folderWatchers = [];
  function showFolder(path) {
    folder = path;
    for (const watcher of folderWatchers) watcher(folder);
  }
  const parentOf = (path) => path.split("/").slice(0, -1).join("/");

  // --- the panel and its tabs ----------------------------------------------------------------

  function open(tab = "files") {
    panel.hidden = false;
    document.body.classList.add("workspace-open");
    toggle.setAttribute("aria-expanded", "true");
    select(tab);
  }

  function close() {
    panel.hidden = true;
    document.body.classList.remove("workspace-open");
    toggle.setAttribute("aria-expanded", "false");
    toggle.focus();
  }

  function select(tab) {
    for (const [name, button] of Object.entries(tabs)) {
      const chosen = name === tab;
      button.setAttribute("aria-selected", String(chosen));
      button.tabIndex = chosen ? 0 : -1;
      $(button.getAttribute("aria-controls")).hidden = !chosen;
    }
    if (tab === "files" && stale) loadTree();
    if (tab === "changes") {
      drawChanges();
      changesShown();
    }
    panel.dispatchEvent(new CustomEvent("workspace-tab", { detail: tab }));
    if (tab === "terminal") terminal?.shown();
    else terminal?.hidden();
  }

  function showProblem(text) {
    problem.textContent = text;
    problem.hidden = !text;
  }

  // --- Files ---------------------------------------------------------------------------------

  async function listFolder(path, offset = 0) {
    const query = new URLSearchParams({ path, offset: String(offset), limit: String(PAGE) });
    const listing = await fetchJson(`${api}files/?${query}`);
    if (offset === 0) listings.set(path, { entries: listing.entries, at: Date.now() });
    return listing;
  }

  // The tree again from the top, with the folders that are open when the new listing has
  // come (one opened meanwhile too) opened again, and the keyboard where it was.
  async function loadTree() {
    stale = false;
    try {
      const listing = await listFolder("");
      const open = [...tree.querySelectorAll("li[aria-expanded=true]")].map((li) => li.dataset.path);
      const focused = tree.contains(document.activeElement) ? document.activeElement.closest("li.entry") : null;
      showListing(tree, "", 0, listing);
      for (const path of open) {
        const li = tree.querySelector(`li[data-path="${CSS.escape(path)}"]`);
        if (li) await expand(li);
      }
      if (focused) tree.querySelector(`li[data-path="${CSS.escape(focused.dataset.path)}"] > .name`)?.focus();
      showProblem("");
    } catch (error) {
      stale = true;
      showProblem(`Couldn't list the files: ${error.message || error}`);
    }
  }

  async function fillFolder(list, path, offset = 0) {
    showListing(list, path, offset, await listFolder(path, offset));
  }

  function showListing(list, path, offset, listing) {
    if (offset === 0) list.replaceChildren();
    list.querySelector(":scope > li.more")?.remove();
    for (const entry of listing.entries) list.appendChild(treeItem(path, entry));
    if (!listing.total && !path) list.appendChild(el("li", "muted empty", "No files yet."));
    if (listing.has_more) {
      const more = list.appendChild(el("li", "more"));
      const button = more.appendChild(el("button", "link", `Show more (${listing.total - offset - listing.entries.length} left)`));
      button.type = "button";
      button.addEventListener("click", () => fillFolder(list, path, offset + listing.entries.length));
    }
  }

  function treeItem(folder, entry) {
    const path = folder ? `${folder}/${entry.name}` : entry.name;
    const li = el("li", `entry ${entry.type}`);
    li.setAttribute("role", "treeitem");
    li.dataset.path = path;
    li.dataset.type = entry.type;
    if (entry.type === "folder") {
      li.setAttribute("aria-expanded", "false");
      const button = li.appendChild(el("button", "name", `${entry.name}/`));
      button.type = "button";
    } else if (entry.type === "file") {
      const button = li.appendChild(el("button", "name", entry.name));
      button.type = "button";
      li.appendChild(el("span", "size", formatBytes(entry.size)));
    } else {
      // Links are shown with their target and never followed; FIFOs, sockets and devices
      // are listed and never opened.
      const label = entry.type === "link" ? `${entry.name} → ${entry.target ?? "?"}` : `${entry.name} (${entry.type})`;
      li.appendChild(el("span", "name", label));
    }
    return li;
  }

  async function expand(li) {
    let group = li.querySelector(":scope > ul");
    if (!group) {
      group = li.appendChild(el("ul"));
      group.setAttribute("role", "group");
    }
    li.setAttribute("aria-expanded", "true");
    await fillFolder(group, li.dataset.path);
  }

  function collapse(li) {
    li.setAttribute("aria-expanded", "false");
    li.querySelector(":scope > ul")?.remove();
  }

  async function show(path) {
    const url = `${api}files/raw?${new URLSearchParams({ path })}`;
    preview.hidden = false;
    preview.replaceChildren();
    const head = preview.appendChild(el("div", "preview-head"));
    head.appendChild(el("strong", "preview-path", path));
    const download = head.appendChild(el("a", "download", "Download"));
    download.href = url;
    download.setAttribute("download", "");
    const body = preview.appendChild(el("div", "preview-body"));
    if (IMAGE.test(path)) {
      const image = body.appendChild(el("img"));
      image.alt = path;
      image.src = url;
      return;
    }
    const entry = tree.querySelector(`li[data-path="${CSS.escape(path)}"] .size`);
    const size = (listings.get(path.split("/").slice(0, -1).join("/"))?.entries || [])
      .find((e) => e.name === path.split("/").at(-1))?.size;
    if (size > PREVIEW_MAX_BYTES) {
      body.appendChild(el("p", "muted", `Too large to show here (${entry ? entry.textContent : formatBytes(size)}): download it.`));
      return;
    }
    try {
      const response = await fetch(url, { cache: "no-store" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const bytes = new Uint8Array(await response.arrayBuffer());
      let text;
      try {
        text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
      } catch {
        body.appendChild(el("p", "muted", "A binary file: download it to open it."));
        return;
      }
      if (/\.(md|markdown)$/i.test(path)) {
        body.classList.add("markdown");
        renderMarkdown(body, text);
        return;
      }
      const pre = body.appendChild(el("pre"));
      pre.tabIndex = 0;
      const code = pre.appendChild(el("code", "", text));
      code.dataset.language = LANGUAGES[(path.split(".").at(-1) || "").toLowerCase()] || "";
      highlight(code);
    } catch (error) {
      body.appendChild(el("p", "bad", `Couldn't read it: ${error.message || error}`));
    }
  }

  tree.addEventListener("click", (event) => {
    const li = event.target.closest("li.entry");
    if (!li || !event.target.closest("button.name")) return;
    if (li.dataset.type === "folder") {
      if (li.getAttribute("aria-expanded") === "true") {
        collapse(li);
        showFolder(parentOf(li.dataset.path));
      } else {
        showFolder(li.dataset.path);
        expand(li).catch((error) => showProblem(`Couldn't list ${li.dataset.path}: ${error.message || error}`));
      }
    } else {
      showFolder(parentOf(li.dataset.path));
      show(li.dataset.path);
    }
  });

  // --- Changes -------------------------------------------------------------------------------

  function drawChanges() {
    const changes = fold.changes;
    if (!changes.length) {
      changeList.replaceChildren(el("li", "muted empty", "No changes yet: what the agent changes in a turn shows here."));
      shownChanges = 0;
      return;
    }
    if (shownChanges === 0) changeList.replaceChildren();
    for (; shownChanges < changes.length; shownChanges++) {
      const change = changes[shownChanges];
      changeList.appendChild(changeItem(change));
      // A revert: the change it reverted (or undid) offers no revert of what is back already.
      for (const seq of change.affects) {
        const shown = changeList.querySelector(`li.change[data-change="${seq}"]`);
        const affected = changes.find((c) => c.seq === seq);
        if (shown && affected) shown.replaceWith(changeItem(affected));
      }
    }
  }

  function changeItem(change) {
    const li = el("li", "change");
    li.dataset.change = String(change.seq);
    const head = li.appendChild(el("div", "change-head"));
    const title = change.reverted ? change.text : `Turn: ${change.prompt || `#${change.seq}`}`;
    head.appendChild(el("strong", "change-title", title));
    if (change.skipped) {
      // nothing to revert: no checkpoint after the turn
    } else if (revertedWhole(change)) {
      head.appendChild(el("span", "change-reverted muted", change.reverted ? "Undone" : "Reverted"));
    } else {
      head.appendChild(confirmButton(change.reverted ? "Undo this revert" : "Revert turn", { seq: change.seq }));
    }
    if (change.skipped) li.appendChild(el("p", "muted", change.text));
    const files = li.appendChild(el("ul", "change-files"));
    for (const file of change.files) files.appendChild(fileItem(change, file));
    if (change.truncated) li.appendChild(el("p", "muted", "… and more files (download the diff to see them all)."));
    return li;
  }

  function fileItem(change, file) {
    const li = el("li", "change-file");
    const details = li.appendChild(el("details"));
    details.dataset.path = file.path;
    const summary = details.appendChild(el("summary"));
    summary.appendChild(el("span", `status ${file.status}`, file.status));
    summary.appendChild(el("span", "path", file.oldPath ? `${file.oldPath} → ${file.path}` : file.path));
    summary.appendChild(el("span", "counts", file.binary ? "binary" : `+${file.added} −${file.removed}`));
    if (revertedFile(change, file.path)) summary.appendChild(el("span", "file-reverted muted", change.reverted ? "undone" : "reverted"));
    details.addEventListener("toggle", () => {
      if (details.open && !details.dataset.loaded) loadFileDiff(change, file, details);
    });
    return li;
  }

  async function loadFileDiff(change, file, details) {
    details.dataset.loaded = "true";
    const body = details.appendChild(el("div", "file-diff"));
    const reverted = revertedFile(change, file.path);
    if (!reverted) body.appendChild(confirmButton("Revert file", { seq: change.seq, path: file.path }));
    try {
      const response = await fetch(`${api}turns/${change.seq}/diff/?${new URLSearchParams({ path: file.path })}`, { cache: "no-store" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const [parsed] = parseDiff(await response.text());
      if (!parsed || !parsed.hunks.length) {
        body.appendChild(el("p", "muted", file.binary ? "A binary file: no lines to show." : "No lines changed."));
        return;
      }
      parsed.hunks.forEach((hunk, index) => {
        const box = body.appendChild(el("div", "hunk"));
        const bar = box.appendChild(el("div", "hunk-head"));
        const { added, removed } = hunkCounts(hunk);
        bar.appendChild(el("code", "", hunk.header));
        bar.appendChild(el("span", "counts", ` +${added} −${removed}`));
        // A renamed file's own diff shows it as added: its hunks are reverted with the file.
        if (!file.oldPath && !reverted) bar.appendChild(confirmButton("Revert hunk", { seq: change.seq, path: file.path, hunk: index }));
        const pre = box.appendChild(el("pre", "diff-lines"));
        pre.tabIndex = 0; // it may scroll: keyboard users scroll it too
        for (const line of hunk.lines) pre.appendChild(el("span", line.kind, `${line.text}\n`));
      });
    } catch (error) {
      body.appendChild(el("p", "bad", `Couldn't load the diff: ${error.message || error}`));
    }
  }

  // A button that asks once more before it reverts: the first click arms it, the second
  // sends; leaving it (blur) disarms it.
  function confirmButton(label, request) {
    const button = el("button", "revert", label);
    button.type = "button";
    button.dataset.request = JSON.stringify(request);
    button.dataset.label = label;
    return button;
  }

  changeList.addEventListener("click", (event) => {
    const button = event.target.closest("button.revert");
    if (!button || button.disabled) return;
    if (button.dataset.armed !== "true") {
      button.dataset.armed = "true";
      button.textContent = `Confirm: ${button.dataset.label.toLowerCase()}`;
      return;
    }
    revert(button, JSON.parse(button.dataset.request));
  });
  changeList.addEventListener("focusout", (event) => {
    const button = event.target.closest?.("button.revert");
    if (button && button.dataset.armed === "true") {
      button.dataset.armed = "false";
      button.textContent = button.dataset.label;
    }
  });

  async function revert(button, { seq, ...body }) {
    button.disabled = true;
    button.textContent = "Reverting…";
    showProblem("");
    try {
      const token = document.querySelector("input[name=csrfmiddlewaretoken]");
      const response = await fetch(`${api}turns/${seq}/revert/`, {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-CSRFToken": token ? token.value : "" },
        body: JSON.stringify(body),
      });
      if (response.status !== 204) {
        const answer = await response.json().catch(() => ({}));
        const code = answer.error ? answer.error.code : "";
        throw new Error(REVERT_ERRORS[code] || (answer.error && answer.error.message) || `HTTP ${response.status}`);
      }
      // The workspace_reverted event that follows on the socket shows what changed.
      revertNote.hidden = false;
      revertNote.dataset.what = body.path ? body.path : "the files";
      announce("Reverted. The agent has not been told.");
    } catch (error) {
      showProblem(`Not reverted: ${error.message || error}`);
    } finally {
      button.disabled = false;
      button.dataset.armed = "false";
      button.textContent = button.dataset.label;
    }
  }

  $("tell-agent").addEventListener("click", () => {
    revertNote.hidden = true;
    tell(`I reverted ${revertNote.dataset.what} in the workspace; the files are not as you left them. Look again before you go on.`);
  });

  // --- wiring --------------------------------------------------------------------------------

  toggle.addEventListener("click", () => (panel.hidden ? open() : close()));
  $("workspace-close").addEventListener("click", close);
  $("files-refresh").addEventListener("click", loadTree);
  for (const [name, button] of Object.entries(tabs)) button.addEventListener("click", () => select(name));
  $("workspace-tabs").addEventListener("keydown", (event) => {
    if (event.key !== "ArrowLeft" && event.key !== "ArrowRight") return;
    const names = Object.keys(tabs);
    const now = names.findIndex((name) => tabs[name].getAttribute("aria-selected") === "true");
    const next = names[(now + (event.key === "ArrowRight" ? 1 : names.length - 1)) % names.length];
    select(next);
    tabs[next].focus();
  });
  panel.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || event.target.closest?.(".terminal-screen")) return; // a shell's Esc
    event.preventDefault(); // Esc in the panel closes it; it does not stop the agent
    close();
  });

  return {
    /** Show the Files tab (or `tab`). */
    open,
    /** The folder the panel shows, where uploads go ("" is the workspace itself). */
    uploadFolder: () => folder,
    /** Call `watcher(folder)` now and whenever the folder the panel shows changes. */
    onFolder(watcher) {
      folderWatchers.push(watcher);
      watcher(folder);
    },
    /** Show the file at `path` (a file an update left in conflict) in the Files tab. */
    openFile(path) {
      open("files");
      show(path);
      preview.scrollIntoView({ block: "nearest" });
    },
    /** A chip in the transcript was clicked: show that change. */
    openChanges(seq) {
      open("changes");
      const item = changeList.querySelector(`li.change[data-change="${seq}"]`);
      if (!item) return;
      item.scrollIntoView({ block: "nearest" });
      const first = item.querySelector("details");
      if (first && !first.open) first.open = true;
      item.querySelector("summary")?.focus();
    },
    /** The files may have changed (a turn ended, a change or a revert came). */
    changed() {
      listings.clear();
      stale = true;
      if (panel.hidden) return;
      if (!$("panel-files").hidden) loadTree();
      else drawChanges();
    },
    /** A change arrived: shown at once if the Changes tab is open. */
    changesArrived() {
      if (!panel.hidden && !$("panel-changes").hidden) drawChanges();
    },
    /** Of the workspace paths `paths` (as "@" mentions name them), those that are not there
     *  now: their folders are listed afresh. A path is taken as there when that cannot be told
     *  (the sandbox is not running, a folder too long to list at once). */
    async missing(paths) {
      const folders = new Map(); // folder -> the paths asked in it
      for (const path of paths) {
        const clean = path.replace(/\/+$/, "");
        const slash = clean.lastIndexOf("/");
        const folder = clean.slice(0, Math.max(slash, 0));
        if (!folders.has(folder)) folders.set(folder, []);
        folders.get(folder).push({ path, name: clean.slice(slash + 1) });
      }
      const missing = new Set();
      await Promise.all([...folders].map(async ([folder, asked]) => {
        const query = new URLSearchParams({ path: folder, limit: "10000" });
        let listing = null;
        try {
          const response = await fetch(`${api}files/?${query}`, { credentials: "same-origin", cache: "no-store" });
          // No such folder, or a file where a folder would be: nothing in it is there.
          if (response.status === 404 || response.status === 400) listing = { entries: [], has_more: false };
          else if (response.ok) listing = await response.json();
        } catch {
          // not told: taken as there
        }
        if (!listing || listing.has_more || !Array.isArray(listing.entries)) return;
        const names = new Set(listing.entries.map((entry) => entry.name));
        for (const { path, name } of asked) if (!names.has(name)) missing.add(path);
      }));
      return paths.filter((path) => missing.has(path));
    },
    /** Workspace files for "@" mentions: the entries of `folder` known now, and a promise of
     *  them when they must be asked for (null when they are known). */
    entriesOf(folder) {
      const known = listings.get(folder);
      if (known && Date.now() - known.at < 30000) return { entries: known.entries, later: null };
      const later = listFolder(folder).then((l) => l.entries, (error) => {
        listings.set(folder, { entries: [], at: Date.now() }); // not asked again at each key
        throw error;
      });
      return { entries: known ? known.entries : [], later };
    },
  };
}
