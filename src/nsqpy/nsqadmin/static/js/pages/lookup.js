// Lookup (/lookup): the nsqlookupd hosts, topics/channels with no producer, and the form that
// creates a topic/channel ahead of its producers. Every delete and create asks first.
import { api, get, config, topicPath } from "../api.js";
import { html } from "../html.js";
import { warningBanner, notice, tableScroll, label } from "../ui.js";
import { runAction } from "./common.js";

export class LookupPage {
  nav = "lookup";
  title = "Lookup";

  async load() {
    if (!(config.nsqlookupd || []).length) {
      return;
    }
    const [inactive, overview] = await Promise.all([
      get("/topics?inactive=true"),
      get("/overview").catch(() => null),
    ]);
    this.inactive = inactive;
    this.overview = overview;
  }

  frame(ctx) {
    if (!(config.nsqlookupd || []).length) {
      return html`<h2>Lookup</h2><div id="page-body"></div>${notice(
        "Notice",
        "nsqadmin is not configured with nsqlookupd hosts",
      )}`;
    }
    const form = ctx.isAdmin
      ? html`<form class="create narrow" id="create-form">
          <legend>Create Topic/Channel</legend>
          <div class="alert alert-info">
            <p>This provides a way to setup a stream hierarchy before services are deployed to
            production.</p>
            <p>If <em>Channel Name</em> is empty, just the topic is created.</p>
          </div>
          <input type="text" name="topic" placeholder="Topic Name" aria-label="Topic Name">
          <input type="text" name="channel" placeholder="Channel Name" aria-label="Channel Name">
          <div><button class="btn btn-default" type="submit">Create</button></div>
        </form>`
      : "";
    return html`<h2>Lookup</h2><div id="page-body"></div>${form}`;
  }

  bind(root, ctx) {
    const form = root.querySelector("#create-form");
    if (form) {
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        this.create(ctx, form);
      });
    }
    root.addEventListener("click", (event) => {
      const button = event.target.closest("[data-delete-topic]");
      if (button) {
        this.remove(ctx, button.dataset.deleteTopic, button.dataset.deleteChannel);
      }
    });
  }

  async create(ctx, form) {
    const topic = form.topic.value.trim();
    const channel = form.channel.value.trim();
    if (!topic && !channel) {
      return; // as Go: an empty form does nothing
    }
    const what = channel ? html`topic <em>${topic}</em> and channel <em>${channel}</em>` : html`topic <em>${topic}</em>`;
    const created = await runAction(ctx, {
      title: "Create topic/channel",
      body: html`<p>Create ${what} on every nsqlookupd${channel ? " (and on the nsqd that already produce the topic)" : ""}?</p>`,
      action: "Create",
      call: () => api("POST", "/topics", channel ? { topic, channel } : { topic }),
      done: channel ? `Created ${topic}/${channel}.` : `Created topic ${topic}.`,
    });
    if (created) {
      form.reset();
    }
  }

  remove(ctx, topic, channel) {
    const name = channel ? `${topic}/${channel}` : topic;
    const path = "/topics/" + encodeURIComponent(topic) + (channel ? "/" + encodeURIComponent(channel) : "");
    return runAction(ctx, {
      title: channel ? "Delete channel" : "Delete topic",
      body: html`<p>Delete ${channel ? "channel" : "topic"} <em>${name}</em> from every
        nsqlookupd${channel ? "" : " (with its channels)"}?</p><p>No nsqd produces it, so no
        queued messages are lost; producers and consumers that look it up will no longer find
        it.</p>`,
      action: "Delete",
      style: "btn-danger",
      call: () => api("DELETE", path),
      done: `Deleted ${name}.`,
    });
  }

  render(ctx) {
    if (!this.inactive) {
      return ""; // no lookupd: the frame's notice says so
    }
    const unreachable = this.overview ? this.overview.lookupd.unreachable : [];
    const dead = (address) => unreachable.find((u) => u.address === address);
    const hosts = tableScroll(html`<table class="table table-auto" id="lookupd-hosts">
      <tr><th>nsqlookupd Host</th></tr>
      ${config.nsqlookupd.map((address) => {
        const down = dead(address);
        return html`<tr class="${down ? "unreachable" : ""}"><td>${address}${
          down ? html` ${label("unreachable", "danger", down.error)}` : ""
        }</td></tr>`;
      })}</table>`);
    const topics = this.inactive.topics || {};
    const names = Object.keys(topics).sort();
    const x = (topic, channel) =>
      ctx.isAdmin
        ? html`<button class="btn-link-x" data-delete-topic="${topic}"
            ${channel ? html`data-delete-channel="${channel}"` : ""}
            title="delete ${channel ? `${topic}/${channel}` : topic}">&#10008;</button>`
        : "";
    const tree = names.length
      ? html`<div class="alert alert-info narrow">Below is a tree of Topics/Channels that are
          currently inactive (i.e. not produced on any nsqd in the cluster but are present in the
          lookup data)</div>
        <ul class="tree" id="inactive">${names.map(
          (t) => html`<li data-topic="${t}">${x(t)} <a href="${topicPath(t)}">${t}</a>
            <ul>${(topics[t] || []).map(
              (c) => html`<li data-channel="${c}">${x(t, c)} <a href="${topicPath(t, c)}">${c}</a></li>`,
            )}</ul></li>`,
        )}</ul>`
      : notice("Notice", "No inactive Topics");
    return html`${warningBanner(this.inactive.message, unreachable)}${hosts}${tree}`;
  }
}

