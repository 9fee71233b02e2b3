// comfysup's operator console: plain JavaScript, no framework, no build. Every URL is relative to the
// document's <base> (the console's root), so the console works behind a reverse proxy's path prefix.
"use strict";

const STATES = ["queued", "waiting", "posted", "running", "storing", "done", "dead", "cancelled"];
let session = { read_only: true, logged_in: false, may_read: false, csrf: null, who: null };

// -- small helpers -----------------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svgEl(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  return node;
}

// A time in the browser's zone, its UTC on hover (and for screen readers in the datetime attribute).
function when(epoch) {
  if (epoch === null || epoch === undefined) return "–";
  const d = new Date(epoch * 1000);
  return el("time", { datetime: d.toISOString(), title: d.toISOString().replace(".000Z", "Z") + " UTC" },
            d.toLocaleString());
}

function seconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${s.toFixed(1)} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function stateTag(state) { return el("span", { class: `state state-${state}`, text: state }); }

function banner(text, isError) {
  const b = document.getElementById("banner");
  b.textContent = text || "";
  b.className = isError ? "error" : "";
}

async function api(path, options) {
  const response = await fetch(path, Object.assign({ credentials: "same-origin" }, options || {}));
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const err = new Error((body && body.error && body.error.message) || `${response.status} ${response.statusText}`);
    err.status = response.status;
    err.body = body;
    throw err;
  }
  return body;
}

function post(path, data) {
  return api(path, { method: "POST", headers: { "Content-Type": "application/json",
                                                 "X-CSRF-Token": session.csrf || "" },
                     body: JSON.stringify(data) });
}

function mayAct() { return !session.read_only && session.logged_in; }

function main(...children) {
  const m = document.getElementById("main");
  m.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return m;
}

// -- who is here -------------------------------------------------------------------------------------------

function renderWho() {
  const who = document.getElementById("who");
  if (session.read_only) {
    who.replaceChildren(el("span", { text: "Read-only" }));
    banner("Read-only: no [api] token is configured, so this console changes nothing. Set [api] token to act.");
  } else if (session.logged_in) {
    who.replaceChildren(el("span", { text: `Signed in as ${session.who}` }),
                        el("button", { type: "button", onclick: logout }, "Sign out"));
  } else {
    who.replaceChildren(el("span", { text: "Not signed in" }));
  }
}

function loginForm() {
  const form = el("form", { id: "login", "aria-labelledby": "login-title" },
    el("h1", { id: "login-title" }, "Sign in"),
    el("p", {}, "Sign in with the API's token ([api] token) to see and act on the queue."),
    el("p", {}, el("label", { for: "login-token" }, "API token "),
       el("input", { id: "login-token", type: "password", autocomplete: "current-password", required: true })),
    el("p", {}, el("label", { for: "login-name" }, "Your name (for the audit log) "),
       el("input", { id: "login-name", type: "text", autocomplete: "username" })),
    el("button", { type: "submit", class: "primary" }, "Sign in"),
    el("p", { id: "login-error", class: "error", role: "alert" }));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await api("api/login", { method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ token: document.getElementById("login-token").value,
                               name: document.getElementById("login-name").value }) });
      location.reload();
    } catch (e) {
      document.getElementById("login-error").textContent = e.message;
    }
  });
  main(form);
  document.getElementById("login-token").focus();
}

async function logout() {
  await api("api/logout", { method: "POST" });
  location.reload();
}

// -- overview ----------------------------------------------------------------------------------------------

function barChart(series, label, colors) {
  const svg = svgEl("svg", { class: "chart", viewBox: "0 0 600 120", preserveAspectRatio: "none", role: "img",
                              "aria-label": label });
  const max = Math.max(1, ...series[0].map((_, i) => series.reduce((sum, s) => sum + (s[i] || 0), 0)));
  series[0].forEach((_, i) => {
    let y = 120;
    series.forEach((s, k) => {
      const h = ((s[i] || 0) / max) * 110;
      if (h > 0) svg.append(svgEl("rect", { x: i * 10 + 1, y: y - h, width: 8, height: h, fill: colors[k] }));
      y -= h;
    });
  });
  return svg;
}

function lineChart(series, label, colors) {
  const svg = svgEl("svg", { class: "chart", viewBox: "0 0 600 120", preserveAspectRatio: "none", role: "img",
                              "aria-label": label });
  const values = series.flat().filter((v) => v !== null && v !== undefined);
  const max = Math.max(0.001, ...values);
  series.forEach((s, k) => {
    const points = s.map((v, i) => (v === null || v === undefined ? null : `${i * 10 + 5},${120 - (v / max) * 110}`))
      .filter(Boolean).join(" ");
    if (points) svg.append(svgEl("polyline", { points, fill: "none", stroke: colors[k], "stroke-width": 2 }));
  });
  return svg;
}

function slotCard(slot, machine) {
  const facts = el("dl", { class: "facts" },
    el("dt", {}, "Machine"), el("dd", {}, machine.host || "–"),
    el("dt", {}, "Device"), el("dd", {}, slot.device || "–"),
    el("dt", {}, "State"), el("dd", {}, slot.draining ? `draining: ${slot.draining}` : (slot.state || "–"),
                                 slot.ready ? " · ready" : ""),
    el("dt", {}, "ComfyUI"), el("dd", {}, slot.comfyui_version || "–"),
    el("dt", {}, "Restarts"), el("dd", {}, `server ${slot.restarts ?? 0}, runner ${slot.runner_restarts ?? 0}`),
    el("dt", {}, "Warm-up"), el("dd", {}, slot.warming ? "warming up" : seconds(slot.warmup_seconds)));
  if (slot.gpu) {
    facts.append(el("dt", {}, "GPU"), el("dd", {}, slot.gpu.name),
      el("dt", {}, "VRAM"), el("dd", {}, `${bytes(slot.gpu.memory_used)} of ${bytes(slot.gpu.memory_total)}`),
      el("dt", {}, "Utilisation"),
      el("dd", {}, slot.gpu.utilization === null ? "–" : `${Math.round(slot.gpu.utilization * 100)} %`));
  }
  if (slot.problem) facts.append(el("dt", {}, "Problem"), el("dd", { class: "error" }, slot.problem));
  if (slot.held_by) facts.append(el("dt", {}, "Held"), el("dd", { class: "held" }, `by ${slot.held_by}: takes no new job`));
  const card = el("section", { class: "slot", "aria-label": `slot ${slot.name} on ${machine.host}`,
                                "data-slot": slot.name }, el("h3", {}, slot.name), facts);
  if (mayAct()) {
    const order = (what, data, done) => async () => {
      try { await post(`api/actions/${what}`, Object.assign({ host: machine.host, slot: slot.name }, data)); banner(done); }
      catch (e) { banner(`${what} refused: ${e.message}`, true); }
    };
    card.append(el("div", { class: "actions" },
      slot.held_by ? el("button", { type: "button", class: "put-back", id: `put-back-${machine.host}-${slot.name}`,
                                    onclick: order("hold", { hold: false }, `${slot.name}: put back`) }, "Put back")
                   : el("button", { type: "button", class: "drain", id: `drain-${machine.host}-${slot.name}`,
                                    onclick: order("hold", { hold: true }, `${slot.name}: held (drains within seconds)`) },
                        "Drain"),
      el("button", { type: "button", class: "restart danger", id: `restart-${machine.host}-${slot.name}`,
                     onclick: order("restart", {}, `${slot.name}: restart asked (after its job)`) }, "Restart server")));
  }
  if (slot.job) {
    const p = slot.progress;
    card.append(el("p", {}, "Runs ", el("a", { href: `jobs/${slot.job}`, class: "mono",
                                               id: `runs-${machine.host}-${slot.name}` }, slot.job.slice(0, 8))),
      el("progress", { max: 1, value: p ? p.value : 0, "aria-label": `progress of job ${slot.job}` }),
      el("div", { class: "progress-text" }, p ? (p.message || `node ${p.nodes_done + 1} of ${p.nodes_total}`)
                                               : "waiting in ComfyUI's queue"));
    if (slot.preview) {
      card.append(el("img", { src: `api/previews/${slot.job}?n=${slot.preview}`,
                              alt: `latest preview of job ${slot.job}` }));
    }
  } else {
    card.append(el("p", { class: "idle" }, "No job"));
  }
  return card;
}

function renderOverview(o) {
  const counts = el("div", { class: "cards", id: "counts" }, STATES.map((s) =>
    el("a", { class: "count", href: `jobs?state=${s === "waiting" ? "queued" : (s === "posted" ? "running" : s)}`,
              "data-state": s, id: `count-${s}` }, el("b", {}, String(o.counts[s] ?? 0)), s)));
  const oldest = o.oldest_queued_at ? seconds(o.now - o.oldest_queued_at) : "none queued";
  const h = o.hour;
  const charts = el("div", { class: "charts" },
    el("figure", {}, barChart([h.done_per_minute, h.dead_per_minute],
                               "jobs done (blue) and dead (red) per minute, last hour", ["#1f5fbf", "#b3261e"]),
       el("figcaption", {}, `Jobs per minute, last hour: ${h.jobs} ended`)),
    el("figure", {}, lineChart([h.wait_p50_per_minute, h.wait_p95_per_minute],
                                "queue wait p50 (blue) and p95 (orange) per minute, last hour", ["#1f5fbf", "#d97706"]),
       el("figcaption", {}, `Queue wait, last hour: p50 ${seconds(h.wait_p50)}, p95 ${seconds(h.wait_p95)}`)));
  const machines = o.machines.length ? o.machines.map((m) => el("div", {},
      el("h2", {}, `${m.host}${m.local ? " (this machine)" : ""}`, " · heartbeat ", seconds(m.age), " ago",
         m.stale ? ` · ${m.stale}` : ""),
      el("div", { class: "slots" }, m.slots.map((s) => slotCard(s, m)))))
    : [el("p", {}, "No supervisor shares this queue yet (comfysup run).")];
  const dead = o.recent_dead.length ? el("ul", {}, o.recent_dead.map((d) => el("li", {},
      el("a", { href: `jobs/${d.id}`, class: "mono", id: `dead-${d.id}` }, d.id.slice(0, 8)), " ", when(d.finished_at), " ",
      d.reason || "")))
    : el("p", {}, "None.");
  main(el("h1", {}, "Overview"), counts,
       el("p", { id: "oldest" }, "Oldest queued job: ", oldest, " · running now: ", String(o.running)),
       charts, el("h2", {}, "Slots"), machines, el("h2", {}, "Latest dead letters"), dead,
       el("p", { class: "updated" }, "Updated ", when(o.now)));
}

async function overview() {
  document.title = "Overview · comfysup";
  renderOverview(await api("api/overview"));
  const source = new EventSource("api/events");
  source.addEventListener("overview", (event) => {
    const active = document.activeElement && document.activeElement.id;
    renderOverview(JSON.parse(event.data));
    if (active && document.getElementById(active)) document.getElementById(active).focus();
    banner(session.read_only ? document.getElementById("banner").textContent : "");
  });
  source.addEventListener("trouble", (event) => banner(`The queue does not answer: ${JSON.parse(event.data).error}`, true));
}

// -- jobs --------------------------------------------------------------------------------------------------

function selectedIds() {
  return [...document.querySelectorAll("input[name=pick]:checked")].map((box) => box.value);
}

async function act(what, ids) {
  try {
    const result = await post(`api/actions/${what}`, { ids });
    banner(`${what}: ${Object.entries(result.result).map(([id, r]) => `${id.slice(0, 8)} ${r}`).join(", ")}`);
    return result;
  } catch (e) {
    banner(`${what} refused: ${e.message}`, true);
    return null;
  }
}

function bulkRetry(params) {
  const box = el("div", { class: "confirm", role: "region", "aria-label": "retry dead letters", id: "bulk" });
  const ask = el("button", { type: "button", id: "bulk-retry", onclick: async () => {
    try {
      const counted = await api(`api/count?${new URLSearchParams({ q: params.get("q") || "" })}`);
      if (counted.more) { box.replaceChildren(`More than ${counted.max} dead letters match: narrow the search.`); return; }
      const go = el("button", { type: "button", class: "danger", id: "bulk-confirm", onclick: async () => {
        try {
          const done = await post("api/actions/retry-search", { q: params.get("q") || "", expected: counted.count });
          box.replaceChildren(el("p", { role: "alert" }, `Retried ${done.retried} dead job(s).`));
        } catch (e) { box.replaceChildren(el("p", { role: "alert", class: "error" }, `Refused: ${e.message}`)); }
      } }, `Retry ${counted.count} dead job(s)`);
      box.replaceChildren(el("p", {}, `${counted.count} dead job(s) match this search. Retry them all?`), go,
                          el("button", { type: "button", onclick: () => box.replaceChildren(ask) }, "Keep them"));
      go.focus();
    } catch (e) { box.replaceChildren(el("p", { role: "alert", class: "error" }, e.message)); }
  } }, "Retry every dead letter this search matches…");
  box.append(ask);
  return box;
}

async function jobs() {
  const params = new URLSearchParams(location.search);
  document.getElementById("q").value = params.get("q") || "";
  document.getElementById("state").value = params.get("state") || "";
  document.getElementById("tenant").value = params.get("tenant") || "";
  document.title = `Jobs${params.get("q") ? ": " + params.get("q") : ""} · comfysup`;
  let page;
  try {
    page = await api(`api/jobs?${params}`);
  } catch (e) {
    main(el("h1", {}, "Jobs"), el("p", { class: "error", role: "alert" }, e.message));
    return;
  }
  const pick = mayAct();
  const rows = page.rows.map((r) => el("tr", { "data-id": r.id },
    pick ? el("td", {}, el("input", { type: "checkbox", name: "pick", value: r.id, "aria-label": `select ${r.id}` })) : null,
    el("td", { "data-label": "Job", class: "mono" }, el("a", { href: `jobs/${r.id}` }, r.id.slice(0, 13))),
    el("td", { "data-label": "State" }, stateTag(r.state)),
    el("td", { "data-label": "Workflow" }, r.workflow || "–"),
    el("td", { "data-label": "Tenant" }, el("a", { href: `jobs?${new URLSearchParams({ tenant: r.tenant })}` }, r.tenant)),
    el("td", { "data-label": "Labels" }, Object.entries(r.labels).map(([k, v]) => `${k}=${v}`).join(" ")),
    el("td", { "data-label": "Submitted" }, when(r.submitted_at)),
    el("td", { "data-label": "Ended" }, when(r.finished_at)),
    el("td", { "data-label": "Attempts" }, String(r.attempt)),
    el("td", { "data-label": "Reason", class: "reason" }, r.reason || "")));
  const table = el("table", { class: "jobs", "aria-label": "jobs found" },
    el("thead", {}, el("tr", {}, pick ? el("th", { scope: "col" }, el("span", { class: "sr-only" }, "Select")) : null,
      ["Job", "State", "Workflow", "Tenant", "Labels", "Submitted", "Ended", "Attempts", "Reason"].map((h) =>
        el("th", { scope: "col" }, h)))),
    el("tbody", {}, rows));
  const order = params.get("order") === "oldest" ? "newest" : "oldest";
  const sortParams = new URLSearchParams(params); sortParams.set("order", order); sortParams.delete("after");
  const nextParams = new URLSearchParams(params); nextParams.set("after", page.after || "");
  const actions = pick ? el("div", { class: "actions" },
    el("button", { type: "button", id: "cancel-selected", onclick: async () => { await act("cancel", selectedIds()); } },
       "Cancel selected"),
    el("button", { type: "button", id: "retry-selected", onclick: async () => { await act("retry", selectedIds()); } },
       "Retry selected (dead)")) : null;
  main(el("h1", {}, "Jobs"),
       el("p", {}, el("a", { href: `jobs?${sortParams}`, id: "sort" }, `Sort: ${order} first`)),
       actions, pick ? bulkRetry(params) : null,
       page.rows.length ? table : el("p", { id: "no-jobs" }, "No job matches."),
       el("div", { class: "pager" }, page.after ? el("a", { href: `jobs?${nextParams}`, id: "next", rel: "next" },
                                                     "Next page") : el("span", {}, "Last page")));
}

// -- a job -------------------------------------------------------------------------------------------------

function facts(pairs) {
  return el("dl", { class: "facts" }, pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

function timeline(a) {
  const total = a.phases.reduce((sum, p) => sum + (p.seconds || 0), 0) || 1;
  const bar = el("div", { class: "timeline", role: "img", "aria-label": a.phases.map((p) =>
    `${p.phase} ${seconds(p.seconds)}`).join(", ") }, a.phases.filter((p) => p.seconds !== null).map((p) =>
    el("span", { class: `ph-${p.phase}`, style: null, title: `${p.phase}: ${seconds(p.seconds)}`,
                 "data-width": (p.seconds / total) }, p.phase)));
  const section = el("section", { class: "attempt", "aria-label": `attempt ${a.attempt}` },
    el("h3", {}, `Attempt ${a.attempt}: `, a.outcome || "running", a.kind ? ` (${a.kind})` : ""),
    facts([["Started", when(a.started_at)], ["Ended", when(a.ended_at)], ["Server", a.server],
           ["Runner", a.owner], ["Prompt", a.prompt_number ?? "–"], ["Reason", a.reason || "–"]]),
    bar,
    el("ol", { class: "phases" }, a.phases.map((p) => el("li", {}, `${p.phase} at `, when(p.at),
                                                          p.seconds !== null ? ` for ${seconds(p.seconds)}` : ""))));
  if (a.nodes.length) {
    section.append(el("details", {}, el("summary", {}, `${a.nodes.length} node(s) ran, ${a.cached.length} cached`),
      el("table", {}, el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Node"), el("th", { scope: "col" }, "Class"),
                                                    el("th", { scope: "col" }, "Time"))),
         el("tbody", {}, a.nodes.map((n) => el("tr", {}, el("td", {}, n.id), el("td", {}, n.class_type),
                                                el("td", {}, seconds(n.seconds))))))));
  }
  if (a.error) {
    section.append(el("div", { class: "comfy-error", role: "group", "aria-label": "ComfyUI's error" },
      el("p", { class: "error" }, `${a.error.class_type || "node"} ${a.error.node_id || ""}: `,
         a.error.exception_type || "", " ", a.error.message || ""),
      a.error.traceback ? el("pre", { class: "traceback" },
        Array.isArray(a.error.traceback) ? a.error.traceback.join("") : String(a.error.traceback)) : null));
  }
  return section;
}

function media(o) {
  const url = o.url;
  let shown;
  if (o.type === "image") shown = el("img", { src: url, alt: o.name, loading: "lazy" });
  else if (o.type === "video") shown = el("video", { src: url, controls: true, preload: "metadata", muted: true,
                                                      "aria-label": o.name });
  else if (o.type === "audio") shown = el("audio", { src: url, controls: true, preload: "metadata", "aria-label": o.name });
  return el("figure", {}, shown, el("figcaption", {}, el("a", { href: url, download: o.name }, o.name), ` · ${bytes(o.size)}`));
}

async function job(id) {
  document.title = `Job ${id.slice(0, 8)} · comfysup`;
  let j;
  try {
    j = await api(`api/jobs/${encodeURIComponent(id)}`);
  } catch (e) {
    main(el("h1", {}, "Job"), el("p", { class: "error", role: "alert" }, e.message));
    return;
  }
  const actions = el("div", { class: "actions" });
  if (mayAct() && ["queued", "running", "posted"].includes(j.state)) {
    actions.append(el("button", { type: "button", class: "danger", id: "cancel",
                                  onclick: async () => { if (await act("cancel", [j.id])) job(id); } }, "Cancel"));
  }
  if (mayAct() && j.state === "dead") {
    actions.append(el("button", { type: "button", id: "retry",
                                  onclick: async () => { if (await act("retry", [j.id])) job(id); } }, "Retry"));
  }
  const error = j.error ? el("section", { "aria-label": "error" }, el("h2", {}, "Error"),
    el("p", { class: "error" }, j.error.message),
    j.error.traceback ? el("pre", { class: "traceback" }, Array.isArray(j.error.traceback) ? j.error.traceback.join("")
                                                                                        : String(j.error.traceback)) : null) : null;
  main(el("h1", {}, "Job ", el("span", { class: "mono" }, j.id), " ", stateTag(j.state)), actions,
    facts([["Workflow", j.workflow || "–"], ["Priority", String(j.priority)], ["Attempts", String(j.attempt)],
           ["Submitted", when(j.submitted_at)], ["Started", when(j.started_at)], ["Ended", when(j.finished_at)],
           ["Queue wait", j.metrics.queue_ms === null ? "–" : seconds(j.metrics.queue_ms / 1000)],
           ["Execution", j.metrics.execution_ms === null ? "–" : seconds(j.metrics.execution_ms / 1000)],
           ["Place in line", j.queue_position ?? "–"], ["Server", j.server || "–"], ["Machine", j.machine || "–"],
           ["Tenant", j.tenant || "default"], ["Reason", j.reason || "–"]]),
    j.progress ? el("progress", { max: 1, value: j.progress.value, "aria-label": "progress" }) : null,
    error,
    el("h2", {}, "Outputs"), j.outputs.length ? el("div", { class: "gallery" }, j.outputs.map(media)) : el("p", {}, "None."),
    el("h2", {}, "Attempts"), j.attempts.length ? j.attempts.map(timeline) : el("p", {}, "None yet."),
    el("h2", {}, "Inputs"), j.inputs.length ? el("ul", {}, j.inputs.map((i) => el("li", {}, `${i.input}: ${i.name} `,
                                                  el("span", { class: "mono" }, i.hash || ""), ` ${bytes(i.size)}`)))
                                         : el("p", {}, "None."),
    el("h2", {}, "Parameters"), el("pre", { id: "params" }, JSON.stringify(j.params, null, 2)),
    el("h2", {}, "Labels"), el("pre", {}, JSON.stringify(j.labels, null, 2)));
  document.querySelectorAll(".timeline span").forEach((span) => { span.style.flexGrow = span.dataset.width; });
}

// -- start -------------------------------------------------------------------------------------------------

async function start() {
  try {
    session = await api("api/session");
  } catch (e) {
    banner(`The console cannot reach its API: ${e.message}`, true);
    return;
  }
  renderWho();
  if (!session.may_read) { loginForm(); return; }
  const root = new URL(document.baseURI).pathname;
  const path = location.pathname.startsWith(root) ? location.pathname.slice(root.length) : "";
  const nav = path.startsWith("jobs") ? "nav-jobs" : "nav-overview";
  document.getElementById(nav).setAttribute("aria-current", "page");
  try {
    if (path.startsWith("jobs/")) await job(decodeURIComponent(path.slice(5)));
    else if (path === "jobs") await jobs();
    else await overview();
  } catch (e) {
    if (e.status === 401) loginForm();
    else banner(e.message, true);
  }
}

start();
