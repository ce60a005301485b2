// Paths as a person should read them: relative to the session's workspace, never the host's.

/** Return the path functions of a session whose agent works in `workspace`. */
export function workspacePaths(workspace, sessionId) {
  const root = (workspace || "").replace(/\/+$/, "");
  const sessionPathPattern = new RegExp(`(?:/[^\\s"'\`()]*)?/sessions/${sessionId}(?=/|\\b)/?`, "g");

  // A path of the workspace, relative to it ("." for the workspace itself).
  function relPath(path) {
    if (typeof path !== "string") return "";
    if (root && path === root) return ".";
    if (root && path.startsWith(`${root}/`)) return path.slice(root.length + 1);
    return path.replace(sessionPathPattern, "") || ".";
  }

  // Text with the workspace's paths made relative.
  function scrub(text) {
    if (typeof text !== "string") return "";
    let out = text;
    if (root && out.includes(root)) out = out.split(`${root}/`).join("").split(root).join(".");
    return out.includes(sessionId) ? out.replace(sessionPathPattern, "") : out;
  }

  // Staff details: workspace paths relative, any other absolute path cut to its last part.
  function scrubHostPaths(text) {
    return scrub(text).replace(/(^|[\s'"(=:])\/(?:[\w.@+-]+\/)+([\w.@+-]+)/g, "$1…/$2");
  }

  return { relPath, scrub, scrubHostPaths };
}
