// Reading untrusted JSON. Events come from agents and frames from the network: a field of the
// wrong type reads as empty, so that what uses it never throws.

/** Return `value` as text: a string as it is, a number written out, anything else "". */
export function str(value) {
  return typeof value === "string" ? value : typeof value === "number" ? String(value) : "";
}

/** Tell whether `value` is a JSON object (not null, not an array). */
export function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}
