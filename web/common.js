/* common.js: what every page of ddtreed's web view shares: the JSON API with the page's CSRF
 * token, building DOM nodes whose user data is text only (never HTML), number formats, and
 * polling that waits for each answer before the next request.
 * Tested by tests/daemon/ui_browser_test.mjs.
 */
"use strict";

const ddtree = (() => {
  const csrf = document.querySelector('meta[name="ddtree-csrf"]').content;

  /* one API call: the parsed JSON answer, or an Error with the daemon's message */
  async function api(method, path, body) {
    const init = { method, headers: { "X-DDTree-CSRF": csrf }, credentials: "same-origin" };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(path, init);
    if (r.status === 401) {
      location.href = "/ui/login";
      throw new Error("log in first");
    }
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch (e) { /* not JSON: the status says it */ }
    if (!r.ok)
      throw new Error(json && json.error ? json.error.message : `${method} ${path}: HTTP ${r.status}`);
    return json;
  }

  /* an element: attrs as properties (dataset: an object), children as nodes or text */
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "dataset") Object.assign(e.dataset, v);
      else e[k] = v;
    }
    for (const c of children)
      if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
    return e;
  }

  const dash = "\u2014";
  function num(v, digits = 4) {
    if (v === null || v === undefined || !Number.isFinite(v)) return dash;
    if (v !== 0 && (Math.abs(v) >= 1e5 || Math.abs(v) < 1e-3)) return v.toExponential(2);
    return Number(v.toPrecision(digits)).toString();
  }
  /* decimal units, as the planner and ddtreectl print them (client/format.c's ddc_fmt_bytes) */
  function bytes(v) {
    if (v === null || v === undefined || !Number.isFinite(v)) return dash;
    if (v < 1e3) return `${v.toFixed(0)} B`;
    if (v < 1e6) return `${(v / 1e3).toFixed(1)} kB`;
    if (v < 1e9) return `${(v / 1e6).toFixed(1)} MB`;
    return `${(v / 1e9).toFixed(2)} GB`;
  }
  /* a value the daemon has not got yet (null) as a dash, not "null" */
  const known = (v) => (v === null || v === undefined ? dash : v);
  /* GET /runs' runs, newest first: by created_ms, the later of equal ones first (as ddtreectl) */
  function newestFirst(runs) {
    const at = (r) => (Number.isFinite(r.created_ms) ? r.created_ms : -1);
    return runs.map((r, i) => [r, i]).sort((a, b) => at(b[0]) - at(a[0]) || b[1] - a[1]).map((x) => x[0]);
  }
  function duration(s) {
    if (s === null || !Number.isFinite(s) || s < 0) return dash;
    if (s < 60) return `${Math.round(s)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
    return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
  }
  /* a running run's time left from its pace so far */
  function eta(run) {
    if (run.state !== "running" || !run.step || !run.started_ms || !run.updated_ms) return null;
    const per_step = (run.updated_ms - run.started_ms) / 1000 / run.step;
    return per_step * (run.max_steps - run.step);
  }
  const finished = (state) => ["completed", "failed", "cancelled"].includes(state);
  const STATES = ["queued", "running", "pausing", "paused", "completed", "failed", "cancelled", "interrupted"];

  function status(text, error) {
    const s = document.getElementById("status");
    if (!s) return;
    s.textContent = text;
    s.classList.toggle("error", !!error);
  }

  /* fn now and again every ms after each call has finished; a failure is shown, not fatal */
  function every(ms, fn) {
    const tick = async () => {
      try { await fn(); } catch (e) { status(e.message, true); }
      setTimeout(tick, ms);
    };
    tick();
  }

  function wireLogout() {
    const b = document.getElementById("logout");
    if (b) b.addEventListener("click", async () => {
      await fetch("/ui/logout", { method: "POST", headers: { "X-DDTree-CSRF": csrf }, credentials: "same-origin" });
      location.href = "/ui/login";
    });
  }
  document.addEventListener("DOMContentLoaded", wireLogout);

  /* the query's "after=N&" for records after N; none for all of them (N < 0) */
  const after = (n) => (n >= 0 ? `after=${n}&` : "");
  const runPage = (id) => `/ui/runs/${encodeURIComponent(id)}`;
  const runPath = (id) => `/runs/${encodeURIComponent(id)}`;

  return { api, el, num, bytes, known, newestFirst, duration, eta, finished, STATES, status, every, after, runPage,
           runPath };
})();
