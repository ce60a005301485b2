// The session's repository on its page (docs/repositories.md), for a session opened on one:
//
//   header   where it is (a link, the session's branch), how its clone is getting on (git's
//            own progress line and a bar, the set-up's output in a block that opens, the plain
//            reason of a failure, the commit once ready) and its pull request
//   panel    the Changes tab's Repository section: the branch against its base (ahead,
//            behind, uncommitted changes) read from `GET .../repository/`, and Commit, Push,
//            Open pull request and Update from remote, each a POST of the HTTP API
//
// What the log says (fold.repository: the clone's status, the pull request) is drawn as it
// comes; what only the sandbox knows (ahead, behind, dirty) and the drafted texts are asked for
// when the panel opens, after each repository event and every 3 minutes while the page is open
// (which also has the server read the pull request's state from its host).

import { $, el } from "./dom.mjs";
import { PREPARING } from "./fold.mjs";
import { PULL_REQUEST_STATES, REPOSITORY_ERRORS, REPOSITORY_STATUS, shortCommit } from "./words.mjs";

const REFRESH_EVERY_MS = 3 * 60 * 1000;

/** Start the repository's parts of the page; nothing for a session not on a repository.
 *  `workspace` opens files (a conflict's), `status` says whether a turn runs. */
export function createRepository({ fold, status, workspace, announce }) {
  const head = $("repo-line");
  const panel = $("repo-panel");
  if (!head || !panel || !fold.repository) {
    return {
      draw() {}, refresh() {}, panelShown() {}, waitReason: () => "", eventArrived() {}, listChanged: () => false,
    };
  }
  const url = panel.dataset.url;
  const buttons = {
    commit: $("repo-commit"), push: $("repo-push"), pullRequest: $("repo-open-pr"), update: $("repo-update"),
  };
  const commitForm = $("repo-commit-form");
  const pullRequestForm = $("repo-pr-form");
  const result = $("repo-result");
  const problem = $("repo-error");
  let state = null; // the last answer of GET .../repository/
  let busy = ""; // the action under way: its buttons wait
  let loading = null; // the GET under way
  let again = false; // asked again while it was under way
  let listed = listedOf(fold.repository); // what the sidebar's item shows of it

  // --- the header ----------------------------------------------------------------------------

  function drawHeader() {
    const repo = fold.repository;
    head.dataset.status = repo.status;
    const link = $("repo-link");
    link.textContent = repo.name || repo.url;
    if (repo.url) link.href = repo.url;
    else link.removeAttribute("href");
    $("repo-branch").textContent = repo.branch;
    $("repo-branch").title = repo.base ? `A branch of its own, from ${repo.base}` : "";
    $("repo-status").textContent = statusText(repo);
    const progress = $("repo-progress");
    progress.hidden = !(repo.status === "cloning" && repo.progress);
    if (!progress.hidden) {
      const bar = $("repo-progress-bar");
      if (repo.progress.percent === null) bar.removeAttribute("value"); // git said no percent
      else bar.value = repo.progress.percent;
      $("repo-progress-text").textContent = repo.progress.text;
    }
    drawSetup(repo);
    const pr = $("repo-pr");
    pr.hidden = !repo.pullRequest;
    if (repo.pullRequest) drawPullRequest(pr, repo.pullRequest);
  }

  function statusText(repo) {
    if (repo.status === "failed") return `${REPOSITORY_STATUS.failed}: ${repo.reason || "the repository could not be cloned."}`;
    if (repo.status === "setting_up" && repo.command) return `Setting up (${repo.command})…`;
    if (repo.status !== "ready") return REPOSITORY_STATUS[repo.status];
    const at = repo.commit ? ` at ${shortCommit(repo.commit)}` : "";
    if (!repo.setup || repo.setup.ok) return `${REPOSITORY_STATUS.ready}${at}`;
    const how = repo.setup.timedOut ? "timed out" : repo.setup.exitCode === null ? "failed" : `failed (exit ${repo.setup.exitCode})`;
    return `${REPOSITORY_STATUS.ready}${at} · its set-up ${how}: the session is usable anyway`;
  }

  // The set-up's output while it runs, and its end when it failed, in a block that opens.
  function drawSetup(repo) {
    const block = $("repo-setup");
    const failed = repo.status === "ready" && repo.setup && !repo.setup.ok;
    const text = repo.status === "setting_up" ? repo.output : failed ? repo.setup.tail || repo.output : "";
    block.hidden = !(repo.status === "setting_up" || failed);
    if (block.hidden) return;
    block.querySelector("summary").textContent = failed
      ? `What the set-up (${repo.setup.command}) wrote last` : `What the set-up (${repo.command || "…"}) writes`;
    const output = $("repo-setup-output");
    const follow = output.scrollTop + output.clientHeight >= output.scrollHeight - 4;
    output.textContent = text || "(nothing yet)";
    if (follow) output.scrollTop = output.scrollHeight;
  }

  function drawPullRequest(holder, pr) {
    holder.dataset.state = pr.state;
    holder.replaceChildren();
    const name = pr.number === null ? "Pull request" : `Pull request #${pr.number}`;
    const link = holder.appendChild(el("a", "repo-pr-link", name));
    if (pr.url) {
      link.href = pr.url;
      link.target = "_blank";
      link.rel = "noopener noreferrer";
    }
    holder.append(" ");
    holder.appendChild(el("span", `pr-state ${pr.state}`, PULL_REQUEST_STATES[pr.state]));
  }

  // --- the panel -----------------------------------------------------------------------------

  function drawPanel() {
    const repo = fold.repository;
    const ready = repo.status === "ready";
    const running = status.running;
    for (const button of Object.values(buttons)) button.disabled = !ready || running || Boolean(busy);
    $("repo-why").textContent = !ready ? `${statusText(repo)} The buttons wait for the clone.`
      : running ? "The agent is working: these wait for its turn to end." : "";
    $("repo-state").textContent = stateText(repo, ready);
    const pr = $("repo-panel-pr");
    pr.hidden = !repo.pullRequest;
    if (repo.pullRequest) drawPullRequest(pr, repo.pullRequest);
    if (!ready || running) {
      commitForm.hidden = true;
      pullRequestForm.hidden = true;
    }
  }

  function stateText(repo, ready) {
    const where = `${repo.branch || "Its branch"}${repo.base ? ` (from ${repo.base})` : ""}`;
    if (!ready) return where;
    if (!state || state.ahead === null || state.ahead === undefined) return `${where}: its state is not known yet.`;
    const parts = [`${state.ahead} ahead`, `${state.behind} behind ${repo.base || "its base"}`];
    parts.push(state.dirty ? "uncommitted changes" : "nothing uncommitted");
    return `${where} at ${shortCommit(state.head)}: ${parts.join(", ")}.`;
  }

  function draw() {
    drawHeader();
    drawPanel();
  }

  function showProblem(text) {
    problem.textContent = text;
    problem.hidden = !text;
  }

  function showResult(text, link = "") {
    result.replaceChildren(el("span", "", text));
    if (link) {
      result.append(" ");
      const a = result.appendChild(el("a", "", "Open it"));
      a.href = link;
      a.target = "_blank";
      a.rel = "noopener noreferrer";
    }
    result.hidden = !text;
  }

  /** Ask the server for the repository's state (and drafts); one request at a time. */
  async function refresh() {
    if (loading) {
      again = true;
      return loading;
    }
    loading = (async () => {
      try {
        const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
        const answer = await response.json().catch(() => ({}));
        if (!response.ok) throw new Error(errorText(answer, response.status));
        state = answer;
      } catch (error) {
        showProblem(`Couldn't read the repository's state: ${error.message || error}`);
      } finally {
        loading = null;
      }
      drawPanel();
      if (again) {
        again = false;
        await refresh();
      }
    })();
    return loading;
  }

  function errorText(answer, httpStatus) {
    const error = answer && typeof answer.error === "object" && answer.error ? answer.error : {};
    return REPOSITORY_ERRORS[error.code] || (typeof error.message === "string" && error.message) || `HTTP ${httpStatus}`;
  }

  async function post(path, body, action) {
    busy = action;
    drawPanel();
    showProblem("");
    showResult("");
    try {
      const token = document.querySelector("input[name=csrfmiddlewaretoken]");
      const response = await fetch(`${url}${path}`, {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": token ? token.value : "" },
        body: JSON.stringify(body),
      });
      const answer = await response.json().catch(() => ({}));
      if (!response.ok) throw new Error(errorText(answer, response.status));
      return answer;
    } finally {
      busy = "";
      drawPanel();
      refresh();
    }
  }

  // Run an action; what it says when it fails is the API's message, shown plainly.
  async function run(action, work) {
    if (busy) return;
    try {
      await work();
    } catch (error) {
      showProblem(error.message || String(error));
      announce(error.message || String(error));
    }
  }

  async function drafts() {
    if (!state || !state.drafts) await refresh();
    return (state && state.drafts) || {};
  }

  buttons.commit.addEventListener("click", async () => {
    pullRequestForm.hidden = true;
    if (!commitForm.hidden) {
      commitForm.hidden = true;
      return;
    }
    const box = $("repo-commit-message");
    if (!box.value.trim()) box.value = (await drafts()).commit_message || "";
    commitForm.hidden = false;
    box.focus();
  });

  commitForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const box = $("repo-commit-message");
    run("commit", async () => {
      const answer = await post("commit/", { message: box.value }, "commit");
      commitForm.hidden = true;
      box.value = "";
      showResult(`Committed ${shortCommit(answer.commit)} to ${fold.repository.branch}.`);
      announce("Committed.");
    });
  });

  buttons.push.addEventListener("click", () => run("push", async () => {
    const answer = await post("push/", {}, "push");
    showResult(`Pushed ${answer.branch || fold.repository.branch} (${shortCommit(answer.head)}).`);
    announce("Pushed.");
  }));

  buttons.pullRequest.addEventListener("click", async () => {
    commitForm.hidden = true;
    if (!pullRequestForm.hidden) {
      pullRequestForm.hidden = true;
      return;
    }
    const texts = await drafts();
    const title = $("repo-pr-title");
    const body = $("repo-pr-body");
    if (!title.value.trim()) title.value = texts.pull_request_title || "";
    if (!body.value.trim()) body.value = texts.pull_request_body || "";
    pullRequestForm.hidden = false;
    title.focus();
  });

  pullRequestForm.addEventListener("submit", (event) => {
    event.preventDefault();
    run("pull-request", async () => {
      const answer = await post("pull-request/", { title: $("repo-pr-title").value, body: $("repo-pr-body").value }, "pull-request");
      pullRequestForm.hidden = true;
      $("repo-pr-title").value = ""; // a later one is drafted afresh
      $("repo-pr-body").value = "";
      const link = typeof answer.url === "string" && /^https?:\/\//i.test(answer.url) ? answer.url : "";
      showResult(`Pull request${Number.isSafeInteger(answer.number) ? ` #${answer.number}` : ""} is ${PULL_REQUEST_STATES[answer.state]?.toLowerCase() || "open"}.`, link);
      announce("The pull request is open.");
    });
  });

  buttons.update.addEventListener("click", () => run("update", async () => {
    const answer = await post("update/", {}, "update");
    const conflicts = Array.isArray(answer.conflicts) ? answer.conflicts.filter((p) => typeof p === "string") : [];
    drawConflicts(conflicts);
    if (conflicts.length) {
      showResult(`Updated from ${fold.repository.base || "the base branch"}: ${conflicts.length} ${conflicts.length === 1 ? "file is" : "files are"} in conflict. Resolve them, then commit.`);
    } else {
      showResult(`Updated from ${fold.repository.base || "the base branch"} (${shortCommit(answer.head)}).`);
    }
    announce(conflicts.length ? "Updated, with conflicts." : "Updated.");
  }));

  function drawConflicts(conflicts) {
    const box = $("repo-conflicts");
    box.hidden = !conflicts.length;
    const list = box.querySelector("ul");
    list.replaceChildren();
    for (const path of conflicts) {
      const button = list.appendChild(el("li")).appendChild(el("button", "repo-conflict link", path));
      button.type = "button";
      button.dataset.path = path;
      button.setAttribute("aria-label", `Open ${path} (in conflict)`);
    }
  }

  panel.addEventListener("click", (event) => {
    const conflict = event.target.closest(".repo-conflict");
    if (conflict) workspace.openFile(conflict.dataset.path);
    const cancel = event.target.closest("button[data-cancel]");
    if (cancel) cancel.closest("form").hidden = true;
  });

  status.onRunningChange(drawPanel);
  setInterval(refresh, REFRESH_EVERY_MS);
  draw();

  return {
    /** The log changed the repository (fold.repository): draw it. */
    draw,
    refresh,
    /** The Changes tab was shown: read the state afresh. */
    panelShown: refresh,
    /** A repository event arrived live (not a clone's progress): read the state afresh. */
    eventArrived(kind, data) {
      const progress = kind === "repository_status" && (data.progress || typeof data.output === "string");
      if (!progress) refresh();
    },
    /** Tell whether what the sidebar's item shows of the repository (its clone under way,
     *  ready or failed; its pull request's state) changed since it was drawn or last told. */
    listChanged() {
      const now = listedOf(fold.repository);
      if (now === listed) return false;
      listed = now;
      return true;
    },
    /** Why prompts wait besides a running turn: the repository is not ready yet ("" if it is). */
    waitReason() {
      const repo = fold.repository;
      return PREPARING.has(repo.status) ? "waiting for the repository: sent once it is cloned" : "";
    },
  };
}

// What the sidebar's item (templates/craft/_session_item.html) shows of a repository.
function listedOf(repo) {
  const clone = PREPARING.has(repo.status) ? "preparing" : repo.status;
  return `${clone} ${repo.pullRequest ? repo.pullRequest.state : ""}`;
}
