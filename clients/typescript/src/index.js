// The tidemark client (spec section 19): typed calls over HTTP (`fetch`, no other runtime
// dependency) and the loops every program that talks to tidemark otherwise writes by hand.
// Types: ./index.d.ts.

/** A problem the server answered, typed by its stable `code`. */
export class ApiError extends Error {
  constructor(status, problem, retryAfterMs) {
    super(`${status} ${problem.code ?? `http_${status}`}: ${problem.detail ?? ""}`);
    this.name = "ApiError";
    this.status = status;
    this.problem = problem;
    this.code = problem.code ?? `http_${status}`;
    this.detail = problem.detail ?? "";
    this.field = problem.field;
    this.retryAfterMs = retryAfterMs;
    this.retryable = status >= 500 || status === 408 || status === 429;
  }
}

/** No answer: the connection failed or was lost (the request may or may not have landed). */
export class TransportError extends Error {
  constructor(cause) {
    super(`transport: ${cause?.message ?? cause}`);
    this.name = "TransportError";
    this.cause = cause;
    this.retryable = true;
  }
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
  });

/** A jittered exponential wait (ms), from the upper half so clients restarted together spread. */
function backoff(attempt, base = 100, cap = 10_000) {
  const exp = Math.min(cap, base * 2 ** Math.min(attempt, 16));
  return exp / 2 + Math.random() * (exp / 2);
}

function retryAfterMs(resp) {
  const v = resp.headers.get("retry-after");
  if (!v) return undefined;
  if (/^\s*\d+\s*$/.test(v)) return Number(v) * 1000;
  const at = Date.parse(v);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

async function answer(resp) {
  const text = await resp.text();
  if (resp.ok) return text ? JSON.parse(text) : null;
  let problem;
  try { problem = JSON.parse(text); } catch { problem = { detail: text.slice(0, 512) }; }
  throw new ApiError(resp.status, problem ?? {}, retryAfterMs(resp));
}

/** A UUIDv7 (time-ordered). */
export function uuid7() {
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  let ms = BigInt(Date.now());
  for (let i = 5; i >= 0; i--) { b[i] = Number(ms & 0xffn); ms >>= 8n; }
  b[6] = (b[6] & 0x0f) | 0x70;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

const seg = (id) => encodeURIComponent(id).replace(/%3A/gi, ":");

export class Client {
  /**
   * @param {string} baseUrl `http://host:port`
   * @param {string} [token] sent as `Authorization: Bearer`
   */
  constructor(baseUrl, token, { attempts = 8, maxRetryAfterMs = 60_000 } = {}) {
    if (!/^https?:\/\//.test(baseUrl)) {
      throw new TypeError(`the base URL must start with http:// or https:// (got ${baseUrl})`);
    }
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.token = token;
    this.attempts = Math.max(1, attempts);
    this.maxRetryAfterMs = maxRetryAfterMs;
  }

  headers(extra = {}) {
    return this.token ? { authorization: `Bearer ${this.token}`, ...extra } : extra;
  }

  async call(method, path, { query, body, signal } = {}) {
    const url = new URL(this.baseUrl + path);
    for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined && v !== null) url.searchParams.set(k, String(v));
    let resp;
    try {
      resp = await fetch(url, {
        method,
        headers: this.headers(body !== undefined ? { "content-type": "application/json" } : {}),
        body: body !== undefined ? JSON.stringify(body) : undefined,
        signal,
      });
    } catch (e) {
      throw new TransportError(e);
    }
    return answer(resp);
  }

  /**
   * Append events atomically; each without an `event_id` is given a UUIDv7 first. A lost
   * answer, a 5xx or a 429 (after its Retry-After) is retried with the same ids: a retry of a
   * batch that landed is answered `duplicate: true` with the original seqs.
   */
  async append(events) {
    const withIds = events.map((e) => (e.event_id ? e : { ...e, event_id: uuid7() }));
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.call("POST", "/v1/events", { body: { events: withIds } });
      } catch (e) {
        if (!e.retryable || attempt >= this.attempts) throw e;
        let wait = backoff(attempt - 1, 100, 5000);
        if (e instanceof ApiError && e.retryAfterMs !== undefined) {
          if (e.retryAfterMs > this.maxRetryAfterMs) throw e;
          wait = Math.max(wait, e.retryAfterMs);
        }
        await sleep(wait);
      }
    }
  }

  events(afterSequence = 0, { stream, subject, limit = 100 } = {}) {
    return this.call("GET", "/v1/events", { query: { after_sequence: afterSequence, stream, subject, limit } });
  }

  /**
   * The events after `afterSequence`, live: after any failure it reconnects with
   * Last-Event-ID (jittered backoff) and yields each seq once, in order. Ends when `signal`
   * aborts, when the caller stops iterating, or with a problem no retry fixes (400, 401, 403,
   * 410), thrown.
   */
  async *stream(afterSequence = 0, { stream, subject, type, signal } = {}) {
    let last = afterSequence;
    let failures = 0;
    let first = true;
    while (!signal?.aborted) {
      const url = new URL(this.baseUrl + "/v1/events/stream");
      url.searchParams.set("after_sequence", String(last));
      if (stream) url.searchParams.set("stream", stream);
      if (subject) url.searchParams.set("subject", subject);
      if (type) url.searchParams.set("type", type);
      const headers = this.headers({ accept: "text/event-stream" });
      if (!first) headers["last-event-id"] = String(last);
      first = false;
      const before = last;
      let asked;
      const ac = new AbortController();
      const onAbort = () => ac.abort();
      signal?.addEventListener("abort", onAbort, { once: true });
      try {
        const resp = await fetch(url, { headers, signal: ac.signal });
        if (!resp.ok) {
          try { await answer(resp); } catch (e) {
            if ([400, 401, 403, 410].includes(e.status)) throw e;
            asked = e.retryAfterMs;
          }
        } else {
          const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
          let buf = "";
          let data = [];
          try {
            for (;;) {
              const { value, done } = await reader.read();
              if (done) break;
              buf += value;
              let nl;
              while ((nl = buf.indexOf("\n")) >= 0) {
                const line = buf.slice(0, nl).replace(/\r$/, "");
                buf = buf.slice(nl + 1);
                if (line === "") {
                  if (data.length === 0) continue;
                  const ev = JSON.parse(data.join("\n"));
                  data = [];
                  if (ev.seq <= last) continue;
                  last = ev.seq;
                  yield ev;
                } else if (line.startsWith("data:")) {
                  const v = line.slice(5);
                  data.push(v.startsWith(" ") ? v.slice(1) : v);
                }
              }
            }
          } finally {
            ac.abort();
          }
        }
      } catch (e) {
        if (e instanceof ApiError) throw e;
        // A lost connection (or the caller's abort): reconnect, or end below.
      } finally {
        signal?.removeEventListener("abort", onAbort);
      }
      if (last > before) failures = 0;
      let wait = backoff(failures++, 100, 10_000);
      if (asked !== undefined) wait = Math.max(wait, asked);
      await sleep(wait, signal);
    }
  }

  async cursor(consumerId, streamName, subjectId = "") {
    const page = await this.call("GET", "/v1/cursors", {
      query: { consumer_id: consumerId, stream_name: streamName, subject_id: subjectId },
    });
    return page.cursors[0];
  }

  advanceCursor(consumerId, streamName, lastSequence, deliveryId, { subjectId = "", expectedSequence } = {}) {
    return this.call("POST", "/v1/cursors/advance", {
      body: {
        consumer_id: consumerId, stream_name: streamName, subject_id: subjectId,
        last_sequence: lastSequence, delivery_id: deliveryId, expected_sequence: expectedSequence,
      },
    });
  }

  async claim(sink, owner, limit = 10, leaseMs = 30_000) {
    return (await this.call("POST", "/v1/deliveries/claim", { body: { sink, owner, limit, lease_ms: leaseMs } })).deliveries;
  }

  async complete(owner, ids) {
    return (await this.call("POST", "/v1/deliveries/complete", { body: { owner, deliveries: ids.map((id) => ({ id })) } })).results;
  }

  fail(id, owner, failure) {
    return this.call("POST", `/v1/deliveries/${seg(id)}/fail`, {
      body: {
        owner, error_code: failure.code, error: failure.message,
        retryable: failure.retryable ?? true, retry_after_ms: failure.retryAfterMs,
      },
    });
  }

  extend(id, owner, leaseMs) {
    return this.call("POST", `/v1/deliveries/${seg(id)}/extend`, { body: { owner, lease_ms: leaseMs } });
  }

  delivery(id) {
    return this.call("GET", `/v1/deliveries/${seg(id)}`);
  }

  /** A bridge's cursor loop (see {@link Consumer}). */
  consumer(consumerId, streamName, options = {}) {
    return new Consumer(this, consumerId, streamName, options);
  }

  /** A sink's claim loop (see {@link Worker}). */
  worker(sink, owner, options = {}) {
    return new Worker(this, sink, owner, options);
  }
}

/**
 * Each page after the stored cursor to the handler; the cursor advanced only after it
 * resolves. After a crash it resumes from the stored cursor: every event handled at least
 * once, in seq order.
 */
export class Consumer {
  constructor(client, consumerId, streamName, { subjectId = "", page = 100, idleMs = 250 } = {}) {
    Object.assign(this, { client, consumerId, streamName, subjectId, page, idleMs });
  }

  async run(handler, { signal } = {}) {
    let at;
    let failures = 0;
    while (!signal?.aborted) {
      try {
        if (at === undefined) at = (await this.client.cursor(this.consumerId, this.streamName, this.subjectId)).last_sequence;
        const { events } = await this.client.events(at, { stream: this.streamName, subject: this.subjectId || undefined, limit: this.page });
        if (events.length === 0) { failures = 0; await sleep(this.idleMs, signal); continue; }
        await handler(events);
        const top = events[events.length - 1].seq;
        try {
          at = (await this.client.advanceCursor(this.consumerId, this.streamName, top, `client:${top}`, {
            subjectId: this.subjectId, expectedSequence: at,
          })).last_sequence;
        } catch (e) {
          if (!(e instanceof ApiError) || e.status !== 409) throw e;
          at = undefined;
        }
        failures = 0;
      } catch (e) {
        if (!(e instanceof ApiError || e instanceof TransportError)) throw e;
        if (e instanceof ApiError && !e.retryable) throw e;
        at = undefined;
        await sleep(backoff(failures++), signal);
      }
    }
    return at ?? 0;
  }
}

/**
 * Claim up to `limit`, extend the leases while the handler runs, complete (in one batch) or
 * fail with its outcome; when `signal` aborts, claim no more and hand the unstarted rows back
 * (failed retryable with no wait, code `worker_stopped`).
 */
export class Worker {
  constructor(client, sink, owner, { limit = 10, leaseMs = 30_000, idleMs = 250 } = {}) {
    Object.assign(this, { client, sink, owner, limit, leaseMs, idleMs });
  }

  async run(handler, { signal } = {}) {
    const report = { completed: 0, failed: 0, released: 0, refused: 0 };
    let failures = 0;
    while (!signal?.aborted) {
      let rows;
      try {
        rows = await this.client.claim(this.sink, this.owner, this.limit, this.leaseMs);
        failures = 0;
      } catch (e) {
        if (!e.retryable) throw e;
        await sleep(backoff(failures++), signal);
        continue;
      }
      if (rows.length === 0) { await sleep(this.idleMs, signal); continue; }
      const held = new Set(rows.map((r) => r.id));
      const beat = setInterval(() => {
        for (const id of held) this.client.extend(id, this.owner, this.leaseMs).catch(() => {});
      }, Math.max(50, this.leaseMs / 3));
      const done = [];
      const rest = [...rows];
      try {
        while (rest.length) {
          const d = rest.shift();
          const out = await handler(d);
          if (out && out.failed) {
            try { await this.client.fail(d.id, this.owner, out); report.failed++; } catch { report.refused++; }
            held.delete(d.id);
          } else {
            done.push(d.id);
          }
          if (signal?.aborted) break;
        }
        for (const d of rest) {
          try {
            await this.client.fail(d.id, this.owner, {
              code: "worker_stopped", message: "the worker stopped before it started this delivery",
              retryable: true, retryAfterMs: 0,
            });
            report.released++;
          } catch { report.refused++; }
          held.delete(d.id);
        }
        if (done.length) {
          for (const r of await this.client.complete(this.owner, done)) {
            if (r.status === 200) report.completed++; else report.refused++;
          }
        }
      } finally {
        clearInterval(beat);
      }
    }
    return report;
  }
}

/** A worker handler's outcome: delivered. */
export const done = () => ({ failed: false });

/** A worker handler's outcome: not delivered; `retryable: false` parks the delivery. */
export const failed = (code, message, { retryable = true, retryAfterMs } = {}) =>
  ({ failed: true, code, message, retryable, retryAfterMs });

// Webhooks (Standard Webhooks): HMAC-SHA256 of "<id>.<timestamp>.<body>", `v1,<base64>`,
// several space-separated during a rotation; a `whsec_<base64>` secret's key is the decoded
// bytes, any other secret's its UTF-8 bytes.

export class WebhookVerificationError extends Error {
  constructor(message) { super(message); this.name = "WebhookVerificationError"; }
}

function keyOf(secret) {
  if (secret.startsWith("whsec_")) {
    const b = secret.slice(6);
    if (/^[A-Za-z0-9+/]*={0,2}$/.test(b) && b.length % 4 === 0) return Buffer.from(b, "base64");
  }
  return new TextEncoder().encode(secret);
}

async function hmac(key, data) {
  const k = await crypto.subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  return new Uint8Array(await crypto.subtle.sign("HMAC", k, data));
}

/** The `webhook-signature` value for `secret`. */
export async function sign(secret, id, timestamp, body) {
  const enc = new TextEncoder();
  const bodyBytes = typeof body === "string" ? enc.encode(body) : body;
  const prefix = enc.encode(`${id}.${timestamp}.`);
  const data = new Uint8Array(prefix.length + bodyBytes.length);
  data.set(prefix); data.set(bodyBytes, prefix.length);
  return "v1," + Buffer.from(await hmac(keyOf(secret), data)).toString("base64");
}

/**
 * Throws WebhookVerificationError unless the exact `body` and `headers` carry a signature
 * under `secret` (or any of an array of them) and a timestamp within `toleranceS` of now.
 */
export async function verifyWebhook(secret, headers, body, { nowS = Date.now() / 1000, toleranceS = 300 } = {}) {
  const get = (name) => (typeof headers.get === "function" ? headers.get(name) : (headers[name] ?? headers[name.toLowerCase()]));
  for (const h of ["webhook-id", "webhook-timestamp", "webhook-signature"]) {
    if (get(h) == null) throw new WebhookVerificationError(`the ${h} header is missing`);
  }
  const ts = Number(String(get("webhook-timestamp")).trim());
  if (!Number.isInteger(ts)) throw new WebhookVerificationError("webhook-timestamp is not a number of seconds");
  if (Math.abs(nowS - ts) > toleranceS) throw new WebhookVerificationError("webhook-timestamp is further than the tolerance from now");
  const given = String(get("webhook-signature")).split(/\s+/).filter((s) => s.startsWith("v1,"));
  for (const s of Array.isArray(secret) ? secret : [secret]) {
    const want = Buffer.from(await sign(s, get("webhook-id"), ts, body));
    for (const g of given) {
      const gb = Buffer.from(g);
      if (gb.length === want.length && (await import("node:crypto")).timingSafeEqual(gb, want)) return;
    }
  }
  throw new WebhookVerificationError("no signature matches any of the secrets");
}
