/* runs.js: the runs table (GET /ui): name, state, step / steps, loss, tau, tokens/s, peak
 * memory and ETA of every run, filtered by state, refreshed every two seconds; runs ticked
 * here open side by side in the compare view, newest first (as ddtreectl runs), each with its id
 * (names may repeat). Names are written as text.
 * Tested by tests/daemon/ui_browser_test.mjs.
 */
"use strict";

(() => {
  const { api, el, num, bytes, duration, eta, every, STATES } = ddtree;
  const chosen = new Set();

  function row(r) {
    const box = el("input", { type: "checkbox", checked: chosen.has(r.id), title: "compare" });
    box.addEventListener("change", () => {
      if (box.checked) chosen.add(r.id); else chosen.delete(r.id);
      document.getElementById("compare").disabled = chosen.size < 2;
    });
    return el("tr", { dataset: { id: r.id, state: r.state } },
      el("td", {}, box),
      el("td", {}, el("a", { href: ddtree.runPage(r.id), className: "run-name" }, r.name || r.id)),
      el("td", {}, el("code", { className: "run-id" }, r.id)),
      el("td", {}, el("span", { className: "state", dataset: { state: r.state } }, r.state)),
      el("td", {}, `${r.step} / ${r.max_steps}`),
      el("td", {}, num(r.loss)),
      el("td", {}, num(r.tau_chain)),
      el("td", {}, num(r.tokens_per_s)),
      el("td", {}, bytes(r.peak_memory_bytes && r.peak_memory_bytes.max)),
      el("td", {}, duration(eta(r))));
  }

  async function refresh() {
    const state = document.getElementById("state-filter").value;
    const runs = (await api("GET", state ? `/runs?state=${encodeURIComponent(state)}` : "/runs")).runs;
    document.querySelector("#runs tbody").replaceChildren(...ddtree.newestFirst(runs).map(row));
    document.getElementById("empty").hidden = runs.length > 0;
    ddtree.status(`${runs.length} run${runs.length === 1 ? "" : "s"}, updated ${new Date().toLocaleTimeString()}`);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const filter = document.getElementById("state-filter");
    filter.append(...STATES.map((s) => el("option", { value: s }, s)));
    filter.value = new URLSearchParams(location.search).get("state") || "";
    filter.addEventListener("change", () => {
      history.replaceState(null, "", filter.value ? `?state=${encodeURIComponent(filter.value)}` : "/ui");
      refresh();
    });
    document.getElementById("compare").addEventListener("click", () => {
      location.href = `/ui/compare?runs=${[...chosen].map(encodeURIComponent).join(",")}`;
    });
    every(2000, refresh);
  });
})();
