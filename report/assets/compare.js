// The compare page's charts (docs/report.md, "compare"): per mode, A's and B's kept step
// times as two histograms over the same bins, overlaid. Reads the JSON in #compare-data and
// leaves the same marks on <body> as the report page: charts = "<drawn>/<expected>",
// errors = count. Every string from the data reaches the page through textContent or uPlot's
// own drawing, never as HTML.
(function () {
  "use strict";
  var body = document.body;
  var errBox = document.getElementById("page-errors");
  var errList = document.getElementById("page-errors-list");
  var nErrors = 0;
  function recordError(msg) {
    nErrors += 1;
    body.dataset.errors = String(nErrors);
    if (errBox && errList) {
      errBox.hidden = false;
      errList.textContent += String(msg) + "\n";
    }
  }
  window.addEventListener("error", function (e) { recordError((e && e.message) || "error"); });
  window.addEventListener("unhandledrejection", function (e) { recordError("unhandled rejection: " + (e && e.reason)); });
  document.addEventListener("securitypolicyviolation", function (e) {
    recordError("blocked by the page's policy: " + e.violatedDirective + " " + e.blockedURI);
  });
  body.dataset.errors = "0";

  var data;
  try {
    data = JSON.parse(document.getElementById("compare-data").textContent);
  } catch (e) {
    recordError("compare data unreadable: " + e);
    body.dataset.charts = "0/0";
    return;
  }
  if (typeof uPlot !== "function") {
    recordError("the chart library did not load");
    body.dataset.charts = "0/0";
    return;
  }
  var expected = data.length, drawn = 0;
  body.dataset.charts = "0/" + expected;
  var boxes = [];
  function markDrawn() {
    drawn += 1;
    body.dataset.charts = drawn + "/" + expected;
    if (drawn === expected) {
      // Each chart's plot area, for the browser tier's check that something is drawn in it.
      body.dataset.chartRects = JSON.stringify(boxes.map(function (c) {
        var area = c.el.querySelector(".u-over") || c.el;
        var r = area.getBoundingClientRect();
        return [Math.round(r.left + window.scrollX), Math.round(r.top + window.scrollY),
          Math.round(r.width), Math.round(r.height), c.name, "uplot"];
      }));
      body.dataset.pageHeight = String(document.documentElement.scrollHeight);
    }
  }
  function pct(u, v) { return v == null ? "–" : v.toFixed(1) + " %"; }
  data.forEach(function (o, i) {
    var box = document.getElementById("overlay-" + i);
    if (!box) { recordError("no place for chart " + i); return; }
    var edges = (o.edges_ms || []).slice();
    // Each side as a share of its own kept steps (per cent), so that runs of different lengths
    // compare by shape.
    var a = (o.a_pct || []).slice(), b = (o.b_pct || []).slice();
    if (edges.length < 2) { edges = [0, 1]; a = [0]; b = [0]; }
    // A stepped line needs a value at the last edge too.
    a.push(a.length ? a[a.length - 1] : 0);
    b.push(b.length ? b[b.length - 1] : 0);
    var first = true;
    boxes.push({ el: box, name: "overlay " + o.mode });
    try {
      new uPlot({
        title: o.mode + ": kept step times, A and B (share of each side's kept steps)",
        width: Math.max(480, Math.floor(box.clientWidth || 900)),
        height: 220,
        scales: { x: { time: false }, y: { auto: true, range: function (u, mn, mx) { return [0, mx > 0 ? mx * 1.1 : 1]; } } },
        axes: [{ label: "step time, ms" }, { size: 64, label: "% of its kept steps" }],
        series: [{},
          { label: "A (" + o.a_kept + " steps)", value: pct, stroke: "#1f77b4", fill: "#1f77b444", width: 2, paths: uPlot.paths.stepped({ align: 1 }), points: { show: false } },
          { label: "B (" + o.b_kept + " steps)", value: pct, stroke: "#ff7f0e", fill: "#ff7f0e44", width: 2, paths: uPlot.paths.stepped({ align: 1 }), points: { show: false } }],
        hooks: { draw: [function () { if (first) { first = false; markDrawn(); } }] }
      }, [edges, a, b], box);
    } catch (e) {
      recordError("chart " + i + ": " + e);
    }
  });
})();
