// Node (/nodes/:node): one nsqd's topics, channels and clients, with its live rates.
import { api, get, history, basePath, topicPath } from "../api.js";
import { html } from "../html.js";
import { commafy, duration } from "../format.js";
import { warningBanner, notice, tableScroll, label } from "../ui.js";
import { graphActive, graphImg, largeGraphUrl } from "../graphite.js";
import { pausedLabel, memoryDisk, liveCards, runAction, lossText, bindActions } from "./common.js";
import { clientAttributes, clientHost } from "./channel.js";

const NODE_GRAPHS = [
  ["*_bytes", "GC Pressure"],
  ["gc_pause_*", "GC Pause Percentiles"],
  ["gc_runs", "GC Runs"],
  ["heap_objects", "Heap Objects In-Use"],
];

export class NodePage {
  nav = "nodes";
  kind = "node";

  constructor(node) {
    this.node = node;
    this.title = node;
  }

  async load() {
    const [data, hist] = await Promise.all([
      get("/nodes/" + encodeURIComponent(this.node)),
      history({ node: this.node }),
    ]);
    this.data = data;
    this.hist = hist;
  }

  bind(root, ctx) {
    const tombstone = (action, data) => this.tombstone(ctx, data.topic);
    bindActions(root, tombstone, "[data-action=tombstone]");
  }

  tombstone(ctx, topic) {
    const stats = (this.data.topics || []).find((t) => t.topic_name === topic) || {};
    const depth = (stats.channels || []).reduce((n, c) => n + (Number(c.depth) || 0), 0);
    return runAction(ctx, {
      title: "Tombstone topic producer",
      body: html`<p>Tombstone topic <em>${topic}</em> on node <strong>${this.node}</strong>?</p>
        <p>nsqlookupd stops listing this node as a producer of the topic, then nsqadmin deletes
        the topic on this node.</p><p class="loss">${lossText(Number(stats.depth) + depth)}
        queued there (topic and channels) will be lost, and its consumers on this node
        disconnected.</p>`,
      action: "Tombstone",
      style: "btn-danger",
      call: () => api("DELETE", "/nodes/" + encodeURIComponent(this.node), { topic }),
      done: `Tombstoned topic ${topic} on ${this.node}.`,
    });
  }

  render(ctx) {
    const d = this.data;
    const topics = d.topics || [];
    const head = html`<ol class="breadcrumb"><li><a href="${basePath("/nodes")}">Nodes</a></li>
      <li class="active">${this.node}</li></ol>`;
    const graphs = graphActive()
      ? html`<div class="stats">${NODE_GRAPHS.map(
          ([key, name]) => html`<div class="stat"><a href="${largeGraphUrl("node", this.node, "", "", key)}"
            target="_blank" rel="noopener"><img class="graphite" width="200" alt="${name}"
            src="${largeGraphUrl("node", this.node, "", "", key)}"></a><div class="name">${name}</div></div>`,
        )}</div>`
      : "";
    const banner = warningBanner(d.message, d.unreachable);
    const replication = replicationTable(d.replication);
    if (!topics.length) {
      return html`${banner}${head}${graphs}${liveCards(this.hist, "node")}${replication}${notice(
        "Notice",
        "No topics exist on this node.",
      )}`;
    }
    return html`${banner}${head}${graphs}${liveCards(this.hist, "node")}${replication}
      <p id="node-summary"><strong>${commafy(d.total_topics ?? topics.length)}</strong> Topics ·
        <strong>${commafy(d.total_messages)}</strong> Messages ·
        <strong>${commafy(d.total_clients)}</strong> Clients</p>
      ${tableScroll(html`<table class="table" id="node-topics">${topics.map((t) =>
        this.topicBlock(ctx, t),
      )}</table>`)}`;
  }

  topicBlock(ctx, t) {
    const graph = graphActive();
    const channels = t.channels || [];
    const tomb = ctx.isAdmin
      ? html`<button class="btn-link-x" data-action="tombstone" data-topic="${t.topic_name}"
          title="tombstone this topic on this node">&#10008;</button>`
      : "";
    return html`
      <tr><th colspan="3">Topic</th><th class="num">Depth</th><th class="num">Memory + Disk</th>
        <th colspan="4"></th><th class="num">Messages</th><th class="num">Channels</th></tr>
      <tr class="info" data-topic="${t.topic_name}">
        <td colspan="3">${tomb} <a href="${topicPath(t.topic_name)}">${t.topic_name}</a>${pausedLabel(
          t.paused,
        )}</td>
        <td class="num">${graph ? graphImg("topic", this.node, t.topic_name, "", "depth") : ""}
          ${commafy(t.depth)}</td>
        <td class="num">${memoryDisk(t)}</td><td colspan="4"></td>
        <td class="num">${graph ? graphImg("topic", this.node, t.topic_name, "", "message_count") : ""}
          ${commafy(t.message_count)}</td>
        <td class="num">${commafy(channels.length)}</td></tr>
      ${channels.length
        ? channels.map((c) => this.channelBlock(t, c, graph))
        : html`<tr><td colspan="11">${notice("Notice", "No channels exist for this topic.")}</td></tr>`}`;
  }

  channelBlock(t, c, graph) {
    const clients = c.clients || [];
    // Client columns in the channel page's order (Go's node page swapped Finished/Requeued).
    const clientRows = clients.length
      ? html`<tr><th></th><th>Client Host</th><th>User-Agent</th><th></th><th>Attributes</th>
          <th class="num">In-Flight</th><th class="num">Ready Count</th><th class="num">Finished</th>
          <th class="num">Requeued</th><th class="num">Messages</th><th class="num">Connected</th></tr>
        ${clients.map(
          (cl) => html`<tr><td></td><td>${clientHost(cl)}</td><td><small>${cl.user_agent}</small></td>
            <td></td><td>${clientAttributes(cl)}</td>
            <td class="num">${commafy(cl.in_flight_count)}</td>
            <td class="num">${commafy(cl.ready_count)}</td>
            <td class="num">${commafy(cl.finish_count)}</td>
            <td class="num">${commafy(cl.requeue_count)}</td>
            <td class="num">${commafy(cl.message_count)}</td>
            <td class="num">${duration(cl.connected)}</td></tr>`,
        )}`
      : html`<tr><td></td><td colspan="10">${notice("Notice", "No clients connected to this channel.")}</td></tr>`;
    return html`
      <tr><th></th><th colspan="2">Channel</th><th class="num">Depth</th>
        <th class="num">Memory + Disk</th><th class="num">In-Flight</th><th class="num">Deferred</th>
        <th class="num">Requeued</th><th class="num">Timed Out</th><th class="num">Messages</th>
        <th class="num">Connections</th></tr>
      <tr class="channel-row" data-channel="${t.topic_name}/${c.channel_name}"><td></td>
        <td colspan="2"><a href="${topicPath(t.topic_name, c.channel_name)}">${c.channel_name}</a>${pausedLabel(
          c.paused,
        )}</td>
        <td class="num">${graph ? graphImg("channel", this.node, t.topic_name, c.channel_name, "depth") : ""}
          ${commafy(c.depth)}</td>
        <td class="num">${memoryDisk(c)}</td><td class="num">${commafy(c.in_flight_count)}</td>
        <td class="num">${commafy(c.deferred_count)}</td><td class="num">${commafy(c.requeue_count)}</td>
        <td class="num">${commafy(c.timeout_count)}</td><td class="num">${commafy(c.message_count)}</td>
        <td class="num">${commafy(clients.length)}</td></tr>
      ${clientRows}`;
  }
}

// nsqd --replica-peer only (its /stats "replication"): this node and, per peer, the link's
// state, how far the peer is behind this node's stream, the copies of the peer's messages held
// here and those taken over. Nothing is shown for a node that does not replicate.
function replicationTable(r) {
  if (!r) return "";
  const peers = r.peers || [];
  return html`<h4>Replication</h4>
    <p id="replication-summary"><strong>${r.address}</strong> · incarnation
      <code>${r.incarnation}</code> · acks <strong>${commafy(r.acks)}</strong> · stream
      sequence <strong>${commafy(r.last_seq)}</strong></p>
    ${tableScroll(html`<table class="table" id="replication">
      <tr><th>Peer</th><th>State</th><th class="num">Acked Seq</th><th class="num">Lag</th>
        <th class="num">Copies Held</th><th class="num">Taken Over</th></tr>
      ${peers.map(
        (p) => html`<tr data-peer="${p.address}"><td>${p.address}</td>
          <td>${label(p.state, p.state === "connected" ? "success" : "danger")}</td>
          <td class="num">${commafy(p.acked_seq)}</td><td class="num">${commafy(p.lag)}</td>
          <td class="num">${commafy(p.held_copies)}</td>
          <td class="num">${commafy(p.taken_over)}</td></tr>`,
      )}</table>`)}`;
}
