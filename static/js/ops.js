// The operations page's charts (uPlot, vendored under static/vendor/uplot). Every refresh of
// the live part (htmx, every 2 s) carries the samples the page has not seen yet; they are kept
// here for an hour and drawn over the window chosen (5 or 60 minutes).
(function () {
  "use strict";
  var HOUR_MS = 60 * 60 * 1000;
  var samples = [];
  var charts = {};
  var windowMinutes = 5;
  window.opsSince = "";

  var CHARTS = {
    answers: {el: "chart-answers", series: [["answers/s", "#2a7d2a"]],
              values: function (s) { return [s.run / s.dt]; }},
    tokens: {el: "chart-tokens", series: [["tokens/s", "#3060b0"]],
             values: function (s) { return [s.tokens / s.dt]; }},
    latency: {el: "chart-latency",
              series: [["TTFT p50 (s)", "#2a7d2a"], ["TTFT p99 (s)", "#b07a00"],
                       ["end to end p99 (s)", "#b03030"]],
              values: function (s) {
                return [sec(s.ttft50), sec(s.ttft99), sec(s.e2e99)];
              }},
    errors: {el: "chart-errors", series: [["error rate (%)", "#b03030"], ["waiting", "#666"]],
             values: function (s) {
               return [s.run ? 100 * s.failed / s.run : null, s.queue];
             }}
  };

  function sec(ms) { return ms === null || ms === undefined ? null : ms / 1000; }

  function dataFor(chart) {
    var since = Date.now() - windowMinutes * 60 * 1000;
    var shown = samples.filter(function (s) { return s.t >= since; });
    var data = [shown.map(function (s) { return s.t / 1000; })];
    chart.series.forEach(function (_, i) {
      data.push(shown.map(function (s) { return chart.values(s)[i]; }));
    });
    return data;
  }

  function draw() {
    if (typeof uPlot === "undefined") { return; }
    Object.keys(CHARTS).forEach(function (name) {
      var chart = CHARTS[name];
      var el = document.getElementById(chart.el);
      if (!el) { return; }
      var data = dataFor(chart);
      if (!charts[name]) {
        var series = [{}].concat(chart.series.map(function (s) {
          return {label: s[0], stroke: s[1], width: 1.5, spanGaps: false};
        }));
        charts[name] = new uPlot({
          width: Math.max(300, el.clientWidth - 8), height: 170, series: series,
          scales: {x: {time: true}}, legend: {live: false}
        }, data, el);
      } else {
        charts[name].setData(data);
      }
    });
  }

  function ingest() {
    var el = document.getElementById("ops-series-data");
    if (!el) { return; }
    var found;
    try { found = JSON.parse(el.textContent); } catch (e) { return; }
    var last = samples.length ? samples[samples.length - 1].t : 0;
    (found.samples || []).forEach(function (s) { if (s.t > last) { samples.push(s); } });
    var cutoff = Date.now() - HOUR_MS;
    while (samples.length && samples[0].t < cutoff) { samples.shift(); }
    if (found.last) { window.opsSince = found.last; }
    var updated = document.getElementById("ops-updated");
    if (updated) { updated.textContent = "refreshed " + new Date().toLocaleTimeString(); }
    draw();
  }

  document.addEventListener("htmx:afterSwap", function (event) {
    if (event.target && event.target.id === "ops-live") { ingest(); }
  });
  document.querySelectorAll("input[name=ops-window]").forEach(function (radio) {
    radio.addEventListener("change", function () {
      windowMinutes = parseInt(radio.value, 10);
      draw();
    });
  });
  window.addEventListener("resize", function () {
    Object.keys(charts).forEach(function (name) {
      var el = document.getElementById(CHARTS[name].el);
      charts[name].setSize({width: Math.max(300, el.clientWidth - 8), height: 170});
    });
  });
  ingest();
})();
