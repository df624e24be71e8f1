// nsqd --max-queue-bytes (bounded queues, nsqio/nsq#549): the queue's bytes against its cap,
// and the messages its --queue-full-policy dropped or refused. Shown only when some node
// reports them: a cluster without the feature keeps Go's columns.
import { html } from "../html.js";
import { commafy } from "../format.js";

export function hasQueueLimits(stats, nodes) {
  return stats.max_queue_bytes !== undefined || nodes.some((n) => n.max_queue_bytes !== undefined);
}

export function queueLimitHeaders() {
  return html`<th class="num" title="bytes queued (memory + disk) / --max-queue-bytes">Queue Bytes</th>
    <th class="num" title="messages discarded by --queue-full-policy=drop-oldest">Dropped</th>
    <th class="num" title="published messages refused because the queue was full">Refused</th>`;
}

export function queueLimitCells(n) {
  if (n.max_queue_bytes === undefined) {
    return html`<td class="num muted" data-col="queue_bytes">–</td>
      <td class="num muted" data-col="queue_dropped_count">–</td>
      <td class="num muted" data-col="queue_refused_count">–</td>`;
  }
  const cap = Number(n.max_queue_bytes);
  const limit = cap ? `${commafy(cap)} (${n.queue_full_policy})` : "no cap";
  return html`<td class="num" data-col="queue_bytes" title="cap: ${limit}">${commafy(n.queue_bytes)} /
      ${cap ? commafy(cap) : "∞"}</td>
    <td class="num" data-col="queue_dropped_count">${commafy(n.queue_dropped_count)}</td>
    <td class="num" data-col="queue_refused_count">${commafy(n.queue_refused_count)}</td>`;
}

export function queueLimitBlanks(shown) {
  return shown ? html`<td></td><td></td><td></td>` : "";
}
