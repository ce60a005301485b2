// Images for the next prompt: pasted, dropped or chosen, for agents that take them
// (promptCapabilities.image). They are listed by name, never previewed (the page's policy
// allows no data: or blob: images).

import { $, el } from "./dom.mjs";
import { formatBytes } from "./words.mjs";

const MAX_IMAGE_BYTES = 2 * 1024 * 1024;
const MAX_ATTACHMENTS = 10;
const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/** Start taking images for `fold`'s agent; return the list and a way to empty it. */
export function createAttachments({ fold, status }) {
  const list = $("attachments");
  const promptBox = $("prompt");
  const composer = $("composer");
  const imageInput = $("image-input");
  let images = []; // {id, name, mimeType, data, bytes} to go with the next prompt
  let imageIds = 0;
  let reading = 0; // images still being read

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
      } else if (images.length + reading >= MAX_ATTACHMENTS) {
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

  function render() {
    list.replaceChildren();
    for (const image of images) {
      const li = list.appendChild(el("li", "", `${image.name} (${formatBytes(image.bytes)})`));
      const remove = li.appendChild(el("button", "", "×"));
      remove.type = "button";
      remove.dataset.image = image.id;
      remove.setAttribute("aria-label", `Remove ${image.name}`);
    }
    list.hidden = !images.length;
  }

  list.addEventListener("click", (event) => {
    const remove = event.target.closest("button[data-image]");
    if (!remove) return;
    images = images.filter((i) => String(i.id) !== remove.dataset.image);
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
    if (event.dataTransfer && event.dataTransfer.files.length && addImages(event.dataTransfer.files)) {
      event.preventDefault();
    }
  });
  $("attach-image").addEventListener("click", () => imageInput.click());
  imageInput.addEventListener("change", () => {
    addImages(imageInput.files);
    imageInput.value = "";
  });

  return {
    images: () => images,
    clear() {
      images = [];
      render();
    },
  };
}
