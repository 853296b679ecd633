// The dashboard's only channel to the server: /api/v1 with the bearer token of this browser
// session. A 401 anywhere sends the user back to sign-in.

const KEY = "dpsweep.token";

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (t) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
    this.errors = this.problem.errors || [];
  }
}

let onUnauthorized = () => {};
export function setUnauthorizedHandler(fn) { onUnauthorized = fn; }

function headers(extra = {}, tok = token.get()) {
  const h = { Accept: "application/json", ...extra };
  if (tok) h.Authorization = `Bearer ${tok}`;
  return h;
}

async function failure(resp) {
  let problem = null;
  try { problem = await resp.json(); } catch { /* not JSON */ }
  return new ApiError(resp.status, problem);
}

/** fetch /api/v1 + path; JSON in and out. Throws ApiError on any non-2xx. */
export async function api(path, { method = "GET", body, contentType, extraHeaders, tok, signal } = {}) {
  const h = headers(extraHeaders, tok === undefined ? token.get() : tok);
  let payload = body;
  if (body !== undefined && contentType === undefined && !(body instanceof FormData)) {
    h["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  } else if (contentType) {
    h["Content-Type"] = contentType;
  }
  const resp = await fetch(`/api/v1${path}`, { method, headers: h, body: payload, signal });
  if (resp.status === 401 && tok === undefined) {
    onUnauthorized();
  }
  if (!resp.ok) throw await failure(resp);
  if (resp.status === 204) return null;
  return resp.json();
}

/**
 * GET /api/v1 + path as bytes (a model, a card as stored), with the bearer token: a bare link
 * cannot send it. Throws ApiError on any non-2xx.
 *
 * @returns {Promise<{blob: Blob, filename: string | null}>} the filename of Content-Disposition
 */
export async function apiBytes(path, { signal } = {}) {
  const resp = await fetch(`/api/v1${path}`, { headers: headers({ Accept: "*/*" }), signal });
  if (resp.status === 401) onUnauthorized();
  if (!resp.ok) throw await failure(resp);
  const cd = resp.headers.get("Content-Disposition") || "";
  return { blob: await resp.blob(), filename: dispositionName(cd) };
}

function dispositionName(cd) {
  const star = cd.match(/filename\*=UTF-8''([^;]+)/i);
  if (star) {
    try { return decodeURIComponent(star[1]); } catch { /* malformed: try the plain one */ }
  }
  const plain = cd.match(/filename="?([^";]+)"?/i);
  return plain ? plain[1] : null;
}

/** Every item of a cursor-paginated list, following next_cursor (onPage sees each page). */
export async function pages(path, { limit = 500, onPage, signal, max = 100000 } = {}) {
  const out = [];
  let cursor = null;
  const sep = path.includes("?") ? "&" : "?";
  do {
    const q = `${sep}limit=${limit}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
    const page = await api(path + q, { signal });
    out.push(...page.items);
    if (onPage) onPage(out, page);
    cursor = page.next_cursor;
  } while (cursor && out.length < max);
  return out;
}

/**
 * Follow a sweep's server-sent events. EventSource cannot send an Authorization header, so
 * the stream is read with fetch and parsed here. Reconnects with Last-Event-ID; after three
 * failures in a row it reports "polling" and stops (the caller polls instead).
 *
 * @returns {{close: () => void}}
 */
export function followEvents(sweepId, { onEvent, onState }) {
  const ctrl = new AbortController();
  let last = null;
  let failures = 0;
  let closed = false;

  async function once() {
    const h = headers({ Accept: "text/event-stream" });
    if (last) h["Last-Event-ID"] = last;
    const resp = await fetch(`/api/v1/sweeps/${sweepId}/events`, { headers: h, signal: ctrl.signal });
    if (resp.status === 401) { onUnauthorized(); throw new ApiError(401, null); }
    if (!resp.ok || !resp.body) throw await failure(resp);
    onState("live");
    failures = 0;
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
        const frame = buf.slice(0, cut);
        buf = buf.slice(cut).replace(/^\r?\n\r?\n/, "");
        const ev = { id: null, event: "message", data: "" };
        for (const line of frame.split(/\r?\n/)) {
          if (line.startsWith(":")) continue;
          const i = line.indexOf(":");
          const field = i < 0 ? line : line.slice(0, i);
          const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
          if (field === "id") ev.id = val;
          else if (field === "event") ev.event = val;
          else if (field === "data") ev.data += (ev.data ? "\n" : "") + val;
        }
        if (ev.id) last = ev.id;
        if (ev.data) {
          try { onEvent(ev.event, JSON.parse(ev.data), ev.id); } catch (e) { console.error(e); }
        }
      }
    }
  }

  (async () => {
    while (!closed) {
      try {
        await once();
        // The server ends the stream when the sweep ends.
        if (!closed) onState("ended");
        return;
      } catch (e) {
        if (closed || e.name === "AbortError") return;
        if (e instanceof ApiError && e.status < 500 && e.status !== 429) { onState("polling"); return; }
        failures += 1;
        if (failures >= 3) { onState("polling"); return; }
        onState("reconnecting");
        await new Promise((r) => setTimeout(r, 1000 * 2 ** failures));
      }
    }
  })();
  return { close() { closed = true; ctrl.abort(); } };
}
