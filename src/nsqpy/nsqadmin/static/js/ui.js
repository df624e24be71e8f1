// Shared page pieces: the confirm dialog, banners, toasts, notices, tables.
import { html, escape } from "./html.js";

// A modal confirm dialog. Resolves true only when the action button is pressed.
export function confirmAction({ title, body, action, style = "btn-primary" }) {
  return new Promise((resolve) => {
    const dialog = document.createElement("dialog");
    dialog.className = "confirm";
    dialog.innerHTML = String(html`
      <form method="dialog">
        <div class="body"><h3>${title}</h3>${body}</div>
        <div class="buttons">
          <button class="btn btn-default" value="cancel">Cancel</button>
          <button class="btn ${style}" value="ok" data-confirm>${action}</button>
        </div>
      </form>`);
    dialog.addEventListener("close", () => {
      resolve(dialog.returnValue === "ok");
      dialog.remove();
    });
    document.body.appendChild(dialog);
    dialog.showModal();
    dialog.querySelector("[data-confirm]").focus();
  });
}

// A short-lived message in the corner (success) or a red banner that stays (error).
export function toast(message, kind = "success") {
  const box = document.getElementById("toast");
  const item = document.createElement("div");
  item.className = "alert alert-" + kind;
  item.setAttribute("role", "status");
  item.textContent = message;
  box.appendChild(item);
  setTimeout(() => item.remove(), kind === "success" ? 4000 : 10000);
}

export function notice(title, ...lines) {
  return html`<div class="alert alert-warning narrow"><h4>${title}</h4>${lines.map(
    (line) => html`<p>${line}</p>`,
  )}</div>`;
}

export function errorBox(message) {
  return html`<div class="alert alert-danger" id="error" role="alert">${message}</div>`;
}

// The one warning banner of a page: the upstream WARNING text and the unreachable daemons,
// shown once (Go printed the same text twice, in yellow and in red).
export function warningBanner(message, unreachable) {
  const list = unreachable || [];
  if (!message && !list.length) {
    return "";
  }
  const n = list.length;
  const title = n
    ? `${n} ${n === 1 ? "daemon" : "daemons"} did not answer: figures below leave them out`
    : "Partial data";
  const details = n
    ? html`<ul>${list.map((u) => html`<li><strong>${u.address}</strong>: ${u.error}</li>`)}</ul>`
    : html`<p>${message}</p>`;
  return html`<div class="alert alert-warning" id="warning" role="alert"><h4>${title}</h4>${details}</div>`;
}

export function tableScroll(content) {
  return html`<div class="table-scroll">${content}</div>`;
}

export function spinner() {
  return html`<div class="spinner"><span></span><span></span><span></span></div>`;
}

export function label(text, kind, title) {
  return html`<span class="label label-${kind}" title="${title || ""}">${text}</span>`;
}

export { escape };
