/* conveyor dashboard: live figures from the JSON API. Values reach the page only through
   textContent and DOM nodes, never as HTML. */
(function () {
  "use strict";
  const body = document.body;
  const base = body.dataset.base || "";

  const fmt = {
    int: (v) => (v == null ? "n/a" : Math.round(v).toLocaleString("en")),
    rate: (v) => (v == null ? "n/a" : v >= 100 ? Math.round(v).toLocaleString("en") : v >= 10 ? v.toFixed(1) : v.toFixed(2)),
    pct: (v) => (v == null ? "n/a" : (v * 100).toFixed(v < 0.1 ? 1 : 0) + " %"),
    dur: (v) => {
      if (v == null) return "n/a";
      if (v < 1e-3) return Math.round(v * 1e6) + " µs";
      if (v < 1) return (v * 1e3).toFixed(1) + " ms";
      if (v < 120) return v.toFixed(2) + " s";
      if (v < 7200) return (v / 60).toFixed(1) + " min";
      return (v / 3600).toFixed(1) + " h";
    },
    when: (v) => (v == null ? "-" : new Date(v * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC"),
    ago: (v) => (v == null ? "never" : v < 1 ? "just now" : fmt.dur(v) + " ago"),
    text: (v) => (v == null ? "" : String(v)),
  };
  const get = (obj, path) => path.split(".").reduce((o, k) => (o == null ? o : o[k]), obj);

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "text") node.textContent = v;
      else if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const c of children) if (c != null) node.append(c);
    return node;
  }
  function link(href, text, cls) { return el("a", { href: base + href, text: text, class: cls || "" }); }
  function cell(content, cls) {
    const td = el("td", { class: cls || "" });
    if (content instanceof Node) td.append(content); else td.textContent = content == null ? "" : String(content);
    return td;
  }
  function fill(tbody, rows, empty, colspan) {
    tbody.replaceChildren(...(rows.length ? rows : [el("tr", { class: "empty" }, el("td", { colspan: colspan, text: empty }))]));
  }
  const seg = (s) => encodeURIComponent(s).replace(/%7E/g, "~");

  /* Fill every [data-f] element from data (formatted by data-fmt). */
  function bind(data, root) {
    for (const node of (root || document).querySelectorAll("[data-f]")) {
      const value = get(data, node.dataset.f);
      const f = fmt[node.dataset.fmt || "int"];
      node.textContent = typeof value === "string" && !node.dataset.fmt ? value : f(value);
    }
  }

  const live = document.getElementById("live");
  const outage = document.getElementById("outage");
  /* The API's own words for a failed answer ({error, detail}), else its status. */
  async function problem(response) {
    try {
      const body = await response.json();
      if (body && body.detail) return body.detail + " (retrying)";
      if (body && body.error) return body.error;
    } catch (err) { /* not JSON */ }
    return "The dashboard could not load its figures (HTTP " + response.status + "); retrying.";
  }
  function poll(path, every, render) {
    let timer = null, stopped = false;
    async function tick() {
      try {
        const response = await fetch(base + path(), { headers: { accept: "application/json" }, credentials: "same-origin" });
        if (!response.ok) throw new Error(await problem(response));
        render(await response.json());
        live.classList.remove("stale");
        live.textContent = "live";
        outage.hidden = true;
      } catch (err) {
        live.classList.add("stale");
        live.textContent = "offline";
        outage.textContent = err instanceof TypeError
          ? "The dashboard server does not answer; retrying." : err.message;
        outage.hidden = false;
      }
      if (!stopped) timer = setTimeout(tick, document.hidden ? every * 4 : every);
    }
    tick();
    return () => { stopped = true; clearTimeout(timer); };
  }

  function spark(values, cls) {
    const w = 120, h = 28, ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    svg.setAttribute("class", "spark " + cls);
    const nums = values.map((v) => (v == null ? 0 : v));
    const max = Math.max(...nums, 1e-9);
    const pts = nums.map((v, i) => `${((i / Math.max(1, nums.length - 1)) * w).toFixed(1)},${(h - 2 - (v / max) * (h - 4)).toFixed(1)}`);
    const area = document.createElementNS(ns, "polygon");
    area.setAttribute("points", `0,${h} ${pts.join(" ")} ${w},${h}`);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.join(" "));
    svg.append(area, line);
    return svg;
  }

  function adviceText(a) {
    if (!a) return "n/a";
    const parts = [];
    if (a.workers_needed != null) parts.push(`${a.workers_needed} worker${a.workers_needed === 1 ? "" : "s"} needed`);
    if (a.never_drains) parts.push("not draining: arrivals outpace the workers");
    else if (a.eta_seconds != null) parts.push(a.eta_seconds > 0 ? `drains in ${fmt.dur(a.eta_seconds)}` : "nothing pending");
    return parts.join(" · ") || "n/a";
  }

  function stateBadge(t) {
    const badge = el("span", { class: "badge " + (t.active ? "s-active" : t.idle ? "s-idle" : "s-recent"),
      text: t.active ? "running" : t.idle ? "idle" : "recent" });
    badge.title = `idle after ${fmt.dur(t.threshold)} without a finished job`;
    return badge;
  }

  const pages = {
    overview() {
      const tbody = document.querySelector("#queues tbody");
      poll(() => "/api/overview", 2000, (data) => {
        for (const node of document.querySelectorAll("[data-total]")) {
          const k = node.dataset.total;
          if (k === "throughput") node.textContent = fmt.rate(data.totals.throughput);
          else if (k === "workers") node.textContent = fmt.int(data.workers.count);
          else if (k === "capacity") node.textContent = data.workers.count ? `· ${data.workers.capacity} slots` : "";
          else node.textContent = fmt.int(data.totals[k]);
        }
        fill(tbody, data.queues.map((q) => {
          const name = el("td", {}, link(`/queues/${seg(q.name)}`, q.name, "mono"));
          if (q.paused) name.append(" ", el("span", { class: "badge s-paused", text: "paused" }));
          const advice = cell(adviceText(q.advice), "advice-cell");
          if (q.advice && q.advice.reasons && q.advice.reasons.length) advice.title = q.advice.reasons.join("\n");
          return el("tr", { "data-queue": q.name }, name,
            cell(fmt.int(q.ready), "n"), cell(fmt.int(q.scheduled), "n"), cell(fmt.int(q.active), "n"),
            cell(q.dead ? link(`/queues/${seg(q.name)}/jobs?state=dead`, fmt.int(q.dead), "dead") : "0", "n"),
            cell(fmt.rate(q.throughput), "n"), cell(fmt.dur(q.wait_p95), "n"),
            cell(spark(q.spark.processed, "rate")), cell(spark(q.spark.wait_p95, "wait")), advice);
        }), "No queue has seen a job yet.", 10);
        fill(document.querySelector("#activity tbody"), data.tasks.map((t) => el("tr", { "data-task": t.name },
          cell(t.name, "mono"), cell(link(`/queues/${seg(t.queue)}`, t.queue)), cell(fmt.int(t.active), "n"),
          cell(stateBadge(t)), cell(t.idle_since == null ? "never" : fmt.ago(t.idle_for)), cell(fmt.dur(t.threshold), "n"))),
          "No task types yet.", 6);
      });
    },

    queue() {
      const queue = body.dataset.queue, win = body.dataset.window;
      const prio = document.querySelector("#priorities tbody"), ten = document.querySelector("#tenants tbody");
      poll(() => `/api/queues/${seg(queue)}?window=${win}`, 3000, (data) => {
        bind(data);
        const box = document.getElementById("advice");
        box.replaceChildren();
        if (!data.advice) box.textContent = "n/a: the monitor gives no advice yet.";
        else {
          box.append(el("strong", { text: adviceText(data.advice) }));
          const ul = el("ul");
          for (const r of data.advice.reasons || []) ul.append(el("li", { text: r }));
          box.append(ul);
        }
        const levels = data.priorities.map((p) => el("tr", {},
          cell(String(p.priority), "n"), cell(fmt.int(p.ready) + (p.hidden ? "+" : ""), "n"), cell(fmt.int(p.tenant_count), "n"),
          cell(p.tenants.slice(0, 5).map((t) => `${t.tenant} (${t.ready})`).join(", ") + (p.hidden ? ` … ${p.hidden} more` : ""))));
        if (data.incoming) levels.push(el("tr", { title: "enqueued without a tenant; a worker's next fetch puts them on their priority's list" },
          cell("new"), cell(fmt.int(data.incoming), "n"), cell("—", "n"), cell("(none)")));
        fill(prio, levels, "Nothing ready.", 4);
        const total = data.top_tenants.reduce((s, t) => s + t.ready, 0) || 1;
        fill(ten, data.top_tenants.map((t) => {
          const bar = el("div", { class: "bar" }, el("span", { style: `width:${(100 * t.ready / total).toFixed(1)}%` }));
          return el("tr", {}, cell(t.tenant), cell(fmt.int(t.ready), "n"), cell(bar));
        }), "Nothing ready.", 3);
      });
      if (window.conveyorCharts) window.conveyorCharts(base, queue, win, poll);
    },

    tasks() {
      const tbody = document.querySelector("#tasks tbody"), win = body.dataset.window;
      poll(() => `/api/tasks?window=${win}`, 3000, (data) => {
        fill(tbody, data.tasks.map((t) => {
          const state = stateBadge(t);
          return el("tr", { "data-task": t.name }, cell(t.name, "mono"), cell(link(`/queues/${seg(t.queue)}`, t.queue)),
            cell(fmt.int(t.active), "n"), cell(state), cell(t.idle_since == null ? "never" : fmt.ago(t.idle_for)),
            cell(fmt.rate(t.throughput), "n"), cell(fmt.dur(t.wait.p50), "n"), cell(fmt.dur(t.wait.p95), "n"),
            cell(fmt.dur(t.run.p50), "n"), cell(fmt.dur(t.run.p95), "n"), cell(fmt.dur(t.run.p99), "n"),
            cell(t.failure_rate == null ? "n/a" : `${fmt.pct(t.failure_rate)} (${t.failed})`, "n"));
        }), "No task types yet.", 12);
      });
    },

    workers() {
      const tbody = document.querySelector("#workers tbody");
      poll(() => "/api/workers", 3000, (data) => {
        document.getElementById("worker-count").textContent = fmt.int(data.workers.length);
        document.getElementById("worker-capacity").textContent = fmt.int(data.capacity);
        document.getElementById("worker-jobs").textContent =
          fmt.int(data.workers.reduce((s, w) => s + (parseInt(w.jobs, 10) || 0), 0));
        const known = new Set(["host", "pid", "queues", "concurrency", "jobs", "started_at"]);
        fill(tbody, data.workers.map((w) => {
          const other = Object.entries(w.fields).filter(([k]) => !known.has(k)).map(([k, v]) => `${k}=${v}`).join(" ");
          const started = parseFloat(w.started_at);
          return el("tr", {}, cell(w.id, "mono"), cell(w.host), cell(w.pid, "n"), cell(w.queues),
            cell(w.concurrency, "n"), cell(w.jobs, "n"), cell(isNaN(started) ? w.started_at : fmt.when(started > 1e11 ? started / 1000 : started)),
            cell(fmt.ago(w.age)), cell(other, "small"));
        }), "No worker has registered. Workers appear here while they heartbeat.", 9);
        supervisors(data.supervisors || []);
      });
      /* The same rows the server rendered, kept fresh; text only, never HTML. */
      const figure = (v) => (v == null ? "-" : String(v));  // as filters.figure renders it
      function supervisors(sups) {
        fill(document.querySelector("#supervisors tbody"), sups.map((s) => el("tr", {},
          cell(s.id, "mono"), cell(s.host), cell(s.pid, "n"), cell(s.queues),
          cell(`${figure(s.active)} / ${figure(s.target)}`, "n"),
          cell(s.min == null ? "fixed" : `${figure(s.min)}–${figure(s.max)}, target wait ${fmt.dur(s.target_wait)}`),
          cell(figure(s.ready), "n"), cell(figure(s.rate), "n"), cell(fmt.dur(s.p95_wait), "n"),
          cell(fmt.dur(s.age) + " ago"))),
          "No supervisor is running. Start workers with conveyor worker -p N or --autoscale MIN,MAX to see them here.", 10);
        const decisions = sups.flatMap((s) => s.decisions.map((d) => ({ ...d, supervisor: s.id })))
          .sort((a, b) => (b.at || 0) - (a.at || 0));
        fill(document.querySelector("#decisions tbody"), decisions.map((d) => el("tr", {},
          cell(fmt.when(d.at)), cell(d.supervisor, "mono"), cell(d.kind),
          cell(d.from != null && d.to != null ? `${d.from} → ${d.to}` : "", "n"), cell(d.text))),
          "No decision yet: supervisors record here when they scale, restart, replace or recycle a process.", 5);
      }
    },

    job() {
      const id = body.dataset.job;
      if (!document.querySelector("[data-f=state]")) return;
      const stop = poll(() => `/api/jobs/${seg(id)}`, 1500, (data) => {
        bind(data);
        const bar = document.getElementById("progress-bar");
        if (bar) bar.style.width = `${((data.progress || 0) * 100).toFixed(1)}%`;
        const badge = document.querySelector("[data-f=state]");
        badge.className = "badge s-" + data.state;
        document.getElementById("error-panel").hidden = !data.error;
        const resultPanel = document.getElementById("result-panel");
        resultPanel.hidden = data.state !== "succeeded";
        if (data.state === "succeeded") document.getElementById("result").textContent = JSON.stringify(data.result, null, 2);
        if (["succeeded", "cancelled", "expired"].includes(data.state)) stop();
      });
    },
  };

  document.addEventListener("submit", (event) => {
    const question = event.target.dataset.confirm;
    if (question && !window.confirm(question)) event.preventDefault();
  });
  // After every script of the page has run (the queue page adds its charts script).
  document.addEventListener("DOMContentLoaded", () => {
    const page = pages[body.dataset.page];
    if (page) page();
  });
})();
