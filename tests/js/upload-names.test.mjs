// What an upload is called (static/craft/session/upload-names.mjs): "Keep both" names, the
// paths of a dropped folder's files (walked through fake file system entries, as Chromium
// gives them), and the size limit. Run by `node --test tests/js/`.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  droppedItems, filesOf, joinPath, keepBothName, limitWords, overLimit,
} from "../../static/craft/session/upload-names.mjs";

// A file system entry of a drop: a file, or a folder whose reader gives its children in
// batches of `batch` (Chromium gives 100 at a time), then an empty batch.
function fileEntry(name, content = name) {
  return { name, isFile: true, isDirectory: false, file: (ok) => ok({ name, size: content.length, content }) };
}
function folderEntry(name, children, batch = 2) {
  return {
    name, isFile: false, isDirectory: true,
    createReader() {
      let at = 0;
      return {
        readEntries(ok) {
          const next = children.slice(at, at + batch);
          at += batch;
          setTimeout(() => ok(next), 0);
        },
      };
    },
  };
}

describe("Keep both", () => {
  test("the number goes before the extension, in the same folder", () => {
    assert.equal(keepBothName("notes.txt", 1), "notes (1).txt");
    assert.equal(keepBothName("docs/notes.txt", 2), "docs/notes (2).txt");
    assert.equal(keepBothName("a.b/archive.tar.gz", 1), "a.b/archive.tar (1).gz");
  });

  test("a name without an extension, or with only a leading dot, gets the number at its end", () => {
    assert.equal(keepBothName("Makefile", 1), "Makefile (1)");
    assert.equal(keepBothName("config/.env", 3), "config/.env (3)");
  });
});

describe("paths", () => {
  test("a folder and a relative path are joined without empty or dot parts", () => {
    assert.equal(joinPath("", "a.txt"), "a.txt");
    assert.equal(joinPath("docs", "img/a.png"), "docs/img/a.png");
    assert.equal(joinPath("docs/", "./a.txt"), "docs/a.txt");
    assert.equal(joinPath("uploads", ""), "uploads");
  });

  test("a dropped folder is walked to its files, its structure kept, every batch read", async () => {
    const dropped = [
      { entry: fileEntry("one.txt") },
      { entry: folderEntry("site", [
        fileEntry("index.html"), fileEntry("a.css"), fileEntry("b.css"),
        folderEntry("img", [fileEntry("logo.png")]), folderEntry("empty", []),
      ]) },
    ];
    const { files, unread } = await filesOf(dropped);
    assert.deepEqual(files.map((f) => f.path),
      ["one.txt", "site/index.html", "site/a.css", "site/b.css", "site/img/logo.png"]);
    assert.equal(files[4].file.name, "logo.png");
    assert.equal(unread, 0);
  });

  test("a file that cannot be read is left out and counted", async () => {
    const broken = { name: "gone.txt", isFile: true, isDirectory: false, file: (ok, fail) => fail(new Error("gone")) };
    const { files, unread } = await filesOf([{ entry: broken }, { entry: fileEntry("here.txt") }]);
    assert.deepEqual(files.map((f) => f.path), ["here.txt"]);
    assert.equal(unread, 1);
  });

  test("files chosen with a folder picker keep their relative path", async () => {
    const chosen = { name: "a.txt", webkitRelativePath: "proj/src/a.txt" };
    const { files } = await filesOf([{ file: chosen }, { file: { name: "b.txt", webkitRelativePath: "" } }]);
    assert.deepEqual(files.map((f) => f.path), ["proj/src/a.txt", "b.txt"]);
  });

  test("a drop is read as entries where the browser gives them, as files elsewhere", () => {
    const entry = fileEntry("x.txt");
    const file = { name: "y.txt" };
    const data = { items: [
      { kind: "file", webkitGetAsEntry: () => entry },
      { kind: "file", getAsFile: () => file },
      { kind: "string", getAsFile: () => null },
    ] };
    assert.deepEqual(droppedItems(data), [{ entry }, { file }]);
    assert.deepEqual(droppedItems({ items: [], files: [file] }), [{ file }]);
    assert.deepEqual(droppedItems(null), []);
  });
});

describe("the limit", () => {
  test("a file over the limit is refused, one of exactly the limit is not", () => {
    assert.equal(overLimit(100 * 2 ** 20 + 1, 100 * 2 ** 20), true);
    assert.equal(overLimit(100 * 2 ** 20, 100 * 2 ** 20), false);
    assert.equal(overLimit(10, NaN), false);
    assert.equal(overLimit(10, 0), false);
  });

  test("the limit is said in binary units", () => {
    assert.equal(limitWords(100 * 2 ** 20), "100 MiB");
    assert.equal(limitWords(1536), "1.5 KiB");
    assert.equal(limitWords(2 ** 30), "1 GiB");
    assert.equal(limitWords(512), "512 bytes");
  });
});
