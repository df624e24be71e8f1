// Nodes (/nodes): every nsqd, its lookupd connections and topics; dead ones marked.
import { config, get, nodePath, topicPath } from "../api.js";
import { html } from "../html.js";
import { warningBanner, tableScroll, label, notice } from "../ui.js";
import { producerName } from "./topic.js";

export class NodesPage {
  nav = "nodes";
  title = "Nodes";

  constructor() {
    this.expanded = new Set(); // nodes whose lookupd connections are shown
  }

  async load() {
    const [nodes, overview] = await Promise.all([
      get("/nodes"),
      get("/overview").catch(() => null),
    ]);
    this.data = nodes;
    this.overview = overview;
  }

  bind(root) {
    root.addEventListener("click", (event) => {
      const button = event.target.closest(".conn-count");
      if (!button) {
        return;
      }
      const node = button.dataset.node;
      if (this.expanded.has(node)) {
        this.expanded.delete(node);
      } else {
        this.expanded.add(node);
      }
      button.nextElementSibling.hidden = !this.expanded.has(node);
    });
  }

  render() {
    const producers = this.data.nodes || [];
    const lookupds = config.nsqlookupd || [];
    const lookupdSet = new Set(lookupds);
    // Unreachable daemons: from this request and from nsqadmin's last poll of every nsqd.
    const unreachable = [...(this.data.unreachable || [])];
    if (this.overview) {
      for (const u of [...this.overview.nodes.unreachable, ...this.overview.lookupd.unreachable]) {
        if (!unreachable.some((x) => x.address === u.address)) {
          unreachable.push(u);
        }
      }
    }
    const deadNsqd = unreachable.filter((u) => !lookupdSet.has(u.address));
    const names = producers.map(producerName);
    const isDead = (name) => deadNsqd.find((u) => u.address === name);
    const total = producers.length + deadNsqd.filter((u) => !names.includes(u.address)).length;
    const reachable = producers.filter((p) => !isDead(producerName(p))).length;
    const heading = deadNsqd.length
      ? `NSQd Nodes (${reachable} of ${total} reachable)`
      : `NSQd Nodes (${producers.length})`;
    const banner = warningBanner(this.data.message, unreachable);
    if (!total) {
      return html`${banner}<h2>${heading}</h2>${notice("Notice", "No nsqd nodes found.")}`;
    }
    const rows = producers.map((p) => this.row(p, lookupds, isDead(producerName(p))));
    const extra = deadNsqd
      .filter((u) => !names.includes(u.address))
      .map(
        (u) => html`<tr class="unreachable" data-node="${u.address}">
          <td>&#10006; ${label("unreachable", "danger")}</td>
          <td><a href="${nodePath(u.address)}">${u.address}</a></td>
          <td colspan="${lookupds.length ? 5 : 4}">${u.error}</td></tr>`,
      );
    return html`${banner}<h2>${heading}</h2>${tableScroll(html`<table class="table" id="nodes">
      <tr><th>Hostname</th><th>Broadcast Address</th><th>TCP Port</th><th>HTTP Port</th>
        <th>Version</th>${lookupds.length ? html`<th>Lookupd Conns.</th>` : ""}<th>Topics</th></tr>
      ${rows}${extra}
    </table>`)}`;
  }

  row(p, lookupds, dead) {
    const name = producerName(p);
    const conns = p.remote_addresses || [];
    // Orange only when the node is not connected to every configured lookupd (Go: always).
    const short = conns.length !== lookupds.length;
    const topics = p.topics || [];
    const rowClass = dead ? "unreachable" : p.out_of_date ? "warning" : "";
    return html`<tr class="${rowClass}" data-node="${name}">
      <td>${p.hostname}${dead ? html` ${label("unreachable", "danger", dead.error)}` : ""}</td>
      <td><a href="${nodePath(name)}">${name}</a></td>
      <td>${p.tcp_port}</td><td>${p.http_port}</td><td>${p.version}${p.out_of_date
        ? html` ${label("out of date", "warning", "older than the newest nsqd in the cluster")}`
        : ""}</td>
      ${lookupds.length
        ? html`<td><button type="button" class="conn-count btn btn-xs ${short ? "btn-warning" : "btn-default"}"
            data-node="${name}" title="${conns.length} of ${lookupds.length} nsqlookupd">${conns.length}</button>
            <div ${this.expanded.has(name) ? "" : "hidden"}>${conns.map((c) => html`${c}<br>`)}</div></td>`
        : ""}
      <td>${topics.length ? html`<span class="badge">${topics.length}</span>` : ""}
        ${topics.map(
          (t) => html`<a href="${topicPath(t.topic)}" class="label ${t.tombstoned ? "label-warning" : "label-primary"}"
            ${t.tombstoned ? html`title="this topic is currently tombstoned on this node"` : ""}>${t.topic}${
              t.tombstoned ? " (tombstoned)" : ""
            }</a> `,
        )}</td>
    </tr>`;
  }
}
