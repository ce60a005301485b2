// Loading a session's stored events over HTTP (GET /api/sessions/<id>/events/, docs/http-api.md).

const LOAD_TIMEOUT_MS = 8000; // per request; a hung load must not hold the load guard
const MAX_PARALLEL_PAGES = 8;

/** Fetch JSON from `url`, or throw an Error whose message says in words what went wrong. */
export async function fetchJson(url, { controller = new AbortController(), cache = "no-store" } = {}) {
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    controller.abort();
  }, LOAD_TIMEOUT_MS);
  try {
    // With cache "default", a GET the page preloaded (session.html) uses that response; every
    // other request goes to the server ("no-store"), or a retry could join a hung preload.
    const response = await fetch(url, { credentials: "same-origin", signal: controller.signal, cache });
    if (!response.ok) {
      throw new Error(response.status >= 500 ? `the server had a problem (${response.status})` : `the server refused (${response.status})`);
    }
    return await response.json();
  } catch (error) {
    if (timedOut) throw new Error("the server took too long to answer");
    if (error.name === "AbortError") throw new Error("the request was stopped");
    if (error instanceof TypeError) throw new Error("the connection failed");
    throw error;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Load the events after lastSeq() from `url`, handing each page to applyPage(events) in seq
 * order (which must advance lastSeq()); return the last page's body. Every page up to the last
 * seq the server told of (serverLastSeq()) is requested at once: the seqs have no gaps, so page
 * k starts after lastSeq + k * pageSize. `controller` stops them all; `cache` is fetch's.
 */
export async function loadHistory({ url, pageSize, lastSeq, serverLastSeq, controller, cache }, applyPage) {
  let body = null;
  while (body === null || body.has_more) {
    const from = lastSeq();
    const pages = [];
    for (
      let after = from;
      pages.length === 0 || (after < serverLastSeq() && pages.length < MAX_PARALLEL_PAGES);
      after += pageSize
    ) {
      pages.push(fetchJson(`${url}?after=${after}&limit=${pageSize}`, { controller, cache }));
    }
    pages.forEach((p) => p.catch(() => {})); // awaited below, in order
    for (const page of pages) {
      body = await page;
      const events = Array.isArray(body.events) ? body.events : [];
      if (events.length && events[0].seq > lastSeq() + 1) {
        body = { has_more: true }; // an earlier page was short: continue from lastSeq
        break;
      }
      applyPage(events);
    }
    if (lastSeq() === from && body.has_more) throw new Error("the server sent no events");
  }
  return body;
}
