// Loading stored events over HTTP (static/craft/session/history.mjs), against a fake fetch that
// serves a session of N events in pages, as GET /api/sessions/<id>/events/ does.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { fetchJson, loadHistory } from "../../static/craft/session/history.mjs";

const URL_ = "/api/sessions/s/events/";

// A fetch for a session of `total` events; `short` pages stop early (as if cut by size).
function serve(t, total, { short = new Set(), status = 200 } = {}) {
  const asked = [];
  t.mock.method(globalThis, "fetch", async (url, options) => {
    const query = new URL(url, "http://craft.test").searchParams;
    const after = Number(query.get("after"));
    const limit = Number(query.get("limit"));
    asked.push({ after, cache: options.cache, credentials: options.credentials });
    const last = Math.min(total, after + (short.has(after) ? 1 : limit));
    const events = [];
    for (let seq = after + 1; seq <= last; seq++) events.push({ seq, kind: "plan", data: {} });
    const body = { events, has_more: last < total, running: false };
    return { ok: status < 400, status, json: async () => body };
  });
  return asked;
}

// Load like the page: applying a page advances lastSeq to its last event.
async function load(total, serverLastSeq, options = {}) {
  let lastSeq = options.from || 0;
  const applied = [];
  const body = await loadHistory({
    url: URL_, pageSize: 10, lastSeq: () => lastSeq, serverLastSeq: () => serverLastSeq,
    controller: new AbortController(), cache: "default",
  }, (events) => {
    for (const event of events) {
      if (event.seq === lastSeq + 1) lastSeq = event.seq;
      applied.push(event.seq);
    }
  });
  return { body, applied, lastSeq };
}

describe("loading history", () => {
  test("every page up to the server's last seq is asked at once, and applied in order", async (t) => {
    const asked = serve(t, 35);
    const { body, applied } = await load(35, 35);
    assert.deepEqual(asked.map((a) => a.after), [0, 10, 20, 30]);
    assert.deepEqual(applied, Array.from({ length: 35 }, (_, i) => i + 1));
    assert.equal(body.has_more, false);
    assert.ok(asked.every((a) => a.cache === "default" && a.credentials === "same-origin"));
  });

  test("events stored after the server's hello come in a further round", async (t) => {
    const asked = serve(t, 25);
    const { applied } = await load(25, 12, { from: 0 });
    assert.deepEqual(asked.map((a) => a.after), [0, 10, 20]);
    assert.equal(applied.length, 25);
  });

  test("a short page is followed from where it stopped, never applied out of order", async (t) => {
    const asked = serve(t, 30, { short: new Set([10]) });
    const { applied, lastSeq } = await load(30, 30);
    assert.equal(lastSeq, 30);
    assert.deepEqual(applied, Array.from({ length: 30 }, (_, i) => i + 1));
    assert.deepEqual(asked.map((a) => a.after), [0, 10, 20, 11, 21]);
  });

  test("a page that brings nothing while more is promised fails the load", async (t) => {
    t.mock.method(globalThis, "fetch", async () => ({
      ok: true, status: 200, json: async () => ({ events: [], has_more: true }),
    }));
    await assert.rejects(load(10, 10), { message: "the server sent no events" });
  });

  test("failures are said in words", async (t) => {
    serve(t, 5, { status: 502 });
    await assert.rejects(fetchJson(URL_), { message: "the server had a problem (502)" });
    serve(t, 5, { status: 403 });
    await assert.rejects(fetchJson(URL_), { message: "the server refused (403)" });
    t.mock.method(globalThis, "fetch", async () => {
      throw new TypeError("Failed to fetch");
    });
    await assert.rejects(fetchJson(URL_), { message: "the connection failed" });
  });
});
