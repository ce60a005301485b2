// The fold (static/craft/session/fold.mjs): a session's events into the blocks a person reads.
// Run by Node's own test runner (`node --test tests/js/`), without a browser or a DOM.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { createFold, revertedFile, revertedWhole } from "../../static/craft/session/fold.mjs";
import { workspacePaths } from "../../static/craft/session/paths.mjs";

const SESSION = "0f6b9a52-3c1e-4c57-9a4e-2f0d8c1b7e11";
const WORKSPACE = `/srv/craft/sandboxes/s1/sessions/${SESSION}`;
const NOW = Date.parse("2025-01-01T12:00:00Z");

// A fold and a way to feed it events with consecutive seqs: fold(kind, data, extra) applies one
// event and returns its step; the fold's state is on `fold.state`.
function session() {
  const state = createFold({ paths: workspacePaths(WORKSPACE, SESSION), now: () => NOW });
  let seq = 0;
  const fold = (kind, data = {}, extra = {}) => state.apply({ seq: ++seq, kind, data, ...extra });
  fold.state = state;
  return fold;
}

const text = (t) => ({ content: { type: "text", text: t } });
const kinds = (fold) => fold.state.blocks.map((b) => b.kind);

describe("messages", () => {
  test("agent chunks join into one message per turn, with the seq of each part", () => {
    const fold = session();
    fold("user_message", { id: "p1", text: "hello" });
    const first = fold("agent_message_chunk", text("Hel"));
    const second = fold("agent_message_chunk", text("lo!"));
    assert.equal(first.block, second.block);
    assert.equal(second.block.text, "Hello!");
    assert.deepEqual(second.block.parts, [{ seq: 2, text: "Hel" }, { seq: 3, text: "lo!" }]);
    assert.deepEqual(second.stale, [second.block]); // its text is drawn at the next flush
    fold("turn_end", { stop_reason: "end_turn" });
    fold("user_message", { id: "p2", text: "again" });
    const next = fold("agent_message_chunk", text("Hi"));
    assert.notEqual(next.block, first.block);
    assert.deepEqual(kinds(fold), ["user", "agent", "turn_end", "user", "agent"]);
  });

  test("a tool call between chunks starts a new message; quiet updates do not", () => {
    const fold = session();
    const before = fold("agent_message_chunk", text("a"));
    fold("usage_update", { used: 1, size: 10 });
    fold("session_info_update", {});
    assert.equal(fold("agent_message_chunk", text("b")).block, before.block);
    fold("tool_call", { toolCallId: "t1" });
    const after = fold("agent_message_chunk", text("c"));
    assert.notEqual(after.block, before.block);
    assert.equal(before.block.text, "ab");
    assert.deepEqual(kinds(fold), ["agent", "quiet", "tool", "agent"]);
  });

  test("thoughts are blocks of their own, shown as going on while live until something follows", () => {
    const fold = session();
    const thought = fold("agent_thought_chunk", text("hmm"), {}).block;
    assert.equal(thought.kind, "thought");
    assert.equal(thought.thinking, false); // loaded from history: already over
    const live = session();
    const step = live.state.apply({ seq: 1, kind: "agent_thought_chunk", data: text("hmm") }, true);
    assert.equal(step.block.thinking, true);
    const reply = live.state.apply({ seq: 2, kind: "agent_message_chunk", data: text("ok") }, true);
    assert.equal(step.block.thinking, false);
    assert.deepEqual(reply.updated, [step.block]);
  });

  test("a user message carries its prompt id, its time and what was attached", () => {
    const fold = session();
    const step = fold("user_message", {
      id: "p1", text: "look", attachments: [
        { type: "file", path: "src/app.py" },
        { type: "image", name: "shot.png", bytes: 2400 },
        { type: "image" },
        "junk",
      ],
    }, { created_at: "2025-01-01T11:59:00Z" });
    assert.equal(step.block.promptId, "p1");
    assert.equal(step.block.time, Date.parse("2025-01-01T11:59:00Z"));
    assert.deepEqual(step.block.attachments, ["src/app.py", "shot.png (2 kB)", "image"]);
    assert.ok(fold.state.knownPaths.has("src/app.py"));
    assert.equal(fold.state.turnStartedAt, step.block.time);
  });
});

describe("tool calls", () => {
  test("an update changes the fields it carries; its content replaces the list", () => {
    const fold = session();
    fold("user_message", { text: "go" });
    const call = fold("tool_call", {
      toolCallId: "t1", kind: "execute", title: "Run tests", status: "pending",
      rawInput: { command: ["pytest", "-q"] },
      content: [{ type: "content", content: { type: "text", text: "one" } }],
    });
    const card = call.block;
    assert.deepEqual(
      [card.label, card.title, card.status, card.badge], ["Run", "Run tests", "pending", "Waiting"]);
    const update = fold("tool_call_update", {
      toolCallId: "t1", status: "completed",
      content: [{ type: "content", content: { type: "text", text: "two" } }],
    });
    assert.equal(update.block, card);
    assert.deepEqual([card.label, card.title, card.badge], ["Run", "Run tests", "Done"]);
    assert.deepEqual(card.call.content, [{ type: "content", content: { type: "text", text: "two" } }]);
    assert.deepEqual(card.call.rawInput, { command: ["pytest", "-q"] }); // kept: not in the update
    assert.equal(card.contentSeq, update.seq);
    assert.deepEqual(update.updated, [card]);
    assert.deepEqual(update.stale, [card]);
    // An update without content, locations or input leaves the body as it was drawn.
    assert.deepEqual(fold("tool_call_update", { toolCallId: "t1", title: "" }).stale, []);
    assert.equal(card.title, "Run tests"); // an empty title is no title
    assert.equal(kinds(fold).filter((k) => k === "tool").length, 1);
  });

  test("unknown kinds and statuses read as a tool that was updated", () => {
    const fold = session();
    const card = fold("tool_call", { toolCallId: "t1", kind: "teleport", status: "beaming" }).block;
    assert.deepEqual([card.label, card.badge, card.status], ["Tool", "Updated", "beaming"]);
  });

  test("tool call ids restart with every agent process: a later turn gets a card of its own", () => {
    const fold = session();
    fold("user_message", { text: "one" });
    const first = fold("tool_call", { toolCallId: "call-0", title: "Read a" }).block;
    fold("user_message", { text: "two" });
    const second = fold("tool_call", { toolCallId: "call-0", title: "Read b" }).block;
    assert.notEqual(first, second);
    assert.equal(first.title, "Read a");
  });

  test("titles and locations are relative to the workspace; locations feed @ mentions", () => {
    const fold = session();
    const card = fold("tool_call", {
      toolCallId: "t1", title: `Edit ${WORKSPACE}/src/app.py`,
      locations: [{ path: `${WORKSPACE}/src/app.py` }, { path: "/etc/passwd" }, { path: WORKSPACE }, 7],
    }).block;
    assert.equal(card.title, "Edit src/app.py");
    assert.deepEqual([...fold.state.knownPaths], ["src/app.py"]);
  });

  test("a turn's end marks the tools it never finished", () => {
    const fold = session();
    fold("user_message", { text: "go" });
    const running = fold("tool_call", { toolCallId: "a", status: "in_progress" }).block;
    const done = fold("tool_call", { toolCallId: "b", status: "completed" }).block;
    const end = fold("turn_end", { stop_reason: "cancelled" });
    assert.equal(running.badge, "Not finished");
    assert.equal(running.status, "in_progress");
    assert.equal(done.badge, "Done");
    assert.deepEqual(end.updated, [running]);
  });
});

describe("plans", () => {
  test("a plan replaces the turn's plan whole; a new turn has a plan of its own", () => {
    const fold = session();
    fold("user_message", { text: "plan" });
    const plan = fold("plan", { entries: [
      { content: "Read", status: "completed" }, { content: "Write", status: "in_progress" },
    ] }).block;
    const again = fold("plan", { entries: [{ content: `Test ${WORKSPACE}/t.py`, status: "bogus" }] });
    assert.equal(again.block, plan);
    assert.deepEqual(plan.entries, [{ status: "pending", text: "Test t.py" }]);
    assert.deepEqual(again.stale, [plan]);
    const broken = fold("plan", { entries: "none" });
    assert.equal(broken.block, plan);
    assert.deepEqual(broken.stale, []); // malformed: the last good list stays
    assert.equal(plan.entries.length, 1);
    fold("user_message", { text: "another" });
    assert.notEqual(fold("plan", { entries: [] }).block, plan);
  });
});

describe("permission requests", () => {
  const options = [
    { optionId: "yes", kind: "allow_once", name: "Allow" },
    { optionId: "always", kind: "allow_always", name: "Always" },
    { optionId: "odd", name: "Something else" },
    { optionId: 3, name: "not an option" },
  ];

  test("a request offers the agent's options and is closed by its answer", () => {
    const fold = session();
    fold("user_message", { text: "go" });
    fold("tool_call", { toolCallId: "t1", kind: "edit", content: [{ type: "diff", path: "a" }] });
    const request = fold("permission_request", {
      request: "r1", toolCall: { toolCallId: "t1", title: "Edit a" }, options,
    }).block;
    assert.equal(request.title, "Edit a");
    assert.deepEqual(request.offered.map((o) => o.id), ["yes", "always", "odd"]);
    // What is approved includes what the earlier tool call carried, but for its diff, which
    // the tool card right above shows already.
    assert.equal(request.details.kind, "edit");
    assert.deepEqual(request.details.content, []);
    assert.equal(request.answer, "");
    const answer = fold("permission_answer", { request: "r1", option: "always" });
    assert.equal(answer.block, request);
    assert.deepEqual(answer.updated, [request]);
    assert.equal(request.answer, "always");
    assert.equal(request.chosen, "always");
    assert.equal(request.answerText, "You allowed this from now on (Always)");
  });

  test("answers read as what choosing meant, or the option's own name", () => {
    const fold = session();
    for (const [i, option] of ["odd", "gone"].entries()) {
      fold("permission_request", { request: `r${i}`, options });
      fold("permission_answer", { request: `r${i}`, option });
    }
    const [odd, gone] = fold.state.blocks;
    assert.equal(odd.answerText, "You chose: Something else");
    assert.equal(gone.answerText, "Answered.");
  });

  test("a cancelled request, an unknown one, and one the turn's end left open", () => {
    const fold = session();
    const cancelled = fold("permission_request", { request: "r1", options }).block;
    const open = fold("permission_request", { request: "r2", options }).block;
    fold("permission_answer", { request: "r1" });
    assert.equal(cancelled.answer, "cancelled");
    assert.equal(cancelled.answerText, "Cancelled: the turn was stopped.");
    const stray = fold("permission_answer", { request: "nope", option: "yes" }).block;
    assert.equal(stray.kind, "other");
    assert.equal(stray.text, "An answer to a question this page never showed.");
    const end = fold("turn_end", { stop_reason: "end_turn" });
    assert.equal(open.answer, "expired");
    assert.equal(open.answerText, "No longer open: the turn ended.");
    assert.equal(cancelled.answer, "cancelled");
    assert.deepEqual(end.updated, [open]);
  });

  test("a request without a title asks to use a tool", () => {
    const fold = session();
    assert.equal(fold("permission_request", { request: "r1" }).block.title, "use a tool");
  });
});

describe("turn ends and the rest", () => {
  test("a turn's end says how it ended, and how long it took", () => {
    const fold = session();
    const labels = {
      end_turn: "Done", cancelled: "Stopped", refusal: "The agent declined to continue",
      interrupted: "Interrupted", max_tokens: "Stopped: the reply reached its length limit",
      something_new: "The turn ended",
    };
    for (const [reason, label] of Object.entries(labels)) {
      assert.equal(fold("turn_end", { stop_reason: reason }).block.label, label);
    }
    fold("user_message", { text: "go" }, { created_at: "2025-01-01T11:58:00Z" });
    const end = fold("turn_end", { stop_reason: "end_turn" }, { created_at: "2025-01-01T11:59:05Z" });
    assert.equal(end.block.took, "1 min 5 s");
    fold("user_message", { text: "quick" }, { created_at: "2025-01-01T11:59:10Z" });
    assert.equal(fold("turn_end", {}, { created_at: "2025-01-01T11:59:10.5Z" }).block.took, null);
  });

  test("a restarted agent is a divider that says whether it remembers", () => {
    const fold = session();
    const label = (restored) => fold("agent_restarted", { restored }).block.label;
    assert.equal(label("resume"), "Agent restarted — context restored");
    assert.equal(label("load"), "Agent restarted — context restored");
    assert.equal(label("none"), "Agent restarted — the agent starts fresh");
    assert.equal(label(undefined), "Agent restarted");
    assert.deepEqual(new Set(kinds(fold)), new Set(["restart"]));
  });

  test("Craft's technical error messages are summarised for people, kept for staff", () => {
    const fold = session();
    const error = fold("agent_error", { message: "agent exited with code 1" }).block;
    assert.equal(error.summary, "The agent stopped unexpectedly.");
    assert.equal(error.detail, "agent exited with code 1");
    assert.equal(error.said, "");
    assert.match(error.next, /Send your message again/);
    assert.equal(fold("agent_error", {}).block.summary, "The agent ran into a problem.");
  });

  test("what the agent said goes to everyone, with the reason in plain words", () => {
    const fold = session();
    const said = (message) => fold("agent_error", { message }).block;
    const failure = said("demo failure requested (code -32603)");
    assert.equal(failure.summary, "The agent reported an error.");
    assert.equal(failure.said, "demo failure requested (code -32603)");
    assert.equal(failure.detail, "");
    for (const message of [
      "Authentication required (code -32000)",
      "Error: 401 Unauthorized",
      "Incorrect API key provided: sk-abc",
      "invalid x-api-key",
    ]) {
      assert.equal(said(message).summary, "The model provider refused your API key.", message);
      assert.match(said(message).next, /Check the key/);
    }
    for (const message of ["429 Too Many Requests", "Rate limit reached for gpt-4", "You exceeded your current quota"]) {
      assert.equal(said(message).summary, "The model provider is rate limiting the agent.", message);
    }
    assert.equal(said("KeyError: missing key 'x'").summary, "The agent reported an error.");
  });

  test("what the agent wrote to stderr goes to everyone: its line, and the whole under Details", () => {
    const fold = session();
    const stderr = "node:internal/modules/esm/resolve:873\nError [ERR_MODULE_NOT_FOUND]: Cannot find package 'sdk'\nNode.js v20.20.2";
    const start = fold("agent_error", {
      message: "agent did not start: agent exited with code 1: Cannot find package 'sdk'",
      stderr, stderr_line: "Cannot find package 'sdk'",
    }).block;
    assert.equal(start.summary, "The agent could not start.");
    assert.equal(start.wrote, "Cannot find package 'sdk'");
    assert.equal(start.stderr, stderr);
    assert.equal(start.said, "");
    // An agent's "Internal error" whose stderr names the provider's 401 is a refused key, and
    // Claude Code's "Internal error: Invalid API key" is the agent's, not Craft's.
    const codex = fold("agent_error", { message: "Internal error (code -32603)", stderr: "x",
      stderr_line: "ERROR codex_acp::thread: unexpected status 401 Unauthorized: Incorrect API key provided" }).block;
    assert.equal(codex.summary, "The model provider refused your API key.");
    assert.equal(codex.said, "Internal error (code -32603)");
    const claude = fold("agent_error", { message: "Internal error: Invalid API key · Fix external API key (code -32603)" }).block;
    assert.equal(claude.summary, "The model provider refused your API key.");
    assert.equal(fold("agent_error", { message: "internal error: boom" }).block.summary, "Something went wrong in Craft.");
  });

  test("an agent error's stderr fields of the wrong type are left out, never thrown on", () => {
    const fold = session();
    for (const odd of [null, 7, ["a"], { text: "x" }, true]) {
      const step = fold("agent_error", { message: "agent exited with code 1", stderr: odd, stderr_line: odd });
      assert.equal(step.block.kind, "error");
      assert.equal(step.block.stderr, typeof odd === "number" ? "7" : "");
      assert.equal(step.block.wrote, typeof odd === "number" ? "7" : "");
    }
  });

  test("a turn Craft cut short says why: restart, lost server, shutdown, stopped sandbox", () => {
    const fold = session();
    const cut = (reason, message = "whatever Craft said") => fold("agent_error", { message, reason }).block;
    assert.match(cut("server_restarted").summary, /^The server restarted/);
    assert.match(cut("server_lost").summary, /stopped responding/);
    assert.match(cut("server_shutdown").summary, /^The server shut down/);
    const staff = cut("sandbox_stopped_by_staff");
    assert.equal(staff.summary, "An administrator stopped your sandbox, so this turn was cut short.");
    assert.match(staff.next, /new sandbox starts for this session/);
    assert.equal(staff.cause, "sandbox_stopped_by_staff");
    assert.equal(staff.said, "");
    assert.equal(staff.detail, "");
    assert.match(cut("sandbox_stopped").summary, /^Your sandbox was stopped/);
    // Events stored before agent errors had a reason say it in their message.
    const old = fold("agent_error", { message: "This turn was interrupted: the server restarted." }).block;
    assert.equal(old.cause, "server_restarted");
  });

  test("a permission request a restart left open says the server restarted", () => {
    const fold = session();
    const options = [{ optionId: "yes", kind: "allow_once", name: "Allow" }];
    const card = fold("permission_request", { request: "r1", options }).block;
    fold("permission_answer", { request: "r1", option: null, outcome: "cancelled", reason: "interrupted" });
    assert.equal(card.answer, "interrupted");
    const error = fold("agent_error", { message: "This turn was interrupted: the server restarted.", reason: "server_restarted" });
    assert.equal(card.answerText, "Not answered: the server restarted.");
    assert.ok(error.updated.includes(card));
    fold("turn_end", { stop_reason: "interrupted" });
    assert.equal(card.answerText, "Not answered: the server restarted.");
  });

  test("a session title names the session; a blank one does not", () => {
    const fold = session();
    const titled = fold("session_title", { title: "Fix the build" });
    assert.equal(titled.title, "Fix the build");
    assert.equal(titled.block.kind, "quiet");
    assert.equal(fold("session_title", { title: "   " }).title, undefined);
    assert.equal(fold("session_title", { title: 42 }).title, undefined);
  });

  test("unknown kinds become a quiet note; quiet kinds share one hidden block", () => {
    const fold = session();
    const unknown = fold("teleport_update", { anything: 1 }).block;
    assert.equal(unknown.kind, "other");
    assert.equal(unknown.text, "The agent sent an update this page can't show.");
    assert.equal(unknown.detail, "kind: teleport_update");
    const quiet = ["user_message_chunk", "session_info_update", "usage_update", "agent_info"]
      .map((kind) => fold(kind).block);
    assert.equal(new Set(quiet).size, 1);
    assert.equal(quiet[0].kind, "quiet");
    assert.equal(fold.state.blocks.filter((b) => b.kind === "quiet").length, 1);
  });

  test("the agent's controls follow agent_info and the updates after it", () => {
    const fold = session();
    const info = fold("agent_info", {
      promptCapabilities: { image: true },
      modes: { currentModeId: "ask", availableModes: [{ id: "ask" }, { id: "code" }] },
      configOptions: [{ id: "model", type: "select" }, "junk"],
    });
    assert.equal(info.controls, true);
    const agent = fold.state.agent;
    assert.equal(agent.prompt.image, true);
    assert.equal(agent.configOptions.length, 1);
    fold("current_mode_update", { currentModeId: "code" });
    assert.equal(agent.modes.currentModeId, "code");
    fold("available_commands_update", { availableCommands: [{ name: "test" }, { name: "" }, {}] });
    assert.deepEqual(agent.commands, [{ name: "test" }]);
    fold("config_option_update", { configOptions: "nope" });
    assert.equal(agent.configOptions.length, 1); // malformed: kept
    fold("usage_update", { used: 5, size: 10 });
    assert.deepEqual(agent.usage, { used: 5, size: 10 });
  });
});

describe("order and delivery", () => {
  test("events apply once, in seq order: a seq already applied or not a seq is ignored", () => {
    const { apply, ...state } = createFold({ paths: workspacePaths("", SESSION) });
    const event = (seq) => ({ seq, kind: "agent_message_chunk", data: text(`${seq}`) });
    assert.ok(apply(event(1)));
    assert.ok(apply(event(3))); // the fold takes what it is given; gaps are the socket's to fill
    for (const seq of [3, 2, 1, 0, -1, 3.5, "4", null, Number.MAX_SAFE_INTEGER + 2]) {
      assert.equal(apply(event(seq)), null, `seq ${seq}`);
    }
    assert.equal(apply(event(4)).block.text, "134");
    assert.equal(state.blocks[0].text, "134");
  });

  test("lastSeq advances for every event, shown or not", () => {
    const fold = session();
    fold("usage_update");
    fold("teleport");
    fold("user_message", null);
    assert.equal(fold.state.lastSeq, 3);
  });

  test("an event cut short for delivery can be fetched whole and folded again", () => {
    const fold = session();
    const step = fold("agent_message_chunk", text("start of a long… "), { truncated: true });
    assert.equal(step.truncated, true);
    fold("agent_message_chunk", text("end"));
    assert.equal(fold("usage_update", {}, { truncated: true }).truncated, false); // quiet: nothing to show
    const whole = { seq: step.seq, kind: "agent_message_chunk", data: text("start of a long story ") };
    assert.equal(fold.state.refold(step.block, whole), true);
    assert.equal(step.block.text, "start of a long story end");
    const card = fold("tool_call", { toolCallId: "t", content: [] }, { truncated: true });
    const full = [{ type: "content", content: { type: "text", text: "all" } }];
    assert.equal(fold.state.refold(card.block, { seq: card.seq, data: { content: full } }), true);
    assert.deepEqual(card.block.call.content, full);
    assert.equal(fold.state.refold(card.block, { seq: card.seq - 1, data: { content: [] } }), false);
  });
});

describe("malformed data", () => {
  const KINDS = [
    "user_message", "agent_message_chunk", "agent_thought_chunk", "tool_call", "tool_call_update",
    "plan", "permission_request", "permission_answer", "turn_end", "agent_error", "session_title",
    "agent_restarted", "agent_info", "config_option_update", "config_options_update",
    "current_mode_update", "available_commands_update", "usage_update", "user_message_chunk",
    "something_new", undefined, null, 7,
  ];
  const DATA = [
    null, undefined, "text", 42, true, [], [1, 2],
    { text: 5, attachments: "x", content: "x", toolCallId: {}, title: [], status: 3, kind: 1,
      locations: "x", rawInput: [], entries: {}, options: "x", toolCall: "x", request: [],
      option: 5, stop_reason: {}, message: [], restored: 1, promptCapabilities: 1, modes: [],
      configOptions: {}, availableCommands: "x", currentModeId: 3 },
    { content: { type: "text", text: null }, attachments: [null, { type: "file", path: 3 }],
      locations: [null, { path: null }], entries: [null, { content: {} }],
      options: [null, { optionId: null }], toolCall: { toolCallId: null, content: "x" },
      availableCommands: [null, { name: 5 }] },
  ];

  test("no kind with any data makes the fold throw, and every event is applied", () => {
    const fold = session();
    let seq = 0;
    for (const kind of KINDS) {
      for (const data of DATA) {
        const step = fold.state.apply({ seq: ++seq, kind, data });
        assert.ok(step.block, `${kind} with ${JSON.stringify(data)}`);
        assert.ok(!step.failed, `${kind} with ${JSON.stringify(data)} failed`);
      }
    }
    assert.equal(fold.state.lastSeq, seq);
    for (const event of [null, undefined, "event", 3, [], {}, { seq: "1" }]) {
      assert.equal(fold.state.apply(event), null);
    }
  });

  test("a failure while folding becomes a note, and the seq still counts as applied", (t) => {
    t.mock.method(console, "error", () => {});
    const fold = session();
    const hostile = { get text() { throw new Error("boom"); } };
    const step = fold("user_message", hostile);
    assert.equal(step.failed, true);
    assert.equal(step.block.kind, "other");
    assert.equal(step.block.text, "Something the agent sent could not be shown.");
    assert.equal(fold.state.lastSeq, step.seq);
  });
});

describe("turn changes", () => {
  test("a turn's changed files become one note with their +/- lines", () => {
    const fold = session();
    fold("turn_end", { stop_reason: "end_turn" });
    const step = fold("turn_changes", {
      turn: 1,
      files: [
        { path: "a.txt", status: "modified", added: 2, removed: 1, binary: false },
        { path: "new.txt", status: "renamed", old_path: "old.txt", added: 0, removed: 0, binary: false },
        { path: "logo.png", status: "added", added: 0, removed: 0, binary: true },
      ],
      truncated: false,
    });
    const changes = step.block;
    assert.equal(changes.kind, "changes");
    assert.equal(changes.seq, 1); // the turn's: what its diff and revert are asked for
    assert.equal(changes.text, "3 files changed");
    assert.equal(changes.detail, "modified: a.txt (+2 −1)\nrenamed: old.txt → new.txt (+0 −0)\nadded: logo.png (binary)");
    assert.deepEqual(changes.files[1], { path: "new.txt", oldPath: "old.txt", status: "renamed", added: 0, removed: 0, binary: false });
    assert.deepEqual(fold.state.changes, [changes]);
  });

  test("a revert is a change of its own, named by its event, and says what it reverted", () => {
    const fold = session();
    fold("user_message", { id: "p", text: "write notes.txt hello" }); // seq 1
    fold("turn_end", { stop_reason: "end_turn" });
    fold("turn_changes", { turn: 1, files: [{ path: "notes.txt", status: "added", added: 1, removed: 0, binary: false }], truncated: false });
    assert.equal(fold.state.changes[0].prompt, "write notes.txt hello");
    const reverted = fold("workspace_reverted", {
      turn: 1, path: "notes.txt", files: [{ path: "notes.txt", status: "deleted", added: 0, removed: 1, binary: false }], truncated: false,
    });
    assert.equal(reverted.block.kind, "changes");
    assert.equal(reverted.block.reverted, true);
    assert.equal(reverted.block.seq, reverted.seq); // a revert of it reverts this event
    assert.equal(reverted.block.text, "Reverted notes.txt to before a turn: 1 file changed");
    const again = fold("workspace_reverted", { turn: reverted.seq, files: [], truncated: false });
    assert.equal(again.block.text, "Reverted the files to before a revert: 0 files changed");
    assert.equal(fold.state.changes.length, 3);
  });

  test("a reverted file, or turn, is marked so the panel offers no revert of it again; an undo clears it", () => {
    const fold = session();
    fold("user_message", { id: "p", text: "write two files" }); // seq 1
    fold("turn_end", { stop_reason: "end_turn" });
    const file = (path) => ({ path, status: "added", added: 1, removed: 0, binary: false });
    fold("turn_changes", { turn: 1, files: [file("a.txt"), file("b.txt")], truncated: false });
    const turn = fold.state.changes[0];
    assert.equal(revertedWhole(turn), false);
    const one = fold("workspace_reverted", { turn: 1, path: "a.txt", files: [file("a.txt")], truncated: false });
    assert.deepEqual(one.block.affects, [1]);
    assert.equal(revertedFile(turn, "a.txt"), true);
    assert.equal(revertedFile(turn, "b.txt"), false);
    assert.equal(revertedWhole(turn), false);
    // A hunk is no whole file: the file may still be reverted.
    fold("workspace_reverted", { turn: 1, path: "b.txt", hunk: 0, files: [file("b.txt")], truncated: false });
    assert.equal(revertedFile(turn, "b.txt"), false);
    const other = fold("workspace_reverted", { turn: 1, path: "b.txt", files: [file("b.txt")], truncated: false });
    assert.equal(revertedWhole(turn), true); // file by file
    // Undoing the revert of b.txt brings it back: revertable again, and the undo is marked.
    const undo = fold("workspace_reverted", { turn: other.seq, files: [file("b.txt")], truncated: false });
    assert.deepEqual(undo.block.affects, [other.seq, 1]);
    assert.equal(revertedFile(turn, "b.txt"), false);
    assert.equal(revertedFile(turn, "a.txt"), true);
    assert.equal(revertedWhole(other.block), true);
    assert.equal(revertedWhole(undo.block), false);
  });

  test("a diff is shown once: in the tool card once it has one, not in its permission card too", () => {
    const fold = session();
    fold("user_message", { id: "p", text: "write a.txt hi" });
    const diff = { type: "diff", path: "/w/a.txt", oldText: null, newText: "hi" };
    fold("tool_call", { toolCallId: "c1", title: "Write a.txt", kind: "edit", status: "pending" });
    const asked = fold("permission_request", { request: "r1", toolCall: { toolCallId: "c1", title: "Write a.txt", content: [diff] }, options: [] });
    assert.deepEqual(asked.block.details.content, [diff]); // the tool card has none yet
    const done = fold("tool_call_update", { toolCallId: "c1", status: "completed", content: [diff] });
    assert.deepEqual(asked.block.details.content, []);
    assert.ok(done.stale.includes(asked.block)); // drawn again without it
    // An agent that puts the diff in its tool_call first: the permission card never repeats it.
    fold("tool_call", { toolCallId: "c2", title: "Write b.txt", kind: "edit", status: "pending", content: [diff] });
    const second = fold("permission_request", { request: "r2", toolCall: { toolCallId: "c2", content: [diff] }, options: [] });
    assert.deepEqual(second.block.details.content, []);
  });

  test("a skipped checkpoint says why, and malformed data never throws", () => {
    const fold = session();
    assert.equal(fold("turn_changes", { turn: 1, files: [], skipped: "took longer than 30 s" }).block.detail, "took longer than 30 s");
    for (const data of [{}, { files: 5 }, { files: [null, 3, { path: 7 }] }, { left_out: "x" }, { turn: "x", hunk: "y" }]) {
      assert.doesNotThrow(() => fold("turn_changes", data));
      assert.doesNotThrow(() => fold("workspace_reverted", data));
    }
  });
});

describe("the queue", () => {
  test("queued prompts are added, edited, steered, removed, and leave when they start", () => {
    const fold = session();
    fold("user_message", { id: "p1", text: "working" });
    const queued = fold("prompt_queued", { id: "a", text: "first" });
    assert.equal(queued.queue, true);
    assert.equal(queued.block.kind, "quiet"); // nothing in the transcript until it runs
    fold("prompt_queued", { id: "b", text: "second", attachments: [{ type: "file", path: "x.txt" }] });
    fold("prompt_queued", { id: "c", text: "third" });
    fold("prompt_queued", { id: "a", text: "a resend" }); // its id is taken: ignored
    fold("queued_prompt_edited", { id: "a", text: "first, edited" });
    fold("prompt_steered", { id: "c" });
    const ids = () => fold.state.queue.map((q) => q.id);
    assert.deepEqual(ids(), ["c", "a", "b"]);
    assert.equal(fold.state.queue[1].text, "first, edited");
    assert.deepEqual(fold.state.queue[2].attachments, ["x.txt"]);
    fold("queued_prompt_removed", { id: "a" });
    assert.equal(fold("queued_prompt_removed", { id: "gone" }).queue, undefined);
    fold("turn_end", { stop_reason: "cancelled" });
    const started = fold("user_message", { id: "c", text: "third" });
    assert.equal(started.queue, true);
    assert.deepEqual(ids(), ["b"]);
    assert.equal(started.block.kind, "user");
  });

  test("a turn that did not end well offers to retry its prompt", () => {
    const fold = session();
    fold("user_message", { id: "p1", text: "try", attachments: [{ type: "file", path: "a.txt" }] });
    assert.deepEqual(fold("turn_end", { stop_reason: "error" }).block.retry, { text: "try", files: ["a.txt"] });
    fold("user_message", { id: "p2", text: "fine" });
    assert.equal(fold("turn_end", { stop_reason: "end_turn" }).block.retry, null);
  });
});

describe("live terminal output (tool call _meta)", () => {
  const start = { sessionUpdate: "tool_call", toolCallId: "c1", kind: "execute", title: "make",
    status: "in_progress", _meta: { terminal_info: { terminal_id: "c1" } } };
  const out = (data) => ({ sessionUpdate: "tool_call_update", toolCallId: "c1",
    _meta: { terminal_output: { terminal_id: "c1", data } } });

  test("output chunks join in order on the card, and the exit is kept", () => {
    const fold = session();
    fold("user_message", { id: "p", text: "t" });
    const card = fold("tool_call", start).block;
    assert.deepEqual(card.terminal, { output: "", exit: null, limit: 0, cut: false });
    const step = fold("tool_call_update", out("one\n"));
    assert.equal(step.block, card);
    assert.deepEqual(step.stale, [card]);
    fold("tool_call_update", out("two\n"));
    fold("tool_call_update", { sessionUpdate: "tool_call_update", toolCallId: "c1", status: "completed",
      _meta: { terminal_exit: { terminal_id: "c1", exit_code: 2, signal: null } } });
    assert.equal(card.terminal.output, "one\ntwo\n");
    assert.deepEqual(card.terminal.exit, { code: 2, signal: "" });
    assert.equal(kinds(fold).filter((k) => k === "tool").length, 1);
  });

  test("what the server dropped is said on the card, and the page keeps a bounded amount", async () => {
    const { MAX_TERMINAL_CHARS } = await import("../../static/craft/session/fold.mjs");
    const fold = session();
    fold("user_message", { id: "p", text: "t" });
    const card = fold("tool_call", start).block;
    const big = "x".repeat(1_000_000);
    for (let i = 0; i < 5; i++) fold("tool_call_update", out(big));
    assert.equal(card.terminal.output.length, MAX_TERMINAL_CHARS);
    assert.equal(card.terminal.cut, true);
    assert.equal(fold("terminal_output_limited", { toolCallId: "c1", limit: 1048576 }).block, card);
    assert.equal(card.terminal.limit, 1048576);
  });
});

describe("elicitation", () => {
  const form = { request: "r1", mode: "form", message: "<b>Configure</b>", answerable: true, fields: [
    { name: "name", type: "string", title: "<i>Name</i>", description: "", required: true },
    { name: "n", type: "integer", title: "N", description: "", required: false, minimum: 1 },
    { name: "shade", type: "unsupported", unsupported: "color", title: "Shade", description: "", required: false },
    { name: "c", type: "enum", title: "C", description: "", required: true,
      options: [{ value: "red", title: "Red" }, { value: 7 }, "junk"] },
  ] };

  test("a form becomes a block of fields, closed by its answer", () => {
    const fold = session();
    fold("user_message", { id: "p", text: "t" });
    const block = fold("elicitation_request", form).block;
    assert.equal(block.kind, "elicitation");
    assert.equal(block.message, "<b>Configure</b>"); // text, drawn as text
    assert.deepEqual(block.fields.map((f) => f.type), ["string", "integer", "unsupported", "enum"]);
    assert.deepEqual(block.fields[3].options, [{ value: "red", title: "Red" }, { value: "7", title: "7" }]);
    assert.equal(block.answer, "");
    const step = fold("elicitation_answer", { request: "r1", action: "accept", content: { name: "x", c: "red" } });
    assert.equal(step.block, block);
    assert.equal(block.answer, "accept");
    assert.equal(block.answerText, "You sent your answers.");
  });

  test("a URL request keeps only http and https links, with the host", () => {
    const fold = session();
    const ok = fold("elicitation_request", { request: "u", mode: "url", message: "m",
      url: "https://example.com/a?b=1", elicitationId: "e" }).block;
    assert.equal(ok.url, "https://example.com/a?b=1");
    assert.equal(ok.host, "example.com");
    const bad = fold("elicitation_request", { request: "v", mode: "url", message: "m", url: "javascript:alert(1)" }).block;
    assert.equal(bad.url, "");
  });

  test("the agent's word that a link's work is done is shown once, for known ids only", () => {
    const fold = session();
    const block = fold("elicitation_request", { request: "u", mode: "url", message: "m",
      url: "https://example.com/", elicitationId: "e1" }).block;
    fold("elicitation_answer", { request: "u", action: "accept" });
    assert.equal(fold("elicitation_complete", { elicitationId: "other" }).block.kind, "quiet");
    const step = fold("elicitation_complete", { sessionUpdate: "elicitation_complete", elicitationId: "e1" });
    assert.equal(step.block, block);
    assert.equal(block.answerText, "You agreed to open the link. The agent says it is done.");
    assert.equal(fold("elicitation_complete", { elicitationId: "e1" }).block.kind, "quiet");
  });

  test("refused, withdrawn, cancelled, interrupted and left-open requests say so", () => {
    const fold = session();
    fold("user_message", { id: "p", text: "t" });
    const refused = fold("elicitation_request", { request: "x", mode: "form", message: "m",
      refused: "the form has 1000 fields; Craft shows forms of at most 100" }).block;
    assert.equal(refused.answer, "refused");
    assert.match(refused.answerText, /1000 fields/);
    const reasons = { withdrawn: "withdrawn", turn_cancelled: "cancelled", interrupted: "interrupted" };
    for (const [reason, answer] of Object.entries(reasons)) {
      const block = fold("elicitation_request", { ...form, request: reason }).block;
      fold("elicitation_answer", { request: reason, action: "cancel", reason });
      assert.equal(block.answer, answer);
    }
    const open = fold("elicitation_request", { ...form, request: "open" }).block;
    fold("turn_end", { stop_reason: "end_turn" });
    assert.equal(open.answer, "expired");
  });

  test("an agent that wants authentication lists its methods on the error", () => {
    const fold = session();
    const block = fold("agent_error", { message: "The agent needs authentication first", reason: "auth_required",
      authMethods: [{ id: "a", name: "Demo login", description: "Sign in" }, { id: "b" }, "junk"] }).block;
    assert.deepEqual(block.methods, [{ name: "Demo login", description: "Sign in" }, { name: "b", description: "" }]);
    assert.equal(block.summary, "The agent needs you to sign in first.");
    assert.deepEqual(block.keys, []);
  });

  test("an agent that wants a sign-in names the keys its catalog entry asks for", () => {
    const fold = session();
    const block = fold("agent_error", { message: "The agent needs authentication first", reason: "auth_required",
      keys: [{ name: "ANTHROPIC_API_KEY", label: "Anthropic API key" }, { label: "no name" }, 3] }).block;
    assert.deepEqual(block.keys, [{ name: "ANTHROPIC_API_KEY", label: "Anthropic API key" }]);
    assert.equal(block.next, "It signs in with your Anthropic API key: check it on the Keys page "
      + "(it may be wrong or expired), then send your message again.");
    assert.deepEqual(fold("agent_error", { reason: "auth_required", keys: "x" }).block.keys, []);
  });
});

describe("going back", () => {
  test("a rewind marks every block of the turns it set aside, and says so in a block of its own", () => {
    const fold = session();
    fold("user_message", { id: "p1", text: "first" }); // seq 1
    fold("agent_message_chunk", text("one"));
    fold("turn_end", { stop_reason: "end_turn" });
    fold("user_message", { id: "p2", text: "second" }); // seq 4
    fold("tool_call", { toolCallId: "t1", title: "Write", status: "completed" });
    fold("agent_message_chunk", text("two"));
    fold("turn_end", { stop_reason: "end_turn" });
    fold("turn_changes", { turn: 4, files: [{ path: "a.txt", status: "added", added: 1, removed: 0 }], truncated: false });
    fold("user_message", { id: "p3", text: "third" }); // seq 9
    fold("agent_message_chunk", text("three"));
    fold("turn_end", { stop_reason: "end_turn" });
    const kept = fold.state.blocks.filter((b) => b.kind !== "quiet").slice(0, 3);
    const aside = fold.state.blocks.filter((b) => b.kind !== "quiet").slice(3);
    const step = fold("rewound", {
      to: 1, turns: [4, 9], truncated: false,
      files: [{ path: "a.txt", status: "deleted", added: 0, removed: 1 }],
    });
    assert.equal(step.block.kind, "rewound");
    assert.equal(step.block.text, "Rewound to “first”: 2 later turns set aside. The agent remembers nothing of them.");
    assert.deepEqual(aside.map((b) => b.kind), ["user", "tool", "agent", "turn_end", "changes", "user", "agent", "turn_end"]);
    assert.ok(aside.every((b) => b.rewound === true));
    assert.ok(kept.every((b) => !b.rewound));
    assert.deepEqual(new Set(step.updated), new Set(aside)); // drawn again, collapsed
    // What comes after belongs to the turns that follow, never to those set aside.
    fold("agent_restarted", { restored: "none" });
    const next = fold("user_message", { id: "p4", text: "fourth" });
    fold("agent_message_chunk", text("four"));
    assert.ok(!next.block.rewound);
    assert.ok(fold.state.blocks.filter((b) => b.kind === "restart").every((b) => !b.rewound));
    // The files it put back are listed with the workspace's changes, as a revert's are.
    const change = fold.state.changes.at(-1);
    assert.deepEqual([change.seq, change.reverted, change.files.map((f) => f.status)], [12, true, ["deleted"]]);
  });

  test("a fork begins with what it copied and says where it came from", () => {
    const fold = session();
    fold("user_message", { id: "p1", text: "first" });
    fold("turn_end", { stop_reason: "end_turn" });
    const from = "5b0c9c1e-1111-4c57-9a4e-2f0d8c1b7e11";
    const step = fold("forked", { from, seq: 7, title: "Fix the build" });
    assert.deepEqual([step.block.kind, step.block.from], ["forked", from]);
    assert.equal(step.block.text, "Forked from “Fix the build”. What follows is this session's own.");
    const odd = fold("forked", { from: "../../admin", seq: 1, before: true });
    assert.equal(odd.block.from, ""); // never a link elsewhere
    assert.match(odd.block.text, /just before a message/);
    // A rewind naming turns it never saw marks nothing and still says so.
    const rewound = fold("rewound", { to: 99, turns: [98, "x"] });
    assert.deepEqual(rewound.updated, []);
    assert.match(rewound.block.text, /an earlier turn: 1 later turn set aside/);
  });
});
