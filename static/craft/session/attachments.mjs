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

  // Take the image files among `files`; return whether there were any.
  function addImages(files) {
    const chosen = [...files].filter((f) => f && typeof f.type === "string" && f.type.startsWith("image/"));
    if (!chosen.length) return false;
    if (fold.agent.prompt.image !== true) {
      status.showFrameError("This agent does not accept images.");
      return true;
    }
    for (const file of chosen) {
      if (!IMAGE_TYPES.includes(file.type)) {
        status.showFrameError(`${file.name || "That image"} can't be sent: use PNG, JPEG, GIF or WebP.`);
        continue;
      }
      if (file.size > MAX_IMAGE_BYTES) {
        status.showFrameError(`${file.name || "That image"} is too large (${formatBytes(file.size)}; at most 2 MB).`);
        continue;
      }
      if (images.length >= MAX_ATTACHMENTS) {
        status.showFrameError("At most 10 attachments go with one message.");
        break;
      }
      const reader = new FileReader();
      reader.addEventListener("load", () => {
        const url = String(reader.result || "");
        const comma = url.indexOf(",");
        if (comma < 0) return;
        images.push({ id: ++imageIds, name: file.name || `image-${imageIds}`, mimeType: file.type,
          data: url.slice(comma + 1), bytes: file.size });
        render();
      });
      reader.readAsDataURL(file);
    }
    return true;
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
