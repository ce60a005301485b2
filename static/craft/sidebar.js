// The sidebar of the chat pages: sessions and the sandbox line, kept fresh without polling
// forever.
// - The sandbox line polls itself only while the sandbox is starting (its template says so);
//   while a "New session" request runs (it starts the sandbox), this script refreshes it.
// - The session list is refreshed when the window regains focus or becomes visible, when the
//   session page sees a title or a new turn, and once a minute while the page is visible;
//   never while someone is using it (a menu open, or focus inside).
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

  let provisioning = null;
  const isNewSession = (event) => event.target.closest && event.target.closest("form.new-session");
  document.addEventListener("htmx:beforeRequest", (event) => {
    if (!isNewSession(event)) return;
    clearInterval(provisioning);
    provisioning = setInterval(() => refresh("sandbox-status"), 1000);
  });
  document.addEventListener("htmx:afterRequest", (event) => {
    if (!isNewSession(event)) return;
    clearInterval(provisioning);
    provisioning = null;
  });

  function refreshList() {
    const list = document.getElementById("session-list");
    if (!list || document.hidden) return;
    if (list.querySelector("details[open]") || list.contains(document.activeElement)) return;
    refresh("session-list");
  }
  window.addEventListener("focus", refreshList);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) refreshList();
  });
  document.addEventListener("craft:sessions-changed", refreshList);
  setInterval(refreshList, 60000);

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
