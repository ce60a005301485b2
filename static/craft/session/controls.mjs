// The agent's own controls above the composer, as the fold last saw them (fold.agent): config
// option pickers (or, for agents that only have modes, a mode picker), the usage meter, and
// whether images and commands are on offer. A picker asks the agent for the change; when the
// change is refused, or cannot be sent, it shows the agent's value again.

import { $, el } from "./dom.mjs";
import { isObject, str } from "./values.mjs";
import { formatNumber } from "./words.mjs";

/** Start the controls of `fold`'s agent; `send` sends a frame (false when not connected). */
export function createControls({ fold, send, status }) {
  const agentControls = $("agent-controls");
  const pickers = $("pickers");
  const usageBox = $("usage");
  const attachImage = $("attach-image");
  let dirty = false;

  // A select's values, flat or in groups ({group, name, options}).
  function selectOptions(option) {
    const values = [];
    for (const item of Array.isArray(option.options) ? option.options : []) {
      if (!isObject(item)) continue;
      if (typeof item.value === "string") values.push(item);
      for (const inner of Array.isArray(item.options) ? item.options : []) {
        if (isObject(inner) && typeof inner.value === "string") values.push(inner);
      }
    }
    return values;
  }

  function picker(label, current, values, data) {
    const box = el("span", "picker");
    const name = box.appendChild(el("label", "", label));
    const select = box.appendChild(el("select"));
    select.id = `picker-${pickers.childElementCount}`;
    name.htmlFor = select.id;
    Object.assign(select.dataset, data);
    for (const value of values) {
      const option = select.appendChild(el("option", "", str(value.name) || value.value));
      option.value = value.value;
      if (typeof value.description === "string") option.title = value.description;
    }
    if (!values.some((v) => v.value === current)) {
      select.insertBefore(el("option", "", current || "—"), select.firstChild).value = current;
    }
    select.value = current;
    return box;
  }

  function render() {
    const agent = fold.agent;
    const focused = document.activeElement && pickers.contains(document.activeElement)
      ? document.activeElement.dataset : null;
    pickers.replaceChildren();
    // Config options are preferred: modes only for agents that offer nothing else.
    if (agent.configOptions && agent.configOptions.length) {
      for (const option of agent.configOptions) {
        if (option.type !== "select" || typeof option.id !== "string") continue; // unknown types are ignored
        const values = selectOptions(option);
        if (!values.length) continue;
        pickers.appendChild(picker(str(option.name) || option.id, str(option.currentValue), values, { config: option.id }));
      }
    } else if (agent.modes && Array.isArray(agent.modes.availableModes)) {
      const values = agent.modes.availableModes
        .filter((m) => isObject(m) && typeof m.id === "string")
        .map((m) => ({ value: m.id, name: m.name, description: m.description }));
      if (values.length) pickers.appendChild(picker("Mode", str(agent.modes.currentModeId), values, { mode: "1" }));
    }
    if (focused) {
      const again = [...pickers.querySelectorAll("select")].find(
        (s) => s.dataset.config === focused.config && s.dataset.mode === focused.mode);
      if (again) again.focus();
    }
    const usage = agent.usage;
    const used = usage && Number(usage.used);
    const size = usage && Number(usage.size);
    if (usage && Number.isFinite(used) && Number.isFinite(size) && size > 0) {
      const meter = $("usage-meter");
      meter.value = Math.min(1, Math.max(0, used / size));
      let text = `Context ${Math.round((100 * used) / size)}% (${formatNumber(used)} of ${formatNumber(size)} tokens)`;
      const cost = isObject(usage.cost) ? usage.cost : null;
      if (cost && Number.isFinite(cost.amount) && typeof cost.currency === "string") {
        try {
          text += ` · ${new Intl.NumberFormat(undefined, { style: "currency", currency: cost.currency, maximumFractionDigits: 4 }).format(cost.amount)}`;
        } catch {
          text += ` · ${cost.amount} ${cost.currency}`;
        }
      }
      $("usage-text").textContent = text;
      usageBox.hidden = false;
    } else {
      usageBox.hidden = true;
    }
    agentControls.hidden = !pickers.childElementCount && usageBox.hidden;
    attachImage.hidden = agent.prompt.image !== true;
    $("composer-hint-more").hidden = !agent.commands.length;
  }

  /** Draw the controls if the agent's offer changed since they were last drawn. */
  function draw() {
    if (!dirty) return;
    dirty = false;
    try {
      render();
    } catch (error) {
      console.error("could not show the agent's controls", error);
    }
  }

  /** Show what the agent last said again (a change was refused or not sent). */
  function revert() {
    dirty = true;
    draw();
  }

  pickers.addEventListener("change", (event) => {
    const select = event.target.closest("select");
    if (!select) return;
    const frame = select.dataset.config
      ? { type: "set_config_option", config: select.dataset.config, value: select.value }
      : { type: "set_mode", mode: select.value };
    if (send(frame)) {
      status.announce("Asking the agent to change that…");
    } else {
      status.showFrameError("Not connected. Change it again in a moment.");
      revert();
    }
  });

  return {
    changed() {
      dirty = true;
    },
    draw,
    revert,
  };
}
