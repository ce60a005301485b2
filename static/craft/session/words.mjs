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
};
export const RESTARTS = {
  resume: "Agent restarted — context restored",
  load: "Agent restarted — context restored",
  none: "Agent restarted — the agent starts fresh",
};

/** Return what a person is told about an `agent_error` (its message is for staff). */
export function agentErrorSummary(message) {
  const text = String(message || "").toLowerCase();
  if (text.startsWith("agent exited") || text.includes("agent is not running"))
    return "The agent stopped unexpectedly.";
  if (text.startsWith("agent did not start")) return "The agent could not start.";
  if (text.includes("sandbox is "))
    return "This session's sandbox is not running, so the agent can't work here.";
  if (text.includes("no answer within") || text.includes("no message from the agent"))
    return "The agent stopped responding.";
  if (text.startsWith("internal error")) return "Something went wrong in Craft.";
  return "The agent ran into a problem.";
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
