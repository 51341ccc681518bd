/* Queue charts (uPlot): throughput, wait and run percentiles over the selected window. */
(function () {
  "use strict";
  const palette = { a: "#2563eb", b: "#f59e0b", c: "#dc2626", d: "#10b981" };

  function secondsAxis(u, values) {
    return values.map((v) => (v == null ? "" : v === 0 ? "0" : v < 1e-3 ? Math.round(v * 1e6) + "µs" : v < 1 ? +(v * 1e3).toFixed(1) + "ms" : +v.toFixed(2) + "s"));
  }

  function make(target, series, axisValues) {
    const width = Math.max(260, target.clientWidth);
    const opts = {
      width: width, height: 190,
      cursor: { drag: { x: false, y: false } },
      legend: { show: true },
      scales: { x: { time: true } },
      // Times in UTC and on a 24-hour clock, as every table of the dashboard shows them.
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
      fmtDate: (tpl) => uPlot.fmtDate(tpl.replace(/\{h\}/g, "{HH}").replace(/\s*\{aa\}/g, "")),
      axes: [
        { stroke: "#64748b", grid: { stroke: "#eef2f7" }, ticks: { stroke: "#e2e8f0" }, label: "UTC", labelSize: 14 },
        { stroke: "#64748b", grid: { stroke: "#eef2f7" }, ticks: { stroke: "#e2e8f0" }, size: 56, values: axisValues },
      ],
      series: [{}].concat(series.map((s) => ({ label: s.label, stroke: s.color, width: 1.6, fill: s.fill || undefined, spanGaps: false, points: { show: false } }))),
    };
    return new uPlot(opts, [[]].concat(series.map(() => [])), target);
  }

  window.conveyorCharts = function (base, queue, win, poll) {
    if (typeof uPlot === "undefined") return;
    const rate = make(document.getElementById("chart-rate"), [
      { label: "processed", color: palette.a, fill: "rgba(37,99,235,0.08)" },
      { label: "enqueued", color: palette.d },
      { label: "failed", color: palette.c },
    ]);
    const wait = make(document.getElementById("chart-wait"), [
      { label: "p50", color: palette.d }, { label: "p95", color: palette.b }, { label: "p99", color: palette.c },
    ], secondsAxis);
    const run = make(document.getElementById("chart-run"), [
      { label: "p50", color: palette.d }, { label: "p95", color: palette.b }, { label: "p99", color: palette.c },
    ], secondsAxis);
    const path = () => `/api/queues/${encodeURIComponent(queue).replace(/%7E/g, "~")}/series?window=${win}`;
    poll(path, 5000, (s) => {
      rate.setData([s.t, s.processed, s.enqueued, s.failed]);
      wait.setData([s.t, s.wait_p50, s.wait_p95, s.wait_p99]);
      run.setData([s.t, s.run_p50, s.run_p95, s.run_p99]);
    });
    window.addEventListener("resize", () => {
      for (const [chart, id] of [[rate, "chart-rate"], [wait, "chart-wait"], [run, "chart-run"]]) {
        chart.setSize({ width: Math.max(260, document.getElementById(id).clientWidth), height: 190 });
      }
    });
  };
})();
