import { api, token } from "../api.js";
import { h, navigate, query } from "../ui.js";

/** Token sign-in: the token is checked with GET /api/v1/me and kept in sessionStorage. */
export function signinView(el, onSignedIn) {
  const input = h("input", { type: "password", id: "token", name: "token", autocomplete: "off",
    placeholder: "dps_…", required: true, size: 50 });
  const msg = h("p", { id: "signin-error", class: "error", hidden: true });
  const form = h("form", { class: "card narrow", id: "signin-form" },
    h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "Paste an API token. Create one on the server with ",
      h("code", {}, "dpsweep token create --name NAME"), ". It is kept for this browser tab only."),
    h("label", { for: "token" }, "Token"), input, msg,
    h("button", { type: "submit", class: "primary" }, "Sign in"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    msg.hidden = true;
    const tok = input.value.trim();
    try {
      await api("/me", { tok });
    } catch (e) {
      msg.textContent = e.status === 401
        ? "That token was not accepted: it is unknown or revoked."
        : `Could not check the token: ${e.message}`;
      msg.hidden = false;
      return;
    }
    token.set(tok);
    await onSignedIn();
    const next = query().get("next");
    navigate(next && next.startsWith("/") && !next.startsWith("//") ? next : "/sweeps");
  });
  el.append(form);
  input.focus();
  return null;
}
