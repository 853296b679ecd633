import { api } from "../api.js";
import { badge, h, num, plot, when } from "../ui.js";
import { auditsPanel } from "./audits.js";
import { modelPanel } from "./model.js";

/** One trial: learning curves, C_t and learning-rate trajectories, reliability, ledger, and
 * its kept model (download and model card). */
export function trialView(el, id) {
  let alive = true;
  (async () => {
    let t;
    let hist;
    try {
      [t, hist] = await Promise.all([api(`/trials/${id}`), api(`/trials/${id}/metrics`)]);
    } catch (e) {
      if (!alive) return;
      el.replaceChildren(h("h1", {}, e.status === 404 ? "Trial not found" : "Could not load the trial"),
        h("p", {}, e.message), h("p", {}, h("a", { href: "/sweeps" }, "All sweeps")));
      return;
    }
    if (!alive) return;
    render(t, hist.metrics);
  })();

  function render(t, metrics) {
    const curves = h("div", { id: "curves-chart", class: "chart" });
    const loss = h("div", { id: "loss-chart", class: "chart" });
    const traj = h("div", { id: "traj-chart", class: "chart" });
    const diag = h("div", { id: "diagnostics-chart", class: "chart" });
    const rel = h("div", { id: "reliability-chart", class: "chart" });
    const p = t.privacy;
    // A Papernot–Steinke grid's released trial has no position (its run index would bound the
    // private number of runs): it is "the selected trial" of its grid.
    const ps = t.planned?.accounting === "papernot-steinke";
    // "trial N" numbers the sweep's trials; the ledger's "run j of grid G" counts the charges
    // made in its grid, in the order they were made: the header names both, so they agree.
    const run = (p.charges || []).map((c) => /^run (\d+) of grid/.exec(c.note || "")).find(Boolean);
    const label = ps ? "selected trial" : `trial ${t.number}${run ? ` (run ${run[1]} of its grid)` : ""}`;
    el.replaceChildren(
      h("p", { class: "crumbs" }, h("a", { href: "/sweeps" }, "Sweeps"), " / ",
        h("a", { href: `/sweeps/${t.sweep}`, id: "back-to-sweep" }, t.sweep.slice(0, 12)), ` / trial ${label}`),
      h("div", { class: "row" }, h("h1", {}, `${t.arm} · ε ${num(t.epsilon_budget)} · ${label}`), badge(t.state)),
      h("p", { class: "muted" }, `strategy ${t.strategy} · seed ${t.seed} · attempts ${t.attempts}`,
        t.worker ? ` · worker ${t.worker}` : "", t.started_at ? ` · started ${when(t.started_at)}` : "",
        t.train_seconds ? ` · ${num(t.train_seconds, 3)} s training` : ""),
      t.randomness === "reproducible" ? h("div", { class: "warning", id: "randomness-warning" },
        h("strong", {}, "Reproducible mode: "),
        "batches and noise came from the public seed; not private against anyone who knows the seed") : "",
      t.error ? h("div", { class: "error", id: "trial-error" }, h("strong", {}, "Error: "), h("pre", {}, t.error)) : "",
      h("div", { class: "charts" },
        h("div", { class: "card" }, h("h2", {}, "Learning curve"), curves),
        h("div", { class: "card", id: "diagnostics-card" }, h("h2", {}, "Clipping diagnostics (evaluation split)"), diag),
        h("div", { class: "card" }, h("h2", {}, "Loss"), loss),
        h("div", { class: "card" }, h("h2", {}, "Clipping norm Cₜ and learning rate"), traj),
        h("div", { class: "card" }, h("h2", {}, "Reliability diagram"), rel)),
      h("div", { class: "charts" },
        h("div", { class: "card" }, h("h2", {}, "Parameters"), kv({ ...t.params, seed: t.seed })),
        h("div", { class: "card" }, h("h2", {}, "Metrics at the best checkpoint"),
          kv({ ...t.metrics, "best step": t.best_step, steps: t.steps, "median step ms": t.step_time_ms_median })),
        h("div", { class: "card" }, h("h2", {}, "Privacy"),
          kv({
            "σ (planned)": t.planned?.noise_multiplier, "σ gradient": t.planned?.gradient_noise_multiplier,
            "sample rate q": t.planned?.sample_rate, steps: t.planned?.steps,
            "single-run ε (this run alone)": p.single_run_epsilon, "ε charged": p.epsilon_charged, "δ charged": p.delta_charged,
            accountant: t.accountant || t.planned?.accountant, accounting: t.planned?.accounting,
            randomness: t.randomness,
          }),
          h("h3", {}, "Ledger"),
          p.charges.length ? h("table", { class: "grid compact", id: "ledger-table" },
            h("thead", {}, h("tr", {}, ["kind", "ε", "δ", "at", "note"].map((c) => h("th", {}, c)))),
            h("tbody", {}, p.charges.map((c) => h("tr", {},
              h("td", {}, c.kind), h("td", {}, num(c.epsilon)), h("td", {}, num(c.delta)),
              h("td", {}, when(c.at)), h("td", {}, c.note || "")))))
            : h("p", { class: "muted" }, "No charges: this trial never started."),
          ps ? h("p", { class: "muted small" }, "Papernot–Steinke: the grid is charged once, at its first run, for its whole search; the number of runs is private.") : "")),
      modelPanel(t),
      auditsPanel({ trial: t.id || id, canStart: t.state === "done" }));

    const series = (name) => ({ x: (metrics[name] || []).map((m) => m.step), y: (metrics[name] || []).map((m) => m.value) });
    drawCurves(curves, metrics, series);
    const diagnostics = Object.keys(metrics).filter((k) => !CURVE_METRICS.has(k) && k !== "loss");
    if (diagnostics.length) {
      plot(diag, diagnostics.map((k) => ({ type: "scatter", mode: "lines+markers", name: k, ...series(k) })),
        { xaxis: { title: { text: "step" } }, legend: { orientation: "h", x: 0, y: 1.15 } });
    } else {
      diag.closest(".card").hidden = true;
    }
    // From zero: a loss axis cut to its data's range turns 0.265 -> 0.29 into a cliff.
    plot(loss, [{ type: "scatter", mode: "lines+markers", name: "loss", ...series("loss") }],
      { xaxis: { title: { text: "step" } }, yaxis: { title: { text: "eval loss" }, rangemode: "tozero" },
        showlegend: false });

    const tr = t.trajectories || {};
    const steps = tr.step || [];
    // Two stacked panels on one step axis (C_t above, the learning rate below), each with its
    // own colour, line style and axis title in that colour: never two lines at one height.
    plot(traj, [
      { type: "scatter", mode: "lines", name: "Cₜ (clipping threshold)", dpRole: "clip", x: steps, y: tr.clip || [],
        yaxis: "y", line: { color: TRAJ.clip, width: 2 },
        hovertemplate: "step %{x}<br>Cₜ %{y:.4g}<extra></extra>" },
      { type: "scatter", mode: "lines", name: "learning rate", dpRole: "lr", x: steps, y: tr.lr || [],
        yaxis: "y2", line: { color: TRAJ.lr, width: 2, dash: "dash" },
        hovertemplate: "step %{x}<br>lr %{y:.4g}<extra></extra>" },
    ], {
      xaxis: { title: { text: "step" }, anchor: "y2" },
      yaxis: { domain: [0.56, 1], title: { text: "Cₜ (clip)", font: { color: TRAJ.clip } },
        tickfont: { color: TRAJ.clip }, linecolor: TRAJ.clip, showline: true, rangemode: "tozero" },
      yaxis2: { domain: [0, 0.44], title: { text: "learning rate", font: { color: TRAJ.lr } },
        tickfont: { color: TRAJ.lr }, linecolor: TRAJ.lr, showline: true, rangemode: "tozero" },
      legend: { orientation: "h", x: 0, y: 1.12 },
      margin: { l: 70, r: 20, t: 40, b: 50 },
      hovermode: "x",
    });

    const bins = (t.reliability || []).filter((b) => b.count > 0);
    if (!bins.length) {
      // No empty diagram: the reason, in its place.
      const why = t.state === "done"
        ? "No reliability diagram: this trial released no reliability bins (DP evaluation releases a noisy accuracy only)."
        : "No reliability diagram yet: the trial has not finished.";
      rel.classList.remove("chart");
      rel.replaceChildren(h("div", { class: "info", id: "reliability-reason" }, why));
      return;
    }
    plot(rel, [
      { type: "bar", name: "accuracy", x: bins.map((b) => (b.lower + b.upper) / 2), y: bins.map((b) => b.accuracy),
        width: bins.map((b) => b.upper - b.lower), marker: { color: "#1f77b4", line: { color: "#fff", width: 1 } },
        customdata: bins.map((b) => b.count),
        hovertemplate: "confidence %{x:.2f}<br>accuracy %{y:.3f}<br>%{customdata} examples<extra></extra>" },
      { type: "scatter", mode: "markers", name: "mean confidence", x: bins.map((b) => b.confidence),
        y: bins.map((b) => b.accuracy), marker: { color: "#d62728", size: 6 } },
      { type: "scatter", mode: "lines", name: "perfect calibration", x: [0, 1], y: [0, 1],
        line: { dash: "dash", color: "#888" }, hoverinfo: "skip" },
    ], {
      xaxis: { title: { text: "confidence" }, range: [0, 1] }, yaxis: { title: { text: "accuracy" }, range: [0, 1] },
      bargap: 0,
    });
  }

  return () => { alive = false; };
}

// The learning curve's two panels: the objective above, calibration below (never one axis for
// an accuracy and an ECE); every other evaluation metric is a clipping diagnostic.
const CURVE_METRICS = new Set(["accuracy", "mse", "ece", "mce"]);

function drawCurves(el, metrics, series) {
  const objective = ["accuracy", "mse"].find((k) => k in metrics);
  const traces = [];
  if (objective) {
    traces.push({ type: "scatter", mode: "lines+markers", name: objective, dpRole: "objective", ...series(objective),
      yaxis: "y", line: { color: TRAJ.clip, width: 2 } });
  }
  if ("ece" in metrics) {
    traces.push({ type: "scatter", mode: "lines+markers", name: "ECE", dpRole: "ece", ...series("ece"),
      yaxis: "y2", line: { color: TRAJ.lr, width: 2, dash: "dash" } });
  }
  plot(el, traces, {
    xaxis: { title: { text: "step" }, anchor: "y2" },
    yaxis: { domain: [0.56, 1], title: { text: objective || "", font: { color: TRAJ.clip } },
      tickfont: { color: TRAJ.clip }, ...(objective === "accuracy" ? { range: [0, 1] } : { rangemode: "tozero" }) },
    yaxis2: { domain: [0, 0.44], title: { text: "ECE", font: { color: TRAJ.lr } }, tickfont: { color: TRAJ.lr },
      rangemode: "tozero" },
    legend: { orientation: "h", x: 0, y: 1.12 },
    margin: { l: 70, r: 20, t: 40, b: 50 },
  });
}

// The trajectories' colours: distinct from each other (and colour-blind safe: blue, orange).
const TRAJ = { clip: "#1f77b4", lr: "#ff7f0e" };

function kv(obj) {
  return h("dl", { class: "kv" }, Object.entries(obj).filter(([, v]) => v !== undefined).map(([k, v]) =>
    [h("dt", {}, k), h("dd", {}, typeof v === "number" ? num(v) : v ?? "–")]));
}
