// dormant's thread dashboard: confirm before closing, and the thread page's live view over
// the thread's event stream (SSE). The stream says what happened; what the store made of it
// (a call's state, the thread's and its family's status, messages still in the inbox) comes
// from thread/state, fetched after each event and every few seconds. No build step; plain DOM.
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

const REFRESH_MS = 4000;
let callStates = {};  // call id -> state, as thread/state last said

function callLine(call) {
  const state = callStates[call.call_id] || "pending";  // just made: pending until told
  const li = el("li", "call c-" + state);
  li.dataset.call = call.call_id;
  li.append(el("span", "fn", call.name), "(",
    el("span", "args", Object.entries(call.args || {})
      .map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ")), ") ",
    el("span", "state", state), " ", el("code", "", call.call_id));
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
      break;  // answered, interrupted, subscribed: thread/state says which
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

// thread/state, fetched at most one at a time; a request asked for meanwhile runs after it.
function stateRefresher(url) {
  let timer = null, running = false, again = false;
  const schedule = () => {
    if (running) { again = true; return; }
    if (!timer) timer = setTimeout(run, 150);
  };
  const run = async () => {
    timer = null; running = true;
    try {
      const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (response.ok) applyState(await response.json());
    } catch (error) {
      // the server is away for a moment: the next event or tick asks again
    } finally {
      running = false;
      if (again) { again = false; schedule(); }
    }
  };
  setInterval(() => { if (document.visibilityState === "visible") schedule(); }, REFRESH_MS);
  return schedule;
}

function applyState(s) {
  const swap = (id, html) => { const node = document.getElementById(id); if (node) node.innerHTML = html; };
  swap("facts", s.facts);
  swap("problems", s.problems);
  swap("side", s.side);
  callStates = s.calls;
  document.querySelectorAll("li.call").forEach((li) => {
    const state = s.calls[li.dataset.call];
    if (state) markCall(li.dataset.call, state);
  });
  const items = document.getElementById("items");
  items.querySelectorAll("li.queued").forEach((li) => li.remove());
  if (s.queued) {
    const empty = items.querySelector("li.empty");
    if (empty) empty.remove();
    items.insertAdjacentHTML("beforeend", s.queued);
  }
}

function live(box) {
  const items = document.getElementById("items");
  const bubble = box.querySelector(".bubble.streaming");
  const text = bubble.querySelector(".text");
  const state = box.querySelector(".stream-state");
  let lastSeq = Number(box.dataset.lastSeq || 0);
  const source = new EventSource(box.dataset.stream);
  const refresh = box.dataset.state ? stateRefresher(box.dataset.state) : () => {};
  const data = (e) => JSON.parse(e.data);
  const dropPartial = () => { text.textContent = ""; bubble.hidden = true; };

  source.onopen = () => { state.textContent = "live"; };
  source.onerror = () => { state.textContent = "reconnecting…"; };
  source.addEventListener("chunk", (e) => {
    if (bubble.hidden) refresh(); // a turn began: the message it answers may be queued
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
    refresh();
  });
  // A dispatched call is shown where it was made (its state) and under "Waiting for":
  // a line of its own at the end of the timeline read as a new item.
  source.addEventListener("dispatched", () => refresh());
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
    refresh();
    if (d.status === "closed") source.close();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const box = document.getElementById("live");
  if (box && box.dataset.stream && window.EventSource) live(box);
});
