// The unified diff parser of the workspace panel (static/craft/session/diff.mjs), on diffs
// as git writes them.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { hunkCounts, parseDiff } from "../../static/craft/session/diff.mjs";

const TWO_HUNKS = `diff --git a/f.txt b/f.txt
index e8823e1..42367c7 100644
--- a/f.txt
+++ b/f.txt
@@ -1,6 +1,6 @@
 1
 2
-3
+three
 4
@@ -22,7 +22,7 @@
 24
-25
+twenty-five
\\ No newline at end of file
`;

describe("unified diffs", () => {
  test("a file's hunks are numbered in git's order, with their lines", () => {
    const [file] = parseDiff(TWO_HUNKS);
    assert.equal(file.path, "f.txt");
    assert.equal(file.hunks.length, 2);
    assert.equal(file.hunks[1].header, "@@ -22,7 +22,7 @@");
    assert.deepEqual(file.hunks[0].lines.map((l) => l.kind), ["ctx", "ctx", "del", "add", "ctx"]);
    assert.deepEqual(hunkCounts(file.hunks[1]), { added: 1, removed: 1 });
    assert.equal(file.hunks[1].lines.at(-1).kind, "meta");
  });

  test("several files, an added one, a deleted one and a binary one", () => {
    const files = parseDiff(`diff --git a/new.txt b/new.txt
new file mode 100644
--- /dev/null
+++ b/new.txt
@@ -0,0 +1 @@
+hello
diff --git a/gone.txt b/gone.txt
deleted file mode 100644
--- a/gone.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
diff --git a/logo.png b/logo.png
new file mode 100644
Binary files /dev/null and b/logo.png differ
`);
    assert.deepEqual(files.map((f) => [f.path, f.hunks.length, f.binary]), [
      ["new.txt", 1, false], ["gone.txt", 1, false], ["logo.png", 0, true],
    ]);
  });

  test("nothing, or nonsense, is no files", () => {
    assert.deepEqual(parseDiff(""), []);
    assert.deepEqual(parseDiff("@@ hello\n+x"), []);
    assert.deepEqual(parseDiff(undefined), []);
  });
});
