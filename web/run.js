/* run.js: the page of one run (GET /ui/runs/{id}): its curves (loss terms, acceptance,
 * throughput, optimizer, peak memory against the budget and the plan), re-chunk / OOM-recovery /
 * checkpoint markers, events, memory plan, config and controls, all live.
 * Steps: the whole history thinned by the daemon (?max_points=) plus the recent window in full,
 * then only what is new (?after=); past RELOAD_AT points the history is thinned again, so a
 * 100,000-step run stays light. Everything the run's owner typed (its name, its config) is
 * written as text.
 * Tested by tests/daemon/ui_browser_test.mjs.
 */
"use strict";

(() => {
  const { api, el, num, bytes, known, duration, eta, finished, status, every, after } = ddtree;
  const id = decodeURIComponent(location.pathname.slice("/ui/runs/".length));
  const path = ddtree.runPath(id);
  const HISTORY = 1500, RECENT = 500, PAGE = 2000, RELOAD_AT = 6000, EVENTS_SHOWN = 300, POLL_MS = 1500;

  let run = null, config = null, plan = null;
  let steps = [], evals = [], marks = [], lastEventId = 0;
  const slots = {}, shown = {};

  const lastStep = () => (steps.length ? steps[steps.length - 1].step : -1);

  async function loadSteps() {
    const history = (await api("GET", `${path}/steps?max_points=${HISTORY}`)).steps;
    const last = history.length ? history[history.length - 1].step : -1;
    const from = Math.max(-1, last - RECENT);
    const recent = last < 0 ? [] : (await api("GET", `${path}/steps?${after(from)}limit=${RECENT + PAGE}`)).steps;
    steps = history.filter((s) => s.step <= from).concat(recent);
  }

  async function newSteps() {
    for (;;) {
      const got = (await api("GET", `${path}/steps?${after(lastStep())}limit=${PAGE}`)).steps;
      steps.push(...got);
      if (got.length < PAGE) break;
    }
    if (steps.length > RELOAD_AT) await loadSteps();
  }

  async function newEvals() {
    const last = evals.length ? evals[evals.length - 1].step : -1;
    evals.push(...(await api("GET", `${path}/evals?${after(last)}`)).evals);
  }

  /* the step of an event: its own, else the first step recorded at or after it */
  function eventStep(e) {
    if (e.detail && Number.isFinite(e.detail.step)) return e.detail.step;
    const s = steps.find((x) => x.ts_ms >= e.ts_ms);
    return s ? s.step : null;
  }

  async function newEvents() {
    const got = (await api("GET", `${path}/events?after=${lastEventId}&limit=1000`)).events;
    const body = document.querySelector("#events tbody");
    for (const e of got) {
      lastEventId = e.id;
      const step = eventStep(e);
      if (e.kind in charts.MARKS && step !== null) marks.push({ step, kind: e.kind });
      body.prepend(el("tr", { dataset: { kind: e.kind } },
        el("td", {}, new Date(e.ts_ms).toLocaleString()), el("td", {}, e.kind),
        el("td", {}, step === null ? "" : step), el("td", {}, el("code", {}, JSON.stringify(e.detail)))));
    }
    while (body.rows.length > EVENTS_SHOWN) body.deleteRow(body.rows.length - 1);
  }

  // ---- header, summary and controls ----------------------------------------------------------

  /* what daemon/runs_requests.c allows the run now (its 409s); r is GET /runs/{id} */
  const ENABLED = {
    pause: (r) => r.state === "running" || (r.state === "paused" && r.held),
    resume: (r) => ["pausing", "paused", "interrupted"].includes(r.state),
    cancel: (r) => !finished(r.state),
    checkpoint: (r) => r.worker,
    export: (r) => r.worker || r.last_checkpoint_step !== null,   /* without a worker: its newest checkpoint */
    rechunk: (r) => !finished(r.state),
  };

  function showRun() {
    document.title = `ddtree: ${run.name}`;
    document.getElementById("run-name").textContent = run.name;
    const st = document.getElementById("run-state");
    st.textContent = run.state;
    st.dataset.state = run.state;
    const parts = [`step ${run.step} / ${run.max_steps}`, `loss ${num(run.loss)}`, `tau_chain ${num(run.tau_chain)}`,
                   `${num(run.tokens_per_s)} tokens/s`, `peak ${bytes(run.peak_memory_bytes && run.peak_memory_bytes.max)}`,
                   `ETA ${duration(eta(run))}`, `chunk ${known(run.chunk)} / vocab_tile ${known(run.vocab_tile)}`,
                   `last checkpoint ${run.last_checkpoint_step === null ? "none" : run.last_checkpoint_step}`,
                   `OOM recoveries ${run.oom_recoveries}`];
    if (run.error) parts.push(`error: ${run.error}`);
    document.getElementById("summary").textContent = parts.join(" \u00b7 ");
    for (const b of document.querySelectorAll("[data-action]"))
      b.disabled = !ENABLED[b.dataset.action](run);
    for (const i of document.querySelectorAll("#rechunk input")) i.disabled = !ENABLED.rechunk(run);
  }

  async function act(action, body) {
    if (action === "cancel" && !confirm(`Cancel run ${run.name} for good? A final checkpoint is kept.`)) return;
    try {
      const reply = await api("POST", `${path}/${action}`, body);
      status(`${action}: ${JSON.stringify(reply)}`);
    } catch (e) {
      status(`${action}: ${e.message}`, true);
    }
    await refresh();
  }

  function wireControls() {
    for (const b of document.querySelectorAll("button[data-action]"))
      if (b.dataset.action !== "rechunk") b.addEventListener("click", () => act(b.dataset.action));
    document.getElementById("rechunk").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const body = {};
      for (const k of ["chunk", "vocab_tile"]) {
        const v = ev.target.elements[k].value;
        if (v !== "") body[k] = Number(v);
      }
      act("rechunk", body);
    });
  }

  // ---- plan and config -----------------------------------------------------------------------

  // the plan at the run's chunk now: its config with the chunk / vocab_tile of its newest step
  // (a re-chunk, by hand or after an out-of-memory step, moves the prediction with it)
  let plannedFor = null;   // the run's chunk / vocab_tile the plan was asked at (the plan may pick a smaller chunk)
  async function replan() {
    const chunk = run && run.chunk, tile = run && run.vocab_tile;
    plannedFor = `${chunk}/${tile}`;
    const loss = { ...(config.loss || {}) };
    if (Number.isInteger(chunk) && chunk > 0) loss.chunk = chunk;
    if (Number.isInteger(tile)) loss.vocab_tile = tile;
    plan = await api("POST", "/plan", { ...config, loss }).catch((e) => ({ error: e.message }));
    showPlan();
  }

  function showPlan() {
    const body = document.querySelector("#plan tbody");
    body.replaceChildren();
    const row = (k, v) => body.append(el("tr", {}, el("th", {}, k), el("td", {}, v)));
    if (!plan.bytes) return row("plan", plan.error);
    row("ranks", plan.ranks);
    row("positions per rank", plan.positions_per_rank);
    for (const [k, v] of Object.entries(plan.bytes)) row(k, bytes(v));
    row("predicted peak", bytes(plan.predicted_peak_bytes));
    row("budget", plan.budget_bytes ? bytes(plan.budget_bytes) : "none (the device's memory)");
    row("chunk / vocab_tile", `${known(plan.chunk)} / ${known(plan.vocab_tile)}`);
    row("fits", plan.fits ? "yes" : `no, as configured: ${plan.why || ""}`);
    if (plan.proposal)
      row("proposed split", `${plan.proposal.fits ? "fits" : "does not fit either"} (the figures above): write ` +
          JSON.stringify(plan.proposal.config));
    if (plan.target) row("target", `${plan.target.placement}, peak ${bytes(plan.target.peak_bytes)}`);
  }

  // ---- charts --------------------------------------------------------------------------------

  const column = (rows, f) => rows.map((r) => { const v = f(r); return v === undefined ? null : v; });

  function draw() {
    const x = steps.map((s) => s.step), markers = () => marks;
    const chart = (spec, columns) => {
      const c = charts.keep(slots[spec.key], shown, { ...spec, markers });
      c.setData([spec.x || x].concat(columns));
    };
    chart({ key: "loss", title: "Loss terms", labels: ["loss", "ce", "kl", "cap"] },
          ["loss", "ce", "kl", "cap"].map((k) => column(steps, (s) => s[k])));

    const budgets = [...new Set(evals.flatMap((e) => Object.keys(e.tau_tree || {})))].sort((a, b) => a - b);
    const specBudgets = [...new Set(evals.flatMap((e) => Object.keys(e.tau_spec_tree || {})))].sort((a, b) => a - b);
    const hasSpec = evals.some((e) => Number.isFinite(e.tau_spec));
    // a DFlash2 run: tau_chain is its path selector's, its unary head's beside
    const hasUnary = evals.some((e) => e.unary && Number.isFinite(e.unary.tau_chain));
    const tauLabels = ["tau_chain"].concat(budgets.map((k) => `tau_tree(${k})`), hasUnary ? ["tau_chain (unary)"] : [],
                                           hasSpec ? ["tau_spec"] : [], specBudgets.map((k) => `tau_spec_tree(${k})`));
    chart({ key: "tau", title: "Acceptance length (evaluations)", labels: tauLabels, x: evals.map((e) => e.step) },
          [column(evals, (e) => e.tau_chain)].concat(
            budgets.map((k) => column(evals, (e) => (e.tau_tree || {})[k])),
            hasUnary ? [column(evals, (e) => (e.unary || {}).tau_chain)] : [],
            hasSpec ? [column(evals, (e) => e.tau_spec)] : [],
            specBudgets.map((k) => column(evals, (e) => (e.tau_spec_tree || {})[k]))));

    chart({ key: "throughput", title: "Throughput", labels: ["tokens/s", "positions/s"] },
          [column(steps, (s) => s.tokens_per_s), column(steps, (s) => s.positions_per_s)]);
    chart({ key: "optimizer", title: "Learning rate and gradient norm", labels: ["lr", "grad_norm"],
            scales: { grad_norm: "y2" } },
          [column(steps, (s) => s.lr), column(steps, (s) => s.grad_norm)]);

    const devices = [...new Set(steps.flatMap((s) => (s.devices || []).map((d) => d.device)))].sort((a, b) => a - b);
    const budget = config && config.memory && config.memory.budget_bytes;
    const predicted = plan && plan.predicted_peak_bytes;
    const memLabels = devices.map((d) => `device ${d} peak`).concat(budget ? ["budget"] : [], predicted ? ["plan's prediction"] : []);
    chart({ key: "memory", title: "Peak memory per device", labels: memLabels, format: bytes },
          devices.map((d) => column(steps, (s) => { const r = (s.devices || []).find((v) => v.device === d); return r ? r.peak_bytes : null; }))
            .concat(budget ? [x.map(() => budget)] : [], predicted ? [x.map(() => predicted)] : []));
  }

  async function refresh() {
    run = await api("GET", path);
    showRun();
    if (config && plan && plan.bytes && plannedFor !== `${run.chunk}/${run.vocab_tile}`) await replan();
    await newSteps();
    await newEvents();
    await newEvals();
    draw();
  }

  document.addEventListener("DOMContentLoaded", async () => {
    const parent = document.getElementById("charts");
    for (const key of ["loss", "tau", "throughput", "optimizer", "memory"])
      parent.append(slots[key] = el("div", { className: "slot" }));
    wireControls();
    try {
      config = await api("GET", `${path}/config`);
      document.getElementById("config").textContent = JSON.stringify(config, null, 2);
      run = await api("GET", path);
      await replan();
      await loadSteps();
    } catch (e) {
      status(e.message, true);
    }
    every(POLL_MS, refresh);
  });
})();
