// Scrolling: the page follows the newest event unless the person scrolled away from it.
//
// Only what the person does decides: a wheel, a touch, a key, a drag of the scrollbar. Scroll
// events say where the page is, not who moved it: the page growing, blocks laid out late
// (content-visibility), scroll anchoring and the page's own scrolls fire them too, a frame or
// more late, when the page may have grown or the person may have turned the wheel meanwhile.
// Deciding "the reader left the bottom" from them lost the reader's place as often as it kept
// it. So the person scrolling up stops the following at once, and a scroll event resumes it
// only when the person was scrolling down and the page is at its bottom again (or, while the
// scrollbar is held, wherever it is dragged to).

const BOTTOM_SLACK = 4; // px: fractional scroll positions never quite reach the bottom
// Keys that scroll the page when nothing editable has the focus.
const UP_KEYS = new Set(["ArrowUp", "PageUp", "Home"]);
const DOWN_KEYS = new Set(["ArrowDown", "PageDown", "End"]);

/** Return whether the person, typing in `target`, edits text rather than scrolls the page. */
export function isEditable(target) {
  if (!target || typeof target !== "object") return false;
  const tag = String(target.tagName || "").toLowerCase();
  return tag === "textarea" || tag === "input" || tag === "select" || target.isContentEditable === true;
}

/** Return which way a wheel or key event asks to scroll the page: "up", "down" or "". */
export function scrollIntent(event) {
  if (event.type === "wheel") return event.deltaY < 0 ? "up" : event.deltaY > 0 ? "down" : "";
  if (event.type !== "keydown") return "";
  if (event.defaultPrevented || event.altKey || event.ctrlKey || event.metaKey) return "";
  if (isEditable(event.target)) return "";
  if (UP_KEYS.has(event.key) || (event.key === " " && event.shiftKey)) return "up";
  if (DOWN_KEYS.has(event.key) || event.key === " ") return "down";
  return "";
}

/** Return the state of following: whether the page keeps the newest event in view. */
export function createFollowing() {
  let following = true;
  let down = false; // the person's last scroll was down
  let dragging = false; // the person holds the scrollbar
  return {
    get following() {
      return following;
    },
    /** The person scrolled "up" or "down"; `canScroll`: the page is longer than the window. */
    personScrolled(direction, canScroll = true) {
      if (direction === "up") {
        down = false;
        if (canScroll) following = false;
      } else if (direction === "down") {
        down = true;
      }
    },
    /** The person took hold of the scrollbar, or let go of it. */
    holdScrollbar(held) {
      dragging = held;
    },
    /** The page scrolled, by anyone or anything; it is now `atBottom` or not. */
    scrolled(atBottom) {
      if (dragging) following = atBottom;
      else if (atBottom && down) following = true;
    },
    /** Follow again (the person asked for the latest, sent a message, answered the agent). */
    follow() {
      following = true;
    },
  };
}

/** Start following the bottom of the page; return how to go there, how to keep there as
 *  things are drawn, and how to show one element. The composer's height is kept in
 *  `--composer-height` on `session`, which leaves that much room below the transcript. */
export function followBottom({ session, transcript, composer, jumpButton, promptBox }) {
  const state = createFollowing();
  const root = document.documentElement;

  function atBottom() {
    return window.innerHeight + window.scrollY >= root.scrollHeight - BOTTOM_SLACK;
  }

  // "Jump to the latest": only when the page does not follow and is not at its end already.
  function showJump() {
    jumpButton.hidden = state.following || atBottom();
  }

  /** Go to the bottom, and follow from there on. */
  function toBottom() {
    state.follow();
    window.scrollTo(0, root.scrollHeight);
    jumpButton.hidden = true;
  }

  /** After something new is drawn: down to it when following; else offer to jump there. */
  function stick() {
    if (state.following) toBottom();
    else showJump();
  }

  /** Bring `element` into view, as the person asked (scroll-margin in the CSS keeps it clear
   *  of the sticky head and the composer); the following goes on only if that is the bottom. */
  function reveal(element) {
    element.scrollIntoView({ block: "nearest" });
    if (atBottom()) state.follow();
    else state.personScrolled("up");
    showJump();
  }

  /** Follow again from the next thing drawn (the person answered the agent). */
  function follow() {
    state.follow();
  }

  // Whether something between `target` and the page scrolls instead of the page (a long tool
  // output, the sidebar, the prompt box): the page only scrolls once that is at its end.
  function scrolledInside(target, direction) {
    for (let node = target; node && node !== document.body && node !== root; node = node.parentElement) {
      if (node.scrollHeight <= node.clientHeight) continue;
      const overflow = getComputedStyle(node).overflowY;
      if (overflow !== "auto" && overflow !== "scroll") continue;
      if (direction === "up" ? node.scrollTop > 0 : node.scrollTop + node.clientHeight < node.scrollHeight - 1) {
        return true;
      }
    }
    return false;
  }

  function personScrolled(direction, target) {
    if (!direction || scrolledInside(target, direction)) return;
    // Whether the page can scroll at all: the wheel's own scroll may be done by the time its
    // event comes (a passive listener), so where the page is now says nothing.
    state.personScrolled(direction, root.scrollHeight > window.innerHeight + BOTTOM_SLACK);
    showJump();
  }

  window.addEventListener("wheel", (event) => personScrolled(scrollIntent(event), event.target), { passive: true });
  document.addEventListener("keydown", (event) => personScrolled(scrollIntent(event), event.target));
  // A finger moving down the screen scrolls the page up, and up the screen down.
  let touchY = null;
  window.addEventListener("touchstart", (event) => {
    touchY = event.touches.length === 1 ? event.touches[0].clientY : null;
  }, { passive: true });
  window.addEventListener("touchmove", (event) => {
    if (touchY === null || event.touches.length !== 1) return;
    const y = event.touches[0].clientY;
    if (Math.abs(y - touchY) < 2) return;
    personScrolled(y > touchY ? "up" : "down", event.target);
    touchY = y;
  }, { passive: true });
  // The page's own scrollbar: a press on it lands on the root element, right of its width.
  window.addEventListener("pointerdown", (event) => {
    if (event.target === root && event.clientX >= root.clientWidth) state.holdScrollbar(true);
  }, { passive: true });
  for (const type of ["pointerup", "pointercancel", "blur"]) {
    window.addEventListener(type, () => state.holdScrollbar(false), { passive: true });
  }
  window.addEventListener("scroll", () => {
    state.scrolled(atBottom());
    showJump();
  }, { passive: true });

  jumpButton.addEventListener("click", () => {
    toBottom();
    promptBox.focus({ preventScroll: true });
  });

  if ("ResizeObserver" in window) {
    // Whatever makes the transcript taller while following (Markdown rendered late, blocks
    // laid out for the first time, which content-visibility defers), keep the bottom in view.
    new ResizeObserver(() => {
      if (state.following) toBottom();
      else showJump();
    }).observe(transcript);
    // The composer grows with what it holds (the pinned request, images, a long message):
    // the transcript keeps that much room below it, so the composer never covers its end.
    new ResizeObserver(() => {
      session.style.setProperty("--composer-height", `${Math.ceil(composer.getBoundingClientRect().height)}px`);
      if (state.following) toBottom();
    }).observe(composer);
  }

  return {
    toBottom, stick, reveal, follow,
    get following() {
      return state.following;
    },
  };
}
