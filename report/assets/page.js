// The report page's charts (docs/report.md, "The page"). Reads the JSON in #report-data,
// draws every chart with uPlot (and the per-core heat map on a canvas), and reports progress
// in document.body.dataset: charts = "<drawn>/<expected>", errors = count. Every string from
// the data goes into the page through textContent or uPlot's own text drawing, never as HTML.
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
  window.addEventListener("error", function (e) {
    recordError((e && e.message) || "error");
  });
  window.addEventListener("unhandledrejection", function (e) {
    recordError("unhandled rejection: " + (e && e.reason));
  });
  // A request the page's Content-Security-Policy refused: the page tried to reach the network.
  document.addEventListener("securitypolicyviolation", function (e) {
    recordError("blocked by the page's policy: " + e.violatedDirective + " " + e.blockedURI);
  });
  var consoleError = console.error;
  console.error = function () {
    recordError(Array.prototype.join.call(arguments, " "));
    consoleError.apply(console, arguments);
  };
  body.dataset.errors = "0";

  var data;
  try {
    data = JSON.parse(document.getElementById("report-data").textContent);
  } catch (e) {
    recordError("report data unreadable: " + e);
    body.dataset.charts = "0/0";
    return;
  }
  if (typeof uPlot !== "function") {
    recordError("the chart library did not load");
    body.dataset.charts = "0/0";
    return;
  }

  var T0 = data.t0 || 0;
  var SPAN = data.span > 0 ? data.span : 1;
  var COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf"];
  function color(i) { return COLORS[i % COLORS.length]; }
  var AXIS = 64; // y-axis width, px: the same on every chart so that plot areas line up
  var expected = 0, drawn = 0;
  var charts = [];   // {name, el, kind}
  var timeCharts = [];

  function markDrawn() {
    drawn += 1;
    body.dataset.charts = drawn + "/" + expected;
    if (drawn === expected) {
      // The plot areas (uPlot's .u-over, the heat map's canvas), for the browser tier's
      // check that each one has something drawn in it.
      var rects = charts.map(function (c) {
        var area = c.el.querySelector(".u-over") || c.el.querySelector("canvas") || c.el;
        var r = area.getBoundingClientRect();
        return [Math.round(r.left + window.scrollX), Math.round(r.top + window.scrollY),
          Math.round(r.width), Math.round(r.height), c.name, c.kind];
      });
      body.dataset.chartRects = JSON.stringify(rects);
      // From navigation start to the last chart drawn, ms (reported by the browser tier).
      body.dataset.drawnMs = String(Math.round(performance.now()));
      body.dataset.pageHeight = String(document.documentElement.scrollHeight);
    }
  }

  function width(el) { return Math.max(480, Math.floor(el.clientWidth || 900)); }

  // Absolute epoch seconds for the x axis, so every time chart shows the job's clock.
  function abs(ts) { return ts.map(function (t) { return t === null ? null : T0 + t; }); }

  // Shaded ranges (outliers, anomaly triggers, findings' evidence), the profiled windows
  // (marks along the time axis) and step boundaries, drawn under the series of every time chart.
  // `name`: the chart's; a finding's band names the charts it is shaded on (`on`: the ends
  // of their names), else it is on all.
  function shadedOn(band, name) {
    return !band.on || band.on.some(function (end) {
      return name.length >= end.length && name.slice(name.length - end.length) === end;
    });
  }
  function bandsPlugin(name) {
    return {
      hooks: {
        drawClear: [function (u) {
          var ctx = u.ctx, b = u.bbox;
          ctx.save();
          ctx.beginPath();
          ctx.rect(b.left, b.top, b.width, b.height);
          ctx.clip();
          (data.marks || []).forEach(function (t) {
            var x = Math.round(u.valToPos(T0 + t, "x", true));
            ctx.fillStyle = "rgba(0,0,0,0.07)";
            ctx.fillRect(x, b.top, 1, b.height);
          });
          (data.bands || []).forEach(function (band) {
            if (!shadedOn(band, name)) { return; }
            var x0 = u.valToPos(T0 + band.a, "x", true), x1 = u.valToPos(T0 + band.b, "x", true);
            if (x1 - x0 < 2) { x1 = x0 + 2; }
            if (band.kind === "window") {
              // A profiled window: a mark along the time axis, not a shade over the chart.
              ctx.fillStyle = "rgba(44,160,44,0.8)";
              ctx.fillRect(x0, b.top + b.height - 6, x1 - x0, 6);
              return;
            }
            ctx.fillStyle = band.kind === "finding" ? "rgba(255,165,0,0.16)"
              : band.kind === "trigger" ? "rgba(148,103,189,0.25)"
              : band.kind === "warmup" ? "rgba(31,119,180,0.18)" : "rgba(214,39,40,0.22)";
            ctx.fillRect(x0, b.top, x1 - x0, b.height);
          });
          ctx.restore();
        }]
      }
    };
  }

  // Zooming one time chart zooms them all.
  var syncing = false;
  function syncScale(u, key) {
    if (key !== "x" || syncing) { return; }
    syncing = true;
    var min = u.scales.x.min, max = u.scales.x.max;
    timeCharts.forEach(function (o) {
      if (o !== u) { o.setScale("x", { min: min, max: max }); }
    });
    syncing = false;
  }

  function place(parent, name, kind) {
    var box = document.createElement("div");
    box.className = "chart";
    parent.appendChild(box);
    charts.push({ name: name, el: box, kind: kind || "uplot" });
    expected += 1;
    return box;
  }

  // Charts are made after the expected count is known (so the marker never reads n/n early).
  var pending = [];
  function later(fn) { pending.push(fn); }

  function timeChart(parent, name, title, t, series, opts) {
    opts = opts || {};
    var box = place(parent, name);
    // The chart, once made; `wait`: what to run once it has drawn (its sizes are known then).
    var made = { u: null, drawn: false, wait: [] };
    later(function () {
      var first = true;
      var axes = [{}, { size: AXIS, label: opts.unit || "" }];
      var yr = opts.yRange;
      var scales = {
        x: { time: true, range: function () { return [T0, T0 + SPAN]; } },
        y: opts.percent ? { range: [0, 100] } : yr ? { range: function () { return [yr[0], yr[1]]; } } : { auto: true }
      };
      if (opts.right) {
        axes.push({ side: 1, scale: opts.right, size: AXIS, label: opts.rightUnit || "", grid: { show: false } });
        scales[opts.right] = { auto: true };
      }
      var u = new uPlot({
        title: title,
        width: width(parent),
        height: opts.height || 190,
        scales: scales,
        axes: axes,
        cursor: { sync: { key: "job" } },
        legend: { live: true },
        series: [{}].concat(series.map(function (s, i) {
          var o = { label: s.label, stroke: s.color || color(i), width: 1.5, spanGaps: false, scale: s.scale || "y" };
          if (s.value) { o.value = s.value; }
          if (s.points) {
            o.paths = function () { return null; };
            o.points = { show: true, size: s.size || 3, stroke: o.stroke, fill: o.stroke };
            if (s.shape) { o.points.show = s.shape; }
          } else {
            o.points = { show: false };
          }
          return o;
        })),
        plugins: [bandsPlugin(name)],
        hooks: {
          draw: [function (u) {
            if (!first) { return; }
            first = false;
            if (opts.onFirstDraw) { opts.onFirstDraw(u); }
            markDrawn();
            made.drawn = true;
            made.wait.forEach(function (fn) {
              try { fn(); } catch (e) { recordError("chart failed: " + e); }
            });
          }],
          setScale: [syncScale]
        }
      }, [abs(t)].concat(series.map(function (s) { return s.data; })), box);
      timeCharts.push(u);
      made.u = u;
    });
    return made;
  }

  function barChart(parent, name, title, labels, series, unit) {
    var box = place(parent, name);
    later(function () {
      var first = true;
      var xs = labels.map(function (_, i) { return i; });
      var bars = uPlot.paths.bars({ size: [0.7, 80] });
      new uPlot({
        title: title,
        width: width(parent),
        height: 200,
        scales: { x: { time: false, range: [-0.5, Math.max(0.5, labels.length - 0.5)] }, y: { auto: true, range: function (u, mn, mx) { return [0, mx > 0 ? mx * 1.1 : 1]; } } },
        axes: [
          { splits: function () { return xs; }, values: function (u, splits) { return splits.map(function (i) { var s = labels[i]; return s === undefined ? "" : (s.length > 24 ? s.slice(0, 23) + "…" : s); }); } },
          { size: AXIS, label: unit }
        ],
        series: [{}].concat(series.map(function (s, i) {
          return { label: s.label, stroke: s.color || color(i), fill: s.fill || color(i) + "99", width: 1, paths: s.points ? function () { return null; } : bars, points: s.points ? { show: true, size: 7, stroke: s.color, fill: s.color } : { show: false } };
        })),
        hooks: { draw: [function () { if (first) { first = false; markDrawn(); } }] }
      }, [xs].concat(series.map(function (s) { return s.data; })), box);
    });
  }

  function histogram(parent, name, title, hist) {
    var box = place(parent, name);
    later(function () {
      var first = true;
      var edges = hist.edges || [], counts = (hist.counts || []).slice();
      if (edges.length === 0) { edges = [0, 1]; counts = [0]; }
      if (hist.over) {
        title += " (the last bin: " + counts[counts.length - 1] + " steps of " + hist.over[0] + "–" + hist.over[1] + " ms)";
      }
      counts.push(counts.length ? counts[counts.length - 1] : 0);
      new uPlot({
        title: title,
        width: width(parent),
        height: 190,
        scales: { x: { time: false }, y: { auto: true, range: function (u, mn, mx) { return [0, mx > 0 ? mx * 1.1 : 1]; } } },
        axes: [{ label: "step time, ms" }, { size: AXIS, label: "steps" }],
        series: [{}, { label: "steps", stroke: color(0), fill: color(0) + "66", width: 1, paths: uPlot.paths.stepped({ align: 1 }), points: { show: false } }],
        hooks: { draw: [function () { if (first) { first = false; markDrawn(); } }] }
      }, [edges, counts], box);
    });
  }

  // Per-core heat map: one row per core, one column per pixel of the plot width, colour by
  // the percentage at that time. Placed under the node's CPU chart, with the same plot area.
  function heatMap(parent, name, t, cores, above) {
    var box = place(parent, name, "heat");
    box.classList.add("heat");
    later(function () {
      if (above.u && !above.drawn) { above.wait.push(draw); } else { draw(); }
    });
    function draw() {
      var title = document.createElement("div");
      title.className = "u-title";
      title.textContent = "CPU per core, % (rows: cores 0–" + (cores.length - 1) + " top to bottom; white 0 %, orange 50 %, dark red 100 %, grey no sample)";
      box.appendChild(title);
      // The plot area of the chart above (the node's CPU chart), so that times line up.
      var left = AXIS + 8, plotW = Math.max(100, width(parent) - left - 10);
      if (above.u) {
        var o = above.u.over.getBoundingClientRect(), bx = box.getBoundingClientRect();
        left = Math.round(o.left - bx.left);
        plotW = Math.max(100, Math.round(o.width));
      }
      var rowH = Math.max(2, Math.min(12, Math.floor(240 / Math.max(1, cores.length))));
      var h = rowH * cores.length;
      var canvas = document.createElement("canvas");
      canvas.width = plotW;
      canvas.height = h;
      canvas.style.marginLeft = left + "px";
      box.appendChild(canvas);
      var ctx = canvas.getContext("2d");
      var img = ctx.createImageData(plotW, cores.length);
      var n = t.length, j = 0;
      for (var px = 0; px < plotW; px++) {
        var at = (px + 0.5) / plotW * SPAN;
        while (j + 1 < n && t[j + 1] <= at) { j++; }
        var inRange = n > 0 && at >= t[0] && at <= t[n - 1] + (n > 1 ? (t[n - 1] - t[0]) / (n - 1) : 1);
        for (var c = 0; c < cores.length; c++) {
          var v = inRange ? cores[c][j] : null, k = (c * plotW + px) * 4;
          if (v === null || v === undefined) {
            img.data[k] = 240; img.data[k + 1] = 240; img.data[k + 2] = 240;
          } else {
            var f = Math.max(0, Math.min(1, v / 100));
            // white → orange → dark red
            img.data[k] = Math.round(255 - 80 * f * f);
            img.data[k + 1] = Math.round(250 - 230 * f);
            img.data[k + 2] = Math.round(240 - 240 * Math.sqrt(f));
          }
          img.data[k + 3] = 255;
        }
      }
      var tmp = document.createElement("canvas");
      tmp.width = plotW;
      tmp.height = cores.length;
      tmp.getContext("2d").putImageData(img, 0, 0);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(tmp, 0, 0, plotW, h);
      markDrawn();
    }
  }

  function el(id) { return document.getElementById(id); }

  var stepMarks = {};
  // uPlot's points hook: upward triangles for the steps above the axis.
  function triangles(u, si) {
    var ctx = u.ctx, s = u.series[si], d = u.data[si], xs = u.data[0];
    var r = 6 * (window.devicePixelRatio || 1);
    ctx.save();
    ctx.fillStyle = s.stroke();
    for (var i = 0; i < d.length; i++) {
      if (d[i] === null || d[i] === undefined) { continue; }
      var x = u.valToPos(xs[i], "x", true), y = u.valToPos(d[i], s.scale, true);
      ctx.beginPath();
      ctx.moveTo(x, y - r);
      ctx.lineTo(x - r, y + r);
      ctx.lineTo(x + r, y + r);
      ctx.closePath();
      ctx.fill();
    }
    ctx.restore();
    return false;
  }

  try {
    (data.modes || []).forEach(function (m, mi) {
      var parent = el("mode-" + mi + "-charts");
      if (!parent) { return; }
      histogram(parent, "steps " + m.mode + " histogram", "Step time histogram, " + m.mode, m.hist || {});
      // Step time over the job: one point series per rank, outliers on top.
      // The y axis is the model's (steps.<mode>.chart): it fits the bulk; the steps above it
      // (m.above) are drawn as triangles at its top edge, their values in the legend.
      var y = m.y && m.y[1] > m.y[0] ? m.y : null;
      var tables = (m.ranks || []).map(function (r) { return [abs(r.t), r.ms]; });
      var out = (m.outliers || []).slice().sort(function (a, b) { return a.t - b.t; });
      tables.push([abs(out.map(function (o) { return o.t; })), out.map(function (o) { return o.ms; })]);
      var above = y ? (m.above || []).slice().sort(function (a, b) { return a.t - b.t; }) : [];
      var edge = y ? y[1] - (y[1] - y[0]) * 0.02 : 0;
      var real = {};
      above.forEach(function (o) { real[T0 + o.t] = (real[T0 + o.t] ? real[T0 + o.t] + ", " : "") + o.ms + " ms (" + o.rank + " step " + o.step + ")"; });
      if (above.length > 0) {
        tables.push([abs(above.map(function (o) { return o.t; })), above.map(function () { return edge; })]);
      }
      var joined = uPlot.join(tables);
      var series = (m.ranks || []).map(function (r, i) {
        return { label: r.rank, data: joined[i + 1], points: true, size: 3, color: color(i) };
      });
      series.push({ label: "outliers", data: joined[(m.ranks || []).length + 1], points: true, size: 9, color: "#d62728" });
      if (above.length > 0) {
        series.push({
          label: "above the axis ▲", data: joined[joined.length - 1], points: true, size: 11, color: "#d62728",
          shape: function (u, si) { return triangles(u, si); },
          value: function (u, v, si, idx) { return v === null || v === undefined ? "–" : (real[u.data[0][idx]] || "–"); }
        });
      }
      var box = document.createElement("div");
      parent.appendChild(box);
      var t = joined[0].map(function (x) { return x - T0; });
      var title = "Step time over the job, " + m.mode + " (ms)" + (above.length > 0 ? "; ▲ steps above the axis" : "");
      var aboveSeries = series.length;
      timeChart(box, "steps " + m.mode + " over time", title, t, series, {
        unit: "ms", height: 240, yRange: y,
        onFirstDraw: function (u) {
          // For the browser tier: the triangles drawn, and where (inside the plot's top 5 %).
          var top = 0, n = 0, data = u.data[aboveSeries] || [];
          data.forEach(function (v) {
            if (v === null || v === undefined) { return; }
            n += 1;
            var py = u.valToPos(v, "y");
            if (py >= 0 && py <= u.bbox.height / (window.devicePixelRatio || 1) * 0.05) { top += 1; }
          });
          stepMarks[m.mode] = { above: above.length, drawn: above.length > 0 ? n : 0, at_top: above.length > 0 ? top : 0, y: y };
          body.dataset.stepMarks = JSON.stringify(stepMarks);
        }
      });
      var pr = m.per_rank || [];
      if (pr.length > 0) {
        barChart(parent, "steps " + m.mode + " ranks", "Ranks side by side, " + m.mode + ": median step (bars), p90 (dots)",
          pr.map(function (r) { return r.rank + (r.straggler ? " (straggler)" : ""); }),
          [{ label: "p50 ms", data: pr.map(function (r) { return r.p50; }) },
            { label: "p90 ms", data: pr.map(function (r) { return r.p90; }), points: true, color: "#d62728" }], "ms");
      }
    });

    (data.nodes || []).forEach(function (n, ni) {
      var parent = el("node-" + ni + "-charts");
      if (!parent) { return; }
      var t = n.t || [];
      var cpu = timeChart(parent, n.node + " cpu", "CPU, all cores, %", t, [{ label: "CPU total %", data: n.cpu }], { percent: true, unit: "%" });
      if (n.cores && n.cores.length > 0) { heatMap(parent, n.node + " cores", t, n.cores, cpu); }
      timeChart(parent, n.node + " memory", "Memory used, %", t, [{ label: "memory %", data: n.mem, color: color(2) }], { percent: true, unit: "%" });
      var gpus = n.gpus || [];
      if (gpus.length > 0) {
        timeChart(parent, n.node + " gpu util", "GPU utilisation, %", t,
          gpus.map(function (g, i) { return { label: g.name, data: g.util, color: color(i) }; }), { percent: true, unit: "%" });
        timeChart(parent, n.node + " gpu mem", "GPU memory used, %", t,
          gpus.map(function (g, i) { return { label: g.name, data: g.mem, color: color(i) }; }), { percent: true, unit: "%" });
      }
      if (n.io) {
        timeChart(parent, n.node + " io", "Disk I/O, MB/s", t, [{ label: "read MB/s", data: n.io.read }, { label: "write MB/s", data: n.io.write }], { unit: "MB/s" });
      }
      if (n.net) {
        timeChart(parent, n.node + " net", "Network, MB/s", t, [{ label: "received MB/s", data: n.net.rx }, { label: "sent MB/s", data: n.net.tx }], { unit: "MB/s" });
      }
      if (n.trainer) {
        timeChart(parent, n.node + " trainer", "Trainer process tree: CPU (% of one core) and memory (MB)", t,
          [{ label: "CPU % of a core", data: n.trainer.cpu }, { label: "memory MB", data: n.trainer.mem, scale: "mb", color: color(1) }],
          { unit: "% of a core", right: "mb", rightUnit: "MB" });
      }
    });

    var ph = data.phases || [];
    if (ph.length > 0 && el("phases-chart")) {
      barChart(el("phases-chart"), "phases", "Time per phase, ms (total over the job)", ph.map(function (p) { return p.name; }),
        [{ label: "total ms", data: ph.map(function (p) { return p.total; }) }], "ms");
    }

    // Collectives across ranks: each collective's arrival spread at its first arrival.
    var co = data.collectives;
    if (co && el("collectives-chart")) {
      timeChart(el("collectives-chart"), "collectives spread", "Arrival spread per collective, ms (last arrival − first)", co[0],
        [{ label: "spread ms", data: co[1], points: true, size: 4, color: "#d62728" }], { unit: "ms" });
    }
  } catch (e) {
    recordError("while laying out charts: " + e);
  }

  body.dataset.charts = "0/" + expected;
  if (expected === 0) {
    body.dataset.chartRects = "[]";
    body.dataset.pageHeight = String(document.documentElement.scrollHeight);
  }
  pending.forEach(function (fn) {
    try { fn(); } catch (e) { recordError("chart failed: " + e); }
  });
})();
