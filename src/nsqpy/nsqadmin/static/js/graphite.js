// Graphite mode (--graphite-url): the same render URLs and rate targets as Go's nsqadmin,
// built from the statsd prefix and formats nsqadmin was started with.
import { config, basePath, get } from "./api.js";
import { html } from "./html.js";

export const INTERVALS = ["1h", "2h", "12h", "24h", "48h", "168h", "off"];

export function graphInterval() {
  const fromQuery = new URLSearchParams(window.location.search).get("t");
  return fromQuery || localStorage.getItem("graph_interval") || (config.graph_enabled ? "2h" : "off");
}

export function setGraphInterval(value) {
  localStorage.setItem("graph_interval", value);
}

export function graphActive() {
  return Boolean(config.graph_enabled) && graphInterval() !== "off";
}

const METRIC_TYPES = {
  depth: "gauge",
  in_flight_count: "gauge",
  deferred_count: "gauge",
  requeue_count: "counter",
  timeout_count: "counter",
  message_count: "counter",
  clients: "gauge",
  "*_bytes": "gauge",
  "gc_pause_*": "gauge",
  gc_runs: "counter",
  heap_objects: "gauge",
  e2e_processing_latency: "gauge",
};

function statsdKey(key, fullKey) {
  const type = METRIC_TYPES[key];
  if (type === "counter") {
    return config.statsd_counter_format.replace(/%s/g, fullKey);
  }
  if (type === "gauge") {
    return config.statsd_gauge_format.replace(/%s/g, fullKey);
  }
  return fullKey;
}

function prefixFor(host) {
  let prefix = config.statsd_prefix.replace(/%s/g, host.replace(/[.:]/g, "_"));
  if (!prefix.endsWith(".")) {
    prefix += ".";
  }
  return prefix;
}

// As statsdaemon names keys: spaces to _, / to -, anything else odd dropped.
function sanitize(name) {
  return name.replaceAll(" ", "_").replaceAll("/", "-").replace(/[^a-zA-Z0-9\-_.]/g, "");
}

// typ: topic | channel | node | counter; node "*" (or "") means every node.
export function targets(typ, node, topic, channel, key) {
  const prefix = prefixFor(node || "*");
  if (typ === "topic") {
    return [`sumSeries(${statsdKey(key, `${prefix}topic.${sanitize(topic)}.${key}`)})`];
  }
  if (typ === "channel") {
    const path = `${prefix}topic.${sanitize(topic)}.channel.${sanitize(channel)}.${key}`;
    return [`sumSeries(${statsdKey(key, path)})`];
  }
  if (typ === "node") {
    let target = `${prefix}mem.${key}`;
    if (key === "gc_runs") {
      target = `movingAverage(${target},45)`;
    }
    return [statsdKey(key, target)];
  }
  if (typ === "counter") {
    return [`sumSeries(${statsdKey(key, `${prefix}topic.*.channel.*.${key}`)})`];
  }
  return [];
}

function colors(typ, key) {
  if ((typ === "topic" || typ === "channel") && (key === "depth" || key === "deferred_count")) {
    return "red";
  }
  if (typ === "node") {
    return "red,green,blue,purple";
  }
  return typ === "counter" ? "green" : "blue";
}

function renderUrl(params, targetList) {
  const query = new URLSearchParams(params);
  for (const t of targetList) {
    query.append("target", t);
  }
  const root = config.graphite_url ? config.graphite_url.replace(/\/+$/, "") : basePath("");
  return (root === "/" ? "" : root) + "/render?" + query.toString();
}

function summarized(typ, node, topic, channel, key, scaleCounters) {
  const interval = config.statsd_interval + "sec";
  return targets(typ, node, topic, channel, key).map((t) => {
    let target = t;
    if (scaleCounters && METRIC_TYPES[key] === "counter") {
      target = `scale(${target},${1 / config.statsd_interval})`;
    }
    return `summarize(${target},"${interval}","avg")`;
  });
}

export function sparklineUrl(typ, node, topic, channel, key) {
  const params = {
    colorList: colors(typ, key),
    height: "20",
    width: "120",
    hideGrid: "true",
    hideLegend: "true",
    hideAxes: "true",
    bgcolor: "ff000000",
    fgcolor: "black",
    margin: "0",
    yMin: "0",
    lineMode: "connected",
    drawNullAsZero: "false",
    from: "-" + graphInterval(),
    until: "-1min",
  };
  return renderUrl(params, summarized(typ, node, topic, channel, key, false));
}

export function largeGraphUrl(typ, node, topic, channel, key, width = 800, height = 450) {
  const params = {
    colorList: colors(typ, key),
    height: String(height),
    width: String(width),
    bgcolor: "ff000000",
    fgcolor: "999999",
    yMin: "0",
    lineMode: "connected",
    drawNullAsZero: "false",
    from: "-" + graphInterval(),
    until: "-1min",
  };
  return renderUrl(params, summarized(typ, node, topic, channel, key, true));
}

// A graphite sparkline image that opens the large graph.
export function graphImg(typ, node, topic, channel, key) {
  return html`<a href="${largeGraphUrl(typ, node, topic, channel, key)}" target="_blank"
    rel="noopener"><img class="graphite" width="120" height="20" alt="${key}"
    src="${sparklineUrl(typ, node, topic, channel, key)}"></a>`;
}

// A cell that fillRates() fills with Graphite's msgs/s for the topic (as Go's Rate column).
export function rateCell(node, topic) {
  const target = targets("topic", node, topic, "", "message_count")[0];
  return html`<td class="num bold graphite-rate" data-target="${target}"></td>`;
}

// Ask nsqadmin's /api/graphite for each rate cell on the page (Go's own rate helper).
export function fillRates(root) {
  for (const cell of root.querySelectorAll(".graphite-rate")) {
    const target = cell.dataset.target;
    get("/graphite?metric=rate&target=" + encodeURIComponent(target))
      .then((data) => {
        cell.textContent = data.rate;
      })
      .catch(() => {
        cell.textContent = "ERROR";
      });
  }
}
