/* charts.js: the web view's charts, uPlot (embedded by the build, docs/ui.md) configured for
 * training curves against the step: one chart per group of series, sized to its container,
 * vertical markers for re-chunks, OOM recoveries and checkpoints (a uPlot draw hook), and a
 * data-points attribute the browser test waits on.
 * Tested by tests/daemon/ui_browser_test.mjs.
 */
"use strict";

const charts = (() => {
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
                   "#7f7f7f", "#bcbd22"];
  const MARKS = { rechunk: "#ff7f0e", oom_recovery: "#d62728", checkpoint: "#2ca02c" };

  /* a uPlot plugin drawing markers(): [{step, kind}] as dashed vertical lines */
  function markerPlugin(markers) {
    return {
      hooks: {
        draw: [(u) => {
          const ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
          ctx.save();
          ctx.setLineDash([4, 4]);
          ctx.lineWidth = 1;
          for (const m of markers()) {
            const x = u.valToPos(m.step, "x", true);
            if (!Number.isFinite(x) || x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
            ctx.strokeStyle = MARKS[m.kind] || "#999";
            ctx.beginPath();
            ctx.moveTo(x, top);
            ctx.lineTo(x, top + height);
            ctx.stroke();
          }
          ctx.restore();
        }],
      },
    };
  }

  /* A chart in a new box of parent: spec {key, title, labels: [..], scales?: {label: "y2"},
   * format?: value -> text, markers?: () => [..]}. setData(columns) takes [x[], y1[], ...]. */
  function create(parent, spec) {
    const box = ddtree.el("figure", { className: "chart", dataset: { chart: spec.key, points: "0" } },
                          ddtree.el("figcaption", {}, spec.title));
    parent.append(box);
    const fmt = spec.format || ((v) => ddtree.num(v));
    const right = Object.values(spec.scales || {}).includes("y2");
    const opts = {
      width: Math.max(300, box.clientWidth - 16),
      height: 220,
      scales: { x: { time: false } },
      series: [{ label: "step" }].concat(spec.labels.map((label, j) => ({
        label, stroke: PALETTE[j % PALETTE.length], width: 1.5, spanGaps: true,
        scale: (spec.scales || {})[label] || "y", value: (u, v) => fmt(v),
      }))),
      axes: [{ label: "step" }, { scale: "y", values: (u, vals) => vals.map(fmt), size: 70 }]
        .concat(right ? [{ scale: "y2", side: 1, grid: { show: false }, values: (u, vals) => vals.map(fmt), size: 70 }] : []),
      plugins: spec.markers ? [markerPlugin(spec.markers)] : [],
      legend: { live: true },
    };
    const empty = [[]].concat(spec.labels.map(() => []));
    const u = new uPlot(opts, empty, box);
    new ResizeObserver(() => u.setSize({ width: Math.max(300, box.clientWidth - 16), height: 220 })).observe(box);
    return {
      labels: spec.labels,
      box,
      setData(columns) {
        u.setData(columns);
        box.dataset.points = String(columns[0].length);
      },
      redraw() { u.redraw(false, false); },
      destroy() { u.destroy(); box.remove(); },
    };
  }

  /* a chart kept while its labels stay the same, made anew (in place) when they change */
  function keep(parent, slots, spec) {
    const old = slots[spec.key];
    if (old && old.labels.join("\n") === spec.labels.join("\n")) return old;
    const c = create(parent, spec);
    if (old) {
      old.box.replaceWith(c.box);
      old.destroy();
    }
    slots[spec.key] = c;
    return c;
  }

  return { create, keep, MARKS };
})();
