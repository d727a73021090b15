// The charts of a run's metrics history, shared by `trainyard dashboard` and
// `trainyard show --html`: one uPlot chart per numeric metric rank 0 reported, over time.
"use strict";

// Draws (or, for those in `charts` already, updates) a chart per numeric metric of rank 0's
// entries into `container`; `charts` maps a metric's name to its chart.
function drawCharts(container, entries, charts) {
  const rank0 = entries.filter((e) => e.rank === 0);
  const names = [];
  for (const e of rank0) {
    for (const [k, v] of Object.entries(e.metrics)) {
      if (typeof v === "number" && !names.includes(k)) names.push(k);
    }
  }
  for (const name of names) {
    const points = rank0.filter((e) => typeof e.metrics[name] === "number");
    const data = [points.map((e) => e.time), points.map((e) => e.metrics[name])];
    if (charts[name]) { charts[name].setData(data); continue; }
    const box = document.createElement("div");
    box.className = "chart";
    container.appendChild(box);
    charts[name] = new uPlot({
      title: name, width: 440, height: 220,
      series: [{}, { label: name, stroke: "#2a6fd6", width: 2, points: { show: true, size: 5 } }],
    }, data, box);
  }
  return names;
}
