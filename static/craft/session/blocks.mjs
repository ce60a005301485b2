// How each kind of block of the fold (fold.mjs) looks: the element it is drawn as, and what
// changes in it when a later event changes the block. Drawing a block gives a record of its
// parts ({element, marks, body, ...}) that render.mjs keeps beside it.

import { fillCollapsible, writePlain } from "./collapsible.mjs";
import { el } from "./dom.mjs";
import { renderToolBody } from "./tool-body.mjs";
import { ANSWERS, PLAN_STATUS } from "./words.mjs";

// Built once: creating a formatter per call (toLocaleTimeString) is slow in long sessions.
const clockFormat = new Intl.DateTimeFormat([], { hour: "2-digit", minute: "2-digit" });
const dateFormat = new Intl.DateTimeFormat([], { dateStyle: "medium", timeStyle: "short" });

function timeElement(ms) {
  const date = new Date(ms);
  const node = el("time", "", clockFormat.format(date));
  node.dateTime = date.toISOString();
  node.title = dateFormat.format(date);
  return node;
}

/** Return how blocks are drawn for a session whose paths `paths` makes readable; technical
 *  detail is shown to `staff` only; `keysUrl` is the Keys page, where keys an agent wants go. */
export function blockDrawing({ paths, staff, keysUrl = "" }) {
  // An element with the hidden holder of its events' marks.
  function newRecord(block, tag, className) {
    const element = el(tag, className);
    element.setAttribute("data-kind", block.kind);
    const marks = el("span", "marks");
    marks.hidden = true;
    element.appendChild(marks);
    return { element, marks };
  }

  function technicalDetails(parent, text) {
    if (!staff || !text) return;
    const details = parent.appendChild(el("details", "tech"));
    details.appendChild(el("summary", "", "Details"));
    details.appendChild(el("pre", "", paths.scrubHostPaths(text)));
  }

  // An error's Details: Craft's own message for staff, and for everyone what the agent wrote
  // to stderr (its own words, host paths cut). The stderr scrolls inside a box that keyboard
  // users can reach and scroll too.
  function errorDetails(parent, block) {
    const detail = staff ? block.detail : "";
    if (!detail && !block.stderr) return;
    const details = parent.appendChild(el("details", "tech"));
    details.appendChild(el("summary", "", "Details"));
    if (detail) details.appendChild(el("pre", "", paths.scrubHostPaths(detail)));
    if (!block.stderr) return;
    details.appendChild(el("p", "tech-label", "What the agent last wrote to its error output (stderr):"));
    const output = details.appendChild(el("pre", "stderr", paths.scrubHostPaths(block.stderr)));
    output.tabIndex = 0;
    output.setAttribute("aria-label", "The agent's error output");
  }

  // Buttons of a whole message (render.mjs handles their clicks): [label, class, aria-label].
  function messageActions(parent, actions) {
    const holder = parent.appendChild(el("span", "msg-actions"));
    for (const [label, className, description] of actions) {
      const button = holder.appendChild(el("button", className, label));
      button.type = "button";
      button.setAttribute("aria-label", description);
    }
  }

  const BUILDERS = {
    user(block) {
      const record = newRecord(block, "div", "msg user");
      const { element } = record;
      record.body = element.appendChild(el("div", "bubble"));
      renderBody(block, record);
      if (block.attachments.length) {
        element.appendChild(el("p", "msg-attachments", `Attached: ${block.attachments.join(", ")}`));
      }
      const meta = element.appendChild(el("div", "msg-meta"));
      meta.appendChild(timeElement(block.time));
      messageActions(meta, [["Copy", "msg-copy", "Copy your message"],
        ["Edit", "msg-edit", "Edit and send again: a fork of this session from just before this message"],
        ["Rewind here", "msg-rewind", "Rewind here: the files and the agent go back to just after this message's turn"],
        ["Fork from here", "msg-fork", "Fork from here: a new session with the conversation and the files as they were just after this message's turn"]]);
      return record;
    },
    rewound(block) {
      const record = newRecord(block, "div", "divider going-back");
      record.element.appendChild(el("span", "", block.text));
      if (block.turns.length) {
        const toggle = record.element.appendChild(el("button", "rewound-toggle", "Show them"));
        toggle.type = "button";
        toggle.setAttribute("aria-expanded", "false");
      }
      return record;
    },
    forked(block) {
      const record = newRecord(block, "div", "divider going-back");
      record.element.appendChild(el("span", "", block.text));
      if (block.from) {
        const link = record.element.appendChild(el("a", "", "Open the original"));
        link.href = `../${block.from}/`;
      }
      return record;
    },
    agent(block) {
      const record = newRecord(block, "div", "msg agent");
      const body = record.element.appendChild(el("div", "bubble"));
      messageActions(record.element.appendChild(el("div", "msg-meta")),
        [["Copy", "msg-copy", "Copy the agent's message"]]);
      return Object.assign(record, { body, shown: null });
    },
    thought(block) {
      const record = newRecord(block, "details", "thought");
      record.element.appendChild(el("summary", "", block.thinking ? "Thinking…" : "Thought"));
      if (block.thinking) record.element.open = true;
      return Object.assign(record, { body: record.element.appendChild(el("div", "body")), shown: null });
    },
    tool(block) {
      const record = newRecord(block, "div", "tool");
      const { element } = record;
      element.dataset.toolCallId = block.toolCallId;
      const head = element.appendChild(el("div", "tool-head"));
      Object.assign(record, {
        label: head.appendChild(el("span", "tool-kind")),
        title: head.appendChild(el("span", "tool-title")),
        badge: head.appendChild(el("span", "badge")),
        body: element.appendChild(el("div", "tool-body")),
      });
      updateTool(block, record);
      return record;
    },
    plan(block) {
      const record = newRecord(block, "div", "plan");
      record.element.appendChild(el("div", "plan-title", "Plan")).appendChild(el("span", "plan-progress"));
      record.element.appendChild(el("ul"));
      return record;
    },
    permission(block) {
      const record = newRecord(block, "div", "permission");
      const { element } = record;
      element.dataset.request = block.request;
      element.dataset.answer = "";
      const question = element.appendChild(el("div", "permission-q"));
      question.id = `permission-${block.seq}`;
      question.appendChild(el("span", "permission-label", "The agent asks for permission: "));
      question.appendChild(el("strong", "", block.title));
      record.body = element.appendChild(el("div", "permission-body"));
      renderBody(block, record);
      const options = element.appendChild(el("div", "options"));
      options.setAttribute("role", "group");
      options.setAttribute("aria-labelledby", question.id);
      for (const option of block.offered) {
        const button = options.appendChild(el("button", "option", option.name));
        if (ANSWERS[option.kind]) button.classList.add(option.kind);
        button.type = "button";
        button.dataset.option = option.id;
      }
      const answer = element.appendChild(el("div", "permission-answer"));
      answer.tabIndex = -1;
      return Object.assign(record, { answer });
    },
    elicitation(block) {
      // Everything the agent wrote goes in as text (el() sets textContent): labels and
      // messages with HTML in them read as what they are.
      const record = newRecord(block, "div", "elicitation");
      const { element } = record;
      element.dataset.request = block.request;
      element.dataset.mode = block.mode;
      element.dataset.answer = block.answer;
      const question = element.appendChild(el("div", "elicitation-q"));
      question.id = `elicitation-${block.seq}`;
      question.appendChild(el("span", "elicitation-label", block.mode === "url"
        ? "The agent asks you to open a link: " : "The agent asks for information: "));
      question.appendChild(el("strong", "", block.message || "(no message)"));
      const form = element.appendChild(el("form", "elicitation-form"));
      form.noValidate = false;
      form.setAttribute("aria-labelledby", question.id);
      if (block.mode === "form" && !block.refused) drawFields(block, form);
      if (block.mode === "url" && block.url) drawLink(block, form);
      if (!block.refused) {
        const actions = form.appendChild(el("div", "options"));
        for (const [action, label] of [["accept", block.mode === "url" ? "I opened it: accept" : "Send"],
          ["decline", "Decline"], ["cancel", "Dismiss"]]) {
          const button = actions.appendChild(el("button", `option ${action}`, label));
          button.type = action === "accept" ? "submit" : "button";
          button.dataset.action = action;
          if (action === "accept" && !block.answerable) button.disabled = true;
        }
        if (!block.answerable) {
          actions.appendChild(el("p", "muted", "This form asks for something this page can't show: you can only decline it."));
        }
      }
      const answer = element.appendChild(el("div", "elicitation-answer"));
      answer.tabIndex = -1;
      answer.textContent = block.answerText;
      if (block.answer) form.querySelectorAll("input, select, button").forEach((c) => (c.disabled = true));
      return Object.assign(record, { answer });
    },
    turn_end(block) {
      const record = newRecord(block, "div", "turn-end");
      record.element.dataset.reason = block.reason;
      record.element.appendChild(el("span", "label", block.label));
      if (block.took) record.element.appendChild(el("span", "turn-meta", ` · ${block.took}`));
      if (block.retry) {
        record.element.appendChild(el("span", "turn-meta", " · ")).setAttribute("aria-hidden", "true");
        const retry = record.element.appendChild(el("button", "turn-retry", "Retry"));
        retry.type = "button";
        retry.setAttribute("aria-label", "Retry: send the same message again");
      }
      return record;
    },
    error(block) {
      // Why, in the person's words, then what to do next; the agent's own words (its
      // answer, its stderr's line, the whole stderr under Details) for everyone (host paths
      // cut), Craft's technical detail for staff.
      const record = newRecord(block, "div", "agent-error");
      if (block.cause) record.element.dataset.cause = block.cause;
      record.element.appendChild(el("p", "", block.summary));
      if (block.said) {
        const said = paths.scrubHostPaths(block.said);
        const quote = record.element.appendChild(el("p", "error-said", "The agent said: "));
        quote.appendChild(el("q", "", said.length > 1000 ? `${said.slice(0, 999)}…` : said));
      }
      if (block.wrote) {
        const quote = record.element.appendChild(el("p", "error-said error-wrote", "Its error output says: "));
        quote.appendChild(el("q", "", paths.scrubHostPaths(block.wrote)));
      }
      if (block.next) {
        const next = record.element.appendChild(el("p", "error-next", block.next));
        if (block.keys.length && keysUrl) {
          next.append(" ");
          const link = next.appendChild(el("a", "", "Open Keys"));
          link.href = keysUrl;
        }
      }
      if (block.methods.length) {
        record.element.appendChild(el("p", "auth-methods-label", "Ways the agent offers to sign in:"));
        const list = record.element.appendChild(el("ul", "auth-methods"));
        for (const method of block.methods) {
          const item = list.appendChild(el("li", ""));
          item.appendChild(el("strong", "", method.name));
          if (method.description) item.appendChild(el("span", "", `: ${method.description}`));
        }
      }
      errorDetails(record.element, block);
      return record;
    },
    changes(block) {
      // "3 files changed": a chip that opens the change in the workspace panel.
      const record = newRecord(block, "div", "changes");
      record.element.dataset.reverted = String(block.reverted);
      if (block.files.length || block.truncated) {
        const chip = record.element.appendChild(el("button", "changes-chip", block.text));
        chip.type = "button";
        chip.dataset.change = String(block.seq);
        chip.setAttribute("aria-label", `${block.text}: show the changes`);
      } else {
        record.element.appendChild(el("span", "note", block.text));
      }
      technicalDetails(record.element, block.skipped);
      return record;
    },
    repository(block) {
      // What Craft did with the session's branch: a line, the commit's first line, the pull
      // request's link (http(s) only: fold.mjs), the files an update left in conflict (each
      // opens the file in the workspace panel: render.mjs).
      const record = newRecord(block, "div", "repo-card");
      record.element.dataset.action = block.action;
      if (block.state) record.element.dataset.state = block.state;
      const line = record.element.appendChild(el("p", "repo-card-text", block.text));
      if (block.detail) line.appendChild(el("q", "repo-card-detail", block.detail));
      if (block.link) {
        line.append(" ");
        const link = line.appendChild(el("a", "repo-card-link", block.linkText));
        link.href = block.link;
        link.target = "_blank";
        link.rel = "noopener noreferrer";
      }
      if (block.conflicts.length) {
        const list = record.element.appendChild(el("ul", "repo-conflicts"));
        for (const path of block.conflicts) {
          const button = list.appendChild(el("li")).appendChild(el("button", "repo-conflict link", path));
          button.type = "button";
          button.dataset.path = path;
          button.setAttribute("aria-label", `Open ${path} (in conflict)`);
        }
      }
      return record;
    },
    other(block) {
      const record = newRecord(block, "div", "note");
      record.element.appendChild(el("span", "", block.text));
      technicalDetails(record.element, block.detail);
      return record;
    },
    restart(block) {
      const record = newRecord(block, "p", "divider");
      record.element.dataset.restored = block.restored;
      record.element.appendChild(el("span", "", block.label));
      return record;
    },
    quiet(block) {
      const record = newRecord(block, "div", "quiet");
      record.element.hidden = true;
      return record;
    },
  };

  function drawFields(block, form) {
    block.fields.forEach((field, index) => {
      const id = `elicitation-${block.seq}-${index}`;
      const row = form.appendChild(el("div", "field"));
      row.dataset.type = field.type;
      const label = row.appendChild(el("label", "", field.title));
      label.htmlFor = id;
      if (field.required) label.appendChild(el("span", "required", " (required)"));
      let input = null;
      if (field.type === "enum") {
        input = el("select", "");
        if (!field.required || field.default === undefined) input.appendChild(el("option", "", "")).value = "";
        for (const option of field.options) {
          const node = input.appendChild(el("option", "", option.title));
          node.value = option.value;
          if (option.value === field.default) node.selected = true;
        }
      } else if (field.type === "boolean") {
        input = el("input", "");
        input.type = "checkbox";
        input.checked = field.default === true;
      } else if (field.type === "number" || field.type === "integer") {
        input = el("input", "");
        input.type = "number";
        input.step = field.type === "integer" ? "1" : "any";
        if (Number.isFinite(field.minimum)) input.min = String(field.minimum);
        if (Number.isFinite(field.maximum)) input.max = String(field.maximum);
        if (Number.isFinite(field.default)) input.value = String(field.default);
      } else if (field.type === "string") {
        input = el("input", "");
        input.type = field.format === "email" ? "email" : field.format === "uri" ? "url" : "text";
        if (Number.isSafeInteger(field.minLength)) input.minLength = field.minLength;
        if (Number.isSafeInteger(field.maxLength)) input.maxLength = field.maxLength;
        if (typeof field.default === "string") input.value = field.default;
      }
      if (input) {
        input.id = id;
        input.name = field.name;
        input.dataset.type = field.type;
        if (field.required && field.type !== "boolean") input.required = true;
        row.appendChild(input);
      } else {
        row.appendChild(el("p", "muted unsupported", `This page can't show this kind of field (${field.unsupported || "unknown"}).`));
      }
      if (field.description) row.appendChild(el("p", "field-help", field.description));
    });
  }

  function drawLink(block, form) {
    // The whole URL, its host first: the person sees where it goes before following it.
    const box = form.appendChild(el("div", "elicitation-link"));
    const where = box.appendChild(el("span", "", "It opens "));
    where.appendChild(el("strong", "elicitation-host", block.host));
    const link = box.appendChild(el("a", "elicitation-url", block.url));
    link.href = block.url;
    link.target = "_blank";
    link.rel = "noopener noreferrer";
  }

  /** Return the record of a new element for `block`. */
  function build(block) {
    return BUILDERS[block.kind](block);
  }

  /** Show what changed in a block's head or state (a thought that is over, a tool's status,
   *  a permission's answer). */
  function update(block, record) {
    if (block.rewound) markRewound(block, record);
    if (block.kind === "thought") updateThought(block, record);
    else if (block.kind === "tool") updateTool(block, record);
    else if (block.kind === "permission") updatePermission(block, record);
    else if (block.kind === "elicitation") updateElicitation(block, record);
  }

  // A block of a turn a rewind set aside: drawn collapsed (craft.css), its message marked.
  function markRewound(block, { element }) {
    if (element.dataset.rewound === "true") return;
    element.dataset.rewound = "true";
    if (block.kind !== "user") return;
    const meta = element.querySelector(".msg-meta");
    meta.insertBefore(el("span", "badge rewound-badge", "Rewound"), meta.firstChild);
  }

  function updateElicitation(block, { element, answer }) {
    element.dataset.answer = block.answer;
    element.dataset.completed = String(block.completed);
    if (block.answer) element.querySelectorAll("input, select, button").forEach((c) => (c.disabled = true));
    answer.textContent = block.answerText;
  }

  function updateThought(block, record) {
    record.element.querySelector("summary").textContent = block.thinking ? "Thinking…" : "Thought";
    if (!block.thinking && !record.userOpened) record.element.open = false;
  }

  function updateTool(block, record) {
    record.element.dataset.status = block.status;
    record.label.textContent = block.label;
    record.title.textContent = block.title;
    record.badge.textContent = block.badge;
  }

  function updatePermission(block, { element, answer }) {
    element.dataset.answer = block.answer;
    element.querySelectorAll(".options button").forEach((b) => (b.disabled = true));
    answer.textContent = block.answerText;
    if (!block.chosen) return;
    const chosen = element.querySelector(`.options button[data-option="${CSS.escape(block.chosen)}"]`);
    if (chosen) chosen.classList.add("chosen");
  }

  /** Draw a block's body (anew): a user's message, a tool's content, what a permission
   *  request is for, a plan's entries. Agent messages are render.mjs's (they wait for
   *  Markdown). */
  function renderBody(block, record) {
    if (block.kind === "user") fillCollapsible(record.body, block.text, writePlain);
    else if (block.kind === "tool") renderToolBody(record.body, block.call, paths, block.terminal);
    else if (block.kind === "permission") renderToolBody(record.body, block.details, paths, null, { terminals: false });
    else if (block.kind === "plan") renderPlan(block, record);
  }

  function renderPlan(block, { element }) {
    const list = element.querySelector("ul");
    list.replaceChildren();
    let done = 0;
    for (const entry of block.entries) {
      if (entry.status === "completed") done++;
      const li = list.appendChild(el("li", "plan-entry"));
      li.setAttribute("data-status", entry.status);
      li.appendChild(el("span", "check")).setAttribute("aria-hidden", "true");
      li.appendChild(el("span", "plan-text", entry.text));
      li.appendChild(el("span", "sr-only", ` (${PLAN_STATUS[entry.status]})`));
    }
    element.querySelector(".plan-progress").textContent =
      block.entries.length ? ` · ${done} of ${block.entries.length} done` : "";
  }

  return { build, update, renderBody, technicalDetails };
}
