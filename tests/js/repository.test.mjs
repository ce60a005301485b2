// The fold of a session's repository events (static/craft/session/fold.mjs): the header's state
// from `repository_status`, and a card in the transcript for what Craft did with the branch.
// Run by Node's own test runner (`node --test tests/js/`), without a browser or a DOM.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { createFold, MAX_SETUP_OUTPUT_CHARS } from "../../static/craft/session/fold.mjs";
import { workspacePaths } from "../../static/craft/session/paths.mjs";
import { repositoryName, shortCommit } from "../../static/craft/session/words.mjs";

const SESSION = "0f6b9a52-3c1e-4c57-9a4e-2f0d8c1b7e11";
const URL = "https://git.example.com/team/app.git";
const COMMIT = "3f2a9c1d0b8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a";
const ROW = {
  url: URL, host: "git.example.com", path: "team/app", branch: "craft/fix-login-0f6b9a52",
  base: "main", status: "pending", detail: "", failure: null, commit: "", pull_request: null,
};

function session(repository = ROW) {
  const state = createFold({ paths: workspacePaths("/w", SESSION), now: () => 0, repository });
  let seq = 0;
  const fold = (kind, data = {}) => state.apply({ seq: ++seq, kind, data });
  fold.state = state;
  return fold;
}

describe("the repository's state", () => {
  test("a session that is not on a repository has none until an event says otherwise", () => {
    const fold = session(null);
    assert.equal(fold.state.repository, null);
    assert.equal(fold("user_message", { id: "p", text: "hi" }).repository, undefined);
  });

  test("the page's row is where it starts", () => {
    const repo = session().state.repository;
    assert.equal(repo.status, "pending");
    assert.equal(repo.name, "team/app");
    assert.equal(repo.branch, "craft/fix-login-0f6b9a52");
    assert.equal(repo.pullRequest, null);
  });

  test("a clone's progress is git's own line and a percent, quietly", () => {
    const fold = session();
    const begun = fold("repository_status", { status: "cloning", url: URL, branch: "craft/x-1", base: "" });
    assert.equal(begun.repository, true);
    assert.equal(begun.block.kind, "quiet");
    assert.equal(fold.state.repository.base, "main"); // "" (the remote's default) keeps what was known
    assert.equal(fold.state.repository.branch, "craft/x-1");
    fold("repository_status", {
      status: "cloning",
      progress: { phase: "receiving", percent: 45, done: 450, total: 1000, bytes: 1258291, text: "Receiving objects:  45% (450/1000), 1.20 MiB" },
    });
    assert.deepEqual(fold.state.repository.progress, { phase: "receiving", percent: 45, text: "Receiving objects:  45% (450/1000), 1.20 MiB" });
    fold("repository_status", { status: "cloning", progress: { phase: "counting", percent: null, text: "Counting objects: 12" } });
    assert.equal(fold.state.repository.progress.percent, null);
    fold("repository_status", { status: "cloning", progress: { percent: 250, text: 7 } });
    assert.equal(fold.state.repository.progress.percent, 100);
    assert.equal(fold.state.repository.progress.text, "7");
    assert.deepEqual(fold.state.blocks.map((b) => b.kind), ["quiet"]);
  });

  test("the set-up's output is streamed into one text, bounded", () => {
    const fold = session();
    fold("repository_status", { status: "setting_up", command: ".craft/setup.sh" });
    fold("repository_status", { status: "setting_up", output: "installing\n" });
    fold("repository_status", { status: "setting_up", output: "done\n" });
    assert.equal(fold.state.repository.command, ".craft/setup.sh");
    assert.equal(fold.state.repository.output, "installing\ndone\n");
    fold("repository_status", { status: "setting_up", output: "x".repeat(MAX_SETUP_OUTPUT_CHARS) });
    assert.equal(fold.state.repository.output.length, MAX_SETUP_OUTPUT_CHARS);
  });

  test("ready says the commit and how the set-up went; failed says why, plainly", () => {
    const fold = session();
    fold("repository_status", { status: "cloning", progress: { percent: 99, text: "…" } });
    fold("repository_status", {
      status: "ready", commit: COMMIT, base: "main", branch: "craft/x-1",
      setup: { command: "make deps", ok: false, exit_code: 2, timed_out: false, tail: "no rule" },
    });
    const repo = fold.state.repository;
    assert.equal(repo.status, "ready");
    assert.equal(repo.progress, null);
    assert.equal(shortCommit(repo.commit), "3f2a9c1");
    assert.deepEqual(repo.setup, { command: "make deps", ok: false, timedOut: false, exitCode: 2, tail: "no rule" });
    const failed = session();
    failed("repository_status", { status: "failed", code: "repository_not_found", reason: "There is no repository at that address." });
    assert.equal(failed.state.repository.status, "failed");
    assert.equal(failed.state.repository.code, "repository_not_found");
    assert.equal(failed.state.repository.reason, "There is no repository at that address.");
  });

  test("a status it does not know, or malformed data, changes nothing and never throws", () => {
    const fold = session();
    const step = fold("repository_status", { status: "exploded" });
    assert.equal(step.block.kind, "quiet");
    assert.equal(fold.state.repository.status, "pending");
    fold("repository_status", { status: "cloning", progress: "lots", url: "javascript:alert(1)" });
    assert.equal(fold.state.repository.url, URL);
    fold.state.apply({ seq: 99, kind: "repository_status", data: null });
    assert.equal(fold.state.lastSeq, 99);
  });

  test("the page's row is read defensively too", () => {
    const repo = session({ url: "file:///etc", status: "nonsense", pull_request: { url: "javascript:x", number: "1", state: "??" } }).state.repository;
    assert.equal(repo.url, "");
    assert.equal(repo.status, "pending");
    assert.deepEqual(repo.pullRequest, { url: "", number: null, state: "open" });
  });
});

describe("what Craft did with the branch", () => {
  test("a commit, a push and an update are cards that say so", () => {
    const fold = session();
    const committed = fold("repository_committed", { commit: COMMIT, branch: "craft/x-1", message: "Fix the login" });
    assert.equal(committed.block.kind, "repository");
    assert.equal(committed.block.text, "Committed 3f2a9c1 to craft/x-1");
    assert.equal(committed.block.detail, "Fix the login");
    assert.equal(fold.state.repository.head, COMMIT);
    const pushed = fold("repository_pushed", { branch: "craft/x-1", head: COMMIT });
    assert.equal(pushed.block.text, "Pushed craft/x-1 (3f2a9c1)");
    const updated = fold("repository_updated", { head: "abcdef0123", base: "main", conflicts: [] });
    assert.equal(updated.block.text, "Updated from main (abcdef0)");
    assert.deepEqual(updated.block.conflicts, []);
    assert.equal(fold.state.repository.head, "abcdef0123");
  });

  test("an update with conflicts lists each file", () => {
    const fold = session();
    const step = fold("repository_updated", { head: "abc", base: "main", conflicts: ["src/a.py", 3, "b.txt"] });
    assert.deepEqual(step.block.conflicts, ["src/a.py", "b.txt"]);
    assert.equal(step.block.text, "Updated from main: 2 files are in conflict, left to resolve");
  });

  test("a pull request's opening and new state are cards, and the state is kept", () => {
    const fold = session();
    const opened = fold("pull_request_opened", { url: "https://git.example.com/team/app/pull/7", number: 7, state: "open" });
    assert.equal(opened.block.text, "Pull request #7 opened");
    assert.equal(opened.block.link, "https://git.example.com/team/app/pull/7");
    assert.deepEqual(fold.state.repository.pullRequest, { url: "https://git.example.com/team/app/pull/7", number: 7, state: "open" });
    const merged = fold("pull_request_updated", { url: "https://git.example.com/team/app/pull/7", number: 7, state: "merged" });
    assert.equal(merged.block.text, "Pull request #7 is now merged");
    assert.equal(merged.block.state, "merged");
    assert.equal(merged.repository, true);
    assert.equal(fold.state.repository.pullRequest.state, "merged");
  });

  test("a pull request's link is only ever an http(s) one", () => {
    const fold = session();
    const step = fold("pull_request_opened", { url: "javascript:alert(1)", number: 1, state: "open" });
    assert.equal(step.block.link, "");
    assert.equal(fold.state.repository.pullRequest.url, "");
  });
});

describe("words", () => {
  test("a repository's name is its owner and name", () => {
    assert.equal(repositoryName("https://github.com/team/app.git"), "team/app");
    assert.equal(repositoryName("https://gitlab.example.com/group/sub/app"), "sub/app");
    assert.equal(repositoryName("http://127.0.0.1:8123/team/app.git/"), "team/app");
    assert.equal(repositoryName("not a url"), "not a url");
    assert.equal(repositoryName(null), "");
  });
});
