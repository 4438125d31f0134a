// The TypeScript client against the real server: a lost answer resent as a duplicate, a 429
// waited out, a stream across kill -9, a consumer crashed between its handler and its advance
// and under a server kill, a worker's heartbeat, failure and shutdown, and tidemark's own
// webhook POSTs verified under both keys of a rotation.
import { test } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import http from "node:http";
import { createHash, randomBytes } from "node:crypto";
import { ApiError, Client, WebhookVerificationError, done, failed, verifyWebhook } from "../src/index.js";
import { Server } from "../test-support/server.js";

const ev = (stream, subject, i) => ({ stream, subject, type: "client.test", payload: { i } });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A relay whose first connection passes the request on and is dropped when the answer starts. */
function answerLosingRelay(upstreamPort) {
  let first = true;
  const lost = [];
  const srv = net.createServer((c) => {
    const u = net.connect(upstreamPort, "127.0.0.1");
    if (first) {
      first = false;
      c.pipe(u);
      u.once("data", () => { lost.push(1); c.destroy(); u.destroy(); });
    } else {
      c.pipe(u); u.pipe(c);
      c.on("error", () => u.destroy()); u.on("error", () => c.destroy());
    }
  });
  return new Promise((resolve) => srv.listen(0, "127.0.0.1", () => resolve({ port: srv.address().port, lost, srv })));
}

test("an append whose answer is lost is resent and answered as a duplicate", async () => {
  const s = await Server.start();
  try {
    const { port, lost, srv } = await answerLosingRelay(s.port);
    const c = new Client(`http://127.0.0.1:${port}`);
    const r = await c.append([0, 1, 2].map((i) => ev("ts-append", "a", i)));
    assert.deepEqual(lost, [1]);
    assert.deepEqual(r.events.map((e) => e.duplicate), [true, true, true]);
    const page = await c.events(0, { stream: "ts-append" });
    assert.deepEqual(page.events.map((e) => e.seq), r.events.map((e) => e.seq));
    await assert.rejects(c.append([{ stream: "ts-append", subject: "a", type: "", payload: {} }]),
      (e) => e instanceof ApiError && e.status === 400 && e.code === "invalid_field" && !e.retryable);
    srv.close();
  } finally { await s.stop(); }
});

test("an append waits out a 429", async () => {
  const token = randomBytes(16).toString("hex");
  const sha = createHash("sha256").update(token).digest("hex");
  const s = await Server.start(`[[auth.tokens]]\nname = "limited"\nsha256 = "${sha}"\nscopes = ["admin"]\nrate = "60/m"\n`);
  try {
    let refused = false;
    for (let i = 0; i < 200 && !refused; i++) {
      const r = await fetch(s.base + "/v1/events?after_sequence=0", { headers: { authorization: `Bearer ${token}` } });
      await r.text();
      if (r.status === 429) { assert.ok(r.headers.get("retry-after")); refused = true; }
    }
    assert.ok(refused);
    const r = await new Client(s.base, token).append([ev("ts-rate", "a", 0)]);
    assert.equal(r.events[0].duplicate, false);
  } finally { await s.stop(); }
});

test("a stream resumes across a kill -9 with each seq once, in order", async () => {
  const s = await Server.start();
  try {
    const c = new Client(s.base);
    await c.append(Array.from({ length: 40 }, (_, i) => ev("ts-stream", "a", i)));
    const ac = new AbortController();
    const it = c.stream(0, { stream: "ts-stream", signal: ac.signal });
    const seen = [];
    for await (const e of it) { seen.push(e.seq); if (seen.length === 40) break; }
    // A new iterator from the last seq, as a dashboard does after its own restart...
    const it2 = c.stream(seen[seen.length - 1], { stream: "ts-stream", signal: ac.signal });
    const next = it2.next();
    // ...held open across a kill -9 of the server.
    await sleep(100);
    await s.kill9();
    await s.restart();
    for (let i = 40; i < 60; i++) await c.append([ev("ts-stream", "a", i)]);
    let r = await next;
    while (!r.done) {
      assert.equal(r.value.payload.i, seen.length);
      seen.push(r.value.seq);
      if (seen.length === 60) break;
      r = await it2.next();
    }
    ac.abort();
    const log = (await c.events(0, { stream: "ts-stream", limit: 1000 })).events.map((e) => e.seq);
    assert.deepEqual(seen, log);
  } finally { await s.stop(); }
});

class Crash extends Error {}

test("a consumer resumes from its cursor after a crash and a server kill", async () => {
  const s = await Server.start();
  try {
    const c = new Client(s.base);
    for (let chunk = 0; chunk < 6; chunk++) await c.append(Array.from({ length: 20 }, (_, i) => ev("ts-consumer", "b", chunk * 20 + i)));
    const handled = [];
    let pages = 0;
    const handler = async (page) => {
      handled.push(...page.map((e) => e.payload.i));
      pages++;
      if (pages === 2 || pages === 5) throw new Crash();
    };
    for (let k = 0; k < 2; k++) {
      await assert.rejects(c.consumer("ts-bridge", "ts-consumer", { page: 9 }).run(handler), Crash);
    }
    const ac = new AbortController();
    const running = c.consumer("ts-bridge", "ts-consumer", { page: 9 }).run(async (p) => { await sleep(10); await handler(p); }, { signal: ac.signal });
    await sleep(50);
    await s.kill9();
    await s.restart();
    for (let i = 0; i < 1200 && new Set(handled).size < 120; i++) await sleep(50);
    ac.abort();
    await running;
    let top = -1, repeats = 0;
    for (const i of handled) {
      if (i <= top) repeats++;
      else { assert.equal(i, top + 1, `skipped after ${top}`); top = i; }
    }
    assert.equal(top, 119);
    assert.ok(repeats <= 3 * 9, `${repeats} repeats`);
    const last = (await c.events(0, { stream: "ts-consumer", limit: 1000 })).events.at(-1).seq;
    assert.equal((await c.cursor("ts-bridge", "ts-consumer")).last_sequence, last);
  } finally { await s.stop(); }
});

const urgent = (id) => ({ event_id: id, stream: "notifications", subject: id, type: "notification.requested",
  payload: { priority: "urgent", title: `title of ${id}` } });

async function waitDelivery(c, id) {
  for (let i = 0; i < 600; i++) {
    try { return await c.delivery(id); } catch (e) { if (e.status !== 404) throw e; await sleep(50); }
  }
  throw new Error(`no ${id}`);
}

test("a worker extends, completes, fails and lets go on shutdown", async () => {
  const s = await Server.start();
  try {
    const c = new Client(s.base);
    await c.append([urgent("tw-slow"), urgent("tw-bad")]);
    for (const i of ["tw-slow", "tw-bad"]) await waitDelivery(c, `dlv:${i}:desktop`);
    let ac = new AbortController();
    const seen = [];
    let report = await c.worker("app", "ts-desk", { leaseMs: 600 }).run(async (d) => {
      seen.push(d.id);
      if (seen.length === 2) ac.abort();
      if (d.notification_id === "tw-bad") return failed("receiver_refused", "the desktop refused it", { retryable: false });
      await sleep(2400); // four leases long: only the heartbeat keeps it
      return done();
    }, { signal: ac.signal });
    assert.equal(report.refused, 0);
    assert.equal(report.completed + report.failed, 2);
    assert.equal((await c.delivery("dlv:tw-slow:desktop")).status, "sent");
    const bad = await c.delivery("dlv:tw-bad:desktop");
    assert.equal(bad.status, "parked");
    assert.ok(JSON.stringify(bad).includes("receiver_refused"));

    await c.append(Array.from({ length: 5 }, (_, i) => urgent(`tw-${i}`)));
    for (let i = 0; i < 5; i++) await waitDelivery(c, `dlv:tw-${i}:desktop`);
    ac = new AbortController();
    report = await c.worker("app", "ts-desk-2", { limit: 5 }).run(async () => { ac.abort(); return done(); }, { signal: ac.signal });
    assert.deepEqual([report.completed, report.released], [1, 4]);
    assert.equal((await c.claim("app", "ts-desk-3", 10)).length, 4);
  } finally { await s.stop(); }
});

test("tidemark's webhook POSTs verify under both keys during a rotation", async () => {
  const hits = [];
  const hook = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (d) => chunks.push(d));
    req.on("end", () => { hits.push({ headers: req.headers, body: Buffer.concat(chunks) }); res.end(); });
  });
  await new Promise((r) => hook.listen(0, "127.0.0.1", r));
  const s = await Server.start();
  try {
    const c = new Client(s.base);
    const [oldKey, newKey] = [randomBytes(16).toString("hex"), randomBytes(16).toString("hex")];
    const put = async (secret) => {
      const r = await fetch(s.base + "/v1/routes/tshook", {
        method: "PUT", headers: { "content-type": "application/json" },
        body: JSON.stringify({ route: { sink: "webhook", url: `http://127.0.0.1:${hook.address().port}/hook`, secret,
          rotation_overlap: "1h", priorities: ["urgent"] }, reason: "the TypeScript client's verification test" }),
      });
      assert.equal(r.status, 200, await r.text());
    };
    const posted = async (id) => {
      for (let i = 0; i < 600; i++) {
        const h = hits.find((x) => x.headers["webhook-id"] === id);
        if (h) return h;
        await sleep(50);
      }
      throw new Error(`no POST of ${id}`);
    };
    await put(oldKey);
    await c.append([urgent("tv-1")]);
    let { headers, body } = await posted("dlv:tv-1:tshook");
    await verifyWebhook(oldKey, headers, body);
    await assert.rejects(verifyWebhook(newKey, headers, body), WebhookVerificationError);
    await assert.rejects(verifyWebhook(oldKey, headers, Buffer.concat([body, Buffer.from(" ")])), WebhookVerificationError);
    await put(newKey);
    await c.append([urgent("tv-2")]);
    ({ headers, body } = await posted("dlv:tv-2:tshook"));
    await verifyWebhook(newKey, headers, body);
    await verifyWebhook(oldKey, headers, body);
    await verifyWebhook(["whsec_AAAA", newKey], headers, body);
  } finally { await s.stop(); hook.close(); }
});

test("every operation is a call with typed problems", async () => {
  const s = await Server.start();
  try {
    const c = new Client(s.base);
    assert.equal((await c.ops.getWhoami()).open, true);
    const put = await c.ops.putRoute("ts-ops", { route: { sink: "app", priorities: ["urgent"] }, reason: "the generated calls" });
    assert.equal(put.name, "ts-ops");
    assert.equal((await c.ops.getRoute("ts-ops")).route.sink, "app");
    await assert.rejects(c.ops.getDelivery("dlv:none:desktop"), (e) => e instanceof ApiError && e.status === 404 && e.code.length > 0);
    assert.throws(() => c.ops.listRoutes({ no_such: 1 }), TypeError);
  } finally { await s.stop(); }
});

test("a worker survives a kill -9 of the server and every delivery is sent", async () => {
  const s = await Server.start();
  try {
    const c = new Client(s.base);
    const ids = Array.from({ length: 20 }, (_, i) => `tk-${i}`);
    await c.append(ids.map(urgent));
    for (const i of ids) await waitDelivery(c, `dlv:${i}:desktop`);
    const handled = [];
    const ac = new AbortController();
    const running = c.worker("app", "ts-kill", { limit: 5, leaseMs: 2000 }).run(async (d) => {
      await sleep(30);
      handled.push(d.notification_id);
      return done();
    }, { signal: ac.signal });
    for (let i = 0; i < 6000 && handled.length < 6; i++) await sleep(10);
    await s.kill9();
    await s.restart();
    for (let i = 0; i < 1200; i++) {
      const all = await Promise.all(ids.map((id) => c.delivery(`dlv:${id}:desktop`).then((d) => d.status === "sent")));
      if (all.every(Boolean)) break;
      await sleep(100);
    }
    ac.abort();
    const report = await running;
    assert.deepEqual(new Set(handled), new Set(ids));
    assert.ok(handled.length - new Set(handled).size <= 5, `${handled}`);
    assert.equal(report.completed + report.refused, handled.length);
  } finally { await s.stop(); }
});

test("a tenant's client reads and writes that tenant alone", async () => {
  const tok = (name, text, tenant) =>
    `[[auth.tokens]]\nname = "${name}"\nsha256 = "${createHash("sha256").update(text).digest("hex")}"\nscopes = ["admin"]\ntenant = "${tenant}"\n\n`;
  const opToken = randomBytes(16).toString("hex");
  const betaToken = randomBytes(16).toString("hex");
  const s = await Server.start(tok("op", opToken, "*") + tok("beta", betaToken, "beta"));
  try {
    const op = new Client(s.base, opToken);
    for (const name of ["acme", "beta"]) await op.ops.createTenant({ name, reason: "ts test" });
    assert.throws(() => op.tenant("Not A Tenant"), TypeError);
    const acme = op.tenant("acme");
    const batch = [0, 1].map((i) => ({ ...ev("ts-tenant", "a", i), event_id: `e-${i}` }));
    const r = await acme.append(batch);
    const seqs = r.events.map((e) => e.seq);
    // The same event ids in the default tenant are its own, not acme's duplicates.
    assert.deepEqual((await op.append(batch)).events.map((e) => e.duplicate), [false, false]);
    assert.equal((await acme.append(batch)).events[0].duplicate, true);
    const page = await acme.events(0, { stream: "ts-tenant" });
    assert.deepEqual(page.events.map((e) => [e.seq, e.tenant]), seqs.map((q) => [q, "acme"]));
    const ctl = new AbortController();
    const seen = [];
    for await (const e of acme.stream(0, { stream: "ts-tenant", signal: ctl.signal })) {
      seen.push(e.seq);
      if (seen.length === 2) { ctl.abort(); break; }
    }
    assert.deepEqual(seen, seqs);
    // A tenant's own token acts for it; with another tenant's prefix it is refused.
    const beta = new Client(s.base, betaToken);
    assert.deepEqual((await beta.events(0, { stream: "ts-tenant" })).events, []);
    await assert.rejects(beta.tenant("acme").events(0),
      (e) => e instanceof ApiError && e.status === 403 && e.code === "tenant_forbidden");
  } finally { await s.stop(); }
});
