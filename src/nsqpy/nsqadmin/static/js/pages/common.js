// Pieces several pages share: host cells, E2E latency columns, live-rate cards, actions.
import { config, nodePath, latest } from "../api.js";
import { html } from "../html.js";
import { commafy, duration, percentLabel, rate } from "../format.js";
import { sparkline } from "../spark.js";
import { confirmAction, toast, label } from "../ui.js";

// "vm:4151 (127.0.0.1:4151)" as Go shows an nsqd, or just the link when hostname = address.
export function hostCell(node) {
  const name = node.node || "";
  const cut = name.lastIndexOf(":");
  const port = name.slice(cut + 1);
  const address = name.slice(0, cut).replace(/^\[|\]$/g, "");
  const hostname = node.hostname || address;
  const hostPort = hostname + ":" + port;
  if (hostname.toLowerCase() !== address.toLowerCase()) {
    return html`${hostPort} (<a href="${nodePath(name)}">${name}</a>)`;
  }
  return html`<a href="${nodePath(name)}">${hostPort}</a>`;
}

export function pausedLabel(paused) {
  return paused ? html` ${label("paused", "primary")}` : "";
}

export function percentiles(stats) {
  const e2e = stats && stats.e2e_processing_latency;
  return (e2e && e2e.percentiles) || [];
}

export function e2eGroupHeader(stats) {
  const n = percentiles(stats).length;
  return n ? html`<th colspan="${n}" class="center">E2E Processing Latency</th>` : "";
}

export function e2eHeaders(stats) {
  return percentiles(stats).map((p) => {
    const [value, suffix] = percentLabel(p.quantile);
    return html`<th class="num">${value}<sup>${suffix}</sup></th>`;
  });
}

// One cell per percentile of the header stats; rows without data show 0ns like Go.
export function e2eCells(headerStats, rowStats) {
  const rowValues = percentiles(rowStats);
  return percentiles(headerStats).map((p, i) => {
    const v = rowValues.find((r) => r.quantile === p.quantile) || rowValues[i];
    if (!v) {
      return html`<td class="num muted">–</td>`;
    }
    const [value] = percentLabel(v.quantile);
    const title = `${value}: min = ${duration(v.min)}, max = ${duration(v.max)}`;
    return html`<td class="num"><span title="${title}">${duration(v.average)}</span></td>`;
  });
}

export function memoryDisk(stats) {
  return html`${commafy(stats.memory_depth)} + ${commafy(stats.backend_depth)}`;
}

// The live cards: depth, msgs/s in and msgs/s out with their sparklines (/api/history).
export function liveCards(hist, what) {
  const now = latest(hist);
  const points = hist ? hist.points : [];
  const card = (name, key, cls, value) => html`
    <div class="stat" data-stat="${key}">
      <div class="name">${name}</div>
      <div class="value">${value}</div>
      ${sparkline(points, key, cls, 160, 28)}
    </div>`;
  if (!now) {
    const why = Number(config.poll_interval_ms)
      ? html`Live rates for this ${what} appear after nsqadmin's next polls of the cluster.`
      : "Live rates are off: nsqadmin runs with --poll-interval=0.";
    return html`<div class="stats"><div class="stat muted" data-stat="none">${why}</div></div>`;
  }
  return html`<div class="stats">
    ${card(what === "topic" ? "Queued (topic + channels)" : "Depth", "queued", "depth", commafy(now.queued))}
    ${card("Msgs/s in", "rate_in", "in", rate(now.rate_in))}
    ${card("Msgs/s out", "rate_out", "out", rate(now.rate_out))}
  </div>`;
}

// Rate cells plus a small depth sparkline for a table row.
export function rateCells(hist) {
  const now = latest(hist);
  const points = hist ? hist.points : [];
  return html`
    <td class="num" data-col="rate_in">${now ? rate(now.rate_in) : "–"}</td>
    <td class="num" data-col="rate_out">${now ? rate(now.rate_out) : "–"}</td>
    <td>${sparkline(points, "depth", "depth", 90, 18)}</td>`;
}

// Rows for daemons that did not answer: shown and marked, never silently dropped.
export function unreachableRows(unreachable, colspan) {
  return (unreachable || []).map(
    (u) => html`<tr class="unreachable" data-unreachable="${u.address}">
      <td>&#10006; ${u.address} ${label("unreachable", "danger")}</td>
      <td colspan="${colspan}">${u.error}</td></tr>`,
  );
}

export function totalLabel(reached, unreachable) {
  const missing = (unreachable || []).length;
  if (!missing) {
    return "Total:";
  }
  return `Total (${reached} of ${reached + missing} nodes):`;
}

// Clicks on a page's [data-action] buttons, delegated from the page root:
// onAction(action, dataset) for the button's data-action and its other data-* values.
export function bindActions(root, onAction, selector = "[data-action]") {
  root.addEventListener("click", (event) => {
    const button = event.target.closest(selector);
    if (button) {
      onAction(button.dataset.action, button.dataset);
    }
  });
}

// The admin buttons of a topic or channel page (noun "Topic" or "Channel"): Empty Queue,
// Delete, and Pause or UnPause as the queue is running or paused; nothing for non-admins.
export function queueActions(ctx, paused, noun) {
  return ctx.isAdmin
    ? html`<div class="actions">
          <button class="btn btn-warning" data-action="empty">Empty Queue</button>
          <button class="btn btn-danger" data-action="delete">Delete ${noun}</button>
          ${paused
            ? html`<button class="btn btn-success" data-action="unpause">UnPause ${noun}</button>`
            : html`<button class="btn btn-primary" data-action="pause">Pause ${noun}</button>`}
        </div>`
    : "";
}

// Confirm, call the API, then say what happened and refresh (or go elsewhere).
export async function runAction(ctx, { title, body, action, style, call, done, after }) {
  const ok = await confirmAction({ title, body, action, style });
  if (!ok) {
    return false;
  }
  await ctx.hold();
  try {
    const result = await call();
    if (result && result.message) {
      toast(result.message, "warning");
    }
  } catch (err) {
    toast(err.message, "danger");
    ctx.reload();
    return false;
  }
  toast(done);
  if (after) {
    after();
  } else {
    ctx.reload();
  }
  return true;
}

// Text for what an action destroys: "3,156 messages (1,000 in memory + 2,156 on disk)".
export function lossText(depth, memory, disk) {
  const n = Number(depth) || 0;
  let text = `${commafy(n)} ${n === 1 ? "message" : "messages"}`;
  if (memory !== undefined && disk !== undefined && n) {
    text += ` (${commafy(memory)} in memory + ${commafy(disk)} on disk)`;
  }
  return text;
}
