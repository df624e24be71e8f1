// nsqadmin's single-page app: the navbar, the router (pushState URLs under --base-path) and
// the refresh loop that reloads the current page every poll interval until paused.
import { config, basePath } from "./api.js";
import { html } from "./html.js";
import { ago } from "./format.js";
import { errorBox, spinner } from "./ui.js";
import { INTERVALS, graphInterval, setGraphInterval, fillRates } from "./graphite.js";
import { TopicsPage } from "./pages/topics.js";
import { TopicPage } from "./pages/topic.js";
import { ChannelPage } from "./pages/channel.js";
import { NodesPage } from "./pages/nodes.js";
import { NodePage } from "./pages/node.js";
import { CounterPage } from "./pages/counter.js";
import { LookupPage } from "./pages/lookup.js";

// Pages refresh as often as nsqadmin polls the cluster, but not more than once a second.
const REFRESH_MS = Math.max(Number(config.poll_interval_ms) || 5000, 1000);
const PAUSED_KEY = "nsqadmin_refresh_paused";

const state = {
  page: null, // the current page object
  generation: 0, // bumps on every navigation, so stale loads are dropped
  timer: null,
  updatedAt: 0,
  failed: "",
  paused: sessionStorage.getItem(PAUSED_KEY) === "1", // per tab
  stale: false, // a refresh was skipped while the tab was hidden
  holding: false, // an action is running: no refresh may ask for what it is deleting
  inflight: null, // the refresh under way, if any
};

// ---- routing ---------------------------------------------------------------------------

function route(pathname) {
  const base = config.base_path === "/" ? "" : config.base_path.replace(/\/+$/, "");
  let path = pathname.startsWith(base) ? pathname.slice(base.length) : pathname;
  path = path.replace(/\/+$/, "") || "/";
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  if (path === "/" || (parts[0] === "topics" && parts.length === 1)) {
    return new TopicsPage();
  }
  if (parts[0] === "topics" && parts.length === 2) {
    return new TopicPage(parts[1]);
  }
  if (parts[0] === "topics" && parts.length === 3) {
    return new ChannelPage(parts[1], parts[2]);
  }
  if (parts[0] === "nodes") {
    return parts.length === 2 ? new NodePage(parts[1]) : new NodesPage();
  }
  if (parts[0] === "counter") {
    return new CounterPage();
  }
  if (parts[0] === "lookup") {
    return new LookupPage();
  }
  return null;
}

export function navigate(href, replace = false) {
  if (replace) {
    window.history.replaceState(null, "", href);
  } else {
    window.history.pushState(null, "", href);
  }
  show();
}

function onLinkClick(event) {
  const link = event.target.closest("a");
  if (!link || event.defaultPrevented || event.button !== 0) {
    return;
  }
  if (event.ctrlKey || event.metaKey || event.shiftKey || link.target) {
    return; // a new tab or window, as the browser does it
  }
  const url = new URL(link.href, window.location.href);
  const inApp = url.origin === window.location.origin && route(url.pathname) !== null;
  if (!inApp || url.pathname.startsWith(basePath("/static"))) {
    return;
  }
  event.preventDefault();
  navigate(url.pathname + url.search);
}

// ---- navbar ----------------------------------------------------------------------------

const LOGO = html`<svg width="26" height="26" viewBox="0 0 32 32" aria-hidden="true">
  <path d="M16 2 30 16 16 30 2 16Z" fill="#1e88c8"/><path d="M16 9 23 16 16 23 9 16Z"
  fill="#222"/><path d="M16 13 19 16 16 19 13 16Z" fill="#1e88c8"/></svg>`;

function renderNavbar() {
  const interval = graphInterval();
  const graphSelect = config.graph_enabled
    ? html`<label class="muted" title="Graph timeframe">Graphs
        <select id="graph-interval">${INTERVALS.map(
          (i) => html`<option ${i === interval ? "selected" : ""}>${i}</option>`,
        )}</select></label>`
    : "";
  document.getElementById("navbar").innerHTML = String(html`
    <a class="brand" href="${basePath("/")}">${LOGO}NSQ</a>
    <a data-nav="topics" href="${basePath("/")}">Streams</a>
    <a data-nav="nodes" href="${basePath("/nodes")}">Nodes</a>
    <a data-nav="counter" href="${basePath("/counter")}">Counter</a>
    <a data-nav="lookup" href="${basePath("/lookup")}">Lookup</a>
    ${graphSelect}
    <span class="spacer"></span>
    <span class="refresh" id="refresh">
      <span class="dot"></span><span id="refresh-text">loading…</span>
      <button type="button" id="refresh-toggle"></button>
    </span>
    ${config.user ? html`<span class="muted user" title="the user named by the ACL header">${config.user}</span>` : ""}
    ${config.is_admin ? "" : html`<span class="label label-default" id="read-only"
      title="not an admin user: no actions">read-only</span>`}
    <span class="version label label-success">v${config.version}</span>`);
  const select = document.getElementById("graph-interval");
  if (select) {
    select.addEventListener("change", () => {
      setGraphInterval(select.value);
      const url = new URL(window.location.href);
      url.searchParams.delete("t");
      navigate(url.pathname + url.search, true);
    });
  }
  document.getElementById("refresh-toggle").addEventListener("click", () => {
    state.paused = !state.paused;
    sessionStorage.setItem(PAUSED_KEY, state.paused ? "1" : "0");
    if (state.paused) {
      clearTimeout(state.timer);
    } else {
      refresh(state.generation);
    }
    showRefreshState();
  });
}

function showRefreshState() {
  const box = document.getElementById("refresh");
  const text = document.getElementById("refresh-text");
  box.classList.toggle("paused", state.paused);
  document.getElementById("refresh-toggle").textContent = state.paused ? "Resume" : "Pause";
  let line = state.updatedAt ? "updated " + ago(Date.now() - state.updatedAt) : "loading…";
  if (state.paused) {
    line = "paused · " + line;
  }
  if (state.failed) {
    line += " · last refresh failed: " + state.failed;
  }
  text.textContent = line;
  box.title = state.paused
    ? "Auto-refresh is paused"
    : `Refreshes every ${REFRESH_MS / 1000}s`;
}

// ---- the page lifecycle ----------------------------------------------------------------

function ctx(generation) {
  return {
    isAdmin: Boolean(config.is_admin),
    navigate,
    // Before an action: stop refreshing and let a refresh under way finish. (A refresh of a
    // topic being deleted would fetch a 404, which the browser logs as an error.)
    hold: () => {
      state.holding = true;
      clearTimeout(state.timer);
      return state.inflight || Promise.resolve();
    },
    reload: () => {
      state.holding = false;
      return refresh(generation, true);
    },
  };
}

async function show() {
  clearTimeout(state.timer);
  state.generation += 1;
  const generation = state.generation;
  state.updatedAt = 0;
  state.failed = "";
  state.holding = false;
  const page = route(window.location.pathname);
  state.page = page;
  const main = document.getElementById("main");
  document.body.className = "";
  for (const link of document.querySelectorAll("[data-nav]")) {
    link.classList.toggle("active", page !== null && link.dataset.nav === page.nav);
  }
  window.scrollTo(0, 0);
  if (!page) {
    main.innerHTML = String(errorBox("NOT_FOUND"));
    return;
  }
  document.title = "nsqadmin - " + page.title;
  main.innerHTML = String(spinner());
  main.dataset.page = page.nav + (page.kind ? "-" + page.kind : "");
  main.dataset.renders = "0";
  try {
    await page.load();
  } catch (err) {
    if (generation === state.generation) {
      main.innerHTML = String(errorBox(err.message));
      main.dataset.renders = "error";
    }
    return;
  }
  if (generation !== state.generation) {
    return;
  }
  // Each visit gets a fresh element, so the page's event handlers go away with it.
  const root = document.createElement("div");
  root.className = "page";
  root.innerHTML = String(page.frame ? page.frame(ctx(generation)) : html`<div id="page-body"></div>`);
  main.replaceChildren(root);
  page.bind?.(root, ctx(generation));
  paint(page, main, generation);
  scheduleRefresh(generation);
}

function paint(page, main, generation) {
  const body = main.querySelector("#page-body");
  if (page.update) {
    page.update(body, ctx(generation));
  } else {
    body.innerHTML = String(page.render(ctx(generation)));
    fillRates(body);
  }
  state.updatedAt = Date.now();
  state.failed = "";
  main.dataset.renders = String(Number(main.dataset.renders || 0) + 1);
  showRefreshState();
}

function scheduleRefresh(generation) {
  clearTimeout(state.timer);
  if (!state.paused && !state.holding && generation === state.generation) {
    state.timer = setTimeout(() => {
      // A tab nobody looks at does not poll; it catches up when shown again.
      if (document.hidden) {
        state.stale = true;
      } else {
        refresh(generation);
      }
    }, REFRESH_MS);
  }
}

// forced: repaint even while paused (after an action the page must show its effect).
function refresh(generation, forced = false) {
  if (generation !== state.generation) {
    return Promise.resolve();
  }
  clearTimeout(state.timer);
  const run = reloadPage(generation, forced).finally(() => {
    if (state.inflight === run) {
      state.inflight = null;
    }
  });
  state.inflight = run;
  return run;
}

async function reloadPage(generation, forced) {
  const page = state.page;
  const main = document.getElementById("main");
  try {
    await page.load();
    // A refresh that was under way when Pause was pressed does not change the frozen page.
    const frozen = state.paused && !forced;
    if (!frozen && generation === state.generation && main.querySelector("#page-body")) {
      paint(page, main, generation);
    }
  } catch (err) {
    state.failed = err.message;
    showRefreshState();
  }
  scheduleRefresh(generation);
}

// ---- start -----------------------------------------------------------------------------

renderNavbar();
document.addEventListener("click", onLinkClick);
window.addEventListener("popstate", show);
document.addEventListener("visibilitychange", () => {
  if (!document.hidden && state.stale && !state.paused) {
    state.stale = false;
    refresh(state.generation);
  }
});
setInterval(showRefreshState, 1000);
show();
