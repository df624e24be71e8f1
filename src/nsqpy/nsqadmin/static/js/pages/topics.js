// Streams (/): every topic with what an operator needs to see what is backing up.
import { config, get, topicPath } from "../api.js";
import { html } from "../html.js";
import { commafy, rate } from "../format.js";
import { sparkline } from "../spark.js";
import { warningBanner, notice, tableScroll, label } from "../ui.js";
import { graphActive, graphImg, rateCell } from "../graphite.js";

const COLUMNS = [
  ["topic_name", "Topic"],
  ["queued", "Queued"],
  ["trend", "Depth trend"],
  ["rate_in", "Msgs/s in"],
  ["rate_out", "Msgs/s out"],
  ["channel_count", "Channels"],
  ["client_count", "Consumers"],
  ["in_flight_count", "In-Flight"],
  ["deferred_count", "Deferred"],
  ["message_count", "Messages"],
  ["producer_count", "Nodes"],
];

// Messages waiting in a topic: its own queue plus all its channels' queues.
export function queued(topic) {
  return (Number(topic.depth) || 0) + (Number(topic.channel_depth) || 0);
}

// A backlog that grows: something queued, and more than a few polls ago (depth_trend is the
// server's change of the queued count over its last polls, a minute at the default interval).
export function isGrowing(topic) {
  return queued(topic) > 0 && Number(topic.depth_trend) > 0;
}

export class TopicsPage {
  nav = "topics";
  title = "Topics";

  constructor() {
    const query = new URLSearchParams(window.location.search);
    this.filter = query.get("q") || "";
    this.sort = query.get("sort") || "topic_name";
    this.desc = query.get("dir") === "desc";
  }

  async load() {
    const [overview, names] = await Promise.all([get("/overview"), get("/topics")]);
    const byName = new Map(overview.topics.map((t) => [t.topic_name, t]));
    // Topics lookupd knows with no producer have no stats: they still get a row.
    for (const name of names.topics || []) {
      if (!byName.has(name)) {
        byName.set(name, { topic_name: name, producer_count: 0, no_stats: true });
      }
    }
    this.overview = overview;
    this.message = names.message || overview.message || "";
    this.topics = [...byName.values()];
    for (const t of this.topics) {
      t.queued = queued(t);
    }
  }

  frame() {
    return html`
      <h2>Topics</h2>
      <div class="toolbar">
        <input type="search" id="topic-filter" placeholder="Filter topics by name"
          value="${this.filter}" aria-label="Filter topics by name">
        <span class="muted" id="topic-count"></span>
      </div>
      <div id="page-body"></div>`;
  }

  bind(root) {
    const input = root.querySelector("#topic-filter");
    input.addEventListener("input", () => {
      this.filter = input.value;
      this.keepInUrl();
      this.repaint(root);
    });
    root.addEventListener("click", (event) => {
      const th = event.target.closest("th[data-sort]");
      if (!th) {
        return;
      }
      const key = th.dataset.sort;
      this.desc = this.sort === key ? !this.desc : key !== "topic_name";
      this.sort = key;
      this.keepInUrl();
      this.repaint(root);
    });
  }

  keepInUrl() {
    const url = new URL(window.location.href);
    const set = (k, v) => (v ? url.searchParams.set(k, v) : url.searchParams.delete(k));
    set("q", this.filter);
    set("sort", this.sort === "topic_name" ? "" : this.sort);
    set("dir", this.desc ? "desc" : "");
    window.history.replaceState(null, "", url.pathname + url.search);
  }

  repaint(root) {
    root.querySelector("#page-body").innerHTML = String(this.render());
  }

  sortValue(topic) {
    if (this.sort === "topic_name") {
      return topic.topic_name;
    }
    if (this.sort === "trend") {
      return Number(topic.depth_trend) || 0;
    }
    return Number(topic[this.sort]) || 0;
  }

  visible() {
    const needle = this.filter.trim().toLowerCase();
    const rows = this.topics.filter((t) => t.topic_name.toLowerCase().includes(needle));
    rows.sort((a, b) => {
      const x = this.sortValue(a);
      const y = this.sortValue(b);
      const order = x < y ? -1 : x > y ? 1 : a.topic_name < b.topic_name ? -1 : 1;
      return this.desc ? -order : order;
    });
    return rows;
  }

  render() {
    const o = this.overview;
    const unreachable = [...o.nodes.unreachable, ...o.lookupd.unreachable];
    const banner = warningBanner(unreachable.length ? "" : this.message, unreachable);
    const count = document.getElementById("topic-count");
    if (!this.topics.length) {
      if (count) {
        count.textContent = "";
      }
      return html`${banner}${notice("Notice", "No Topics Found")}`;
    }
    const rows = this.visible();
    if (count) {
      count.textContent = `${rows.length} of ${this.topics.length} topics`;
    }
    const growing = this.topics.filter(isGrowing);
    const callout = growing.length
      ? html`<div class="alert alert-danger" id="backlog"><span class="backlog-marker"></span>
          <strong>Backing up:</strong> ${growing.map(
            (t, i) => html`${i ? ", " : ""}<a href="${topicPath(t.topic_name)}">${t.topic_name}</a>
              (${commafy(t.queued)} queued and growing)`,
          )}</div>`
      : "";
    let waiting = "";
    if (!Number(config.poll_interval_ms)) {
      waiting = html`<p class="muted" id="poll-note">Live figures are off: nsqadmin runs with
        --poll-interval=0. Open a topic for its numbers.</p>`;
    } else if (!o.updated_at) {
      waiting = html`<p class="muted" id="poll-note">Waiting for nsqadmin's first poll of the
        cluster…</p>`;
    }
    const graph = graphActive();
    return html`${banner}${callout}${waiting}
      ${tableScroll(html`<table class="table" id="topics">
        <thead><tr>${this.header(...COLUMNS[0])}
          ${graph ? html`<th>Depth graph</th><th>Messages graph</th><th class="num">Rate</th>` : ""}
          ${COLUMNS.slice(1).map(([key, name]) => this.header(key, name))}
        </tr></thead>
        <tbody>${rows.map((t) => this.row(t, graph))}</tbody>
        ${this.totals(rows, graph)}
      </table>`)}`;
  }

  header(key, name) {
    const arrow = this.sort === key ? html` <span class="arrow">${this.desc ? "▼" : "▲"}</span>` : "";
    const cls = key === "topic_name" || key === "trend" ? "sortable" : "sortable num";
    return html`<th class="${cls}" data-sort="${key}" title="Sort by ${name}">${name}${arrow}</th>`;
  }

  row(t, graph) {
    const growing = isGrowing(t);
    const labels = [
      t.paused ? label("paused", "primary") : "",
      // Without stats from a poll we cannot tell; after one, no stats means no producer.
      (t.no_stats && this.overview.updated_at) || (!t.no_stats && !Number(t.producer_count))
        ? label("no producers", "default", "known to nsqlookupd only")
        : "",
      t.tombstoned_count
        ? label(`tombstoned on ${t.tombstoned_count}`, "warning", "tombstoned producers")
        : "",
    ];
    const stat = (key) => (t.no_stats ? "–" : commafy(t[key]));
    const graphCells = graph
      ? html`<td>${graphImg("topic", "", t.topic_name, "", "depth")}</td>
          <td>${graphImg("topic", "", t.topic_name, "", "message_count")}</td>
          ${rateCell("*", t.topic_name)}`
      : "";
    // The row's own compact history (one list per figure) feeds its sparkline: no request
    // per topic.
    const points = ((t.history && t.history.queued) || []).map((queued) => ({ queued }));
    return html`<tr data-topic="${t.topic_name}" class="${growing ? "growing" : ""}">
      <td>${growing ? html`<span class="backlog-marker" title="backlog growing"></span>` : ""}<a
        href="${topicPath(t.topic_name)}">${t.topic_name}</a> ${labels}</td>
      ${graphCells}
      <td class="num ${growing ? "backlog" : ""}" data-col="queued"
        title="topic ${commafy(t.depth)} + channels ${commafy(t.channel_depth)}">${stat("queued")}</td>
      <td>${t.no_stats ? "" : sparkline(points, "queued", "depth", 90, 18)}</td>
      <td class="num" data-col="rate_in">${t.no_stats ? "–" : rate(t.rate_in)}</td>
      <td class="num" data-col="rate_out">${t.no_stats ? "–" : rate(t.rate_out)}</td>
      <td class="num" data-col="channel_count">${stat("channel_count")}</td>
      <td class="num" data-col="client_count">${stat("client_count")}</td>
      <td class="num" data-col="in_flight_count">${stat("in_flight_count")}</td>
      <td class="num" data-col="deferred_count">${stat("deferred_count")}</td>
      <td class="num" data-col="message_count">${stat("message_count")}</td>
      <td class="num" data-col="producer_count">${commafy(t.producer_count)}</td>
    </tr>`;
  }

  totals(rows, graph) {
    const sum = (key) => rows.reduce((n, t) => n + (Number(t[key]) || 0), 0);
    const nodes = this.overview.nodes;
    const reach = nodes.total
      ? html`<span class="${nodes.reachable < nodes.total ? "backlog" : "muted"}" id="nodes-reached">
          (${nodes.reachable} of ${nodes.total} nodes)</span>`
      : "";
    return html`<tfoot><tr class="total">
      <td>Total: ${reach}</td>${graph ? html`<td></td><td></td><td></td>` : ""}
      <td class="num">${commafy(sum("queued"))}</td><td></td>
      <td class="num">${rate(sum("rate_in"))}</td><td class="num">${rate(sum("rate_out"))}</td>
      <td class="num">${commafy(sum("channel_count"))}</td>
      <td class="num">${commafy(sum("client_count"))}</td>
      <td class="num">${commafy(sum("in_flight_count"))}</td>
      <td class="num">${commafy(sum("deferred_count"))}</td>
      <td class="num">${commafy(sum("message_count"))}</td><td></td>
    </tr></tfoot>`;
  }
}
