// dormant's thread dashboard: confirm before closing, and the thread page's live view over
// the thread's event stream (SSE). No build step; plain DOM.
"use strict";

document.addEventListener("submit", (e) => {
  const message = e.target.dataset && e.target.dataset.confirm;
  if (message && !window.confirm(message)) e.preventDefault();
});

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function callLine(call) {
  const li = el("li", "call c-pending");
  li.dataset.call = call.call_id;
  li.append(el("span", "fn", call.name), "(",
    el("span", "args", Object.entries(call.args || {})
      .map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ")), ") ",
    el("span", "state", "pending"), " ", el("code", "", call.call_id));
  return li;
}

// One history item as the server renders it (thread_page.py's _item).
function itemNode(seq, item) {
  const li = el("li", "bubble");
  li.dataset.seq = seq;
  li.append(el("span", "seq", "#" + seq));
  const who = (text) => li.append(el("span", "who", text));
  const body = (text) => li.append(el("div", "text", text));
  switch (item.kind) {
    case "user": li.classList.add("user"); who("user"); body(item.text); break;
    case "assistant": {
      li.classList.add("assistant"); who("assistant");
      if (item.text) body(item.text);
      if (item.calls && item.calls.length) {
        const ul = el("ul", "calls");
        item.calls.forEach((c) => ul.append(callLine(c)));
        li.append(ul);
      }
      break;
    }
    case "tool_result":
      li.classList.add("tool_result");
      if (item.is_error) li.classList.add("error");
      who(`result of ${item.name} ${item.call_id}`); body(item.content);
      markCall(item.call_id, "answered");
      break;
    case "event":
      li.classList.add("event"); who(`event on ${item.original_name} ${item.original_call_id}`);
      body(item.content); break;
    case "summary":
      li.classList.add("summary"); who(`summary up to #${item.upto_seq}`); body(item.text); break;
    default: li.classList.add(item.kind || "unknown"); who(item.kind); body(JSON.stringify(item));
  }
  return li;
}

function markCall(callId, state) {
  document.querySelectorAll("li.call").forEach((li) => {
    if (li.dataset.call !== callId) return;
    li.className = "call c-" + state;
    const badge = li.querySelector(".state");
    if (badge) badge.textContent = state;
  });
}

function live(box) {
  const items = document.getElementById("items");
  const bubble = box.querySelector(".bubble.streaming");
  const text = bubble.querySelector(".text");
  const state = box.querySelector(".stream-state");
  let lastSeq = Number(box.dataset.lastSeq || 0);
  const source = new EventSource(box.dataset.stream);
  const data = (e) => JSON.parse(e.data);
  const dropPartial = () => { text.textContent = ""; bubble.hidden = true; };

  source.onopen = () => { state.textContent = "live"; };
  source.onerror = () => { state.textContent = "reconnecting…"; };
  source.addEventListener("chunk", (e) => {
    bubble.hidden = false;
    text.textContent += data(e).text;
  });
  source.addEventListener("item", (e) => {
    const d = data(e);
    if (d.item.kind === "assistant") dropPartial(); // the turn is committed: text is in it
    if (d.seq <= lastSeq) return; // already on the page (rendered by the server)
    lastSeq = d.seq;
    const empty = items.querySelector("li.empty");
    if (empty) empty.remove();
    // A committed item was applied from the inbox: the queued copies shown are now in it.
    items.querySelectorAll("li.queued").forEach((li) => li.remove());
    items.append(itemNode(d.seq, d.item));
  });
  source.addEventListener("dispatched", (e) => {
    const d = data(e);
    items.append(el("li", "line", `dispatched ${d.name} ${d.call_id}`));
  });
  source.addEventListener("retry", (e) => {
    dropPartial();
    items.append(el("li", "line", `turn retried: ${data(e).reason}`));
  });
  source.addEventListener("status", (e) => {
    const d = data(e);
    document.querySelectorAll(".head .badge").forEach((b) => {
      b.className = "badge s-" + d.status; b.dataset.status = d.status; b.textContent = d.status;
    });
    state.textContent = d.detail ? `${d.status}: ${d.detail}` : d.status;
    if (d.status === "closed") source.close();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const box = document.getElementById("live");
  if (box && box.dataset.stream && window.EventSource) live(box);
});
