import { api, followEvents } from "../api.js";
import { armStyles, naturalOrder } from "../palette.js";
import {
  badge, confirmDialog, errorBox, h, navigate, num, params, perUnit, planFields, planHeader, plot,
  progress, query, setQuery, TERMINAL, tuningCard, unitNote, when,
} from "../ui.js";
import { auditsPanel } from "./audits.js";
import { trialsTable } from "./trials-table.js";

const TABS = [["fronts", "Fronts"], ["plan", "Plan & budget"], ["trials", "Trials"]];
const CONN = {
  connecting: "connecting…", live: "live", reconnecting: "reconnecting…",
  polling: "polling", ended: "finished", static: "finished",
};

// One seed has no spread: "—", as the CLI shows it, not a standard deviation of 0.
// (The CLI's "—" for a missing ECE too.)
const NO_SPREAD = "—";
const hasSpread = (stdev, seeds) => typeof stdev === "number" && Number.isFinite(stdev) && Number(seeds) >= 2;
const spread = (p) => hasSpread(p.y_std, p.seeds);
const std = (r) => (hasSpread(r.objective_std, r.seeds) ? num(r.objective_std) : NO_SPREAD);

/** One sweep: its fronts, plan and budget, and trials; live while it runs. */
export function sweepView(el, id) {
  let alive = true;
  let summary = null;
  let stream = null;
  let poll = null;
  let pending = null;
  let lastRefresh = 0;
  // The arms' colours and symbols: the CLI's plots' palette, keyed by the sweep's arms in
  // natural order (api/plots/palette.py), so an arm has the same colour in both.
  let styles = {};

  const title = h("h1", { id: "sweep-name" }, "…");
  const stateEl = h("span");
  const conn = h("span", { class: "conn", id: "conn-state", "data-state": "connecting" }, CONN.connecting);
  const cancelBtn = h("button", { class: "danger", id: "cancel-sweep", hidden: true, onclick: cancel }, "Cancel sweep");
  const meta = h("p", { class: "muted", id: "sweep-meta" });
  const progressEl = h("div", { id: "sweep-progress" });
  const notice = h("div"); // the sweep's own error, redrawn with every refresh
  const flash = h("div"); // the outcome of what the user did here (kept across redraws)
  const tabBar = h("div", { class: "tabs", role: "tablist" });
  const panes = {
    fronts: h("section", { id: "pane-fronts" }),
    plan: h("section", { id: "pane-plan" }),
    trials: h("section", { id: "pane-trials" }),
  };
  el.append(
    h("p", { class: "crumbs" }, h("a", { href: "/sweeps" }, "Sweeps"), " / ", id.slice(0, 12)),
    h("div", { class: "row" }, title, stateEl, h("span", { class: "spacer" }), conn, cancelBtn),
    meta, progressEl, notice, flash, tabBar, ...Object.values(panes));

  // --- fronts pane ------------------------------------------------------------------------
  const logBox = h("input", { type: "checkbox", id: "log-eps", checked: query().get("log") === "1" });
  const epsChart = h("div", { id: "eps-chart", class: "chart" });
  const calChart = h("div", { id: "cal-chart", class: "chart" });
  const calNote = h("p", { class: "muted" });
  // Why there is no calibration front (DP evaluation releases none, no ECE, no trials yet):
  // said where the chart would be, in its place, rather than under an empty plot.
  const calReason = h("div", { class: "info cal-reason", id: "cal-reason", role: "status", hidden: true });
  const calDesc = h("p", { class: "muted small" }, "Every finished trial; ringed points are non-dominated among the trials of their ε level. Click to open.");
  const calCard = h("div", { class: "card", id: "cal-card" },
    h("h2", {}, "Calibration"), calReason, calDesc, calChart, calNote);
  const resultsBox = h("div", { id: "results" });
  panes.fronts.append(
    h("div", { class: "charts" },
      h("div", { class: "card" },
        h("div", { class: "row" }, h("h2", {}, "Privacy–utility front"), h("span", { class: "spacer" }),
          h("label", {}, logBox, " log ε")),
        h("p", { class: "muted small" }, "Best configuration per arm and ε level: mean ± std over seeds. ",
          "★ marks the non-dominated points. Click a point to open its best trial."),
        epsChart),
      calCard),
    h("div", { class: "card" }, h("h2", {}, "Best per arm and level"), resultsBox),
    auditsPanel({ sweep: id }));
  logBox.addEventListener("change", () => { setQuery({ log: logBox.checked ? "1" : null }); drawFronts(); });

  // --- trials pane ------------------------------------------------------------------------
  let table = null;

  function showTab(name) {
    for (const [k, pane] of Object.entries(panes)) pane.hidden = k !== name;
    for (const b of tabBar.children) b.setAttribute("aria-selected", String(b.dataset.tab === name));
  }

  function selectTab(name) {
    showTab(name);
    setQuery({ tab: name === "fronts" ? null : name });
    draw(name);
  }
  tabBar.append(...TABS.map(([k, label]) =>
    h("button", { role: "tab", class: "tab", "data-tab": k, onclick: () => selectTab(k) }, label)));

  function tab() { const t = query().get("tab"); return TABS.some(([k]) => k === t) ? t : "fronts"; }

  function setArms(names) {
    const known = Object.keys(styles);
    if (names.length === known.length && names.every((n) => n in styles)) return;
    styles = armStyles(names);
  }
  function style(arm) {
    if (!(arm in styles)) setArms([...Object.keys(styles), arm]);
    return styles[arm];
  }
  function color(arm) { return style(arm).color; }

  // --- drawing ----------------------------------------------------------------------------
  function drawHeader() {
    const s = summary;
    title.textContent = s.name;
    const ended = TERMINAL.has(s.state);
    stateEl.replaceChildren(badge(s.state), ended && s.finished_at
      ? h("span", { class: "muted small", id: "sweep-duration" }, ` in ${duration(s.started_at || s.created_at, s.finished_at)}`)
      : "");
    // A finished sweep's state says it all: the events stream's "finished" would be a second
    // badge saying the same.
    conn.hidden = ended;
    meta.replaceChildren(
      `dataset ${s.dataset} · objective ${s.objective.metric} (${s.objective.mode}) · created ${when(s.created_at)}`,
      s.started_at ? ` · started ${when(s.started_at)}` : "",
      s.finished_at ? ` · finished ${when(s.finished_at)}` : "");
    const hidden = s.plan.some((g) => g.release === "selected-only");
    progressEl.replaceChildren(hidden ? h("p", { class: "muted" },
      "Papernot–Steinke accounting: only each grid's selected trial is released; the number of runs stays private.")
      : progress(s.trials));
    cancelBtn.hidden = TERMINAL.has(s.state);
    notice.replaceChildren(
      s.warning ? h("div", { class: "warning", id: "randomness-warning" }, h("strong", {}, "Reproducible mode: "), s.warning) : "",
      s.error ? h("div", { class: "error" }, h("strong", {}, "Sweep failed: "), s.error) : "");
    setArms([...new Set([...Object.keys(styles), ...s.arms.map((a) => a.name)])]);
  }

  async function drawFronts() {
    const metric = summary.objective.metric;
    const logX = logBox.checked;
    const eps = await api(`/sweeps/${id}/pareto?x=epsilon&y=${encodeURIComponent(metric)}`);
    if (!alive) return;
    const byArm = {};
    for (const p of eps.points) (byArm[p.arm] ||= []).push(p);
    const traces = naturalOrder(Object.keys(byArm)).map((arm) => {
      const pts = byArm[arm];
      pts.sort((a, b) => a.x - b.x);
      return {
        type: "scatter", mode: "lines+markers", name: arm, dpRole: "arm",
        x: pts.map((p) => p.x), y: pts.map((p) => p.y),
        error_y: { type: "data", array: pts.map((p) => (spread(p) ? p.y_std : 0)), visible: true, thickness: 1 },
        marker: { size: 9, color: color(arm), symbol: style(arm).symbol }, line: { color: color(arm) },
        customdata: pts.map((p) => p.trial),
        text: pts.map((p) => [
          `<b>${arm}</b> at ε=${num(p.x)}`,
          `${metric}: ${num(p.y)}${spread(p) ? ` ± ${num(p.y_std)}` : ""} (${p.seeds} seed${p.seeds === 1 ? "" : "s"})`,
          `params: ${params(p.params)}`, `σ = ${num(p.noise_multiplier)}`,
        ].join("<br>")),
        hovertemplate: "%{text}<extra></extra>",
      };
    });
    const front = eps.points.filter((p) => !p.dominated).sort((a, b) => a.x - b.x);
    traces.push({
      type: "scatter", mode: "markers", name: "non-dominated", dpRole: "front",
      x: front.map((p) => p.x), y: front.map((p) => p.y), customdata: front.map((p) => p.trial),
      marker: { symbol: "star", size: 16, color: "rgba(0,0,0,0)", line: { width: 1.5, color: "#111" } },
      hoverinfo: "skip",
    });
    // The ε levels are discrete: ticks at the levels only (no 1.5 between 1 and 2, and no
    // stray minor labels such as a lone "9" on the log axis).
    const levels = [...new Set(eps.points.map((p) => p.x))].sort((a, b) => a - b);
    plot(epsChart, traces, {
      xaxis: { title: { text: "per-grid ε budget" }, type: logX ? "log" : "linear",
        tickmode: "array", tickvals: levels, ticktext: levels.map((v) => num(v)) },
      yaxis: { title: { text: metric } },
    }, { onClick: openPoint });
    drawResults();
    drawCalibration(metric);
  }

  /** No calibration front: the reason in the chart's place, and no empty plot. */
  function calUnavailable(reason, why) {
    window.Plotly.purge(calChart);
    calChart.hidden = true;
    calDesc.hidden = true;
    calNote.textContent = "";
    calReason.replaceChildren(reason);
    calReason.dataset.reason = why;
    calReason.hidden = false;
    calCard.dataset.state = "unavailable";
  }

  function calAvailable() {
    calReason.hidden = true;
    calDesc.hidden = false;
    calChart.hidden = false;
    calCard.dataset.state = "shown";
  }

  async function drawCalibration(metric) {
    const dpEval = summary.privacy?.evaluation?.mode === "dp"
      || summary.plan.some((g) => g.eval_mode === "dp");
    if (dpEval) {
      calUnavailable(h("span", {}, h("strong", {}, "No calibration front: "),
        "this sweep uses DP evaluation: ε covers the evaluation records too, and all that is ",
        "released from them is a noisy accuracy. No ECE or reliability bins are released, so there is no ",
        "accuracy-vs-ECE front to draw."), "dp-evaluation");
      return;
    }
    if (!summary.results.some((r) => r.ece_mean !== null)) {
      calUnavailable(summary.results.length ? "No calibration front: this sweep records no ECE."
        : "No calibration front yet: no finished trials.", summary.results.length ? "no-ece" : "no-trials");
      return;
    }
    let cal;
    try {
      cal = await api(`/sweeps/${id}/pareto?x=${encodeURIComponent(metric)}&y=ece`);
    } catch (e) {
      if (e.status === 422) { calUnavailable("No calibration front: this sweep records no ECE.", "no-ece"); return; }
      throw e;
    }
    if (!alive) return;
    calAvailable();
    const byArm = {};
    for (const p of cal.points) (byArm[p.arm] ||= []).push(p);
    const hover = (p) => [
      `<b>${p.arm}</b> at ε level ${num(p.epsilon_budget)}`, `params: ${params(p.params)}`,
      `σ = ${num(p.noise_multiplier)} · single-run ε = ${num(p.single_run_epsilon)} (grid ε ${num(p.epsilon_budget)})`,
      `${metric} = ${num(p.x)} · ECE = ${num(p.y)}`,
    ].join("<br>");
    const traces = naturalOrder(Object.keys(byArm)).map((arm) => [arm, byArm[arm]]).map(([arm, pts]) => ({
      type: "scatter", mode: "markers", name: arm, dpRole: "trials",
      x: pts.map((p) => p.x), y: pts.map((p) => p.y), customdata: pts.map((p) => p.trial),
      text: pts.map(hover), hovertemplate: "%{text}<extra></extra>",
      marker: { size: 7, color: color(arm), symbol: style(arm).symbol, opacity: 0.75 },
    }));
    // One front per ε level: trials at different privacy levels are not alternatives to each
    // other, and a pooled front would ring a low-ε trial (even one at chance) for its low ECE
    // only because nothing at its level was compared with it.
    const fronts = levelFronts(cal.points);
    const shades = ["#111", "#555", "#888", "#aaa"];
    fronts.forEach(([level, front], i) => traces.push({
      type: "scatter", mode: "lines+markers", name: `non-dominated at ε ${num(level)}`, dpRole: "front",
      x: front.map((p) => p.x), y: front.map((p) => p.y), customdata: front.map((p) => p.trial),
      text: front.map(hover), hovertemplate: "%{text}<extra>front</extra>",
      line: { color: shades[i % shades.length], dash: "dot", width: 1 },
      marker: { size: 13, color: "rgba(0,0,0,0)", line: { width: 2, color: shades[i % shades.length] } },
    }));
    const ringed = fronts.reduce((n, [, f]) => n + f.length, 0);
    calNote.textContent = `${cal.points.length} finished trials; ${ringed} non-dominated within their ε level.`;
    plot(calChart, traces, {
      xaxis: { title: { text: metric } }, yaxis: { title: { text: "ECE (lower is better)" } },
    }, { onClick: openPoint });
  }

  function openPoint(p) {
    const trial = p.customdata;
    if (trial) navigate(`/trials/${trial}`);
  }

  function drawResults() {
    const order = naturalOrder(summary.results.map((r) => r.arm));
    const rows = [...summary.results].sort((a, b) => order.indexOf(a.arm) - order.indexOf(b.arm)
      || a.epsilon_budget - b.epsilon_budget);
    resultsBox.replaceChildren(rows.length ? h("table", { class: "grid compact", id: "results-table" },
      h("thead", {}, h("tr", {}, ["arm", "ε", "best params", summary.objective.metric, "± std", "ECE", "seeds",
        "done / failed", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, rows.map((r) => h("tr", {},
        h("td", {}, h("span", { class: "swatch", style: `background:${color(r.arm)}` }), r.arm),
        h("td", {}, num(r.epsilon_budget)), h("td", {}, params(r.best_params)),
        h("td", {}, h("strong", {}, num(r.objective_mean))), h("td", { class: "std" }, std(r)),
        h("td", {}, r.ece_mean === null || r.ece_mean === undefined ? NO_SPREAD : num(r.ece_mean)), h("td", {}, r.seeds), h("td", {}, `${r.trials_done} / ${r.trials_failed}`),
        h("td", {}, r.best_trial ? h("a", { href: `/trials/${r.best_trial}` }, "best trial") : "")))))
      : h("p", { class: "muted" }, "No finished trials yet."));
  }

  async function drawPlan() {
    const fields = await planFields();
    const s = summary;
    const b = s.budget;
    const cols = ["arm", "strategy", "epsilon_budget", "trials", "noise_multiplier",
      "gradient_noise_multiplier", "steps_per_trial", "sample_rate", "epsilon_per_trial",
      "epsilon_total", "epsilon_verified", "accounting"];
    // A plan with a privacy unit (a person): every ε below is per unit.
    const unit = perUnit(s.plan[0]?.privacy_unit) ? s.plan[0].privacy_unit : "";
    panes.plan.replaceChildren(
      h("div", { class: "card" }, h("h2", {}, "Plan"),
        h("p", { class: "muted small" }, "Per arm and ε level: the noise every trial of the grid uses, and the ε the grid's runs compose to, verified by a second accountant."),
        unit ? h("p", { class: "info", id: "plan-unit", "data-unit": unit }, unitNote(unit)) : "",
        h("table", { class: "grid compact", id: "plan-table" },
          planHeader(fields, cols, unit),
          h("tbody", {}, s.plan.map((g) => h("tr", { "data-arm": g.arm, "data-level": g.epsilon_budget },
            h("td", {}, g.arm), h("td", {}, g.strategy), h("td", {}, num(g.epsilon_budget)),
            h("td", {}, g.trials ?? h("span", { class: "muted", title: "Papernot–Steinke: the number of runs is private" }, "private")),
            h("td", {}, num(g.noise_multiplier)),
            h("td", {}, g.gradient_noise_multiplier && g.gradient_noise_multiplier !== g.noise_multiplier ? num(g.gradient_noise_multiplier) : "="),
            h("td", {}, g.steps_per_trial), h("td", {}, num(g.sample_rate)),
            h("td", {}, num(g.epsilon_per_trial)), h("td", {}, num(g.epsilon_total)),
            h("td", { title: g.verified_by ? `verified by ${g.verified_by}` : "" }, num(g.epsilon_verified),
              g.verified_by ? h("span", { class: "muted small" }, ` (${g.verified_by})`) : ""),
            h("td", {}, g.accounting, g.retries ? ` +${g.retries} retries` : "")))))),
      tuningCard(s.plan, fields),
      privacyCard(s.privacy),
      h("div", { class: "card" }, h("h2", {}, "Budget"),
        h("dl", { class: "kv", id: "sweep-budget" },
          h("dt", {}, `ε${perUnit(unit)} reserved`), h("dd", {}, num(b.epsilon_reserved)),
          h("dt", {}, "ε charged"), h("dd", {}, num(b.epsilon_charged)),
          h("dt", {}, "ε released"), h("dd", {}, num(b.epsilon_released)),
          h("dt", {}, "ε outstanding"), h("dd", {}, num(b.epsilon_outstanding)),
          h("dt", {}, "δ reserved / charged"), h("dd", {}, `${num(b.delta_reserved)} / ${num(b.delta_charged)}`),
          h("dt", {}, "charges"), h("dd", {}, b.charges ?? "private")),
        h("p", {}, h("a", { href: `/datasets?focus=${encodeURIComponent(s.dataset)}` }, `Dataset ${s.dataset}'s budget`))));
  }

  // One ε per release, each with what it covers (sweeper/privacy/releases.py).
  function privacyCard(p) {
    if (!p) return "";
    const rows = [];
    if (p.sweep) rows.push(["whole sweep", p.sweep.epsilon, `${p.sweep.covers} (${p.sweep.method}; grids' sum ${num(p.sweep.epsilon_summed)})`]);
    for (const g of p.grids || []) rows.push([`grid ${g.grid}`, g.epsilon, g.covers]);
    if (p.dataset_lifetime) rows.push(["dataset lifetime (spent)", p.dataset_lifetime.epsilon_spent, p.dataset_lifetime.covers]);
    return h("div", { class: "card", id: "privacy-releases" }, h("h2", {}, "What ε covers"),
      h("table", { class: "grid compact" },
        h("thead", {}, h("tr", {}, ["release", `ε${perUnit(p.grids?.[0]?.privacy_unit)}`, "covers"].map((c) => h("th", {}, c)))),
        h("tbody", {}, rows.map(([name, eps, covers]) => h("tr", {}, h("td", {}, name), h("td", {}, num(eps)), h("td", {}, covers))))),
      p.evaluation ? h("p", { class: "warning", id: "evaluation-statement" }, p.evaluation.statement) : "",
      h("p", { class: "muted small" }, "A trial's single-run ε is what that run alone would cost; it is not what was spent."));
  }

  function draw(name = tab()) {
    if (!summary) return;
    if (name === "fronts") drawFronts().catch(showError);
    else if (name === "plan") drawPlan().catch(showError);
    else if (name === "trials") {
      if (!table) { table = trialsTable(panes.trials, id, summary); } else table.reload(summary);
    }
  }

  function showError(e) { if (alive) flash.replaceChildren(errorBox(e)); }

  // --- data and liveness ------------------------------------------------------------------
  async function refresh() {
    lastRefresh = Date.now();
    try {
      summary = await api(`/sweeps/${id}`);
    } catch (e) {
      if (e.status === 404) { el.replaceChildren(h("h1", {}, "Sweep not found"), h("p", {}, h("a", { href: "/sweeps" }, "All sweeps"))); alive = false; return; }
      showError(e); return;
    }
    if (!alive) return;
    drawHeader();
    draw();
    if (TERMINAL.has(summary.state)) {
      stopLive();
      setConn("ended");
    }
  }

  function soon() {
    // Events come in bursts (metric steps): redraw at most every 1.5 s.
    if (pending) return;
    const wait = Math.max(0, 1500 - (Date.now() - lastRefresh));
    pending = setTimeout(() => { pending = null; refresh(); }, wait);
  }

  function setConn(state) {
    conn.dataset.state = state;
    conn.textContent = CONN[state];
    conn.title = state === "polling" ? "The events stream is unavailable; polling every 3 s" : "";
  }

  function startLive() {
    setConn("connecting");
    stream = followEvents(id, {
      onEvent: () => soon(),
      onState: (st) => {
        if (!alive) return;
        setConn(st);
        if (st === "polling" && !poll) poll = setInterval(refresh, 3000);
        if (st === "ended") {
          // The stream ends with the sweep; if it ended for another reason (a server restart),
          // follow again.
          refresh().then(() => {
            if (alive && summary && !TERMINAL.has(summary.state)) startLive();
          });
        }
      },
    });
  }

  function stopLive() {
    if (stream) { stream.close(); stream = null; }
    if (poll) { clearInterval(poll); poll = null; }
  }

  async function cancel() {
    const ps = summary.plan.some((g) => g.release === "selected-only");
    const ok = await confirmDialog(`Cancel sweep “${summary.name}”? Pending trials are dropped and their reserved budget released; running trials stop and stay charged.` +
      (ps ? " Papernot–Steinke grids whose search has started stay charged in full and release nothing unless their search has already completed." : ""));
    if (!ok) return;
    try {
      const out = await api(`/sweeps/${id}/cancel`, { method: "POST" });
      // Papernot–Steinke grids are not counted (their number of runs is private): the
      // response states what the cancel means for them instead.
      const counted = out.cancelled_pending || out.stopped_running || !out.papernot_steinke;
      flash.replaceChildren(h("div", { class: "info", id: "cancel-result" },
        counted
          ? `Cancelled: ${out.cancelled_pending} pending trials dropped, ${out.stopped_running} running stopped, ε ${num(out.released_epsilon)} released.`
          : `Cancelled: ε ${num(out.released_epsilon)} released.`,
        out.papernot_steinke ? ` Papernot–Steinke grids: ${out.papernot_steinke}.` : ""));
      refresh();
    } catch (e) { showError(e); }
  }

  (async () => {
    showTab(tab());
    await refresh();
    if (!alive || !summary) return;
    if (!TERMINAL.has(summary.state)) startLive(); else setConn("static");
  })();

  return () => { alive = false; stopLive(); clearTimeout(pending); };
}

/** Each ε level's non-dominated points (higher x, lower y), sorted by x: ``[[level, points]]``. */
export function levelFronts(points) {
  const byLevel = new Map();
  for (const p of points) {
    if (!Number.isFinite(p.x) || !Number.isFinite(p.y)) continue;
    const key = p.epsilon_budget;
    if (!byLevel.has(key)) byLevel.set(key, []);
    byLevel.get(key).push(p);
  }
  return [...byLevel.entries()].sort((a, b) => a[0] - b[0]).map(([level, pts]) => [level,
    pts.filter((p) => !pts.some((q) => q !== p && q.x >= p.x && q.y <= p.y && (q.x > p.x || q.y < p.y)))
      .sort((a, b) => a.x - b.x)]);
}

/** ``from`` to ``to`` (ISO times) as "42 s", "3 min 5 s" or "2 h 10 min". */
export function duration(from, to) {
  const s = Math.max(0, Math.round((Date.parse(to) - Date.parse(from)) / 1000));
  if (!Number.isFinite(s)) return "–";
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}
