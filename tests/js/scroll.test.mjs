// Following the newest event (static/craft/session/scroll.mjs): only the person stops it, and
// only the person (or the page on their behalf) resumes it.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { createFollowing, isEditable, scrollIntent } from "../../static/craft/session/scroll.mjs";

describe("following", () => {
  test("scrolls the page makes itself never stop it, at the bottom or not", () => {
    const state = createFollowing();
    for (const atBottom of [false, true, false, false]) state.scrolled(atBottom);
    assert.equal(state.following, true);
  });

  test("the person scrolling up stops it, even while the page still reads as at the bottom", () => {
    const state = createFollowing();
    state.personScrolled("up");
    assert.equal(state.following, false);
    state.scrolled(true); // the page's own scroll to the bottom, arriving late
    assert.equal(state.following, false);
  });

  test("scrolling up a page shorter than the window stops nothing", () => {
    const state = createFollowing();
    state.personScrolled("up", false);
    assert.equal(state.following, true);
  });

  test("the person scrolling back down to the bottom resumes it; part of the way does not", () => {
    const state = createFollowing();
    state.personScrolled("up");
    state.personScrolled("down");
    state.scrolled(false);
    assert.equal(state.following, false);
    state.scrolled(true);
    assert.equal(state.following, true);
  });

  test("a held scrollbar follows where it is dragged, both ways", () => {
    const state = createFollowing();
    state.holdScrollbar(true);
    state.scrolled(false);
    assert.equal(state.following, false);
    state.scrolled(true);
    assert.equal(state.following, true);
    state.holdScrollbar(false);
    state.scrolled(false);
    assert.equal(state.following, true);
  });

  test("follow() resumes it whatever the person did", () => {
    const state = createFollowing();
    state.personScrolled("up");
    state.follow();
    assert.equal(state.following, true);
  });
});

describe("what an input event asks", () => {
  const key = (k, extra = {}) => ({ type: "keydown", key: k, target: { tagName: "BUTTON" }, ...extra });

  test("the wheel: up, down, or sideways", () => {
    assert.equal(scrollIntent({ type: "wheel", deltaY: -120 }), "up");
    assert.equal(scrollIntent({ type: "wheel", deltaY: 53 }), "down");
    assert.equal(scrollIntent({ type: "wheel", deltaY: 0, deltaX: 40 }), "");
  });

  test("keys that scroll the page", () => {
    for (const k of ["ArrowUp", "PageUp", "Home"]) assert.equal(scrollIntent(key(k)), "up", k);
    for (const k of ["ArrowDown", "PageDown", "End", " "]) assert.equal(scrollIntent(key(k)), "down", k);
    assert.equal(scrollIntent(key(" ", { shiftKey: true })), "up");
    assert.equal(scrollIntent(key("a")), "");
  });

  test("keys typed in a text box, with a modifier, or taken by the page scroll nothing", () => {
    assert.equal(scrollIntent(key("ArrowUp", { target: { tagName: "TEXTAREA" } })), "");
    assert.equal(scrollIntent(key("Home", { target: { tagName: "DIV", isContentEditable: true } })), "");
    assert.equal(scrollIntent(key("ArrowUp", { altKey: true })), "");
    assert.equal(scrollIntent(key("Home", { defaultPrevented: true })), "");
  });

  test("editable targets", () => {
    assert.equal(isEditable({ tagName: "INPUT" }), true);
    assert.equal(isEditable({ tagName: "select" }), true);
    assert.equal(isEditable({ tagName: "BODY" }), false);
    assert.equal(isEditable(null), false);
  });
});
