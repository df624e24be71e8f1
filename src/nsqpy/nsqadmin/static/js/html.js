// A tiny safe templating helper: html`<td>${value}</td>` escapes every interpolated value
// unless it is itself the result of html`...` (or an array of those).

export class Safe {
  constructor(text) {
    this.text = text;
  }

  toString() {
    return this.text;
  }
}

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function escape(value) {
  return String(value).replace(/[&<>"']/g, (ch) => ESCAPES[ch]);
}

function piece(value) {
  if (value === null || value === undefined || value === false) {
    return "";
  }
  if (value instanceof Safe) {
    return value.text;
  }
  if (Array.isArray(value)) {
    return value.map(piece).join("");
  }
  return escape(value);
}

export function html(strings, ...values) {
  let out = strings[0];
  values.forEach((value, i) => {
    out += piece(value) + strings[i + 1];
  });
  return new Safe(out);
}

// Text that is already markup (e.g. an SVG we built from numbers).
export function raw(text) {
  return new Safe(text);
}
