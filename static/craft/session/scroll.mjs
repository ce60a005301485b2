// Scrolling: the page follows the newest event unless the reader scrolled up.

/** Start following the bottom of the page; return how to go there. */
export function followBottom({ transcript, jumpButton, promptBox }) {
  let pinned = true;

  function atBottom() {
    return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 80;
  }

  function toBottom() {
    window.scrollTo(0, document.documentElement.scrollHeight);
    pinned = true;
    jumpButton.hidden = true;
  }

  // After something new is drawn: down to it, or offer to jump there.
  function stick() {
    if (pinned) toBottom();
    else jumpButton.hidden = false;
  }

  window.addEventListener("scroll", () => {
    pinned = atBottom();
    jumpButton.hidden = pinned;
  }, { passive: true });
  jumpButton.addEventListener("click", () => {
    toBottom();
    promptBox.focus({ preventScroll: true });
  });
  // Whatever makes the transcript taller while the reader is at the bottom (Markdown rendered
  // late, off-screen blocks laid out for the first time, which content-visibility defers),
  // keep the bottom in view.
  if ("ResizeObserver" in window) {
    new ResizeObserver(() => {
      if (pinned) toBottom();
    }).observe(transcript);
  }

  return { toBottom, stick };
}
