// The sidebar of the chat pages: sessions and the sandbox line, kept fresh without polling.
// - When the session page says some of the person's sessions changed (`craft:sessions-changed`,
//   its `detail.sessions` their ids: the session socket's `sessions` frame, pushed by the
//   server within moments of a turn starting or ending, a permission request, a title, a
//   session read, created or deleted, in any tab or worker), their items are fetched again
//   and put in their place (newest change first); a gone session's item is taken out. The
//   whole list is fetched instead when the change names no session, when the list is empty,
//   and when the window regains focus or becomes visible. Bursts of changes make one round
//   of requests; never while someone is using the list (a menu open, or focus inside): it
//   is fetched when they leave; never while the tab is hidden: it is fetched once, whole,
//   when it is shown.
// - The sandbox line is fetched again with it on focus; on a session's page the socket's
//   `sandbox` frames keep it up to date (session/status.mjs).
(() => {
  "use strict";

  const ZERO_ID = "00000000-0000-0000-0000-000000000000"; // in the list's data-item-url

  function refresh(id) {
    const node = document.getElementById(id);
    if (node && window.htmx) window.htmx.trigger(node, "craft:refresh");
  }

  // On a phone the list is a drawer: its button opens and closes it, and so do its own
  // Close button and Esc (taken before the page's Esc, which would stop the agent).
  const toggle = document.getElementById("sidebar-toggle");
  if (toggle) {
    const setOpen = (open) => {
      document.body.classList.toggle("sidebar-open", open);
      toggle.setAttribute("aria-expanded", String(open));
    };
    const close = () => {
      setOpen(false);
      toggle.focus();
    };
    toggle.addEventListener("click", () => setOpen(!document.body.classList.contains("sidebar-open")));
    document.getElementById("sidebar-close")?.addEventListener("click", close);
    document.addEventListener("keydown", (event) => {
      if (event.key !== "Escape" || !document.body.classList.contains("sidebar-open")) return;
      if (event.target.closest && event.target.closest("details[open]")) return; // closes its menu
      event.preventDefault();
      close();
    }, true);
  }

  // A list that is in use is fetched once it is no longer (a swap would close its menu or
  // take the keyboard away).
  let stale = false;
  let soon = null;
  // A change that comes while the list is being fetched may be newer than the answer, and
  // htmx loses a trigger on an element that its own swap replaces: fetch once more after.
  let again = false;
  // What to fetch: the items of these sessions, or (whole) the list.
  const changed = new Set();
  let whole = false;

  function inUse(list) {
    return list.querySelector("details[open]") || list.contains(document.activeElement);
  }

  function refreshList() {
    const list = document.getElementById("session-list");
    if (!list) return;
    if (inUse(list)) {
      stale = true;
      return;
    }
    stale = false;
    if (list.dataset.loading) {
      again = true;
      return;
    }
    if (whole || !list.dataset.itemUrl || !list.querySelector(".session-item")) {
      whole = false;
      changed.clear();
      refresh("session-list");
    } else if (changed.size) {
      const ids = [...changed];
      changed.clear();
      refreshItems(list, ids);
    }
  }

  // Fetch the sessions' items and put each in its place; one that is gone is taken out.
  async function refreshItems(list, ids) {
    list.dataset.loading = "true";
    try {
      const answers = await Promise.all(ids.map(async (id) => {
        const url = list.dataset.itemUrl.replace(ZERO_ID, encodeURIComponent(id));
        const response = await fetch(url, { headers: { "HX-Request": "true" } });
        if (response.status === 404) return [id, null];
        // Signed out meanwhile, the answer is the sign-in page (after a redirect): not an item.
        const item = response.ok && !response.redirected ? parseItem(await response.text()) : null;
        if (!item) throw new Error(`${url}: ${response.status}, not an item of the list`);
        return [id, item];
      }));
      if (inUse(list)) { // opened or focused meanwhile: the answers wait until it is left
        ids.forEach((id) => changed.add(id));
        stale = true;
        return;
      }
      for (const [id, item] of answers) {
        const old = document.getElementById(`session-${id}`);
        if (old) old.remove();
        if (item) place(list, item);
      }
      if (!list.querySelector(".session-item")) whole = true; // its "No sessions yet"
    } catch (error) {
      console.error("could not refresh the list of sessions", error);
      whole = true; // fetched whole instead, below
    } finally {
      delete list.dataset.loading;
    }
    if (again || whole) {
      again = false;
      refreshListSoon();
    }
  }

  function parseItem(html) {
    const template = document.createElement("template");
    template.innerHTML = html.trim();
    const item = template.content.firstElementChild;
    return item && item.classList.contains("session-item") && !item.nextElementSibling ? item : null;
  }

  // Put an item where the list has it: by its latest change, newest first.
  function place(list, item) {
    const updated = Number(item.dataset.updated);
    let before = null;
    for (const other of list.querySelectorAll(":scope > .session-item")) {
      if (Number(other.dataset.updated) <= updated) {
        before = other;
        break;
      }
    }
    list.insertBefore(item, before);
    if (window.htmx) window.htmx.process(item); // its rename and delete forms
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
    whole = true;
    refreshList();
    refresh("sandbox-status");
  }
  window.addEventListener("focus", refreshAll);
  document.addEventListener("visibilitychange", refreshAll);
  // A hidden tab fetches nothing: it fetches the list once when it is shown (refreshAll).
  document.addEventListener("craft:sessions-changed", (event) => {
    const ids = event.detail && event.detail.sessions;
    if (Array.isArray(ids)) ids.forEach((id) => changed.add(String(id)));
    else whole = true;
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
