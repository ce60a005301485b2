// The fold: a session's events, applied in seq order, into the blocks a person reads. This is
// the one place where events are interpreted (invariant "one renderer"); render.mjs only draws
// what it holds. No DOM here, so that Node can run it (tests/js/fold.test.mjs).
//
// A block is a plain object with a `kind` that the page shows as `data-kind`: "user", "agent"
// and "thought" (messages), "tool", "plan", "permission", "elicitation" (the agent asks for
// information: a form or a URL), "turn_end", "error", "restart",
// "changes" (what a turn or a revert changed in the workspace), "rewound" (the session went
// back to an earlier turn: the blocks of the turns it set aside get `rewound`, and the page
// shows them collapsed), "forked" (the session is a fork of another), "repository" (Craft committed,
// pushed, updated the session's branch, or its pull request opened or changed state), "other"
// (a note) and one hidden "quiet" block for the events that have no block of their own. Every applied event belongs to exactly one block. Labels, titles and plan entries are
// ready to read; message text and tool content stay as the agent sent them, since drawing them
// (and cutting host paths out of them) waits until the page draws.
//
// apply(event, live) folds one event; `live` when it arrives on the socket as it happens
// rather than from the stored history (a thought shown live says it is going on). It returns
// a step that says what to draw: `block` (the event's), `updated` (blocks whose head or state
// changed: drawn now), `stale` (blocks whose body changed: drawn once per frame or per loaded
// page, however many updates came) and, when the event said so, `title` (the session's new
// title), `controls` (the agent's controls changed), `truncated` (the event was cut short for
// delivery: the whole of it can be fetched), `repository` (the session's repository changed:
// `fold.repository`) and `failed` (it could not be shown: its block is a note saying so). Blocks appear in `blocks` in the order the page shows them.

import { isObject, str } from "./values.mjs";
import {
  ANSWERS, PLAN_STATUS, PULL_REQUEST_STATES, RESTARTS, STOP_REASONS, TOOL_KINDS, TOOL_STATUS,
  agentErrorWording, duration, formatBytes, repositoryName, shortCommit,
} from "./words.mjs";

// ACP updates with no block of their own: the controls around the composer show them.
const QUIET_KINDS = new Set([
  "available_commands_update", "current_mode_update", "config_option_update",
  "config_options_update", "session_info_update", "usage_update", "agent_info",
  // The person's own words: the page shows the prompt from Craft's user_message.
  "user_message_chunk",
]);
const MAX_KNOWN_PATHS = 2000;
// A clone's set-up output the page keeps (the server keeps at most 64 KiB of it).
export const MAX_SETUP_OUTPUT_CHARS = 256 * 1024;
const REPOSITORY_STATUSES = new Set(["pending", "cloning", "setting_up", "ready", "failed"]);
// While the repository is not ready yet, prompts wait for it (docs/websocket-api.md).
export const PREPARING = new Set(["pending", "cloning", "setting_up"]);
// Live command output a tool card keeps (the server keeps at most 1 MiB per tool call: this
// only guards against a page fed by something else).
export const MAX_TERMINAL_CHARS = 2_000_000;

/** Return an empty fold for a session whose paths `paths` makes readable (paths.mjs).
 *  `repository` is the session's repository as the page was rendered with it (the API's
 *  `repository` of a session: {url, path, branch, base, status, detail, failure, commit,
 *  pull_request}), or null for a session that is not on one: its events are folded over it. */
/** Return whether `path` of `change` (a "changes" block) was reverted since (and not undone). */
export function revertedFile(change, path) {
  return change.revertedBy.some((r) => !r.path || r.path === path);
}

/** Return whether the whole of `change` was reverted since: at once, or file by file. */
export function revertedWhole(change) {
  if (change.revertedBy.some((r) => !r.path)) return true;
  return !change.truncated && change.files.length > 0 && change.files.every((f) => revertedFile(change, f.path));
}

export function createFold({ paths, now = Date.now, repository = null }) {
  const fold = {
    lastSeq: 0, // the highest seq applied: it advances for every event, shown or not
    blocks: [],
    turnStartedAt: null, // when this turn's user message was stored (ms)
    // What the agent offers, as the log last said (agent_info and the updates after it).
    agent: { started: false, prompt: {}, configOptions: null, modes: null, commands: [], usage: null },
    knownPaths: new Set(), // workspace paths seen in this session, for @ mentions
    changes: [], // the "changes" blocks, oldest first: the workspace panel's Changes tab
    // Prompts waiting for the running turn to end, in the order they will run:
    // {id, text, attachments}. docs/websocket-api.md, "Queued prompts".
    queue: [],
    // The session's repository, as the log last said (null: not on one): {url, name, branch,
    // base, status, progress: {phase, percent, text} | null, command, output, setup, commit,
    // code, reason, head, pullRequest: {url, number, state} | null}.
    repository: isObject(repository) ? repositoryFrom(repository) : null,
    apply,
    refold,
    fail,
  };
  let turn = 0; // user messages so far: tool call ids restart with every agent process
  let last = null; // the last block, for chunks that continue it
  let quiet = null;
  let plan = null; // this turn's plan
  let turnTools = []; // this turn's tool cards
  const tools = new Map(); // `${turn}:${toolCallId}` -> tool card
  const permissions = new Map(); // request id -> permission block
  const elicitations = new Map(); // request id -> elicitation block
  const asked = new Map(); // `${turn}:${toolCallId}` -> the permission block asked for it
  const prompts = new Map(); // seq of a user_message -> its text, to name a turn's changes
  let interruptedCards = []; // permission blocks Craft closed, until the agent_error says why
  let step = null; // the step being folded
  let lastPrompt = null; // the last user block
  let turnSeq = 0; // the seq of the user_message of the turn the next blocks belong to
  const turnBlocks = new Map(); // seq of a user_message -> the blocks of its turn

  /** Apply one event; return its step, or null for one already applied (or without a seq).
   *  Never throws. */
  function apply(event, live = false) {
    if (!isObject(event)) return null;
    const seq = event.seq;
    if (!Number.isSafeInteger(seq) || seq <= fold.lastSeq) return null; // already applied
    step = { seq, live, block: null, updated: [], stale: [], truncated: false };
    try {
      step.block = foldEvent(event, isObject(event.data) ? event.data : {});
      step.truncated = event.truncated === true && step.block !== quiet;
    } catch (error) {
      console.error("could not fold event", seq, error);
      fail(step);
    }
    fold.lastSeq = seq;
    return step;
  }

  /** Give a step that could not be shown a note of its own instead (a guard, never a wedge). */
  function fail(broken) {
    step = broken;
    broken.block = note("Something the agent sent could not be shown.");
    broken.truncated = false;
    broken.failed = true;
  }

  function foldEvent(event, data) {
    switch (event.kind) {
      case "user_message": return userMessage(event, data);
      case "agent_message_chunk": return chunk("agent", event, data);
      case "agent_thought_chunk": return chunk("thought", event, data);
      case "tool_call":
      case "tool_call_update": return toolCall(event, data);
      case "plan": return planUpdate(data);
      case "permission_request": return permissionRequest(event, data);
      case "permission_answer": return permissionAnswer(data);
      case "elicitation_request": return elicitationRequest(event, data);
      case "elicitation_answer": return elicitationAnswer(data);
      case "elicitation_complete": return elicitationComplete(data);
      case "terminal_output_limited": return terminalLimited(data);
      case "turn_end": return turnEnd(event, data);
      case "agent_error": return agentError(data);
      case "session_title": return sessionTitle(data);
      case "agent_restarted": return agentRestarted(data);
      case "turn_changes": return workspaceChanges(event, data, false);
      case "workspace_reverted": return workspaceChanges(event, data, true);
      case "rewound": return rewound(event, data);
      case "forked": return forked(data);
      case "repository_status": return repositoryStatus(data);
      case "repository_committed":
      case "repository_pushed":
      case "repository_updated":
      case "pull_request_opened":
      case "pull_request_updated": return repositoryWork(event.kind, data);
      case "prompt_queued":
      case "queued_prompt_edited":
      case "queued_prompt_removed":
      case "prompt_steered":
        followQueue(event.kind, data);
        return quietBlock();
      case "agent_info":
      case "config_option_update":
      case "config_options_update":
      case "current_mode_update":
      case "available_commands_update":
      case "usage_update":
        followControls(event.kind, data);
        return quietBlock();
      default:
        if (QUIET_KINDS.has(event.kind)) return quietBlock();
        return note("The agent sent an update this page can't show.", `kind: ${str(event.kind)}`);
    }
  }

  function append(block) {
    const previous = last;
    fold.blocks.push(block);
    last = block;
    if (turnSeq) turnBlocks.get(turnSeq).push(block);
    if (previous && previous.kind === "thought") {
      previous.thinking = false; // a thought is over once something follows it
      step.updated.push(previous);
    }
    return block;
  }

  function quietBlock() {
    if (!quiet) {
      quiet = { kind: "quiet" };
      fold.blocks.push(quiet); // not `last`: chunks go on across quiet events
    }
    return quiet;
  }

  function timeOf(event) {
    const parsed = event.created_at ? Date.parse(event.created_at) : NaN;
    return Number.isNaN(parsed) ? now() : parsed;
  }

  function userMessage(event, data) {
    if (fold.queue.some((queued) => queued.id === data.id)) followQueue("started", data);
    turn += 1;
    plan = null;
    turnTools = [];
    fold.turnStartedAt = timeOf(event);
    const text = str(data.text);
    prompts.set(event.seq, text.length > 80 ? `${text.slice(0, 79)}…` : text);
    const attached = Array.isArray(data.attachments) ? data.attachments.filter(isObject) : [];
    const attachments = attached.map((a) => {
      if (a.type === "file" && typeof a.path === "string") {
        fold.knownPaths.add(a.path);
        return a.path;
      }
      const size = Number.isFinite(a.bytes) ? ` (${formatBytes(a.bytes)})` : "";
      return `${str(a.name) || "image"}${size}`;
    });
    turnSeq = event.seq;
    turnBlocks.set(turnSeq, []);
    lastPrompt = append({
      kind: "user", seq: event.seq, rewound: false, promptId: data.id, text, parts: [{ seq: event.seq, text }], attachments,
      files: attached.filter((a) => a.type === "file" && typeof a.path === "string").map((a) => a.path),
      time: fold.turnStartedAt,
    });
    return lastPrompt;
  }

  // The queue: prompt_queued adds a prompt at the end, an edit replaces its text, a removal
  // or its user_message (it started) takes it out, prompt_steered moves it to the head.
  function followQueue(kind, data) {
    const id = data.id;
    const index = fold.queue.findIndex((queued) => queued.id === id);
    if (kind === "prompt_queued") {
      if (index >= 0 || typeof id !== "string") return;
      const attached = Array.isArray(data.attachments) ? data.attachments.filter(isObject) : [];
      fold.queue.push({
        id, text: str(data.text),
        attachments: attached.map((a) => (a.type === "file" ? str(a.path) : str(a.name) || "image")),
      });
    } else if (index < 0) {
      return;
    } else if (kind === "queued_prompt_edited") {
      fold.queue[index] = { ...fold.queue[index], text: str(data.text) };
    } else if (kind === "prompt_steered") {
      fold.queue.unshift(...fold.queue.splice(index, 1));
    } else {
      fold.queue.splice(index, 1); // removed, or started
    }
    fold.queue = [...fold.queue];
    step.queue = true;
  }

  function textOf(data) {
    return isObject(data) && isObject(data.content) && data.content.type === "text"
      ? str(data.content.text)
      : "";
  }

  // Message chunks join the message they continue; a thought shown live says it is going on.
  function chunk(kind, event, data) {
    let block = last;
    if (!block || block.kind !== kind) {
      block = append(kind === "thought"
        ? { kind, thinking: step.live, parts: [], text: "" }
        : { kind, parts: [], text: "" });
    }
    const text = textOf(data);
    block.parts.push({ seq: event.seq, text });
    block.text += text;
    step.stale.push(block);
    return block;
  }

  // Tool cards are keyed by (turn, toolCallId). Updates carry only the fields that changed;
  // `content` replaces the whole list. `call` keeps what is known of the call, as ACP has it.
  function toolCall(event, data) {
    const id = str(data.toolCallId);
    const key = `${turn}:${id}`;
    let card = tools.get(key);
    if (!card) {
      card = {
        kind: "tool", toolCallId: id, status: "pending", label: "Tool", title: "Tool call",
        badge: TOOL_STATUS.pending, call: {}, contentSeq: null, firstSeq: event.seq,
      };
      tools.set(key, card);
      turnTools.push(card);
      append(card);
    }
    const call = card.call;
    if (typeof data.kind === "string") {
      card.label = TOOL_KINDS[data.kind] || "Tool";
      call.kind = data.kind;
    }
    if (typeof data.title === "string" && data.title) {
      card.title = paths.scrub(data.title);
      call.title = data.title;
    }
    if (typeof data.status === "string") {
      card.status = data.status;
      card.badge = TOOL_STATUS[data.status] || "Updated";
    }
    if (Array.isArray(data.locations)) {
      call.locations = data.locations;
      for (const l of data.locations) {
        if (isObject(l) && typeof l.path === "string" && fold.knownPaths.size < MAX_KNOWN_PATHS) {
          const path = paths.relPath(l.path);
          if (path && path !== "." && !path.startsWith("/")) fold.knownPaths.add(path);
        }
      }
    }
    if (isObject(data.rawInput)) call.rawInput = data.rawInput;
    if (isObject(data._meta)) followTerminal(card, data._meta);
    if (Array.isArray(data.content)) {
      call.content = data.content;
      card.contentSeq = event.seq;
      // The tool card shows the diff now: its permission card stops showing it too.
      const permission = asked.get(key);
      if (permission && hasDiff(data.content) && hasDiff(permission.details.content)) {
        permission.details = { ...permission.details, content: withoutDiffsIf(true, permission.details.content) };
        step.stale.push(permission);
      }
    }
    step.updated.push(card);
    if (Array.isArray(data.content) || Array.isArray(data.locations) || isObject(data.rawInput)) {
      step.stale.push(card); // in a loaded page, only the card's last content is drawn
    }
    return card;
  }

  // Live command output (Zed's `_meta` convention, docs/acp.md): `terminal_info` starts it,
  // each `terminal_output` adds its data, `terminal_exit` says how the command ended.
  function followTerminal(card, meta) {
    const info = meta.terminal_info, output = meta.terminal_output, exit = meta.terminal_exit;
    if (!isObject(info) && !isObject(output) && !isObject(exit)) return;
    const terminal = card.terminal || (card.terminal = { output: "", exit: null, limit: 0, cut: false });
    if (isObject(output) && typeof output.data === "string" && !terminal.cut) {
      const room = MAX_TERMINAL_CHARS - terminal.output.length;
      terminal.output += output.data.length > room ? output.data.slice(0, room) : output.data;
      terminal.cut = output.data.length > room;
    }
    if (isObject(exit)) {
      terminal.exit = {
        code: Number.isSafeInteger(exit.exit_code) ? exit.exit_code : null,
        signal: typeof exit.signal === "string" ? exit.signal : "",
      };
    }
    step.stale.push(card); // the body is drawn once per frame, however many chunks came
  }

  // Craft dropped a tool call's live output past its limit: its card says so.
  function terminalLimited(data) {
    const card = tools.get(`${turn}:${str(data.toolCallId)}`);
    if (!card) return quietBlock();
    const terminal = card.terminal || (card.terminal = { output: "", exit: null, limit: 0, cut: false });
    terminal.limit = Number.isSafeInteger(data.limit) ? data.limit : 1;
    step.stale.push(card);
    return card;
  }

  function planEntries(entries) {
    return entries.filter(isObject).map((entry) => ({
      status: PLAN_STATUS[entry.status] ? entry.status : "pending",
      text: paths.scrub(str(entry.content)),
    }));
  }

  // A plan always carries the whole list: it replaces the turn's plan.
  function planUpdate(data) {
    if (!plan) plan = append({ kind: "plan", entries: [] });
    if (!Array.isArray(data.entries)) return plan; // malformed: keep the last good list
    plan.entries = planEntries(data.entries);
    step.stale.push(plan);
    return plan;
  }

  function permissionRequest(event, data) {
    const call = isObject(data.toolCall) ? data.toolCall : {};
    const request = str(data.request);
    // What is being approved: the proposed content, the command, the files it touches. A
    // request may omit content that an earlier tool_call of this turn carried.
    const key = `${turn}:${str(call.toolCallId)}`;
    const card = tools.get(key);
    const known = card ? card.call : {};
    const offered = [];
    for (const option of Array.isArray(data.options) ? data.options : []) {
      if (!isObject(option) || typeof option.optionId !== "string") continue;
      const kind = typeof option.kind === "string" ? option.kind : "";
      offered.push({ id: option.optionId, kind, name: str(option.name) || option.optionId });
    }
    const block = {
      kind: "permission", seq: event.seq, request,
      title: paths.scrub(str(call.title)) || "use a tool",
      details: {
        title: call.title,
        kind: typeof call.kind === "string" ? call.kind : known.kind,
        // A diff is shown once: in the tool card when it has one (see toolCall).
        content: withoutDiffsIf(
          hasDiff(known.content),
          Array.isArray(call.content) && call.content.length ? call.content : known.content,
        ),
        locations: Array.isArray(call.locations) ? call.locations : known.locations,
        rawInput: isObject(call.rawInput) ? call.rawInput : known.rawInput,
      },
      offered, answer: "", answerText: "", chosen: null,
    };
    if (request) permissions.set(request, block);
    asked.set(key, block);
    return append(block);
  }

  function hasDiff(content) {
    return Array.isArray(content) && content.some((item) => isObject(item) && item.type === "diff");
  }

  function withoutDiffsIf(drop, content) {
    if (!drop || !Array.isArray(content)) return content;
    return content.filter((item) => !(isObject(item) && item.type === "diff"));
  }

  function closePermission(block, answer, text) {
    block.answer = answer;
    block.answerText = text;
    step.updated.push(block);
  }

  function permissionAnswer(data) {
    const block = permissions.get(str(data.request));
    if (!block) return note("An answer to a question this page never showed.");
    const optionId = typeof data.option === "string" ? data.option : "";
    if (!optionId && data.reason === "withdrawn") {
      closePermission(block, "withdrawn", "Withdrawn: the agent no longer needs an answer.");
    } else if (!optionId && data.reason === "interrupted") {
      // Craft cut the turn short: the agent_error that follows says why (see agentError).
      closePermission(block, "interrupted", "Not answered: the turn was cut short.");
      interruptedCards.push(block);
    } else if (!optionId) {
      closePermission(block, "cancelled", "Cancelled: the turn was stopped.");
    } else {
      const offered = block.offered.find((o) => o.id === optionId);
      // The agent's own name for the option, after what choosing it means when ACP says.
      const text = !offered ? "Answered."
        : ANSWERS[offered.kind] ? `${ANSWERS[offered.kind]} (${offered.name})`
          : `You chose: ${offered.name}`;
      block.chosen = optionId;
      closePermission(block, optionId, text);
    }
    return block;
  }

  // The agent asks the person for information: a form of fields (sandboxes/elicitation.py
  // read it: every field has a known type or is "unsupported"), or a URL to open.
  function elicitationRequest(event, data) {
    const request = str(data.request);
    const url = data.mode === "url" && typeof data.url === "string" ? data.url : "";
    let host = "";
    try {
      host = url ? new URL(url).host : "";
    } catch {
      host = "";
    }
    const fields = (Array.isArray(data.fields) ? data.fields : []).filter(isObject).map((f) => ({
      ...f, name: str(f.name), title: str(f.title) || str(f.name), description: str(f.description),
      type: ["string", "number", "integer", "boolean", "enum"].includes(f.type) ? f.type : "unsupported",
      options: Array.isArray(f.options) ? f.options.filter(isObject).map((o) => ({ value: str(o.value), title: str(o.title) || str(o.value) })) : [],
      required: f.required === true,
    }));
    const refused = typeof data.refused === "string" ? data.refused : "";
    const block = {
      kind: "elicitation", seq: event.seq, request,
      mode: data.mode === "url" ? "url" : data.mode === "form" ? "form" : "other",
      message: str(data.message), fields, url: host && /^https?:$/.test(new URL(url).protocol) ? url : "",
      host, refused, answerable: !refused && data.answerable !== false,
      elicitationId: str(data.elicitationId), completed: false,
      answer: refused ? "refused" : "", answerText: refused ? `Craft could not show this request: ${refused}.` : "",
    };
    if (request && !refused) elicitations.set(request, block);
    return append(block);
  }

  function elicitationAnswer(data) {
    const block = elicitations.get(str(data.request));
    if (!block) return note("An answer to a question this page never showed.");
    const action = str(data.action);
    const reason = str(data.reason);
    if (reason === "interrupted") {
      closePermission(block, "interrupted", "Not answered: the turn was cut short.");
      interruptedCards.push(block);
    } else if (reason === "withdrawn") {
      closePermission(block, "withdrawn", "Withdrawn: the agent no longer needs an answer.");
    } else if (reason === "turn_cancelled") {
      closePermission(block, "cancelled", "Cancelled: the turn was stopped.");
    } else if (reason) {
      closePermission(block, "expired", "No longer open: the turn ended.");
    } else if (action === "accept") {
      block.content = isObject(data.content) ? data.content : null;
      closePermission(block, "accept", block.mode === "url" ? "You agreed to open the link." : "You sent your answers.");
    } else if (action === "decline") {
      closePermission(block, "decline", "You declined.");
    } else {
      closePermission(block, "cancel", "You dismissed it.");
    }
    return block;
  }

  // The agent says the out-of-band part of a link it asked to open is done.
  function elicitationComplete(data) {
    const id = str(data.elicitationId);
    const block = [...elicitations.values()].find((b) => b.mode === "url" && id && b.elicitationId === id);
    if (!block || block.completed) return quietBlock();
    block.completed = true;
    block.answerText = `${block.answerText || ""} The agent says it is done.`.trim();
    step.updated.push(block);
    return block;
  }

  function turnEnd(event, data) {
    const reason = str(data.stop_reason);
    const ended = timeOf(event);
    const took = fold.turnStartedAt !== null && ended - fold.turnStartedAt >= 1000
      ? duration(ended - fold.turnStartedAt) : null;
    for (const block of [...permissions.values(), ...elicitations.values()]) {
      if (block.answer === "") closePermission(block, "expired", "No longer open: the turn ended.");
    }
    // A tool the agent never finished must not look like it is still running.
    for (const card of turnTools) {
      if (card.status === "pending" || card.status === "in_progress") {
        card.badge = "Not finished";
        step.updated.push(card);
      }
    }
    // The turn's prompt, for "Retry" after a turn that did not end well.
    const prompt = lastPrompt;
    const retry = ["error", "interrupted", "max_tokens", "max_turn_requests", "refusal"].includes(reason) && prompt
      ? { text: prompt.text, files: prompt.files } : null;
    return append({ kind: "turn_end", reason, label: STOP_REASONS[reason] || "The turn ended", took, retry });
  }

  // An agent error says why in the person's words and what to do next (words.mjs); the
  // agent's own words (its answer, its stderr) are kept for everyone, Craft's technical ones
  // for staff. When Craft cut
  // the turn short, the permission requests it left open say why too.
  function agentError(data) {
    const message = str(data.message);
    // What the agent wrote to stderr (docs/websocket-api.md): its line that says what went
    // wrong, for everyone, and the whole of what Craft kept, under Details.
    const wrote = str(data.stderr_line);
    // The keys its catalog entry asks for, when it wants a sign-in (the Keys page has them).
    const keys = (Array.isArray(data.keys) ? data.keys : []).filter(isObject)
      .map((k) => ({ name: str(k.name), label: str(k.label) })).filter((k) => k.name);
    const wording = agentErrorWording(message, str(data.reason), wrote, keys);
    if (wording.card) {
      for (const block of interruptedCards) {
        block.answerText = `Not answered: ${wording.card}.`;
        step.updated.push(block);
      }
    }
    interruptedCards = [];
    // An agent that wants authentication names the ways it offers (docs/acp.md).
    const methods = (Array.isArray(data.authMethods) ? data.authMethods : []).filter(isObject)
      .map((m) => ({ name: str(m.name) || str(m.id), description: str(m.description) }))
      .filter((m) => m.name);
    return append({
      kind: "error", summary: wording.summary, next: wording.next, cause: wording.cause || "",
      said: wording.agentSaid ? message : "", detail: wording.agentSaid || wording.cause ? "" : message,
      methods, wrote, stderr: str(data.stderr), keys,
    });
  }

  // What a turn changed in the workspace (its checkpoint), as one note: how many files, and
  // each with its +/- lines. The workspace panel will show the diffs.
  // What a turn (turn_changes) or a revert (workspace_reverted) changed in the workspace: one
  // "changes" block, drawn as a chip that opens it in the workspace panel. `seq` names the
  // change for the diff and revert endpoints: the turn's user_message, or the revert's event.
  function workspaceChanges(event, data, reverted) {
    const files = (Array.isArray(data.files) ? data.files : []).filter(isObject).map((file) => ({
      path: str(file.path), oldPath: file.status === "renamed" ? str(file.old_path) : "",
      status: ["added", "modified", "deleted", "renamed"].includes(file.status) ? file.status : "modified",
      added: Number(file.added) || 0, removed: Number(file.removed) || 0, binary: file.binary === true,
    }));
    const truncated = data.truncated === true;
    const turnSeq = Number.isSafeInteger(data.turn) ? data.turn : 0;
    const leftOut = Array.isArray(data.left_out) ? data.left_out.map(str) : [];
    const skipped = typeof data.skipped === "string" ? data.skipped : "";
    const count = `${files.length}${truncated ? "+" : ""} ${files.length === 1 && !truncated ? "file" : "files"}`;
    let text = `${count} changed`;
    if (skipped) text = "No checkpoint of the files after this turn.";
    else if (reverted) text = `Reverted ${revertedWhat(data, turnSeq)}: ${count} changed`;
    const lines = files.map((file) => {
      const moved = file.oldPath ? `${file.oldPath} → ${file.path}` : file.path;
      return `${file.status}: ${moved} (${file.binary ? "binary" : `+${file.added} −${file.removed}`})`;
    });
    if (truncated) lines.push("… and more");
    if (leftOut.length) lines.push(`left out (too large): ${leftOut.join(", ")}`);
    const block = {
      kind: "changes", seq: reverted ? event.seq : turnSeq, turn: turnSeq, reverted,
      prompt: reverted ? "" : prompts.get(turnSeq) || "", path: reverted ? str(data.path) : "",
      files, truncated, leftOut, skipped, text, detail: skipped || lines.join("\n"),
      revertedBy: [], affects: [],
    };
    if (reverted && !Number.isSafeInteger(data.hunk)) markReverted(block);
    fold.changes.push(block);
    return append(block);
  }

  // A revert of a whole change or of one file of it: that change (or file) is as it was
  // before, so the panel offers no revert of it again. Undoing a revert (a revert of the
  // revert) brings back what that revert had set aside. `affects` names the changes whose
  // items the panel draws again.
  function markReverted(block) {
    const target = fold.changes.find((c) => c.seq === block.turn);
    if (!target) return;
    target.revertedBy.push({ path: block.path, by: block.seq });
    block.affects.push(target.seq);
    if (!target.reverted) return;
    const undone = fold.changes.find((c) => c.seq === target.turn);
    if (!undone) return;
    undone.revertedBy = undone.revertedBy.filter((r) => r.by !== target.seq);
    block.affects.push(undone.seq);
  }

  function revertedWhat(data, turnSeq) {
    const what = Number.isSafeInteger(data.hunk) ? `a change to ${str(data.path)}`
      : typeof data.path === "string" && data.path ? str(data.path) : "the files";
    const reverted = fold.changes.find((c) => c.seq === turnSeq && c.reverted);
    return `${what} to before ${reverted ? "a revert" : "a turn"}`;
  }

  // --- going back (docs/workbench.md) --------------------------------------------------------

  // The session went back to just after turn `to`: the blocks of the turns it set aside are
  // marked (the page collapses them), and its own block says so. Its files are a change the
  // Changes tab lists, as a revert's are.
  function rewound(event, data) {
    const turns = (Array.isArray(data.turns) ? data.turns : []).filter(Number.isSafeInteger);
    for (const seq of turns) {
      for (const block of turnBlocks.get(seq) || []) {
        block.rewound = true;
        step.updated.push(block);
      }
    }
    turnSeq = 0; // what follows belongs to no turn set aside
    const to = Number.isSafeInteger(data.to) ? data.to : 0;
    const n = turns.length;
    const prompt = prompts.get(to);
    const block = append({
      kind: "rewound", seq: event.seq, to, turns,
      text: `Rewound to ${prompt ? `“${prompt}”` : "an earlier turn"}: ${n} later ${n === 1 ? "turn" : "turns"} set aside. The agent remembers nothing of ${n === 1 ? "it" : "them"}.`,
    });
    fold.changes.push({
      kind: "changes", seq: event.seq, turn: to, reverted: true, prompt: "", path: "",
      files: (Array.isArray(data.files) ? data.files : []).filter(isObject).map((file) => ({
        path: str(file.path), oldPath: file.status === "renamed" ? str(file.old_path) : "",
        status: ["added", "modified", "deleted", "renamed"].includes(file.status) ? file.status : "modified",
        added: Number(file.added) || 0, removed: Number(file.removed) || 0, binary: file.binary === true,
      })),
      truncated: data.truncated === true, leftOut: [], skipped: "", text: "Rewound the files", detail: "",
      revertedBy: [], affects: [],
    });
    return block;
  }

  // The session is a fork of another, from one of its turns.
  function forked(data) {
    const title = str(data.title);
    const from = typeof data.from === "string" && /^[0-9a-f-]{36}$/.test(data.from) ? data.from : "";
    turnSeq = 0;
    return append({
      kind: "forked", from, before: data.before === true,
      text: `Forked from ${title ? `“${title}”` : "another session"}${data.before === true ? ", from just before a message" : ""}. What follows is this session's own.`,
    });
  }

  // --- the session's repository (docs/repositories.md) ---------------------------------------

  function repositoryState() {
    if (!fold.repository) fold.repository = repositoryFrom({});
    step.repository = true;
    return fold.repository;
  }

  // How the clone is getting on: the header shows it, the transcript does not.
  function repositoryStatus(data) {
    const status = str(data.status);
    if (!REPOSITORY_STATUSES.has(status)) return quietBlock();
    const repo = repositoryState();
    repo.status = status;
    if (status === "cloning" && isObject(data.progress)) {
      const p = data.progress;
      repo.progress = {
        phase: str(p.phase), text: str(p.text),
        percent: Number.isFinite(p.percent) ? Math.max(0, Math.min(100, Math.round(p.percent))) : null,
      };
    } else if (status === "cloning") {
      if (httpUrl(data.url)) Object.assign(repo, { url: data.url, name: repositoryName(data.url) });
      if (typeof data.branch === "string" && data.branch) repo.branch = data.branch;
      if (typeof data.base === "string" && data.base) repo.base = data.base;
      Object.assign(repo, { progress: null, output: "", command: "", setup: null, code: "", reason: "" });
    } else if (status === "setting_up" && typeof data.output === "string") {
      const room = MAX_SETUP_OUTPUT_CHARS - repo.output.length;
      if (room > 0) repo.output += data.output.length > room ? data.output.slice(0, room) : data.output;
    } else if (status === "setting_up") {
      Object.assign(repo, { progress: null, command: str(data.command), output: "" });
    } else if (status === "ready") {
      repo.progress = null;
      repo.commit = str(data.commit);
      repo.head = repo.commit;
      if (typeof data.branch === "string" && data.branch) repo.branch = data.branch;
      if (typeof data.base === "string" && data.base) repo.base = data.base;
      const setup = isObject(data.setup) ? data.setup : null;
      repo.setup = setup && {
        command: str(setup.command), ok: setup.ok === true, timedOut: setup.timed_out === true,
        exitCode: Number.isSafeInteger(setup.exit_code) ? setup.exit_code : null, tail: str(setup.tail),
      };
    } else if (status === "failed") {
      Object.assign(repo, { progress: null, code: str(data.code), reason: str(data.reason) || "The repository could not be cloned." });
    }
    return quietBlock();
  }

  // What Craft did with the session's branch, and its pull request: a card each.
  function repositoryWork(kind, data) {
    const repo = repositoryState();
    const branch = str(data.branch) || repo.branch;
    const card = { kind: "repository", action: kind, text: "", detail: "", link: "", linkText: "", conflicts: [] };
    if (kind === "repository_committed") {
      repo.head = str(data.commit);
      card.text = `Committed ${shortCommit(data.commit)} to ${branch}`;
      card.detail = str(data.message);
    } else if (kind === "repository_pushed") {
      repo.head = str(data.head) || repo.head;
      card.text = `Pushed ${branch} (${shortCommit(data.head)})`;
    } else if (kind === "repository_updated") {
      repo.head = str(data.head) || repo.head;
      const base = str(data.base) || repo.base || "the base branch";
      card.conflicts = (Array.isArray(data.conflicts) ? data.conflicts : []).filter((p) => typeof p === "string" && p);
      const n = card.conflicts.length;
      card.text = n
        ? `Updated from ${base}: ${n} ${n === 1 ? "file is" : "files are"} in conflict, left to resolve`
        : `Updated from ${base} (${shortCommit(data.head)})`;
    } else {
      const number = Number.isSafeInteger(data.number) ? data.number : null;
      const state = PULL_REQUEST_STATES[data.state] ? data.state : "open";
      const url = httpUrl(data.url) ? data.url : "";
      repo.pullRequest = { url, number, state };
      const name = number === null ? "Pull request" : `Pull request #${number}`;
      card.state = state;
      card.text = kind === "pull_request_opened" ? `${name} opened` : `${name} is now ${PULL_REQUEST_STATES[state].toLowerCase()}`;
      card.link = url;
      card.linkText = url ? "Open it" : "";
    }
    return append(card);
  }

  function note(text, detail = "") {
    return append({ kind: "other", text, detail });
  }

  function agentRestarted(data) {
    const restored = str(data.restored);
    return append({ kind: "restart", restored, label: RESTARTS[restored] || "Agent restarted" });
  }

  function sessionTitle(data) {
    if (typeof data.title === "string" && data.title.trim()) step.title = data.title;
    return quietBlock();
  }

  // The agent's controls: the fold keeps the newest state, controls.mjs shows it.
  function followControls(kind, data) {
    const agent = fold.agent;
    if (kind === "agent_info") {
      agent.started = true;
      agent.prompt = isObject(data.promptCapabilities) ? data.promptCapabilities : {};
      agent.configOptions = Array.isArray(data.configOptions) ? data.configOptions.filter(isObject) : null;
      agent.modes = isObject(data.modes) ? data.modes : null;
    } else if ((kind === "config_option_update" || kind === "config_options_update") && Array.isArray(data.configOptions)) {
      agent.configOptions = data.configOptions.filter(isObject);
    } else if (kind === "current_mode_update") {
      const mode = typeof data.currentModeId === "string" ? data.currentModeId : data.modeId;
      if (agent.modes && typeof mode === "string") agent.modes = { ...agent.modes, currentModeId: mode };
    } else if (kind === "available_commands_update" && Array.isArray(data.availableCommands)) {
      agent.commands = data.availableCommands.filter((c) => isObject(c) && typeof c.name === "string" && c.name);
    } else if (kind === "usage_update") {
      agent.usage = data;
    }
    step.controls = true;
  }

  /** Fold the whole of an event that was delivered cut short into its block (`block`, as
   *  apply() gave it). Return whether the block changed, so must be drawn again. */
  function refold(block, event) {
    const data = isObject(event.data) ? event.data : {};
    if (block.parts) {
      const part = block.parts.find((p) => p.seq === event.seq);
      const text = event.kind === "user_message" ? str(data.text) : textOf(data);
      if (part) part.text = text;
      block.text = block.parts.map((p) => p.text).join("");
      return true;
    }
    if (block.kind === "tool" && Array.isArray(data.content) && block.contentSeq === event.seq) {
      block.call.content = data.content;
      return true;
    }
    if (block.kind === "permission" && isObject(data.toolCall)) {
      block.details = data.toolCall;
      return true;
    }
    if (block.kind === "plan" && Array.isArray(data.entries)) {
      block.entries = planEntries(data.entries);
      return true;
    }
    return false;
  }

  return fold;
}

function httpUrl(value) {
  return typeof value === "string" && /^https?:\/\/[^\s/]/i.test(value);
}

// A repository as the page was rendered with it (the API's shape) into the fold's shape.
function repositoryFrom(row) {
  const url = httpUrl(row.url) ? row.url : "";
  const pr = isObject(row.pull_request) ? row.pull_request : null;
  const status = REPOSITORY_STATUSES.has(row.status) ? row.status : "pending";
  return {
    url, name: str(row.path) || repositoryName(url), branch: str(row.branch), base: str(row.base),
    status, progress: null, command: "", output: "", setup: null, commit: str(row.commit),
    head: str(row.commit), code: status === "failed" ? str(row.failure) : "",
    reason: status === "failed" ? str(row.detail) : "",
    pullRequest: pr && {
      url: httpUrl(pr.url) ? pr.url : "", number: Number.isSafeInteger(pr.number) ? pr.number : null,
      state: PULL_REQUEST_STATES[pr.state] ? pr.state : "open",
    },
  };
}
