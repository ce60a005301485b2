// The Terminal tab's pure parts: where its socket is, and the ids a tab remembers.
import assert from "node:assert/strict";
import { test } from "node:test";

import { terminalStore, terminalUrl } from "../../static/craft/session/terminal.mjs";

function memoryStorage() {
  const items = new Map();
  return {
    getItem: (key) => (items.has(key) ? items.get(key) : null),
    setItem: (key, value) => items.set(key, String(value)),
    removeItem: (key) => items.delete(key),
    items,
  };
}

test("a new terminal asks for its size, a known one for its id", () => {
  const http = { protocol: "http:", host: "craft.test:8000" };
  assert.equal(
    terminalUrl(http, "s1", null, 80, 24),
    "ws://craft.test:8000/ws/sessions/s1/terminals/?cols=80&rows=24",
  );
  const https = { protocol: "https:", host: "craft.test" };
  assert.equal(terminalUrl(https, "s1", "abc", 80, 24), "wss://craft.test/ws/sessions/s1/terminals/?terminal=abc");
});

test("a session's terminal ids are kept once each, and forgotten", () => {
  const storage = memoryStorage();
  const store = terminalStore(storage, "s1");
  store.add("a");
  store.add("b");
  store.add("a");
  assert.deepEqual(store.ids(), ["a", "b"]);
  assert.deepEqual(terminalStore(storage, "s2").ids(), []);
  store.remove("a");
  store.remove("b");
  assert.deepEqual(store.ids(), []);
  assert.equal(storage.items.size, 0);
});

test("what is not a list of ids in storage counts as none", () => {
  const storage = memoryStorage();
  storage.setItem("craft.terminals.s1", "{not json");
  assert.deepEqual(terminalStore(storage, "s1").ids(), []);
  storage.setItem("craft.terminals.s1", JSON.stringify(["a", 5, null]));
  assert.deepEqual(terminalStore(storage, "s1").ids(), ["a"]);
});
