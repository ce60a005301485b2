// Git's unified diff (what GET .../turns/<seq>/diff/ streams) split into files and hunks, as
// the workspace panel shows them. No DOM here, so that Node can run it (tests/js/diff.test.mjs).
//
// Hunks are numbered from 0 in the order git writes them: the number the revert endpoint takes
// for one hunk of one file (docs/workspace.md), when the diff was asked for that file alone.

/** Return the files of a unified diff: [{path, oldPath, binary, header, hunks: [{header,
 *  lines: [{kind: "add" | "del" | "ctx" | "meta", text}]}]}]. Never throws. */
export function parseDiff(text) {
  const files = [];
  let file = null;
  let hunk = null;
  for (const line of String(text).split("\n")) {
    if (line.startsWith("diff --git ")) {
      const names = /^diff --git a\/(.*) b\/(.*)$/.exec(line);
      file = { path: names ? names[2] : "", oldPath: names ? names[1] : "", binary: false, header: [line], hunks: [] };
      files.push(file);
      hunk = null;
    } else if (!file) {
      continue; // nothing before the first file
    } else if (line.startsWith("@@")) {
      hunk = { header: line, lines: [] };
      file.hunks.push(hunk);
    } else if (hunk) {
      if (line.startsWith("+")) hunk.lines.push({ kind: "add", text: line.slice(1) });
      else if (line.startsWith("-")) hunk.lines.push({ kind: "del", text: line.slice(1) });
      else if (line.startsWith(" ")) hunk.lines.push({ kind: "ctx", text: line.slice(1) });
      else if (line.startsWith("\\")) hunk.lines.push({ kind: "meta", text: line });
    } else {
      file.header.push(line);
      if (line.startsWith("Binary files ")) file.binary = true;
      const target = /^\+\+\+ b\/(.*)$/.exec(line);
      if (target) file.path = target[1];
      const source = /^--- a\/(.*)$/.exec(line);
      if (source) file.oldPath = source[1];
    }
  }
  return files;
}

/** Return the (+added, −removed) line counts of a hunk. */
export function hunkCounts(hunk) {
  let added = 0;
  let removed = 0;
  for (const line of hunk.lines) {
    if (line.kind === "add") added++;
    else if (line.kind === "del") removed++;
  }
  return { added, removed };
}
