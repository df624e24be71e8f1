// Counter (/counter): the total of message_count over every channel on every node, animated
// toward each new total in both directions (Go's counter only ever counted up).
import { get } from "../api.js";
import { html } from "../html.js";
import { commafy, rate } from "../format.js";
import { warningBanner } from "../ui.js";
import { graphActive, largeGraphUrl } from "../graphite.js";

const ANIMATION_MS = 900;
const NOTE_MS = 15000;

export class CounterPage {
  nav = "counter";
  title = "Counter";

  constructor() {
    this.shown = null; // the number on screen
    this.target = null;
    this.previous = null; // {total, at} of the last poll, for the rate line
    this.frame_ = 0;
  }

  async load() {
    const data = await get("/counter");
    const stats = Object.values(data.stats || {});
    this.total = stats.reduce((n, s) => n + (Number(s.message_count) || 0), 0);
    this.message = data.message || "";
    this.polledAt = Date.now();
  }

  frame() {
    document.body.classList.add("counter-page");
    const graph = graphActive()
      ? html`<img id="big_graph" height="500" alt="message rate"
          src="${largeGraphUrl("counter", "*", "", "", "message_count")}">`
      : "";
    return html`<div id="page-body"></div>
      <div class="counter">
        <div class="digits" id="counter-digits" aria-live="polite"></div>
        <p class="processed">Messages Processed</p>
        <p class="messagerate" id="counter-rate"></p>
        ${graph}
      </div>`;
  }

  update(body) {
    body.innerHTML = String(warningBanner(this.message, []));
    this.rateLine();
    this.animateTo(this.total);
    const img = document.getElementById("big_graph");
    if (img) {
      const url = new URL(img.src);
      url.searchParams.set("_uniq", String(Math.floor(Math.random() * 1e6)));
      img.src = url.toString();
    }
  }

  // msgs/s between the last two polls; a drop in the total is said for a while.
  rateLine() {
    const line = document.getElementById("counter-rate");
    const now = { total: this.total, at: this.polledAt };
    if (this.previous && now.at > this.previous.at) {
      const delta = now.total - this.previous.total;
      if (delta < 0) {
        this.note = `down ${commafy(-delta)}: a channel, topic or node went away`;
        this.noteUntil = now.at + NOTE_MS;
      }
      const perSecond = (Math.max(delta, 0) * 1000) / (now.at - this.previous.at);
      const note = this.note && now.at < this.noteUntil ? " · " + this.note : "";
      line.textContent = `${rate(perSecond)} msgs/s${note}`;
    }
    this.previous = now;
  }

  animateTo(target) {
    this.target = target;
    const digits = document.getElementById("counter-digits");
    digits.dataset.target = String(target);
    if (this.shown === null) {
      this.draw(target);
      return;
    }
    const from = this.shown;
    const started = performance.now();
    cancelAnimationFrame(this.frame_);
    const step = (now) => {
      const progress = Math.min(1, (now - started) / ANIMATION_MS);
      this.draw(Math.round(from + (target - from) * progress));
      if (progress < 1 && document.body.contains(digits)) {
        this.frame_ = requestAnimationFrame(step);
      }
    };
    this.frame_ = requestAnimationFrame(step);
  }

  draw(value) {
    this.shown = value;
    const digits = document.getElementById("counter-digits");
    if (!digits) {
      return;
    }
    digits.dataset.value = String(value);
    digits.innerHTML = String(
      html`${commafy(value)
        .split("")
        .map((ch) =>
          ch === "," ? html`<span class="digit sep">,</span>` : html`<span class="digit">${ch}</span>`,
        )}`,
    );
  }
}
