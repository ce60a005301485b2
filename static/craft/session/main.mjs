// The live session page (templates/craft/session.html). The server renders no transcript: the
// page folds the session's event log (the same JSON every API client reads,
// docs/websocket-api.md) into what a person reads; see "One renderer" in docs/architecture.md.
// This module wires the parts, each of which has one job:
//
//   fold.mjs         events into the blocks a person reads (no DOM: Node tests it)
//   render.mjs       those blocks drawn as the transcript, and the clicks in it
//   blocks.mjs       what each kind of block looks like
//   socket.mjs       the websocket, reconnects, and the load guard (how a page stays exact)
//   history.mjs      stored events over HTTP
//   status.mjs       what the page shows around the transcript
//   attention.mjs    the tab's title and notifications while hidden; telling the server it was seen
//   controls.mjs     the agent's own controls
//   composer.mjs     sending prompts, stopping the agent, ↑ recall, edit and retry
//   going-back.mjs   rewind to, or fork from, an earlier message (and edit one: a fork)
//   queue.mjs        prompts waiting for the running turn: edit, remove, send now
//   palette.mjs      "/" commands and "@" files in the prompt box
//   attachments.mjs  images and files for the next prompt
//   uploads.mjs      files uploaded into the workspace: buttons, drops, progress, name clashes
//   scroll.mjs       following the newest event, unless the person scrolled up
//   permission-pin.mjs  an open permission request, pinned beside the composer
//   workspace.mjs    the workspace panel: files, changes, revert (diff.mjs reads git's diffs)
//   preview.mjs      the Preview tab: an app the sandbox serves, on the preview origin
//   terminal.mjs     the panel's Terminal tab: shells in the workspace (xterm.js)
//   repository.mjs   a session on a repository: its clone in the header, commit, push, pull
//                    request and update in the Changes tab
//
// Agent output is untrusted: text goes in through textContent, Markdown is sanitised
// (markdown.mjs), and paths are shown relative to the workspace (paths.mjs).

import { createAttachments } from "./attachments.mjs";
import { createAttention } from "./attention.mjs";
import { createComposer } from "./composer.mjs";
import { createControls } from "./controls.mjs";
import { $ } from "./dom.mjs";
import { createFold } from "./fold.mjs";
import { createGoingBack } from "./going-back.mjs";
import { fetchJson, loadHistory } from "./history.mjs";
import { createPalette } from "./palette.mjs";
import { createPermissionPin } from "./permission-pin.mjs";
import { createPreview } from "./preview.mjs";
import { createQueue } from "./queue.mjs";
import { createRepository } from "./repository.mjs";
import { workspacePaths } from "./paths.mjs";
import { createView } from "./render.mjs";
import { followBottom } from "./scroll.mjs";
import { createConnection } from "./socket.mjs";
import { createStatus } from "./status.mjs";
import { createUploads } from "./uploads.mjs";
import { isObject, str } from "./values.mjs";
import { FRAME_ERRORS, STOP_REASONS } from "./words.mjs";
import { createTerminals } from "./terminal.mjs";
import { createWorkspace } from "./workspace.mjs";

const root = $("session");
const sessionId = root.dataset.session;
const transcript = $("transcript");
const promptBox = $("prompt");
const paths = workspacePaths(root.dataset.workspace, sessionId);
// The repository the page was rendered with (none: the session is not on one).
const fold = createFold({ paths, repository: root.dataset.repository ? JSON.parse(root.dataset.repository) : null });
const status = createStatus({ root, turnStartedAt: () => fold.turnStartedAt, paths });
const scroll = followBottom({ session: root, transcript, composer: $("composer"), jumpButton: $("jump"), promptBox });
const pin = createPermissionPin({ reveal: scroll.reveal });
// Once the socket said how the sandbox is, its `sandbox` frames keep the page exact: an
// events response read before the latest of them (they race) must not put an older state back.
let sandboxFromSocket = false;

const connection = createConnection({
  url: `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/sessions/${sessionId}/`,
  serverLastSeq: Number(root.dataset.lastSeq || 0),
  lastSeq: () => fold.lastSeq,
  loadEvents,
  page: {
    connection: status.showConnection,
    announce: status.announce,
    hello(frame) {
      status.showAgentStderr(""); // said again within seconds if the agent is still quiet
      status.setRunning(frame.running);
      if (isObject(frame.sandbox)) {
        status.setSandbox(frame.sandbox);
        sandboxFromSocket = true;
      }
      connection.send({ type: "follow_sessions" }); // the sidebar's list follows every session
      // Back after a drop: what changed meanwhile was told to no one here (a turn the next
      // server closed as it started, say): the whole list is read again.
      if (helloSeen) sessionsChanged(null);
      helloSeen = true;
      startAgentEarly();
      attention.looked();
    },
    notice(frame) { // pushed as it changes, never polled (docs/websocket-api.md)
      if (frame.type === "sandbox") {
        status.setSandbox(frame);
        startAgentEarly();
        if (frame.status === "running") workspace.changed(); // woken: its files show again
      }
      else if (frame.type === "agent_stderr") status.showAgentStderr(str(frame.text));
      else sessionsChanged(frame.sessions);
    },
    event(frame) {
      applyEvent(frame, true);
      view.scheduleFlush();
    },
    error: refused,
    loaded,
    loadFailed: status.showLoadFailure,
  },
});
const attention = createAttention({
  send: (frame) => connection.send(frame),
  sessionTitle: () => $("session-title").textContent,
});
const controls = createControls({ fold, send: connection.send, status });
function tell(text) {
  promptBox.value = promptBox.value ? `${promptBox.value}\n${text}` : text;
  promptBox.focus();
}
const terminal = createTerminals({
  session: root.dataset.session,
  libraries: (root.dataset.terminalLibraries || "").split(" ").filter(Boolean),
  stylesheet: root.dataset.terminalStylesheet,
  attach: tell,
  announce: status.announce,
});
const workspace = createWorkspace({
  api: root.dataset.apiUrl, fold, announce: status.announce, tell, terminal,
  changesShown: () => repository.panelShown(),
});
const repository = createRepository({ fold, status, workspace, announce: status.announce });
const preview = createPreview({ announce: status.announce });
const view = createView({
  transcript, fold, paths, scroll,
  staff: root.dataset.staff === "true",
  keysUrl: root.dataset.keysUrl || "",
  libraries: (root.dataset.libraries || "").split(" ").filter(Boolean),
  hooks: {
    beforeFlush: controls.draw,
    answer(request, option) {
      const sent = connection.send({ type: "permission", request, option });
      if (sent) scroll.follow(); // the agent goes on: what it does next comes into view
      return sent;
    },
    answerElicitation(request, action, content) {
      const frame = { type: "elicitation", request, action };
      if (content) frame.content = content;
      const sent = connection.send(frame);
      if (sent) scroll.follow();
      return sent;
    },
    announce: status.announce,
    showError: status.showFrameError,
    fetchEvent: (seq) => fetchJson(root.dataset.eventUrl.replace(/0\/$/, `${seq}/`)),
    openChanges: workspace.openChanges,
    openFile: workspace.openFile,
    retry: (text, files) => composer.resend(text, files),
    edit: (text, seq) => composer.edit(text, seq),
    goBack: (how, seq, button) => goingBack.goBack(how, seq, button),
  },
});
const goingBack = createGoingBack({ api: root.dataset.apiUrl, announce: status.announce, showError: status.showFrameError });
const uploads = createUploads({
  api: root.dataset.apiUrl, limit: Number(root.dataset.uploadMaxBytes), workspace, announce: status.announce,
});
const attachments = createAttachments({ fold, status, uploads });
const composer = createComposer({
  connection, status, attachments, fold, workspace, palette: createPalette({ fold, workspace }),
  sessionId, forkEdited: goingBack.forkEdited,
});
const queue = createQueue({ fold, send: connection.send, status, waitReason: repository.waitReason });

// Apply one event: fold it, draw it, and let the page around the transcript follow.
function applyEvent(event, live = false) {
  const step = fold.apply(event, live);
  if (!step) return;
  view.draw(step);
  pin.seen(step);
  if (step.block.kind === "user") {
    composer.promptStored(step.block);
    if (live) $("keys-missing")?.remove(); // a prompt went through: the keys are there now
  }
  if (step.title) {
    status.setTitle(step.title);
    attention.titleChanged();
  }
  if (step.controls) controls.changed();
  if (step.block.kind === "changes") workspace.changesArrived();
  if (step.repository) {
    repository.draw();
    if (fold.queue.length) queue.draw(); // the reason they wait may have changed
  }
  if (step.queue) {
    queue.draw();
    if (event.kind === "prompt_queued") composer.promptStored({ promptId: event.data.id, text: event.data.text });
  }
  if (live && !step.failed) followLive(event.kind, step.block, event.data);
  if (live) status.showAgentStderr(""); // the agent said something: no longer quiet
}

// Tell the sidebar (sidebar.js) which of the person's sessions changed what its list shows;
// anything but a list of ids (a `sessions` frame without them): not known which, it reads all.
let helloSeen = false;
function sessionsChanged(ids) {
  const sessions = Array.isArray(ids) && ids.every((id) => typeof id === "string") ? ids : undefined;
  document.dispatchEvent(new CustomEvent("craft:sessions-changed", { detail: { sessions } }));
}

// What a person is told of a live event besides the transcript.
function followLive(kind, block, data) {
  const listChanged = () => sessionsChanged([sessionId]);
  switch (kind) {
    case "user_message":
      scroll.toBottom(); // a new message, and what answers it, always come into view
      status.setRunning(true);
      status.announce("The agent is working.");
      listChanged();
      break;
    case "prompt_queued":
      status.announce(repository.waitReason()
        ? "Your message will be sent once the repository is cloned."
        : "Your message will be sent when the agent is done.");
      break;
    case "repository_status":
    case "repository_committed":
    case "repository_pushed":
    case "repository_updated":
    case "pull_request_opened":
    case "pull_request_updated":
      repository.eventArrived(kind, isObject(data) ? data : {});
      if (kind !== "repository_status") workspace.changed(); // an update changes files
      if (repository.listChanged()) listChanged();
      break;
    case "permission_request":
      scroll.toBottom(); // the agent waits for the person: the card comes into view
      status.announce(`The agent asks for permission: ${block.title}.`);
      attention.needsApproval(block.title);
      break;
    case "elicitation_request":
      if (block.answer !== "") break; // refused: nothing to answer
      scroll.toBottom();
      status.announce(`The agent asks for information: ${block.message}`);
      attention.needsApproval(block.message || "a question", "asks for information");
      break;
    case "turn_changes":
    case "workspace_reverted":
      workspace.changed();
      break;
    case "turn_end":
      workspace.changed();
      preview.turnEnded();
      status.setRunning(false);
      status.announce(STOP_REASONS[block.reason] || "The turn ended.");
      attention.turnEnded(STOP_REASONS[block.reason] || "The turn ended");
      listChanged();
      break;
    case "agent_error":
      status.showAgentError(block);
      break;
    case "agent_restarted":
      status.announce(block.label);
      break;
    case "session_title":
      listChanged();
      break;
  }
}

// The connection's load: the stored events after the last one applied, drawn as they come.
async function loadEvents({ controller, cache, serverLastSeq }) {
  const load = view.startLoad(applyEvent);
  try {
    return await loadHistory({
      url: root.dataset.eventsUrl, pageSize: Number(root.dataset.pageSize || 1000),
      lastSeq: () => fold.lastSeq, serverLastSeq, controller, cache,
    }, load.page);
  } finally {
    load.show(); // what was applied counts, even when the load failed: show it
  }
}

function loaded(body) {
  status.hideLoadFailure();
  status.setRunning(body.running);
  if (isObject(body.sandbox) && !sandboxFromSocket) status.setSandbox(body.sandbox);
  // The list was drawn with the page: the clone may have ended (or the pull request changed)
  // between that and the load.
  if (repository.listChanged()) sessionsChanged([sessionId]);
  if (!view.loaded) requestAnimationFrame(firstLoadDone);
}

// A session whose agent never ran (a new one) has it started when the page has loaded, so
// that its pickers and commands are there before the first message (once per page).
let startAsked = false;
function startAgentEarly() {
  if (startAsked || !view.loaded || fold.agent.started || status.sandboxStatus !== "running") return;
  startAsked = connection.send({ type: "start_agent" });
}

// A search result of this session (search.mjs), or a link to one of its events
// (`#event-<seq>`, what search opens): that event's block is brought into view.
function jumpToHash() {
  const match = /^#event-(\d+)$/.exec(location.hash);
  if (match && view.jumpTo(Number(match[1]))) return true;
  return false;
}
document.addEventListener("craft:jump", (event) => {
  if (!view.jumpTo(Number(event.detail && event.detail.seq))) status.showFrameError("That message is not in this session any more.");
});

function firstLoadDone() {
  if (!view.firstLoadDone()) return;
  if (jumpToHash()) {
    startAgentEarly();
    return;
  }
  startAgentEarly();
  if (!fold.lastSeq || document.activeElement === document.body) promptBox.focus({ preventScroll: true });
}

function refused(frame) {
  if (frame.code === "not_running") return; // Stop raced with the end of the turn
  if (frame.code === "credentials_missing") {
    // The message names the keys (never their values); the prompt stays in the box.
    const message = typeof frame.message === "string" ? frame.message : FRAME_ERRORS.credentials_missing;
    status.showFrameErrorWithLink(`${message} Your message is kept.`, root.dataset.keysUrl, "Open Keys");
    return;
  }
  if (frame.code === "disk_full") {
    // The message says how much the files take, the limit and what to do; the prompt stays.
    const message = typeof frame.message === "string" ? frame.message : FRAME_ERRORS.disk_full;
    status.showFrameError(`${message} Your message is kept.`);
    return;
  }
  if (frame.code === "agent_not_started") {
    // The page started the agent ahead of the first message: say at once why it could not.
    const said = paths.scrubHostPaths(str(frame.message));
    status.showFrameError(`${FRAME_ERRORS.agent_not_started}${said ? ` It says: ${said}` : ""}`, true);
    return;
  }
  if (frame.code === "not_queued" && queue.notQueued()) {
    status.showFrameError(`${FRAME_ERRORS.not_queued} Your edit is in the box.`);
    return;
  }
  if (frame.code === "invalid_content") {
    view.reopenElicitations(); // the form stays open: change the answers and send again
    status.showFrameError(`${FRAME_ERRORS.invalid_content} ${frame.message}.`);
    return;
  }
  controls.revert(); // a refused change: the pickers go back to what the agent said
  status.showFrameError(FRAME_ERRORS[frame.code] || "The server did not accept that. Try again in a moment.");
}

$("retry-now").addEventListener("click", () => connection.load());
window.addEventListener("offline", () => status.showConnection("offline"));
window.addEventListener("online", () => connection.online());

status.start();
connection.start(); // the first load uses what the page preloaded, and the socket joins it
