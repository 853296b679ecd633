// The dashboard's entry point: sign-in state, client-side routing and the page views.
// Routes mirror the server's page paths (api/dashboard/__init__.py), so every view has a URL.

import { api, setUnauthorizedHandler, token } from "./api.js";
import { h, navigate } from "./ui.js";
import { datasetsView } from "./views/datasets.js";
import { signinView } from "./views/signin.js";
import { submitView } from "./views/submit.js";
import { sweepView } from "./views/sweep.js";
import { sweepsView } from "./views/sweeps.js";
import { trialView } from "./views/trial.js";

const view = document.getElementById("view");
let current = null; // the mounted view's cleanup
export const session = { me: null };

const ROUTES = [
  [/^\/(sweeps\/?)?$/, "sweeps", () => sweepsView],
  [/^\/sweeps\/([^/]+)$/, "sweeps", (m) => (el) => sweepView(el, m[1])],
  [/^\/trials\/([^/]+)$/, "sweeps", (m) => (el) => trialView(el, m[1])],
  [/^\/datasets$/, "datasets", () => datasetsView],
  [/^\/submit$/, "submit", () => submitView],
];

function signinUrl() {
  const next = location.pathname === "/signin" ? "/sweeps" : location.pathname + location.search;
  return `/signin?next=${encodeURIComponent(next)}`;
}

setUnauthorizedHandler(() => {
  token.clear();
  session.me = null;
  if (location.pathname !== "/signin") navigate(signinUrl());
});

async function whoAmI() {
  if (session.me) return session.me;
  try {
    session.me = await api("/me");
  } catch (e) {
    if (e.status === 401) return null;
    throw e;
  }
  return session.me;
}

function showWho() {
  const who = document.getElementById("who");
  const out = document.getElementById("signout");
  const me = session.me;
  if (!me) { who.textContent = ""; out.hidden = true; return; }
  who.textContent = me.auth ? `${me.name}${me.admin ? " (admin)" : ""}` : "local (auth off)";
  out.hidden = !me.auth;
}

let seq = 0;

async function route() {
  const mine = ++seq;
  if (current) { try { current(); } catch (e) { console.error(e); } current = null; }
  view.replaceChildren();
  const path = location.pathname;
  if (path === "/signin") {
    showWho();
    current = signinView(view, async () => { session.me = null; await whoAmI(); showWho(); });
    markNav(null);
    return;
  }
  let me;
  try { me = await whoAmI(); } catch (e) {
    view.replaceChildren(h("div", { class: "error" }, `The server did not answer: ${e.message}`));
    return;
  }
  if (mine !== seq) return; // a newer navigation took over while we waited
  if (!me) { navigate(signinUrl()); return; }
  showWho();
  for (const [re, nav, make] of ROUTES) {
    const m = path.match(re);
    if (m) {
      markNav(nav);
      current = make(m)(view) || null;
      return;
    }
  }
  view.replaceChildren(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "/sweeps" }, "All sweeps")));
}

function markNav(name) {
  for (const a of document.querySelectorAll("[data-nav]")) {
    a.classList.toggle("active", a.dataset.nav === name);
  }
}

// Same-origin links navigate inside the page.
document.addEventListener("click", (ev) => {
  const a = ev.target.closest("a[href]");
  if (!a || a.target || a.hasAttribute("download") || ev.ctrlKey || ev.metaKey || ev.shiftKey) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || url.pathname.startsWith("/api/") || url.pathname.startsWith("/static/")) return;
  ev.preventDefault();
  navigate(url.pathname + url.search);
});
document.getElementById("signout").addEventListener("click", () => {
  token.clear();
  session.me = null;
  navigate("/signin");
});
window.addEventListener("popstate", route);
window.addEventListener("dpsweep:navigate", route);
route();
