// Channel (/topics/:topic/:channel): per-node queues, live rates, clients and the actions.
import { api, config, get, history, basePath, topicPath, nodePath } from "../api.js";
import { html } from "../html.js";
import { commafy, duration } from "../format.js";
import { warningBanner, tableScroll, notice, label } from "../ui.js";
import { graphActive, graphImg, rateCell } from "../graphite.js";
import {
  hostCell,
  pausedLabel,
  e2eGroupHeader,
  e2eHeaders,
  e2eCells,
  memoryDisk,
  liveCards,
  unreachableRows,
  totalLabel,
  runAction,
  bindActions,
  queueActions,
  lossText,
} from "./common.js";
import { adminOnlyNote, inspectSection, loadInspection } from "./inspect.js";
import { hasQueueLimits, queueLimitHeaders, queueLimitCells, queueLimitBlanks } from "./queue_limits.js";

// The Attributes labels of a client, as Go shows them.
export function clientAttributes(c) {
  const tlsTitle = c.tls_version
    ? `${c.tls_version} ${c.tls_cipher_suite} ${c.tls_negotiated_protocol} mutual:${c.tls_negotiated_protocol_is_mutual}`
    : "";
  const authTitle = "Authed" + (c.auth_identity ? " Identity:" + c.auth_identity : "");
  const authed = c.auth_identity_url
    ? html`<a class="label label-success" href="${c.auth_identity_url}" title="${authTitle}">👤</a>`
    : label("👤", "success", authTitle);
  return html`${c.sample_rate ? label(`Sampled ${c.sample_rate}%`, "info") : ""}
    ${c.tls ? label("TLS", "warning", tlsTitle) : ""}
    ${c.deflate ? label("Deflate", "default") : ""}
    ${c.snappy ? label("Snappy", "primary") : ""}
    ${c.authed ? authed : ""}`;
}

// "host:port (client_id)" with the id left out when it only repeats the hostname.
export function clientHost(c) {
  const id = (c.client_id || "").toLowerCase();
  const host = c.hostname || "";
  const short = host.split(".")[0].toLowerCase();
  const showId = id && id !== short && id !== host.toLowerCase();
  const port = (c.remote_address || "").split(":").pop();
  return html`<span title="${c.remote_address}">${host}:${port}${showId ? ` (${c.client_id})` : ""}</span>`;
}

export class ChannelPage {
  nav = "topics";
  kind = "channel";

  constructor(topic, channel) {
    this.topic = topic;
    this.channel = channel;
    this.title = topic + "/" + channel;
    this.opened = new Set(); // message bodies expanded with "show more", kept across refreshes
  }

  async load() {
    const path = "/topics/" + encodeURIComponent(this.topic) + "/" + encodeURIComponent(this.channel);
    // Message bodies are for admins only (with --admin-user nsqadmin refuses the rest).
    const [stats, inspection] = await Promise.all([
      get(path),
      config.is_admin ? loadInspection(this.topic, this.channel) : null,
    ]);
    const known = (stats.nodes || []).length > 0; // the poller has nothing for the rest
    const hist = known ? await history({ topic: this.topic, channel: this.channel }) : null;
    this.path = path;
    this.stats = stats;
    this.hist = hist;
    this.inspection = inspection;
  }

  bind(root, ctx) {
    bindActions(root, (action, data) => this.act(ctx, action, data));
    // "toggle" does not bubble: listen while it travels down.
    root.addEventListener(
      "toggle",
      (event) => {
        const details = event.target;
        if (details.dataset && details.dataset.key) {
          if (details.open) {
            this.opened.add(details.dataset.key);
          } else {
            this.opened.delete(details.dataset.key);
          }
        }
      },
      true,
    );
  }

  act(ctx, action, data) {
    if (action === "kick") {
      return this.kick(ctx, data);
    }
    const s = this.stats;
    const name = html`<em>${this.topic}/${this.channel}</em>`;
    const extra = [];
    if (Number(s.in_flight_count)) {
      extra.push(`${commafy(s.in_flight_count)} in flight`);
    }
    if (Number(s.deferred_count)) {
      extra.push(`${commafy(s.deferred_count)} deferred`);
    }
    const also = extra.length ? `, and the ${extra.join(" and ")},` : "";
    const loss = html`<p class="loss">${lossText(s.depth, s.memory_depth, s.backend_depth)}${also}
      will be lost.</p>`;
    const specs = {
      empty: {
        title: "Empty channel queue",
        body: html`<p>Empty channel ${name} on every nsqd that has it?</p>${loss}`,
        action: "Empty Queue",
        style: "btn-warning",
        call: () => api("POST", this.path, { action: "empty" }),
        done: `Emptied channel ${this.topic}/${this.channel}.`,
      },
      delete: {
        title: "Delete channel",
        body: html`<p>Delete channel ${name} from every nsqd and nsqlookupd? Its
          ${commafy(s.client_count)} consumers are disconnected.</p>${loss}`,
        action: "Delete Channel",
        style: "btn-danger",
        call: () => api("DELETE", this.path),
        done: `Deleted channel ${this.topic}/${this.channel}.`,
        after: () => ctx.navigate(topicPath(this.topic)),
      },
      pause: {
        title: "Pause channel",
        body: html`<p>Pause channel ${name}? Messages keep queuing in it but none are delivered
          to its consumers until it is unpaused.</p>`,
        action: "Pause Channel",
        call: () => api("POST", this.path, { action: "pause" }),
        done: `Paused channel ${this.topic}/${this.channel}.`,
      },
      unpause: {
        title: "Unpause channel",
        body: html`<p>Unpause channel ${name}? Delivery of its ${commafy(s.depth)} queued messages
          resumes.</p>`,
        action: "UnPause Channel",
        style: "btn-success",
        call: () => api("POST", this.path, { action: "unpause" }),
        done: `Unpaused channel ${this.topic}/${this.channel}.`,
      },
    };
    return runAction(ctx, specs[action]);
  }

  // nsqpy (nsqio/nsq#418): close one consumer's connection on its nsqd, after a confirmation
  // naming the client. Its in-flight messages go back to the channel on their timeout.
  kick(ctx, data) {
    const c = (this.stats.clients || []).find(
      (x) => x.node === data.node && x.remote_address === data.remoteAddress,
    );
    const inFlight = c ? Number(c.in_flight_count) : 0;
    const who = html`<em>${c ? clientHost(c) : data.remoteAddress}</em>`;
    return runAction(ctx, {
      title: "Kick client",
      body: html`<p>Disconnect client ${who} (${data.remoteAddress}) from nsqd
          <em>${data.node}</em>?</p>
        <p>${inFlight
          ? `Its ${commafy(inFlight)} in-flight messages are requeued when their timeout expires.`
          : "It has no messages in flight."}
          The client may reconnect.</p>`,
      action: "Kick Client",
      style: "btn-danger",
      call: () =>
        api("POST", this.path + "/clients", {
          action: "kick",
          node: data.node,
          remote_address: data.remoteAddress,
        }),
      done: `Kicked client ${data.remoteAddress} off ${data.node}.`,
    });
  }

  render(ctx) {
    const s = this.stats;
    const nodes = s.nodes || [];
    const head = html`
      <ol class="breadcrumb"><li><a href="${basePath("/")}">Streams</a></li>
        <li><a href="${topicPath(this.topic)}">${this.topic}</a></li>
        <li class="active">${this.channel}</li></ol>
      <blockquote><p>Topic: <strong>${this.topic}</strong></p>
        <p>Channel: <strong>${this.channel}</strong></p></blockquote>`;
    const banner = warningBanner(s.message, s.unreachable);
    if (!nodes.length && !(s.unreachable || []).length) {
      return html`${banner}${head}${notice(
        "Notice",
        "No producers exist for this topic/channel.",
        html`See <a href="${basePath("/lookup")}">Lookup</a> for more information.`,
      )}`;
    }
    const actions = queueActions(ctx, s.paused, "Channel");
    return html`${banner}${head}${actions}${liveCards(this.hist, "channel")}
      ${this.nodeTable()}${this.clientTable(ctx)}${this.messages(ctx)}`;
  }

  messages(ctx) {
    return ctx.isAdmin ? inspectSection(this.inspection, this.opened) : adminOnlyNote();
  }

  nodeTable() {
    const s = this.stats;
    const nodes = s.nodes || [];
    const graph = graphActive();
    const nE2e = e2eHeaders(s).length;
    // nsqd --max-attempts: its limit and the messages it moved to the dead-letter topic
    const dead = s.max_attempts !== undefined || nodes.some((n) => n.max_attempts !== undefined);
    const bounded = hasQueueLimits(s, nodes); // nsqd --max-queue-bytes
    const cols = 8 + (graph ? 1 : 0) + nE2e + (dead ? 2 : 0) + (bounded ? 3 : 0);
    const deadCells = (n) =>
      n.max_attempts === undefined
        ? html`<td class="num muted" data-col="max_attempts">–</td>
            <td class="num muted" data-col="dead_letter_count">–</td>`
        : html`<td class="num" data-col="max_attempts">${n.max_attempts ? commafy(n.max_attempts) : "off"}</td>
            <td class="num" data-col="dead_letter_count">${commafy(n.dead_letter_count)}</td>`;
    const numbers = (n) => html`
      <td class="num" data-col="depth">${commafy(n.depth)}</td><td class="num">${memoryDisk(n)}</td>
      <td class="num" data-col="in_flight_count">${commafy(n.in_flight_count)}</td>
      <td class="num">${commafy(n.deferred_count)}</td>
      <td class="num">${commafy(n.requeue_count)}</td><td class="num">${commafy(n.timeout_count)}</td>
      ${dead ? deadCells(n) : ""}${bounded ? queueLimitCells(n) : ""}
      <td class="num" data-col="message_count">${commafy(n.message_count)}</td>`;
    const rows = nodes.map(
      (n) => html`<tr data-node="${n.node}"><td>${hostCell(n)}${pausedLabel(n.paused)}</td>
          ${numbers(n)}${graph ? rateCell(n.node, this.topic) : ""}
          <td class="num">${commafy(n.client_count)}</td>${e2eCells(s, n)}</tr>
        ${graph ? html`<tr class="graph-row"><td></td>
          <td>${graphImg("channel", n.node, this.topic, this.channel, "depth")}</td><td></td>
          <td>${graphImg("channel", n.node, this.topic, this.channel, "in_flight_count")}</td>
          <td>${graphImg("channel", n.node, this.topic, this.channel, "deferred_count")}</td>
          <td>${graphImg("channel", n.node, this.topic, this.channel, "requeue_count")}</td>
          <td>${graphImg("channel", n.node, this.topic, this.channel, "timeout_count")}</td>
          ${dead ? html`<td></td><td></td>` : ""}${queueLimitBlanks(bounded)}<td>${graphImg("channel", n.node, this.topic, this.channel, "message_count")}</td>
          <td colspan="${cols - 7 - (dead ? 2 : 0) - (bounded ? 3 : 0)}"></td></tr>` : ""}`,
    );
    return html`<h4>Channel</h4>${tableScroll(html`<table class="table" id="channel-nodes">
      <tr><th>&nbsp;</th><th colspan="4" class="center">Message Queues</th>
        <th colspan="${(graph ? 5 : 4) + (dead ? 2 : 0) + (bounded ? 3 : 0)}" class="center">Statistics</th>${e2eGroupHeader(s)}</tr>
      <tr><th>NSQd Host</th><th class="num">Depth</th><th class="num">Memory + Disk</th>
        <th class="num">In-Flight</th><th class="num">Deferred</th><th class="num">Requeued</th>
        <th class="num">Timed Out</th>
        ${dead ? html`<th class="num">Max Attempts</th><th class="num">Dead-Lettered</th>` : ""}
        ${bounded ? queueLimitHeaders() : ""}
        <th class="num">Messages</th>
        ${graph ? html`<th class="num">Rate</th>` : ""}<th class="num">Connections</th>
        ${e2eHeaders(s)}</tr>
      ${rows}${unreachableRows(s.unreachable, cols)}
      <tr class="total"><td>${totalLabel(nodes.length, s.unreachable)}</td>${numbers(s)}
        ${graph ? rateCell("*", this.topic) : ""}
        <td class="num">${commafy(s.client_count)}</td>${e2eCells(s, s)}</tr>
    </table>`)}`;
  }

  clientTable(ctx) {
    const clients = this.stats.clients || [];
    if (!clients.length) {
      return html`<h4>Client Connections</h4>${notice("Notice", "No clients connected to this channel")}`;
    }
    return html`<h4>Client Connections</h4>${tableScroll(html`<table class="table" id="clients">
      <tr><th>Client Host</th><th>User-Agent</th><th>Attributes</th><th>NSQd Host</th>
        <th class="num">In-Flight</th><th class="num">Ready Count</th><th class="num">Finished</th>
        <th class="num">Requeued</th><th class="num">Messages</th><th class="num">Connected</th>
        ${ctx.isAdmin ? html`<th></th>` : ""}</tr>
      ${clients.map(
        (c) => html`<tr data-client="${c.client_id}">
          <td>${clientHost(c)}</td><td><small>${c.user_agent}</small></td>
          <td>${clientAttributes(c)}</td>
          <td><a href="${nodePath(c.node)}">${c.node}</a></td>
          <td class="num">${commafy(c.in_flight_count)}</td>
          <td class="num">${commafy(c.ready_count)}</td>
          <td class="num">${commafy(c.finish_count)}</td>
          <td class="num">${commafy(c.requeue_count)}</td>
          <td class="num">${commafy(c.message_count)}</td>
          <td class="num">${duration(c.connected)}</td>
          ${ctx.isAdmin ? html`<td><button class="btn btn-xs btn-danger" data-action="kick"
            data-node="${c.node}" data-remote-address="${c.remote_address}"
            title="disconnect this client">Kick</button></td>` : ""}</tr>`,
      )}
    </table>`)}`;
  }
}
