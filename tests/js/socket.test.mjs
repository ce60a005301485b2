// The connection (static/craft/session/socket.mjs) and its load guard, invariant 7: the page
// loads a session once per (re)connect, and retries when the load fails. The websocket is a
// fake, the load one the test finishes when it wants, and time a clock the test moves.

import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, test } from "node:test";

import { createConnection } from "../../static/craft/session/socket.mjs";

class FakeSocket {
  static OPEN = 1;
  static made = [];

  constructor(url) {
    this.url = url;
    this.readyState = 0;
    this.sent = [];
    FakeSocket.made.push(this);
  }

  send(text) {
    this.sent.push(JSON.parse(text));
  }

  receive(frame) {
    this.onmessage({ data: JSON.stringify(frame) });
  }

  hello(lastSeq = 0) {
    this.readyState = FakeSocket.OPEN;
    this.receive({ type: "hello", session: "s", last_seq: lastSeq, running: false });
  }

  drop(code = 1006) {
    this.readyState = 3;
    this.onclose({ code });
  }
}

// setTimeout and clearTimeout on a clock that moves only when told (Node's own mock timers are
// experimental in Node 20 and differ in Debian's Node 18).
class FakeClock {
  now = 0;
  timers = new Map();
  last = 0;

  install() {
    this.saved = [globalThis.setTimeout, globalThis.clearTimeout];
    globalThis.setTimeout = (run, ms = 0) => {
      this.timers.set(++this.last, { at: this.now + ms, run });
      return this.last;
    };
    globalThis.clearTimeout = (id) => this.timers.delete(id);
  }

  uninstall() {
    [globalThis.setTimeout, globalThis.clearTimeout] = this.saved;
  }

  tick(ms) {
    const until = this.now + ms;
    for (;;) {
      const due = [...this.timers].filter(([, t]) => t.at <= until).sort(([, a], [, b]) => a.at - b.at);
      if (!due.length) break;
      const [id, timer] = due[0];
      this.timers.delete(id);
      this.now = timer.at;
      timer.run();
    }
    this.now = until;
  }
}

const clock = new FakeClock();
const settle = () => new Promise((resolve) => setImmediate(resolve)); // let awaits run
const LONGEST_BACKOFF = 15000;

// A started connection whose loads wait for the test: `loads` lists them ({options, resolve,
// reject}), `told` what the page was told, `sockets` every socket opened.
function started() {
  const page = { lastSeq: 0, told: [], loads: [], sockets: FakeSocket.made };
  const hooks = new Proxy({}, { get: (_, name) => (...args) => page.told.push([name, ...args]) });
  page.connection = createConnection({
    url: "ws://craft.test/ws/sessions/s/",
    serverLastSeq: 0,
    lastSeq: () => page.lastSeq,
    loadEvents: (options) => new Promise((resolve, reject) => page.loads.push({ options, resolve, reject })),
    page: hooks,
  });
  page.connection.start();
  page.told.length = 0;
  // Finish the newest load, as if it applied events up to `seq`.
  page.finish = async (seq) => {
    page.lastSeq = seq;
    page.loads.at(-1).resolve({ events: [], has_more: false, running: false });
    await settle();
  };
  page.fail = async (message) => {
    page.loads.at(-1).reject(new Error(message));
    await settle();
  };
  // Lose the socket and let the reconnect happen.
  page.reconnect = () => {
    page.sockets.at(-1).drop();
    clock.tick(LONGEST_BACKOFF);
    return page.sockets.at(-1);
  };
  page.said = (name) => page.told.filter(([hook]) => hook === name).map(([, ...args]) => args);
  return page;
}

describe("the load guard", () => {
  beforeEach(() => {
    FakeSocket.made = [];
    globalThis.WebSocket = FakeSocket;
    clock.install();
  });
  afterEach(() => {
    clock.uninstall();
    delete globalThis.WebSocket;
  });

  test("the first load starts with the page, with what it preloaded; the first hello joins it", async () => {
    const page = started();
    assert.equal(page.loads.length, 1);
    assert.equal(page.loads[0].options.cache, "default");
    const [socket] = page.sockets;
    assert.equal(socket.url, "ws://craft.test/ws/sessions/s/");
    socket.hello(5);
    assert.equal(page.loads.length, 1);
    assert.equal(page.loads[0].options.serverLastSeq(), 5); // the load reaches what hello told
    await page.finish(5);
    assert.deepEqual(socket.sent, [{ type: "resume", after: 5 }]);
    assert.equal(page.said("loaded").length, 1);
  });

  test("reconnects during a load start no second load; it resumes on the newest socket", async () => {
    const page = started();
    page.sockets[0].hello();
    page.reconnect().hello();
    const newest = page.reconnect();
    newest.hello();
    assert.equal(page.sockets.length, 3);
    assert.equal(page.loads.length, 1);
    await page.finish(7);
    assert.deepEqual(newest.sent, [{ type: "resume", after: 7 }]);
    assert.deepEqual(page.sockets[0].sent, []);
    assert.deepEqual(page.sockets[1].sent, []);
  });

  test("every reconnect after a load loads once, from the server", async () => {
    const page = started();
    page.sockets[0].hello();
    await page.finish(3);
    const socket = page.reconnect();
    socket.hello(4);
    socket.hello(4); // a second hello on the same socket while the load runs
    assert.equal(page.loads.length, 2);
    assert.equal(page.loads[1].options.cache, "no-store");
    await page.finish(4);
    assert.deepEqual(socket.sent, [{ type: "resume", after: 4 }]);
  });

  test("a failed load clears the guard: its retry runs, and resumes on the newest socket", async () => {
    const page = started();
    page.sockets[0].hello();
    await page.fail("the connection failed");
    const [[message, delay]] = page.said("loadFailed");
    assert.equal(message, "the connection failed");
    assert.ok(delay > 0 && delay <= 500, `first retry after ${delay} ms`);
    assert.equal(page.loads[0].options.controller.signal.aborted, true); // its other pages stop
    // A reconnect while the retry waits does not load: the retry will.
    const socket = page.reconnect();
    socket.hello();
    assert.equal(page.loads.length, 2);
    await page.finish(9);
    assert.deepEqual(socket.sent, [{ type: "resume", after: 9 }]);
  });

  test("a retry that waits runs after its backoff, once", async () => {
    const page = started();
    page.sockets[0].hello();
    await page.fail("the server had a problem (502)");
    const [[, delay]] = page.said("loadFailed");
    page.sockets[0].hello(); // the same socket again: the retry is pending, nothing loads
    clock.tick(delay - 1);
    assert.equal(page.loads.length, 1);
    clock.tick(1);
    assert.equal(page.loads.length, 2);
    await page.fail("the server had a problem (502)");
    const [, [, second]] = page.said("loadFailed");
    assert.ok(second > 250, `second retry after ${second} ms`); // backs off
  });

  test("Retry now loads at once, and the waiting retry does not run too", async () => {
    const page = started();
    page.sockets[0].hello();
    await page.fail("the server took too long to answer");
    page.connection.load();
    page.connection.load(); // pressed twice
    assert.equal(page.loads.length, 2);
    clock.tick(LONGEST_BACKOFF);
    assert.equal(page.loads.length, 2);
    await page.finish(2);
    assert.deepEqual(page.sockets[0].sent, [{ type: "resume", after: 2 }]);
  });

  test("live events apply in order; a gap loads what is missing", async () => {
    const page = started();
    const [socket] = page.sockets;
    socket.hello(5);
    await page.finish(5);
    socket.receive({ type: "event", seq: 6, kind: "plan", data: {} });
    assert.deepEqual(page.said("event").map(([frame]) => frame.seq), [6]);
    page.lastSeq = 6;
    socket.receive({ type: "event", seq: 9, kind: "plan", data: {} });
    assert.equal(page.loads.length, 2);
    socket.receive({ type: "event", seq: 10, kind: "plan", data: {} }); // during that load
    assert.equal(page.loads.length, 2);
    assert.deepEqual(page.said("event").map(([frame]) => frame.seq), [6]);
  });

  test("a socket closed for good is not reopened", async () => {
    const page = started();
    page.sockets[0].hello();
    page.sockets[0].drop(4401);
    clock.tick(LONGEST_BACKOFF);
    assert.equal(page.sockets.length, 1);
    assert.deepEqual(page.said("connection").at(-1), ["signed-out"]);
    page.connection.online();
    assert.equal(page.sockets.length, 1);
  });

  test("coming back online reconnects at once; frames go only to an open socket", async () => {
    const page = started();
    assert.equal(page.connection.send({ type: "cancel" }), false); // not open yet
    page.sockets[0].hello();
    assert.equal(page.connection.send({ type: "cancel" }), true);
    page.sockets[0].drop();
    assert.deepEqual(page.said("announce").at(-1), ["Connection lost. Reconnecting…"]);
    page.connection.online();
    assert.equal(page.sockets.length, 2);
    page.sockets[1].hello();
    assert.deepEqual(page.said("announce").at(-1), ["Connected again."]);
  });
});
