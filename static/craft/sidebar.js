// The sidebar of the chat pages: sessions and the sandbox line, kept fresh without polling.
// - The session list is fetched again when the session page says one of the person's
//   sessions changed (`craft:sessions-changed`: the session socket's `sessions` frame, pushed
//   by the server within moments of a turn starting or ending, a permission request, a
//   title, a session read, created or deleted, in any tab or worker), and when the window
//   regains focus or becomes visible. Bursts of changes make one request; never while
//   someone is using the list (a menu open, or focus inside): it is fetched when they leave;
//   never while the tab is hidden: it is fetched once when it is shown.
// - The sandbox line is fetched again with it on focus; on a session's page the socket's
//   `sandbox` frames keep it up to date (session/status.mjs).
(() => {
  "use strict";

  function refresh(id) {
    const node = document.getElementById(id);
    if (node && window.htmx) window.htmx.trigger(node, "craft:refresh");
  }

  const toggle = document.getElementById("sidebar-toggle");
  if (toggle) {
    toggle.addEventListener("click", () => {
      const open = document.body.classList.toggle("sidebar-open");
      toggle.setAttribute("aria-expanded", String(open));
    });
  }

  // A list that is in use is fetched once it is no longer (a swap would close its menu or
  // take the keyboard away).
  let stale = false;
  let soon = null;
  // A change that comes while the list is being fetched may be newer than the answer, and
  // htmx loses a trigger on an element that its own swap replaces: fetch once more after.
  let again = false;
  function refreshList() {
    const list = document.getElementById("session-list");
    if (!list) return;
    if (list.querySelector("details[open]") || list.contains(document.activeElement)) {
      stale = true;
      return;
    }
    stale = false;
    if (list.dataset.loading) {
      again = true;
      return;
    }
    refresh("session-list");
  }
  document.addEventListener("htmx:beforeRequest", (event) => {
    if (event.target.id === "session-list") event.target.dataset.loading = "true";
  });
  document.addEventListener("htmx:afterRequest", (event) => {
    // The list stays when its fetch failed; a new one (swapped in) has no mark.
    if (event.target.id === "session-list") delete event.target.dataset.loading;
    if (again) {
      again = false;
      refreshListSoon();
    }
  });
  document.addEventListener("htmx:afterSettle", () => {
    if (again) {
      again = false;
      refreshListSoon();
    }
  });
  // A turn's end comes with a title, a permission answer with the next step: one request.
  function refreshListSoon() {
    clearTimeout(soon);
    soon = setTimeout(refreshList, 100);
  }
  function refreshAll() {
    if (document.hidden) return;
    refreshList();
    refresh("sandbox-status");
  }
  window.addEventListener("focus", refreshAll);
  document.addEventListener("visibilitychange", refreshAll);
  // A hidden tab fetches nothing: it fetches the list once when it is shown (refreshAll).
  document.addEventListener("craft:sessions-changed", () => {
    if (!document.hidden) refreshListSoon();
  });
  document.addEventListener("focusout", () => {
    if (stale) setTimeout(refreshList, 0); // once focus has landed outside
  });
  document.addEventListener("toggle", () => stale && refreshListSoon(), true);

  // After a rename, the item is swapped: put the keyboard back on its link (or, when the
  // rename was refused, on the title field, which the template marks autofocus).
  document.addEventListener("htmx:afterSwap", (event) => {
    const target = event.detail && event.detail.target;
    const item = target && target.id ? document.getElementById(target.id) : null;
    if (!item || !item.classList.contains("session-item")) return;
    if (!item.querySelector(".form-error")) {
      const link = item.querySelector(".session-link");
      if (link) link.focus();
    }
  });
})();
