/* compare.js: two or more runs side by side (GET /ui/compare?runs=A,B,...): their loss,
 * acceptance (tau_chain) and tokens/s on shared charts against the step (uPlot.join aligns the
 * runs' steps), live. Each run's history thinned by the daemon, then only its new steps.
 * Tested by tests/daemon/ui_browser_test.mjs.
 */
"use strict";

(() => {
  const { api, el, every, status } = ddtree;
  const ids = (new URLSearchParams(location.search).get("runs") || "").split(",").filter(Boolean);
  const HISTORY = 1500, PAGE = 2000, RELOAD_AT = 6000;
  const runs = ids.map((id) => ({ id, name: id, steps: [], evals: [] }));
  const shown = {}, slots = {};

  async function update(r) {
    const path = ddtree.runPath(r.id);
    r.name = (await api("GET", path)).name || r.id;
    const last = r.steps.length ? r.steps[r.steps.length - 1].step : null;
    if (last === null || r.steps.length > RELOAD_AT)
      r.steps = (await api("GET", `${path}/steps?max_points=${HISTORY}`)).steps;
    else
      r.steps.push(...(await api("GET", `${path}/steps?${ddtree.after(last)}limit=${PAGE}`)).steps);
    const lastEval = r.evals.length ? r.evals[r.evals.length - 1].step : -1;
    r.evals.push(...(await api("GET", `${path}/evals?${ddtree.after(lastEval)}`)).evals);
  }

  /* one chart: each run's (x, y) table joined on x */
  function chart(key, title, rowsOf, xOf, yOf) {
    const labels = runs.map((r) => r.name);
    const tables = runs.map((r) => { const rows = rowsOf(r); return [rows.map(xOf), rows.map(yOf)]; });
    const c = charts.keep(slots[key], shown, { key, title, labels });
    c.setData(uPlot.join(tables));
  }

  async function refresh() {
    for (const r of runs) await update(r);
    document.getElementById("compared").replaceChildren(...runs.map((r) =>
      el("li", {}, el("a", { href: ddtree.runPage(r.id) }, r.name), ` (${r.id})`)));
    chart("loss", "Loss", (r) => r.steps, (s) => s.step, (s) => s.loss);
    chart("tau", "tau_chain (evaluations)", (r) => r.evals, (e) => e.step, (e) => e.tau_chain);
    chart("throughput", "Tokens/s", (r) => r.steps, (s) => s.step, (s) => s.tokens_per_s);
  }

  document.addEventListener("DOMContentLoaded", () => {
    if (ids.length < 2) {
      status("Pick two or more runs in the runs table (/ui) to compare them.", true);
      return;
    }
    const parent = document.getElementById("charts");
    for (const key of ["loss", "tau", "throughput"])
      parent.append(slots[key] = el("div", { className: "slot" }));
    every(3000, refresh);
  });
})();
