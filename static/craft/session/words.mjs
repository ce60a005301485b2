// The words a person reads: what the page calls the agent's kinds, statuses and endings, what
// it says when the server refuses a frame, and how it writes sizes and durations.

export const TOOL_KINDS = {
  read: "Read", edit: "Edit", delete: "Delete", move: "Move", search: "Search",
  execute: "Run", think: "Think", fetch: "Fetch", switch_mode: "Mode", other: "Tool",
};
export const TOOL_STATUS = { pending: "Waiting", in_progress: "Running", completed: "Done", failed: "Failed" };
export const PLAN_STATUS = { pending: "to do", in_progress: "in progress", completed: "done" };
export const STOP_REASONS = {
  end_turn: "Done",
  cancelled: "Stopped",
  max_tokens: "Stopped: the reply reached its length limit",
  max_turn_requests: "Stopped: the agent took too many steps in one turn",
  refusal: "The agent declined to continue",
  error: "Ended with an error",
  interrupted: "Interrupted",
};
export const ANSWERS = {
  allow_once: "You allowed this once",
  allow_always: "You allowed this from now on",
  reject_once: "You rejected this",
  reject_always: "You rejected this from now on",
};
export const FRAME_ERRORS = {
  turn_running: "The agent is still working on your previous message. Wait for it, or press Stop.",
  sandbox_starting: "Your sandbox is still starting. Your message is kept: send it when the sandbox is ready.",
  queue_full: "20 messages are already waiting. Your message is kept: send it when some have run, or remove some.",
  not_queued: "That message had already been sent to the agent, so it could not be changed.",
  empty_prompt: "Type a message first.",
  prompt_too_long: "That message is too long for the agent. It's still in the box: shorten it and send again.",
  unknown_request: "That question is no longer open: the agent has moved on.",
  invalid_option: "That answer isn't one the agent offered.",
  invalid_content: "The agent can't take those answers:",
  bad_attachment: "One of the attachments can't be sent: files must be inside the workspace, images PNG, JPEG, GIF or WebP.",
  too_many_attachments: "That's too many attachments for one message (at most 10).",
  attachment_too_large: "The images are too large to send (at most 2 MB each).",
  attachments_not_supported: "This agent does not accept images.",
  no_config_options: "The agent doesn't offer that setting any more.",
  unknown_config: "The agent doesn't offer that setting any more.",
  invalid_value: "The agent doesn't offer that choice any more.",
  no_modes: "The agent doesn't offer modes any more.",
  unknown_mode: "The agent doesn't offer that mode any more.",
  agent_refused: "The agent did not accept that change.",
  agent_starting: "The agent is starting. Try again in a moment.",
  agent_unavailable: "The agent could not start, so the change was not made.",
  agent_not_started: "The agent could not start. Your first message will try again.",
  credentials_missing: "This session's agent needs a key you have not stored.",
  disk_full: "Your sandbox's files take more disk than its limit, so the agent takes no new message. Delete sessions you no longer need.",
  session_deleted: "This session was deleted (in another tab or window), with its conversation and files. Start a new session to carry on.",
  shutting_down: "The server is restarting. Your message is kept: send it again once the page has reconnected.",
  unavailable: "The server running this session does not answer. Your message is kept: send it again in a moment.",
};
export const RESTARTS = {
  resume: "Agent restarted — context restored",
  load: "Agent restarted — context restored",
  none: "Agent restarted — the agent starts fresh",
};

// Why Craft cut a turn short (an agent_error's `reason`), in the person's words, and what to
// do next. `card`: what an open permission request the turn left says.
const SEND_AGAIN = "Send your message again to carry on.";
const NEW_SANDBOX = "Send a message to carry on: a new sandbox starts for this session and the conversation stays here (the files of the old sandbox are gone).";
export const INTERRUPTIONS = {
  server_restarted: {
    summary: "The server restarted while the agent was working, so this turn was cut short.",
    next: SEND_AGAIN, card: "the server restarted",
  },
  server_lost: {
    summary: "The server running this turn stopped responding, so the turn was cut short.",
    next: SEND_AGAIN, card: "the server stopped responding",
  },
  server_shutdown: {
    summary: "The server shut down (a restart or an update) while the agent was working, so this turn was cut short.",
    next: "Send your message again in a moment, once the page has reconnected.", card: "the server shut down",
  },
  sandbox_stopped_by_staff: {
    summary: "An administrator stopped your sandbox, so this turn was cut short.",
    next: NEW_SANDBOX, card: "an administrator stopped your sandbox",
  },
  sandbox_stopped: {
    summary: "Your sandbox was stopped, so this turn was cut short.",
    next: NEW_SANDBOX, card: "your sandbox was stopped",
  },
};
// Craft's own messages from before agent errors had a reason.
const INTERRUPTION_MESSAGES = {
  "This turn was interrupted: the server restarted.": "server_restarted",
  "This turn was interrupted: the server running it stopped responding.": "server_lost",
  "The server shut down during this turn.": "server_shutdown",
};
// What agents (and the model providers behind them) say when a key or a quota is the problem.
// ACP's `auth_required` is JSON-RPC error -32000.
const AUTH_REFUSED = /\(code -32000\)|auth_required|authentication required|\b401\b|unauthori[sz]ed|(invalid|incorrect|expired|missing|no)[ _-]?(x-)?api[ _-]?key|api[ _-]?key.{0,40}(invalid|expired|not valid|refused|rejected|missing)/i;
const RATE_LIMITED = /\b429\b|rate[ _-]?limit|too many requests|quota/i;

/** Return what a person is told about an `agent_error` with this message and reason: a
 *  `summary`, what to do `next`, whether the message is the agent's own words (`agentSaid`:
 *  shown to everyone; Craft's technical messages are for staff), and, when Craft cut the turn
 *  short, its `cause` (an INTERRUPTIONS key). `wrote`, the line of the agent's stderr that
 *  says what went wrong, tells a refused key or a rate limit that its answer did not name
 *  (Codex answers "Internal error" and logs the model provider's 401). */
export function agentErrorWording(message, reason, wrote = "", keys = []) {
  const said = String(message || "");
  if (reason === "auth_required") {
    // The keys its catalog entry asks for (docs/agents.md), which the person stores.
    const named = keys.map((key) => key.label || key.name).filter(Boolean);
    return {
      summary: "The agent needs you to sign in first.", agentSaid: false,
      next: named.length
        ? `It signs in with your ${named.join(", ")}: check it on the Keys page (it may be wrong or expired), then send your message again.`
        : "Set up one of the ways it offers (an API key on the Keys page, say), then send your message again.",
    };
  }
  const cause = INTERRUPTIONS[reason] ? reason : INTERRUPTION_MESSAGES[said];
  if (cause) return { ...INTERRUPTIONS[cause], cause, agentSaid: false };
  const text = said.toLowerCase();
  const craft = (summary, next) => ({ summary, next, agentSaid: false });
  if (text.startsWith("agent exited") || text.includes("agent is not running") || text === "agent connection stopped")
    return craft("The agent stopped unexpectedly.", "Send your message again: a new agent starts, with this conversation if it can.");
  if (text.startsWith("agent did not start")) {
    // What it wrote says why; an agent that fails the same way again is not set up right.
    return craft("The agent could not start.", wrote
      ? "Try again in a moment. If it fails the same way, show its details to whoever runs Craft: the agent is not set up right."
      : "Try again in a moment.");
  }
  if (text.includes("sandbox is "))
    return craft("This session's sandbox is not running, so the agent can't work here.", NEW_SANDBOX);
  if (text.includes("no answer within") || text.includes("no message from the agent"))
    return craft("The agent stopped responding.", SEND_AGAIN);
  // Craft's own ("internal error: …"), not an agent's JSON-RPC "Internal error" (-32603).
  if (said.startsWith("internal error: ")) return craft("Something went wrong in Craft.", "Try again in a moment.");
  const agent = (summary, next) => ({ summary, next, agentSaid: Boolean(said) });
  const words = `${said}\n${String(wrote || "")}`;
  if (AUTH_REFUSED.test(words))
    return agent("The model provider refused your API key.", "Check the key the agent uses (it may be wrong or expired), then send your message again.");
  if (RATE_LIMITED.test(words))
    return agent("The model provider is rate limiting the agent.", "Wait a minute, then send your message again.");
  if (!said) return craft("The agent ran into a problem.", SEND_AGAIN);
  return agent("The agent reported an error.", "Send your message again, or change it.");
}

const numberFormat = new Intl.NumberFormat(); // once: toLocaleString builds one per call

export function formatNumber(number) {
  return numberFormat.format(number);
}

export function formatBytes(bytes) {
  if (bytes >= 1e6) return `${(bytes / 1e6).toFixed(1)} MB`;
  if (bytes >= 1e3) return `${Math.round(bytes / 1e3)} kB`;
  return `${bytes} bytes`;
}

export function formatSize(chars) {
  if (chars >= 1e6) return `${(chars / 1e6).toFixed(1)} MB`;
  if (chars >= 1e3) return `${Math.round(chars / 1e3)} kB`;
  return `${chars} characters`;
}

export function duration(ms) {
  const seconds = Math.round(ms / 1000);
  if (seconds < 60) return `${seconds} s`;
  return `${Math.floor(seconds / 60)} min ${seconds % 60} s`;
}

// A session's repository (docs/repositories.md): how far its clone got, its pull request.
export const REPOSITORY_STATUS = {
  pending: "Waiting to clone",
  cloning: "Cloning…",
  setting_up: "Setting up…",
  ready: "Ready",
  failed: "Clone failed",
};
export const PULL_REQUEST_STATES = { open: "Open", merged: "Merged", closed: "Closed" };
// What a refused repository action means to the person, where the server's own message is
// not the best thing to say (otherwise its message is shown: it is fit to show).
export const REPOSITORY_ERRORS = {
  nothing_to_commit: "Nothing to commit: the workspace has no changes since the last commit.",
  turn_running: "The agent is working: try again once its turn ends.",
};

/** Return "owner/name" of a repository's URL (its last two path segments, without ".git"),
 *  or the URL itself when it has no such path. */
export function repositoryName(url) {
  const text = typeof url === "string" ? url : "";
  const match = /^[a-z]+:\/\/[^/]+\/(.+?)(?:\.git)?\/*$/i.exec(text);
  if (!match) return text;
  const parts = match[1].split("/").filter(Boolean);
  return parts.slice(-2).join("/");
}

/** Return a commit's short form (its first 7 hex digits). */
export function shortCommit(commit) {
  return typeof commit === "string" ? commit.slice(0, 7) : "";
}
