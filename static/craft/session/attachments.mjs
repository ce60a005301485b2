// What goes with the next prompt besides its text:
//   images   pasted, dropped or chosen, for agents that take them (promptCapabilities.image),
//            sent as image blocks; listed by name, never previewed (the page's policy allows
//            no data: or blob: images)
//   files    any other file (or folder) dropped on the composer: uploaded into the workspace's
//            uploads/ folder (a taken name kept as "name (n)"), then sent as a link to it
//            (a resource link, as an "@" mention is)

import { $, el } from "./dom.mjs";
import { droppedItems, filesOf, joinPath } from "./upload-names.mjs";
import { formatBytes } from "./words.mjs";

const MAX_IMAGE_BYTES = 2 * 1024 * 1024;
const MAX_ATTACHMENTS = 10;
const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"];
const UPLOADS = "uploads"; // the workspace folder files dropped on the composer go to

/** Start taking images and files for `fold`'s agent (files through `uploads`, uploads.mjs);
 *  return the lists and a way to empty them. */
export function createAttachments({ fold, status, uploads }) {
  const list = $("attachments");
  const promptBox = $("prompt");
  const composer = $("composer");
  const imageInput = $("image-input");
  let images = []; // {id, name, mimeType, data, bytes} to go with the next prompt
  let imageIds = 0;
  let reading = 0; // images still being read
  let files = []; // {id, name, path, bytes, ready, abort, label} uploaded for the next prompt

  // Take the images among `files`, and tell the person which files were not taken and why;
  // return whether there were files at all.
  function addImages(files) {
    const all = [...files].filter((f) => f && typeof f.type === "string");
    if (!all.length) return false;
    const refused = []; // "name (why)"
    const name = (file) => file.name || "That file";
    for (const file of all) {
      if (!file.type.startsWith("image/")) {
        refused.push(`${name(file)} (only images can be attached)`);
      } else if (fold.agent.prompt.image !== true) {
        refused.push(`${name(file)} (this agent does not accept images)`);
      } else if (!IMAGE_TYPES.includes(file.type)) {
        refused.push(`${name(file)} (use PNG, JPEG, GIF or WebP)`);
      } else if (file.size > MAX_IMAGE_BYTES) {
        refused.push(`${name(file)} (${formatBytes(file.size)}; at most 2 MB)`);
      } else if (images.length + reading + files.length >= MAX_ATTACHMENTS) {
        refused.push(`${name(file)} (at most 10 attachments go with one message)`);
      } else {
        read(file);
      }
    }
    if (refused.length) status.showFrameError(`Not attached: ${refused.join(", ")}.`);
    return true;
  }

  function read(file) {
    reading++;
    const reader = new FileReader();
    reader.addEventListener("loadend", () => {
      reading--;
      const url = String(reader.result || "");
      const comma = url.indexOf(",");
      if (reader.error || comma < 0) {
        status.showFrameError(`Not attached: ${file.name || "that image"} could not be read.`);
        return;
      }
      images.push({ id: ++imageIds, name: file.name || `image-${imageIds}`, mimeType: file.type,
        data: url.slice(comma + 1), bytes: file.size });
      render();
    });
    reader.readAsDataURL(file);
  }

  // An image the agent takes as an image block: anything else dropped goes as a file.
  const takenAsImage = (file) => fold.agent.prompt.image === true && IMAGE_TYPES.includes(file.type)
    && file.size <= MAX_IMAGE_BYTES;

  // Take what was dropped on the composer: images as images, the rest (folders walked) as files.
  async function addDropped(items) {
    const { files: dropped, unread } = await filesOf(items);
    if (unread) status.showFrameError(`Not attached: ${unread} of the dropped files could not be read.`);
    const asImages = dropped.filter(({ file, path }) => !path.includes("/") && takenAsImage(file));
    if (asImages.length) addImages(asImages.map(({ file }) => file));
    const refused = [];
    for (const item of dropped) {
      if (asImages.includes(item)) continue;
      if (images.length + reading + files.length >= MAX_ATTACHMENTS) refused.push(item.path);
      else upload(item);
    }
    if (refused.length) status.showFrameError(`Not attached: ${refused.join(", ")} (at most 10 attachments go with one message).`);
  }

  async function upload({ file, path }) {
    const entry = { id: ++imageIds, name: path, path: joinPath(UPLOADS, path), bytes: file.size, ready: false, abort: null, label: null };
    files.push(entry);
    render();
    const result = await uploads.send(file, entry.path, {
      progress(sent, total) {
        if (entry.label) entry.label.textContent = `${entry.name} (uploading, ${total ? Math.floor((100 * sent) / total) : 100}%)`;
      },
      sending: (abort) => (entry.abort = abort),
    });
    if (!files.includes(entry)) return; // removed meanwhile
    if (result.state !== "done") {
      files = files.filter((f) => f !== entry);
      render();
      if (result.state === "failed") status.showFrameError(`Not attached: ${entry.name} (${result.why}).`);
      return;
    }
    entry.path = result.path;
    entry.ready = true;
    entry.abort = null;
    render();
  }

  function render() {
    list.replaceChildren();
    for (const image of images) chip(`${image.name} (${formatBytes(image.bytes)})`, image.name, "image", image.id);
    for (const file of files) {
      const text = file.ready ? `${file.path} (${formatBytes(file.bytes)})` : `${file.name} (uploading…)`;
      file.label = chip(text, file.path, "file", file.id);
    }
    list.hidden = !images.length && !files.length;
  }

  function chip(text, name, kind, id) {
    const li = list.appendChild(el("li"));
    const label = li.appendChild(el("span", "", text));
    const remove = li.appendChild(el("button", "", "×"));
    remove.type = "button";
    remove.dataset[kind] = id;
    remove.setAttribute("aria-label", `Remove ${name}`);
    return label;
  }

  list.addEventListener("click", (event) => {
    const remove = event.target.closest("button[data-image], button[data-file]");
    if (!remove) return;
    if (remove.dataset.image) images = images.filter((i) => String(i.id) !== remove.dataset.image);
    const file = files.find((f) => String(f.id) === remove.dataset.file);
    if (file) {
      files = files.filter((f) => f !== file);
      if (file.abort) file.abort(); // what was uploaded already stays in the workspace
    }
    render();
    promptBox.focus();
  });
  promptBox.addEventListener("paste", (event) => {
    const files = event.clipboardData ? event.clipboardData.files : null;
    if (files && files.length && addImages(files)) event.preventDefault();
  });
  composer.addEventListener("dragover", (event) => {
    if (event.dataTransfer && [...event.dataTransfer.types].includes("Files")) event.preventDefault();
  });
  composer.addEventListener("drop", (event) => {
    const items = droppedItems(event.dataTransfer);
    if (!items.length) return;
    event.preventDefault(); // the browser would open the file instead
    addDropped(items);
  });
  $("attach-image").addEventListener("click", () => imageInput.click());
  imageInput.addEventListener("change", () => {
    addImages(imageInput.files);
    imageInput.value = "";
  });

  return {
    images: () => images,
    /** The workspace paths of the files uploaded for the next prompt. */
    files: () => files.filter((f) => f.ready).map((f) => f.path),
    /** Whether a file for the next prompt is still being uploaded. */
    uploading: () => files.some((f) => !f.ready),
    clear() {
      images = [];
      files = files.filter((f) => !f.ready); // one still uploading goes with the next prompt
      render();
    },
  };
}
