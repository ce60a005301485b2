// What an upload is called and whether it may go: the workspace path of each file dropped or
// chosen (a dropped folder walked, its structure kept), "Keep both" names, and the size limit.
// No DOM and no network: Node tests it (tests/js/upload-names.test.mjs).

const UNITS = [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];

/** Return `bytes` as a person reads a limit: "100 MiB", "1.5 KiB", "12 bytes". */
export function limitWords(bytes) {
  for (const [unit, size] of UNITS) if (bytes >= size) return `${Number((bytes / size).toFixed(1))} ${unit}`;
  return `${bytes} bytes`;
}

/** Return whether a file of `size` bytes is over `limit` (no limit: 0 or not a number). */
export function overLimit(size, limit) {
  return Number.isFinite(limit) && limit > 0 && size > limit;
}

/** Return `folder` and `relative` joined as a workspace path ("" is the workspace itself). */
export function joinPath(folder, relative) {
  const parts = `${folder || ""}/${relative || ""}`.split("/").filter((part) => part && part !== ".");
  return parts.join("/");
}

/** Return the `n`th "Keep both" name of `path`: "docs/notes (2).txt", ".env (1)",
 *  "archive.tar (1).gz" (the number goes before the last extension; a leading dot is no
 *  extension). */
export function keepBothName(path, n) {
  const slash = path.lastIndexOf("/");
  const folder = path.slice(0, slash + 1);
  const name = path.slice(slash + 1);
  const dot = name.lastIndexOf(".");
  const [stem, ext] = dot > 0 ? [name.slice(0, dot), name.slice(dot)] : [name, ""];
  return `${folder}${stem} (${n})${ext}`;
}

/** Return what a drop carries, read at once (a DataTransfer is emptied once its event is
 *  over): each item's file system entry (a folder can only be walked through it), or its file
 *  when the browser gives no entry. */
export function droppedItems(dataTransfer) {
  if (!dataTransfer) return [];
  const items = [...(dataTransfer.items || [])].filter((item) => item.kind === "file");
  if (!items.length) return [...(dataTransfer.files || [])].map((file) => ({ file }));
  return items.map((item) => {
    const entry = typeof item.webkitGetAsEntry === "function" ? item.webkitGetAsEntry() : null;
    return entry ? { entry } : { file: item.getAsFile() };
  }).filter((item) => item.entry || item.file);
}

/** Return the files of dropped `items` ({entry} or {file}) as [{file, path}], each folder
 *  walked to its files, `path` relative to where they were dropped ("photos/2024/a.jpg").
 *  Empty folders bring nothing; what cannot be read is left out and counted in `unread`. */
export async function filesOf(items) {
  const files = [];
  let unread = 0;
  async function walk(entry, prefix) {
    const path = `${prefix}${entry.name}`;
    if (entry.isFile) {
      try {
        files.push({ file: await new Promise((resolve, reject) => entry.file(resolve, reject)), path });
      } catch {
        unread++;
      }
    } else if (entry.isDirectory) {
      let children;
      try {
        children = await readAll(entry.createReader());
      } catch {
        unread++;
        return;
      }
      for (const child of children) await walk(child, `${path}/`);
    }
  }
  for (const item of items) {
    if (item.entry) await walk(item.entry, "");
    else if (item.file) files.push({ file: item.file, path: item.file.webkitRelativePath || item.file.name });
  }
  return { files, unread };
}

// A folder's reader gives its entries in batches (Chromium: 100 at a time) until an empty one.
async function readAll(reader) {
  const all = [];
  for (;;) {
    const batch = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
    if (!batch.length) return all;
    all.push(...batch);
  }
}
