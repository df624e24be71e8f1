// The settings nsqadmin put in the page, URL helpers and the JSON API client.

export const config = window.NSQADMIN;

// A path under --base-path: basePath("/topics") is "/admin/topics" with --base-path=/admin.
export function basePath(path) {
  const base = config.base_path === "/" ? "" : config.base_path.replace(/\/+$/, "");
  return (base + path).replace(/\/$/, "") || "/";
}

export function topicPath(topic, channel) {
  let path = "/topics/" + encodeURIComponent(topic);
  if (channel !== undefined) {
    path += "/" + encodeURIComponent(channel);
  }
  return basePath(path);
}

export function nodePath(node) {
  return basePath("/nodes/" + encodeURIComponent(node));
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

const TIMEOUT_MS = 20000;

// Every request carries Go nsqadmin's AJAX headers.
export async function api(method, path, body) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), TIMEOUT_MS);
  const options = {
    method,
    signal: controller.signal,
    credentials: "same-origin",
    headers: {
      Accept: "application/vnd.nsq; version=1.0",
      "X-UserAgent": "nsqadmin/v" + config.version,
      "Content-Type": "application/json",
    },
  };
  if (body !== undefined) {
    options.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(basePath("/api" + path), options);
  } catch (err) {
    throw new ApiError(0, "ERROR: failed to connect to nsqadmin");
  } finally {
    clearTimeout(timer);
  }
  const text = await response.text();
  let data = {};
  try {
    data = text ? JSON.parse(text) : {};
  } catch (err) {
    if (response.ok) {
      throw new ApiError(response.status, "ERROR: failed to decode JSON - " + err.message);
    }
    data = { message: text.trim() };
  }
  if (!response.ok) {
    throw new ApiError(response.status, data.message || response.statusText);
  }
  return data;
}

export const get = (path) => api("GET", path);

// /api/history for one topic, channel or node; null when the server has none.
export async function history(query) {
  if (!Number(config.poll_interval_ms)) {
    return null; // --poll-interval=0: nsqadmin keeps no history
  }
  const params = new URLSearchParams(query);
  try {
    const hist = await get("/history?" + params.toString());
    for (const p of hist.points || []) {
      p.queued = (Number(p.depth) || 0) + (Number(p.channel_depth) || 0);
    }
    return hist;
  } catch (err) {
    return null;
  }
}

// The newest point of a history: the current rates.
export function latest(hist) {
  if (!hist || !hist.points || !hist.points.length) {
    return null;
  }
  return hist.points[hist.points.length - 1];
}
