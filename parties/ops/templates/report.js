// fedhet report: draws the message map, the per-round sequence and the charts from the embedded run data.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("run-data").textContent);
  var RUN = DATA.run, CMP = DATA.compare;
  var SVGNS = "http://www.w3.org/2000/svg";
  var COLORS = {
    shares: "#2e7d32", paillier: "#1565c0", ckks: "#6a1b9a", masked: "#00838f", blinded: "#795548",
    derived: "#ef6c00", clear: "#424242", control: "#90a4ae", "not stated": "#c9a400", undeclared: "#cf222e"
  };
  var RED = "#cf222e";

  function el(tag, attrs, parent, text) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    if (text !== undefined) { e.textContent = text; }
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function h(tag, attrs, parent, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) { e.setAttribute(k, attrs[k]); }
    if (text !== undefined) { e.textContent = text; }
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function bytes(n) {
    if (n === null || n === undefined) { return "-"; }
    var u = ["B", "KB", "MB", "GB", "TB"], i = 0;
    while (Math.abs(n) >= 1000 && i < u.length - 1) { n /= 1000; i++; }
    return (i === 0 ? String(n) : n.toPrecision(3)) + " " + u[i];
  }
  function num(v) {
    if (v === null || v === undefined) { return "-"; }
    if (Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-3 && v !== 0)) { return v.toExponential(3); }
    return String(Math.round(v * 1e4) / 1e4);
  }
  function color(p) { return COLORS[p] || "#888"; }

  // ------------------------------------------------------------------ legend
  var legend = document.getElementById("legend");
  var used = {};
  RUN.kinds.forEach(function (k) { used[k.protects] = true; });
  Object.keys(RUN.protections).forEach(function (p) {
    var s = h("span", {"data-protects": p, title: RUN.protections[p]}, legend);
    var c = h("i", {"class": "chip"}, s); c.style.background = color(p);
    h("span", {}, s, p + (used[p] ? "" : " (none here)"));
    if (!used[p]) { s.style.opacity = "0.45"; }
  });

  // ------------------------------------------------------------------ message map
  var roles = RUN.roles.slice();
  RUN.kinds.forEach(function (k) {
    k.links.forEach(function (l) {
      [l.from, l.to].forEach(function (r) { if (roles.indexOf(r) < 0) { roles.push(r); } });
    });
  });
  var partiesOf = {};
  RUN.parties.forEach(function (p) { (partiesOf[p.role] = partiesOf[p.role] || []).push(p.name); });
  var COLW = 300, LEFT = 70, TOP = 64, ROWH = 30;
  function xOf(role) { return LEFT + COLW / 2 + roles.indexOf(role) * COLW; }
  function lifelines(svg, height) {
    roles.forEach(function (r) {
      var x = xOf(r), n = (partiesOf[r] || []).length;
      el("line", {"class": "lifeline", x1: x, x2: x, y1: TOP - 8, y2: height - 6}, svg);
      el("rect", {"class": "role-box", x: x - 95, y: 6, width: 190, height: 44, rx: 6}, svg);
      el("text", {x: x, y: 25, "text-anchor": "middle", "font-weight": "600"}, svg, r);
      el("text", {x: x, y: 42, "text-anchor": "middle", fill: "#57606a"}, svg,
         n === 1 ? partiesOf[r][0] : n + " parties");
    });
  }
  function arrow(svg, from, to, y, stroke, width) {
    var x1 = xOf(from), x2 = xOf(to);
    if (from === to) {   // a message between two parties of one role: a loop on the lifeline
      el("path", {d: "M" + x1 + "," + (y - 7) + " c 60,-6 60,20 6,14", fill: "none", stroke: stroke,
                  "stroke-width": width, "marker-end": "url(#head-" + stroke.replace("#", "") + ")"}, svg);
      return;
    }
    var dir = x2 > x1 ? 1 : -1;
    el("line", {x1: x1 + dir * 4, x2: x2 - dir * 10, y1: y, y2: y, stroke: stroke, "stroke-width": width,
                "marker-end": "url(#head-" + stroke.replace("#", "") + ")"}, svg);
  }
  function markers(svg) {
    var defs = el("defs", {}, svg);
    var all = Object.keys(COLORS).map(function (k) { return COLORS[k]; }).concat([RED]);
    all.forEach(function (c) {
      var m = el("marker", {id: "head-" + c.replace("#", ""), viewBox: "0 0 10 10", refX: 8, refY: 5,
                            markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse"}, defs);
      el("path", {d: "M 0 0 L 10 5 L 0 10 z", fill: c}, m);
    });
  }
  function label(svg, from, to, y, text, fill) {
    var x1 = xOf(from), x2 = xOf(to);
    var x = from === to ? x1 + 50 : (x1 + x2) / 2;
    el("text", {x: x, y: y - 6, "text-anchor": from === to ? "start" : "middle", fill: fill}, svg, text);
  }

  var map = document.getElementById("map");
  var rows = [];
  RUN.kinds.forEach(function (k) { k.links.forEach(function (l) { rows.push({kind: k, link: l}); }); });
  var width = LEFT + COLW * roles.length + 200, height = TOP + ROWH * rows.length + 20;
  map.setAttribute("width", width); map.setAttribute("height", height);
  map.setAttribute("viewBox", "0 0 " + width + " " + height);
  markers(map);
  lifelines(map, height);
  var detail = document.getElementById("kind-detail");
  rows.forEach(function (r, i) {
    var k = r.kind, l = r.link, y = TOP + ROWH * i + 20;
    var bad = l.bad > 0 || k.protects === "undeclared";
    var g = el("g", {"class": "row" + (bad ? " bad" : ""), "data-kind": k.kind, "data-protects": k.protects,
                     "data-bad": bad ? "1" : "0"}, map);
    el("rect", {"class": "hit", x: 0, y: y - ROWH + 8, width: width, height: ROWH, fill: "transparent"}, g);
    el("text", {x: 8, y: y + 4, fill: bad ? RED : "#57606a"}, g, bad ? "\u26a0" : "");
    var stroke = bad ? RED : color(k.protects);
    arrow(g, l.from, l.to, y, stroke, bad ? 3 : 2);
    label(g, l.from, l.to, y, k.kind + "  \u00d7" + l.count + "  " + bytes(l.bytes) + (bad ? "  (" + l.bad + " failed)" : ""),
          bad ? RED : "#1f2328");
    g.addEventListener("click", function () { showKind(k, g); });
  });

  function showKind(k, g) {
    Array.prototype.forEach.call(map.querySelectorAll(".row.selected"), function (e) { e.classList.remove("selected"); });
    if (g) { g.classList.add("selected"); }
    detail.innerHTML = "";
    h("h3", {}, detail, k.kind);
    var p = h("p", {}, detail);
    var c = h("i", {"class": "chip"}, p); c.style.background = color(k.protects);
    h("b", {}, p, " " + k.protects + ": ");
    h("span", {}, p, RUN.protections[k.protects] || "");
    h("p", {}, detail, "declared as: " + k.what);
    if (k.schema) { var s = h("p", {}, detail, "payload schema: "); h("code", {}, s, k.schema); }
    h("p", {}, detail, k.count + " message(s), " + bytes(k.bytes) + ", on: " +
      k.links.map(function (l) { return l.from + " \u2192 " + l.to + " \u00d7" + l.count; }).join(", "));
    h("p", {}, detail, "What the audit checked for every record of this kind:");
    var ul = h("ul", {}, detail);
    k.checks.forEach(function (t) { h("li", {}, ul, t); });
    if (k.problems.length) {
      h("p", {"class": "bad"}, detail, k.bad + " record(s) failed:");
      var ul2 = h("ul", {"class": "bad"}, detail);
      k.problems.forEach(function (t) { h("li", {}, ul2, t); });
    } else {
      h("p", {}, detail, "The audit found no problem with this kind.");
    }
  }
  window.fedhetShowKind = function (name) {
    var k = RUN.kinds.filter(function (k) { return k.kind === name; })[0];
    var g = map.querySelector('.row[data-kind="' + CSS.escape(name) + '"]');
    if (k) { showKind(k, g); }
  };

  // ------------------------------------------------------------------ sequence per round
  var seq = document.getElementById("sequence"), sel = document.getElementById("round");
  var firstBad = -1;
  RUN.flow.forEach(function (f, i) {
    var n = 0, bad = false;
    f.steps.forEach(function (s) { n += s.count; bad = bad || s.problems.length > 0; });
    if (bad && firstBad < 0) { firstBad = i; }
    var o = h("option", {value: i}, sel, "round " + f.round + " (" + n + " messages" + (bad ? ", FAILED AUDIT" : "") + ")");
    if (bad) { o.style.color = RED; }
  });
  function drawRound(i) {
    while (seq.firstChild) { seq.removeChild(seq.firstChild); }
    var f = RUN.flow[i];
    if (!f) { return; }
    var extra = 0;
    f.steps.forEach(function (s) { extra += s.problems.length ? 1 : 0; });
    var w = LEFT + COLW * roles.length + 200, hh = TOP + ROWH * (f.steps.length + extra) + 30;
    seq.setAttribute("width", w); seq.setAttribute("height", hh); seq.setAttribute("viewBox", "0 0 " + w + " " + hh);
    markers(seq);
    lifelines(seq, hh);
    var y = TOP + 20;
    f.steps.forEach(function (s, j) {
      var bad = s.problems.length > 0;
      var k = RUN.kinds.filter(function (k) { return k.kind === s.kind; })[0];
      var prot = k ? k.protects : "undeclared";
      var g = el("g", {"class": "row" + (bad ? " bad" : ""), "data-kind": s.kind, "data-step": j, "data-bad": bad ? "1" : "0"}, seq);
      el("title", {}, g, s.parties.join(", ") + (bad ? "\n" + s.problems.join("\n") : ""));
      el("text", {x: 8, y: y + 4, fill: "#57606a"}, g, (j + 1) + ".");
      arrow(g, s.from, s.to, y, bad ? RED : color(prot), bad ? 3 : 2);
      label(g, s.from, s.to, y, s.kind + "  \u00d7" + s.count + "  " + bytes(s.bytes), bad ? RED : "#1f2328");
      if (bad) {
        y += ROWH;
        el("text", {x: LEFT, y: y - 6, fill: RED, "class": "problem"}, g, "\u26a0 " + s.problems[0] +
           (s.problems.length > 1 ? " (+" + (s.problems.length - 1) + " more)" : ""));
      }
      if (k) {
        g.addEventListener("click", function () {
          showKind(k, map.querySelector('.row[data-kind="' + CSS.escape(s.kind) + '"]'));
          detail.scrollIntoView();
        });
      }
      y += ROWH;
    });
    if (f.more) { el("text", {x: LEFT, y: y, fill: "#57606a"}, seq, "... " + f.more + " more steps in this round"); }
  }
  sel.addEventListener("change", function () { drawRound(parseInt(sel.value, 10)); });
  var start = firstBad >= 0 ? firstBad : 0;
  sel.value = String(start);
  drawRound(start);

  // ------------------------------------------------------------------ charts
  var PLOT_CFG = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["sendDataToCloud"]};
  var DASH = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"];
  var SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "cross", "star"];
  function chart(parent, id, traces, layout) {
    var d = h("div", {"class": "chart", id: id, "data-chart": id}, parent);
    layout.margin = layout.margin || {l: 60, r: 20, t: 40, b: 80};
    layout.font = {size: 12};
    layout.legend = layout.legend || {orientation: "h", y: -0.28};
    Plotly.newPlot(d, traces, layout, PLOT_CFG);
    return d;
  }
  function runName(v) { return v.federation || v.path; }

  var curves = document.getElementById("curves");
  var metrics = {};
  [[RUN, ""], [CMP, CMP ? runName(CMP) + ": " : ""]].forEach(function (pair) {
    var v = pair[0];
    if (!v) { return; }
    v.curves.forEach(function (c) {
      (metrics[c.metric] = metrics[c.metric] || []).push({prefix: pair[1], series: c.series, cmp: v === CMP});
    });
  });
  var mnames = Object.keys(metrics);
  if (!mnames.length) { h("p", {"class": "hint"}, curves, "No per-round metrics were recorded (metrics.jsonl is empty)."); }
  mnames.forEach(function (m, mi) {
    var traces = [], i = 0;
    metrics[m].forEach(function (g) {
      g.series.forEach(function (s) {
        traces.push({x: s.x, y: s.y, name: g.prefix + s.party, type: "scatter",
                     mode: s.x.length > 1 ? "lines+markers" : "markers",
                     line: {dash: DASH[i % DASH.length], width: 2}, marker: {symbol: SYMBOLS[i % SYMBOLS.length], size: 7}});
        i++;
      });
    });
    chart(curves, "curve-" + mi, traces, {title: {text: m}, xaxis: {title: {text: "round / epoch"}}, yaxis: {title: {text: m}}});
  });

  var cost = document.getElementById("cost-charts");
  function phaseChart(id, v, field, title, ytitle, stacked) {
    var parties = Object.keys(v.phases[field]);
    var phases = [];
    parties.forEach(function (p) { Object.keys(v.phases[field][p]).forEach(function (k) { if (phases.indexOf(k) < 0) { phases.push(k); } }); });
    var traces = phases.map(function (ph) {
      return {type: "bar", name: ph, x: parties, y: parties.map(function (p) { var x = v.phases[field][p][ph]; return x === undefined ? null : x; })};
    });
    return chart(cost, id, traces, {title: {text: title}, barmode: stacked ? "stack" : "group", yaxis: {title: {text: ytitle}}});
  }
  phaseChart("time-" + "main", RUN, "time", "Seconds per phase and party: " + runName(RUN), "seconds", false);
  phaseChart("bytes-" + "main", RUN, "bytes_sent", "Bytes sent per phase and party: " + runName(RUN), "bytes", true);
  if (CMP) {
    phaseChart("time-cmp", CMP, "time", "Seconds per phase and party: " + runName(CMP), "seconds", false);
    phaseChart("bytes-cmp", CMP, "bytes_sent", "Bytes sent per phase and party: " + runName(CMP), "bytes", true);
    comparison();
  }

  function firstOfRole(v) {
    var out = {};
    v.parties.forEach(function (p) { if (!(p.role in out)) { out[p.role] = p; } });
    return out;
  }
  function comparison() {
    var rowsOut = [["wall time (s)", RUN.wall_s, CMP.wall_s], ["bytes on the wire", RUN.bytes_total, CMP.bytes_total],
                   ["messages", RUN.audit.messages, CMP.audit.messages]];
    var a = firstOfRole(RUN), b = firstOfRole(CMP);
    Object.keys(a).forEach(function (role) {
      if (!(role in b)) { return; }
      var ra = a[role].results, rb = b[role].results;
      Object.keys(ra).forEach(function (k) {
        if (typeof ra[k] === "number" && typeof rb[k] === "number") { rowsOut.push([role + ": " + k, ra[k], rb[k]]); }
      });
    });
    var tbody = document.querySelector("#comparison tbody");
    var bars = {x: [], a: [], b: []};
    rowsOut.forEach(function (r) {
      var tr = h("tr", {"data-quantity": r[0]}, tbody);
      h("td", {}, tr, r[0]);
      h("td", {"class": "num"}, tr, num(r[1]));
      h("td", {"class": "num"}, tr, num(r[2]));
      var ratio = (r[1] && r[2] !== null && r[2] !== undefined) ? r[2] / r[1] : null;
      h("td", {"class": "num ratio"}, tr, ratio === null ? "-" : (ratio >= 100 ? ratio.toFixed(0) : ratio.toPrecision(3)) + "\u00d7");
      if (/(_s|time \(s\))$/.test(r[0]) && r[1] > 0 && r[2] > 0) { bars.x.push(r[0]); bars.a.push(r[1]); bars.b.push(r[2]); }
    });
    if (bars.x.length) {
      chart(cost, "compare-time", [
        {type: "bar", name: runName(RUN), x: bars.x, y: bars.a},
        {type: "bar", name: runName(CMP), x: bars.x, y: bars.b, marker: {pattern: {shape: "/"}}}],
        {title: {text: "Seconds side by side (log scale)"}, barmode: "group", yaxis: {type: "log", title: {text: "seconds"}}});
    }
  }
  window.fedhetReady = true;
})();
