// Topic (/topics/:topic): per-node queue, channels with live rates, and the topic actions.
import { api, get, history, basePath, topicPath } from "../api.js";
import { html } from "../html.js";
import { commafy } from "../format.js";
import { warningBanner, tableScroll, label, notice } from "../ui.js";
import { graphActive, graphImg, rateCell } from "../graphite.js";
import {
  hostCell,
  pausedLabel,
  e2eGroupHeader,
  e2eHeaders,
  e2eCells,
  memoryDisk,
  liveCards,
  rateCells,
  unreachableRows,
  totalLabel,
  runAction,
  bindActions,
  queueActions,
  lossText,
} from "./common.js";
import { hasQueueLimits, queueLimitHeaders, queueLimitCells, queueLimitBlanks } from "./queue_limits.js";

// A producer's node name as the API spells it: <broadcast_address>:<http_port>.
export function producerName(producer) {
  const address = producer.broadcast_address;
  return (address.includes(":") ? `[${address}]` : address) + ":" + producer.http_port;
}

export class TopicPage {
  nav = "topics";
  kind = "topic";

  constructor(topic) {
    this.topic = topic;
    this.title = topic;
  }

  async load() {
    const t = encodeURIComponent(this.topic);
    const stats = await get("/topics/" + t);
    // History only for what nsqd reported: the poller has nothing for the rest.
    const channels = stats.channels || [];
    const [hist, ...channelHistories] = await Promise.all([
      (stats.nodes || []).length ? history({ topic: this.topic }) : null,
      ...channels.map((c) => history({ topic: this.topic, channel: c.channel_name })),
    ]);
    this.stats = stats;
    this.hist = hist;
    this.channelHistories = channelHistories;
    // Producers lookupd has tombstoned for this topic: Go hid them; nsqadmin lists them
    // with "tombstoned": true and we label them.
    this.tombstoned = (stats.nodes || []).filter((n) => n.tombstoned).map((n) => n.node);
  }

  bind(root, ctx) {
    bindActions(root, (action, data) => this.act(ctx, action, data.node));
  }

  // Messages queued on one node for this topic: the topic's own queue plus its channels'.
  nodeDepth(node) {
    const own = (this.stats.nodes || []).find((n) => n.node === node);
    let depth = own ? Number(own.depth) || 0 : 0;
    for (const channel of this.stats.channels || []) {
      const there = (channel.nodes || []).find((n) => n.node === node);
      depth += there ? Number(there.depth) || 0 : 0;
    }
    return depth;
  }

  act(ctx, action, node) {
    const s = this.stats;
    const topic = html`<em>${this.topic}</em>`;
    const channels = s.channels || [];
    const channelDepth = channels.reduce((n, c) => n + (Number(c.depth) || 0), 0);
    const path = "/topics/" + encodeURIComponent(this.topic);
    const specs = {
      empty: {
        title: "Empty topic queue",
        body: html`<p>Empty the queue of topic ${topic} on every nsqd that produces it?</p>
          <p class="loss">${lossText(s.depth, s.memory_depth, s.backend_depth)} queued at the
          topic will be lost.</p><p>Channel backlogs (${commafy(channelDepth)} messages) are not
          touched.</p>`,
        action: "Empty Queue",
        style: "btn-warning",
        call: () => api("POST", path, { action: "empty" }),
        done: `Emptied topic ${this.topic}.`,
      },
      delete: {
        title: "Delete topic",
        body: html`<p>Delete topic ${topic} and its ${channels.length} channels from every nsqd
          and nsqlookupd?</p><p class="loss">${lossText(Number(s.depth) + channelDepth)} queued in
          the topic and its channels will be lost, and its consumers disconnected.</p>`,
        action: "Delete Topic",
        style: "btn-danger",
        call: () => api("DELETE", path),
        done: `Deleted topic ${this.topic}.`,
        after: () => ctx.navigate(basePath("/")),
      },
      pause: {
        title: "Pause topic",
        body: html`<p>Pause topic ${topic}? Messages keep arriving and queue at the topic, but
          none reach its channels until it is unpaused.</p>`,
        action: "Pause Topic",
        call: () => api("POST", path, { action: "pause" }),
        done: `Paused topic ${this.topic}.`,
      },
      unpause: {
        title: "Unpause topic",
        body: html`<p>Unpause topic ${topic}? Its ${commafy(s.depth)} queued messages flow on to
          its channels.</p>`,
        action: "UnPause Topic",
        style: "btn-success",
        call: () => api("POST", path, { action: "unpause" }),
        done: `Unpaused topic ${this.topic}.`,
      },
      tombstone: {
        title: "Tombstone topic producer",
        body: html`<p>Tombstone topic ${topic} on node <strong>${node}</strong>?</p>
          <p>nsqlookupd stops listing this node as a producer of the topic, then nsqadmin deletes
          the topic on that node.</p><p class="loss">${lossText(this.nodeDepth(node))} queued
          there (topic and channels) will be lost, and its consumers on that node disconnected.</p>`,
        action: "Tombstone",
        style: "btn-danger",
        call: () => api("DELETE", "/nodes/" + encodeURIComponent(node), { topic: this.topic }),
        done: `Tombstoned topic ${this.topic} on ${node}.`,
      },
    };
    return runAction(ctx, specs[action]);
  }

  render(ctx) {
    const s = this.stats;
    const nodes = s.nodes || [];
    const head = html`
      <ol class="breadcrumb"><li><a href="${basePath("/")}">Streams</a></li>
        <li class="active">${this.topic}</li></ol>
      <blockquote><p>Topic: <strong>${this.topic}</strong></p></blockquote>`;
    const banner = warningBanner(s.message, s.unreachable);
    if (!nodes.length && !(s.unreachable || []).length && !this.tombstoned.length) {
      return html`${banner}${head}<h4>Topic Message Queue</h4>${notice(
        "Notice",
        "No producers exist for this topic.",
        html`See <a href="${basePath("/lookup")}">Lookup</a> for more information.`,
      )}`;
    }
    const actions = queueActions(ctx, s.paused, "Topic");
    return html`${banner}${head}${actions}${liveCards(this.hist, "topic")}
      ${this.nodeTable(ctx)}${this.channelTable()}`;
  }

  nodeTable(ctx) {
    const s = this.stats;
    const graph = graphActive();
    const nodes = s.nodes || [];
    const bounded = hasQueueLimits(s, nodes); // nsqd --max-queue-bytes: the topic's own queue
    const cols = 4 + (graph ? 1 : 0) + (e2eHeaders(s).length || 0) + (bounded ? 3 : 0);
    const tomb = (name) =>
      ctx.isAdmin
        ? html`<button class="btn-link-x" data-action="tombstone" data-node="${name}"
            title="tombstone this producer">&#10008;</button>`
        : "";
    const rows = nodes.map((n) => {
      const dead = this.tombstoned.includes(n.node);
      return html`<tr data-node="${n.node}" class="${dead ? "tombstoned" : ""}">
          <td>${tomb(n.node)}${hostCell(n)}${pausedLabel(n.paused)}${dead ? html` ${label(
            "tombstoned",
            "warning",
            "nsqlookupd no longer lists this node as a producer of the topic",
          )}` : ""}</td>
          <td class="num">${commafy(n.depth)}</td><td class="num">${memoryDisk(n)}</td>
          ${bounded ? queueLimitCells(n) : ""}
          <td class="num">${commafy(n.message_count)}</td>
          ${graph ? rateCell(n.node, this.topic) : ""}
          <td class="num">${commafy((n.channels || []).length)}</td>${e2eCells(s, n)}
        </tr>
        ${graph ? html`<tr class="graph-row"><td></td>
          <td>${graphImg("topic", n.node, this.topic, "", "depth")}</td><td></td>
          ${queueLimitBlanks(bounded)}
          <td>${graphImg("topic", n.node, this.topic, "", "message_count")}</td>
          <td colspan="${cols - 3 - (bounded ? 3 : 0)}"></td></tr>` : ""}`;
    });
    return html`<h4>Topic Message Queue</h4>${tableScroll(html`<table class="table" id="topic-nodes">
      ${e2eHeaders(s).length ? html`<tr><th colspan="${cols - e2eHeaders(s).length + 1}"></th>
        ${e2eGroupHeader(s)}</tr>` : ""}
      <tr><th>NSQd Host</th><th class="num">Depth</th><th class="num">Memory + Disk</th>
        ${bounded ? queueLimitHeaders() : ""}
        <th class="num">Messages</th>${graph ? html`<th class="num">Rate</th>` : ""}
        <th class="num">Channels</th>${e2eHeaders(s)}</tr>
      ${rows}${unreachableRows(s.unreachable, cols)}
      <tr class="total"><td>${totalLabel(nodes.length, s.unreachable)}</td>
        <td class="num">${commafy(s.depth)}</td><td class="num">${memoryDisk(s)}</td>
        ${bounded ? queueLimitCells(s) : ""}
        <td class="num">${commafy(s.message_count)}</td>
        ${graph ? rateCell("*", this.topic) : ""}
        <td class="num">${commafy((s.channels || []).length)}</td>${e2eCells(s, s)}</tr>
      ${graph ? html`<tr class="graph-row"><td></td>
        <td>${graphImg("topic", "*", this.topic, "", "depth")}</td><td></td>
        ${queueLimitBlanks(bounded)}
        <td>${graphImg("topic", "*", this.topic, "", "message_count")}</td>
        <td colspan="${cols - 3 - (bounded ? 3 : 0)}"></td></tr>` : ""}
    </table>`)}`;
  }

  channelTable() {
    const s = this.stats;
    const channels = s.channels || [];
    if (!channels.length) {
      return html`<h4>Channel Message Queues</h4>${notice(
        "Notice",
        "No channels exist for this topic.",
        "Messages will queue at the topic until a channel is created.",
      )}`;
    }
    const graph = graphActive();
    const nE2e = e2eHeaders(s).length;
    const bounded = hasQueueLimits({}, channels); // nsqd --max-queue-bytes
    const rows = channels.map(
      (c, i) => html`<tr data-channel="${c.channel_name}">
          <th><a href="${topicPath(this.topic, c.channel_name)}">${c.channel_name}</a>${pausedLabel(
            c.paused,
          )}</th>
          <td class="num" data-col="depth">${commafy(c.depth)}</td>
          ${rateCells(this.channelHistories[i])}
          <td class="num">${memoryDisk(c)}</td>
          <td class="num">${commafy(c.in_flight_count)}</td>
          <td class="num">${commafy(c.deferred_count)}</td>
          <td class="num">${commafy(c.requeue_count)}</td>
          <td class="num">${commafy(c.timeout_count)}</td>
          ${bounded ? queueLimitCells(c) : ""}
          <td class="num">${commafy(c.message_count)}</td>
          <td class="num" data-col="client_count">${commafy(c.client_count)}</td>${e2eCells(s, c)}
        </tr>
        ${graph ? html`<tr class="graph-row"><td></td>
          <td>${graphImg("channel", "", this.topic, c.channel_name, "depth")}</td>
          <td colspan="4"></td>
          <td>${graphImg("channel", "", this.topic, c.channel_name, "in_flight_count")}</td>
          <td>${graphImg("channel", "", this.topic, c.channel_name, "deferred_count")}</td>
          <td>${graphImg("channel", "", this.topic, c.channel_name, "requeue_count")}</td>
          <td>${graphImg("channel", "", this.topic, c.channel_name, "timeout_count")}</td>
          ${queueLimitBlanks(bounded)}
          <td>${graphImg("channel", "", this.topic, c.channel_name, "message_count")}</td>
          <td>${graphImg("channel", "", this.topic, c.channel_name, "clients")}</td>
          ${nE2e ? html`<td colspan="${nE2e}"></td>` : ""}</tr>` : ""}`,
    );
    return html`<h4>Channel Message Queues</h4>${tableScroll(html`<table class="table" id="channels">
      ${nE2e ? html`<tr><th colspan="${12 + (bounded ? 3 : 0)}"></th>${e2eGroupHeader(s)}</tr>` : ""}
      <tr><th>Channel</th><th class="num">Depth</th><th class="num">Msgs/s in</th>
        <th class="num">Msgs/s out</th><th>Depth trend</th><th class="num">Memory + Disk</th>
        <th class="num">In-Flight</th><th class="num">Deferred</th><th class="num">Requeued</th>
        <th class="num">Timed Out</th>${bounded ? queueLimitHeaders() : ""}<th class="num">Messages</th>
        <th class="num">Connections</th>${e2eHeaders(s)}</tr>
      ${rows}
    </table>`)}`;
  }
}
