import { api, pages } from "../api.js";
import { badge, h, num, when } from "../ui.js";

// Canary audits (issue 38): an empirical lower bound on a run's ε beside the ε it claims.
// The trial page lists that trial's audits and can start one; the sweep page lists its
// sweep's audits. A running audit is polled (GET /audits/{id}) until it ends.

const POLL_MS = 1500;

const EXPLAIN = "A canary audit trains the configuration once with m canaries and bounds ε from below, "
  + "for any mechanism, at 95 % confidence. An honest run's bound exceeds its claim with probability "
  + "at most 5 %: a bound above the claimed ε suggests repeating the audit on public data before calling it a bug. "
  + "A bound below the claim is expected and proves nothing about it: it is not an upper bound. "
  + "The Gaussian estimate, shown where the scores pass a normality test, assumes Gaussian scores and is not a bound.";

/**
 * The "Audits" panel: `{trial}` (with an "Audit this trial" form when `canStart`) or `{sweep}`.
 * Polling stops once the panel leaves the page.
 */
export function auditsPanel({ trial = null, sweep = null, canStart = false } = {}) {
  const list = h("ul", { class: "audits", id: "audits-list" });
  const status = h("p", { class: "muted small", id: "audits-status" }, "Loading audits…");
  const flash = h("div", { id: "audit-flash" });
  const panel = h("div", { class: "card", id: "audits-panel" },
    h("h2", {}, "Audits"),
    h("p", { class: "muted small", id: "audits-explain" }, EXPLAIN),
    canStart && trial ? form() : "", flash, status, list);
  const rows = new Map(); // audit id -> its <li>
  const polling = new Set();

  const path = trial ? `/audits?trial=${encodeURIComponent(trial)}` : `/audits?sweep=${encodeURIComponent(sweep)}`;
  pages(path, { limit: 100 }).then((items) => {
    for (const a of items) show(a, false);
    updateStatus();
  }, (e) => {
    status.replaceChildren(`Could not load the audits: ${e.message}`);
  });

  function updateStatus() {
    status.textContent = rows.size ? "" : (trial ? "No audits of this trial yet." : "No audits of this sweep's trials yet.");
    status.hidden = rows.size > 0;
  }

  function show(a, first) {
    const li = row(a);
    const old = rows.get(a.id);
    if (old) old.replaceWith(li);
    else if (first) list.prepend(li);
    else list.append(li);
    rows.set(a.id, li);
    if (a.state === "running" || a.state === "pending" || a.state === "queued") follow(a.id);
  }

  function follow(id) {
    if (polling.has(id)) return;
    polling.add(id);
    (async () => {
      try {
        for (;;) {
          await new Promise((r) => setTimeout(r, POLL_MS));
          if (!panel.isConnected) return;
          const a = await api(`/audits/${encodeURIComponent(id)}`);
          if (!panel.isConnected) return;
          if (a.state !== "running" && a.state !== "pending" && a.state !== "queued") {
            polling.delete(id);
            show(a, false);
            return;
          }
        }
      } catch (e) {
        polling.delete(id);
        if (panel.isConnected) flash.replaceChildren(problem(e));
      }
    })();
  }

  function form() {
    const setting = h("select", { id: "audit-setting", name: "setting" },
      h("option", { value: "white-box", selected: true }, "white-box"),
      h("option", { value: "black-box" }, "black-box"));
    const canaries = h("input", { type: "number", id: "audit-canaries", name: "canaries", min: "2", max: "100000", step: "1", value: "1000" });
    const button = h("button", { type: "submit", id: "audit-start" }, "Audit this trial");
    const f = h("form", { class: "row audit-form", id: "audit-form", novalidate: true },
      h("label", { for: "audit-setting" }, "Setting"), setting,
      h("label", { for: "audit-canaries" }, "Canaries"), canaries, button);
    // An audit of private data spends its owner's budget: its cost is quoted first
    // (POST /audits/quote, nothing reserved) and the audit sent with confirm: true only once
    // the user has said yes. Public data charges nothing and starts at once.
    f.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      flash.replaceChildren();
      button.disabled = true;
      const body = { trial, setting: setting.value, canaries: Number(canaries.value) };
      try {
        const cost = await api("/audits/quote", { method: "POST", body });
        if (cost.charged) {
          flash.replaceChildren(confirmBox(cost, body));
          return;
        }
        await start(body);
      } catch (e) {
        flash.replaceChildren(problem(e));
      } finally {
        button.disabled = false;
      }
    });
    return f;
  }

  async function start(body) {
    const a = await api("/audits", { method: "POST", body: { ...body, confirm: true } });
    show(a, true);
    updateStatus();
  }

  /** The charge, in the server's words, and the two answers: charge it, or not. */
  function confirmBox(cost, body) {
    const yes = h("button", { type: "button", id: "audit-confirm" }, `Charge ε ${num(cost.epsilon, 4)} and audit`);
    const no = h("button", { type: "button", id: "audit-cancel" }, "Cancel");
    const box = h("div", { class: "audit-confirm", role: "alertdialog", id: "audit-confirm-box" },
      h("strong", {}, "This audit spends privacy budget. "),
      h("span", { id: "audit-cost" }, cost.text),
      cost.fits ? "" : h("div", { class: "error small" }, "The cap does not leave enough: it will be refused."),
      h("div", { class: "row" }, yes, no));
    no.addEventListener("click", () => flash.replaceChildren());
    yes.addEventListener("click", async () => {
      yes.disabled = true;
      no.disabled = true;
      try {
        await start(body);
        flash.replaceChildren();
      } catch (e) {
        flash.replaceChildren(problem(e));
      }
    });
    return box;
  }

  return panel;
}

/** A refusal as the server worded it (problem+json detail; an analyst's 403 included). */
function problem(e) {
  return h("div", { class: "error", role: "alert", id: "audit-error" },
    h("strong", {}, e.problem?.title || "Error"), " ", e.message);
}

function row(a) {
  const r = a.result || {};
  const req = a.request || {};
  let body;
  if (a.state === "succeeded" && a.result) {
    const conf = typeof r.confidence === "number" ? `${num(100 * r.confidence, 3)} %` : "95 %";
    const low = r.epsilon_lower_bound;
    const est = r.epsilon_estimate;
    // An audit of a dataset with a privacy unit audits ε per unit (a person, all their rows).
    const per = r.privacy_unit && r.privacy_unit !== "example" ? ` per ${r.privacy_unit}` : "";
    body = h("span", { class: "audit-result" },
      h("strong", { class: "audit-bound" }, low === null || low === undefined ? "ε ≥ – (no bound)" : `ε ≥ ${num(low)}${per}`),
      ` (${conf} lower bound, any mechanism) · claimed ε = ${num(r.epsilon_claimed)}${per}`,
      typeof est === "number"
        ? h("span", { class: "audit-estimate", title: r.estimate_assumption || "" },
          ` · Gaussian estimate ε ≈ ${num(est)}${per} (not a bound)`)
        : "",
      typeof r.claim_refuted === "boolean"
        ? h("span", { class: "audit-curve" },
          ` · claimed curve ${r.claim_refuted ? "refuted" : "not refuted"}`
          + (typeof r.claim_p_value === "number" ? ` (p = ${num(r.claim_p_value, 2)})` : "")
          + (typeof r.noise_scale_upper_bound === "number"
            ? ` · noise at most ${num(r.noise_scale_upper_bound)} × planned` : ""))
        : "",
      ` · ${r.setting} · ${r.canaries} canaries`,
      typeof r.seconds === "number" ? ` · ${num(r.seconds, 3)} s` : "",
      r.strategy ? h("span", { class: "muted" }, ` · ${r.strategy}${r.engine_path ? ` (${r.engine_path})` : ""}`) : "",
      r.summary ? h("div", { class: "audit-summary" }, h("strong", {}, "Verdict: "), r.summary) : "",
      r.verdict ? h("div", { class: "audit-verdict small" }, r.verdict) : "");
  } else if (a.state === "failed") {
    body = h("span", { class: "audit-failed" }, a.error || "the audit failed");
  } else {
    body = h("span", { class: "muted" },
      `${req.setting || "white-box"} · ${req.canaries ?? 1000} canaries · training…`);
  }
  // The server's verdict decides (result.exceeds_claim); its sentence is shown as written.
  const above = a.state === "succeeded" && (r.exceeds_claim === true || r.claim_refuted === true);
  const suspect = a.state === "succeeded" && !above && r.estimate_exceeds_claim === true;
  const cls = `audit${above ? " audit-above" : ""}${suspect ? " audit-suspect" : ""}`;
  return h("li", { class: cls, "data-audit": a.id, "data-state": a.state },
    badge(a.state), " ", body,
    h("span", { class: "muted small" }, ` · ${when(a.created_at)}`,
      a.trial_id ? " · trial " : "",
      a.trial_id ? h("a", { href: `/trials/${a.trial_id}` }, a.trial_id.slice(0, 12)) : ""));
}
