// What tells a person that the agent finished or needs them while they look elsewhere, and
// what tells the server that they looked.
//
// - While the tab is hidden, a turn's end puts "(n) ✓" before the tab's title (n turns ended
//   since), a permission request puts "Needs approval" there; both go when the tab is shown.
// - Browser notifications say the same, only for a person who asked for them: the "Notify me"
//   button asks the browser's permission when it is clicked (never before), and the choice is
//   kept in this browser (localStorage).
// - The page is "seen" when it is shown: the socket's `seen` frame marks the session read
//   (docs/websocket-api.md), so that the session lists of the person's other tabs drop
//   "New".

const PREFIX = /^(\(\d+\) ✓ |Needs approval · )/;
const STORED = "craft.notifications";

/** Return the page's attention: `send(frame)` sends on the session socket (false when it is
 *  not open), `sessionTitle()` is the session's title now. */
export function createAttention({ send, sessionTitle }) {
  const toggle = document.getElementById("notify-toggle");
  const supported = typeof window.Notification === "function";
  let ended = 0;
  let needed = false;
  let shown = [];

  const hidden = () => document.visibilityState === "hidden";
  const wanted = () => supported && Notification.permission === "granted"
    && localStorage.getItem(STORED) === "on";

  function showTitle() {
    const base = document.title.replace(PREFIX, "");
    if (needed) document.title = `Needs approval · ${base}`;
    else if (ended) document.title = `(${ended}) ✓ ${base}`;
    else document.title = base;
  }

  function notify(title, body) {
    if (!wanted()) return;
    try {
      const notification = new Notification(title, { body, tag: `craft-${location.pathname}` });
      notification.onclick = () => {
        window.focus();
        notification.close();
      };
      shown.push(notification);
    } catch {
      // A browser that only notifies from a service worker: the title says it instead.
    }
  }

  /** A live turn ended (`reason`: what the page says of its stop reason). */
  function turnEnded(reason) {
    if (!hidden()) {
      looked();
      return;
    }
    ended += 1;
    needed = false;
    showTitle();
    notify(`${reason} · ${sessionTitle()}`, "The agent's turn ended.");
  }

  /** A live permission request: the agent waits for the person. */
  function needsApproval(what, asks = "asks for permission") {
    if (!hidden()) return;
    needed = true;
    showTitle();
    notify(`Needs approval · ${sessionTitle()}`, `The agent ${asks}: ${what}.`);
  }

  /** Tell the server the person sees the session now, if they do. */
  function looked() {
    if (!hidden()) send({ type: "seen" });
  }

  document.addEventListener("visibilitychange", () => {
    if (hidden()) return;
    ended = 0;
    needed = false;
    showTitle();
    for (const notification of shown) notification.close();
    shown = [];
    looked();
  });

  function drawToggle() {
    const on = wanted();
    const blocked = supported && Notification.permission === "denied";
    toggle.setAttribute("aria-pressed", String(on));
    toggle.textContent = blocked ? "Notifications blocked" : on ? "Notifying" : "Notify me";
    toggle.title = blocked
      ? "Your browser blocks notifications from this site: allow them in its site settings."
      : on ? "You are told when a turn ends or the agent needs you while this tab is hidden. Click to stop."
        : "Be told when a turn ends or the agent needs you while this tab is hidden.";
  }

  if (toggle && supported) {
    toggle.hidden = false;
    drawToggle();
    toggle.addEventListener("click", async () => {
      if (wanted()) {
        localStorage.setItem(STORED, "off");
      } else {
        // Asked only now, on the person's click: browsers refuse (or bury) prompts otherwise.
        const answer = Notification.permission === "granted"
          ? "granted" : await Notification.requestPermission();
        localStorage.setItem(STORED, answer === "granted" ? "on" : "off");
      }
      drawToggle();
    });
  }

  return { turnEnded, needsApproval, looked, titleChanged: showTitle };
}
