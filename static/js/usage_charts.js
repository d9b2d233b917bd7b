// The admin usage page's charts (uPlot, vendored): the series the page rendered, drawn once.
(function () {
  "use strict";
  // Axis labels that fit the axis: uPlot's default prints 100,000 in full and cuts it.
  function compact(u, splits) {
    return splits.map(function (v) {
      if (v == null) { return ""; }
      var a = Math.abs(v);
      if (a >= 1e6) { return +(v / 1e6).toFixed(1) + "M"; }
      if (a >= 1e3) { return +(v / 1e3).toFixed(1) + "k"; }
      return String(v);
    });
  }
  function draw() {
    var source = document.getElementById("usage-series");
    if (!source || typeof uPlot === "undefined") { return; }
    var rows = JSON.parse(source.textContent);
    var x = rows.map(function (r) { return Date.parse(r.period) / 1000; });
    function col(name) { return rows.map(function (r) { return r[name] || 0; }); }
    var charts = [
      ["chart-usage-tokens", [["prompt", "#3060b0", col("prompt_tokens")],
                              ["from cache", "#7a9ad0", col("cached_tokens")],
                              ["answer", "#2a7d2a", col("completion_tokens")]]],
      ["chart-usage-answers", [["requests", "#2a7d2a", col("requests")],
                               ["refused", "#b03030", col("rejected")]]]
    ];
    charts.forEach(function (chart) {
      var el = document.getElementById(chart[0]);
      if (!el) { return; }
      var series = [{}].concat(chart[1].map(function (s) {
        return {label: s[0], stroke: s[1], width: 1.5};
      }));
      var data = [x].concat(chart[1].map(function (s) { return s[2]; }));
      // Fits a phone: the chart takes its box's width, at least 280 px.
      new uPlot({width: Math.max(280, el.clientWidth - 8), height: 200, series: series,
                 scales: {x: {time: true}}, axes: [{}, {values: compact}]}, data, el);
    });
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", draw); }
  else { draw(); }
})();
