// The channel page's "Messages" section: what nsqd --enable-inspect lists for a channel (the
// next queued messages, those in flight, the deferred ones), read without consuming anything.
import { get, nodePath } from "../api.js";
import { html } from "../html.js";
import { ago, commafy, duration } from "../format.js";

// Messages asked for per node and list (nsqadmin allows 1..100).
export const INSPECT_N = 20;
// Characters of a body shown before "show more".
const PREVIEW_CHARS = 80;

// The channel's listings; null when nsqadmin could not say (the section is left out).
export async function loadInspection(topic, channel) {
  const path = "/topics/" + encodeURIComponent(topic) + "/" + encodeURIComponent(channel);
  try {
    return await get(path + "/inspect?n=" + INSPECT_N);
  } catch (err) {
    return null;
  }
}

// A base64 body as text (invalid UTF-8 shows as U+FFFD, control characters as "·").
export function bodyText(b64) {
  let bytes;
  try {
    bytes = Uint8Array.from(atob(b64 || ""), (c) => c.charCodeAt(0));
  } catch (err) {
    return "";
  }
  const text = new TextDecoder("utf-8").decode(bytes);
  return text.replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, "·");
}

// "in 41.33s" for a time to come, "3s ago" for one gone (nanoseconds since the epoch).
export function fromNow(ns) {
  const ms = Number(ns) / 1e6 - Date.now();
  return ms >= 0 ? "in " + duration(ms * 1e6) : ago(-ms);
}

function when(ns) {
  const date = new Date(Number(ns) / 1e6);
  return Number.isNaN(date.getTime()) ? "" : date.toISOString().replace("T", " ").replace("Z", " UTC");
}

function bodyCell(m, key, opened) {
  const text = bodyText(m.body);
  const size = Number(m.body_size) || 0;
  const note = m.body_truncated ? html`<p class="muted">The first ${commafy(text.length)} characters
    of ${commafy(size)} bytes.</p>` : "";
  if (text.length <= PREVIEW_CHARS && !m.body_truncated) {
    return html`<td class="msg-body"><code>${text}</code></td>`;
  }
  return html`<td class="msg-body"><details data-key="${key}" ${opened.has(key) ? "open" : ""}>
    <summary><code>${text.slice(0, PREVIEW_CHARS)}…</code>
      <span class="more">show more</span><span class="less">show less</span></summary>
    <pre>${text}</pre>${note}</details></td>`;
}

function table(id, title, total, rows, extra, opened) {
  const heading = html`<h5>${title} <span class="muted">(${total})</span></h5>`;
  if (!rows.length) {
    return html`${heading}<p class="muted" id="${id}-none">None.</p>`;
  }
  return html`${heading}<div class="table-scroll"><table class="table messages" id="${id}">
    <tr><th>NSQd Host</th><th>ID</th><th>Timestamp</th><th class="num">Attempts</th>
      ${extra.map(([name]) => html`<th>${name}</th>`)}<th>Body</th></tr>
    ${rows.map((m) => {
      const key = `${id}/${m.node}/${m.id}`;
      return html`<tr data-id="${m.id}"><td><a href="${nodePath(m.node)}">${m.node}</a></td><td><code>${m.id}</code></td>
        <td title="${when(m.timestamp)}">${fromNow(m.timestamp)}</td>
        <td class="num">${commafy(m.attempts)}</td>
        ${extra.map(([, cell]) => html`<td>${cell(m)}</td>`)}${bodyCell(m, key, opened)}</tr>`;
    })}
  </table></div>`;
}

// What a non-admin sees instead of the section (with --admin-user bodies are for admins only).
export function adminOnlyNote() {
  return html`<section id="inspect-admin-only"><h4>Messages</h4>
    <p class="muted">Message bodies are shown to admins only.</p></section>`;
}

// The section, or nothing when no nsqd of the channel supports inspection.
export function inspectSection(found, opened) {
  const nodes = (found && found.nodes) || [];
  if (!nodes.length) {
    return "";
  }
  const rows = (key) => nodes.flatMap((n) => (n[key] || []).map((m) => ({ node: n.node, ...m })));
  const sum = (key) => nodes.reduce((k, n) => k + (Number(n[key]) || 0), 0);
  const queued = rows("queued");
  const unsupported = found.unsupported || [];
  return html`<section id="inspect"><h4>Messages</h4>
    <p class="muted">Read without consuming (nsqd <code>--enable-inspect</code>): delivery order,
      attempts and depth stay as they are. Up to ${found.n} per node and list.
      ${unsupported.length ? html`Not listed: ${unsupported.join(", ")} (no inspection).` : ""}</p>
    ${table("next-messages", "Next messages", `next ${commafy(queued.length)}`, queued, [], opened)}
    ${table("in-flight", "In flight", commafy(sum("in_flight_total")), rows("in_flight"), [
      ["Client", (m) => m.client_id],
      ["Timeout", (m) => html`<span title="${when(m.deadline)}">${fromNow(m.deadline)}</span>`],
    ], opened)}
    ${table("deferred", "Deferred", commafy(sum("deferred_total")), rows("deferred"), [
      ["Due", (m) => html`<span title="${when(m.due)}">${fromNow(m.due)}</span>`],
    ], opened)}
  </section>`;
}
