// Browser tests of the operator console (spec section 15): Debian's Chromium, headless, driven by
// playwright-core against the built `tidemark` binary with real data. Run by the cargo test
// `e2e_console` (tests/tests/e2e/e2e_console.rs), which passes:
//   TIDEMARK_BIN   the built binary (checked to be current by the harness)
//   CONSOLE_WORK   a fresh temporary directory (data directories, Chromium profile, configs)
//   CONSOLE_SHOTS  where the screenshots go (target/console-screenshots)
//   CHROMIUM       the browser (default /usr/bin/chromium)
// Every wait is a bound against hanging, never a speed assertion.
import { spawn } from 'node:child_process';
import { createHash, createHmac, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';

const BIN = process.env.TIDEMARK_BIN;
const WORK = process.env.CONSOLE_WORK;
const SHOTS = process.env.CONSOLE_SHOTS;
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
if (!BIN || !WORK || !SHOTS) {
  console.error('TIDEMARK_BIN, CONSOLE_WORK and CONSOLE_SHOTS are required');
  process.exit(2);
}
mkdirSync(SHOTS, { recursive: true });
const WAIT = 30_000;

function step(msg) {
  console.log(`[console] ${msg}`);
}

async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}

async function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

/// Poll `probe` until it returns a truthy value (bounded).
async function until(what, probe, limit = WAIT) {
  const end = Date.now() + limit;
  let last;
  for (;;) {
    try {
      last = await probe();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`timed out waiting for ${what} (last: ${last})`);
    await sleep(100);
  }
}

// ---------------------------------------------------------------------------------------------
// The server: the real binary, its own data directory, stopped by PID.

class Server {
  constructor(name, config, env) {
    this.env = env || {};
    this.dir = path.join(WORK, name);
    mkdirSync(this.dir, { recursive: true });
    this.config = path.join(WORK, `${name}.toml`);
    writeFileSync(this.config, config || '');
    this.token = null;
    this.log = '';
  }

  async start() {
    if (!this.port) this.port = await freePort();
    this.base = `http://127.0.0.1:${this.port}`;
    this.proc = spawn(BIN, ['serve', '--data', path.join(this.dir, 'data'),
      '--listen', `127.0.0.1:${this.port}`, '--config', this.config],
    { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...this.env } });
    const exited = new Promise((resolve) => this.proc.once('exit', (code) => resolve(code)));
    this.proc.stderr.on('data', (d) => { this.log += d; });
    let out = '';
    await Promise.race([
      new Promise((resolve) => {
        this.proc.stdout.on('data', (d) => {
          out += d;
          if (out.includes('listening on')) resolve();
        });
      }),
      exited.then((code) => { throw new Error(`the server exited (${code}) before listening: ${this.log}`); }),
      sleep(WAIT).then(() => { throw new Error('the server did not announce it is listening'); }),
    ]);
  }

  kill9() {
    this.proc.kill('SIGKILL');
    return new Promise((resolve) => {
      if (this.proc.exitCode !== null || this.proc.signalCode) resolve();
      else this.proc.once('exit', resolve);
    });
  }

  async req(method, p, body, token) {
    const headers = { Accept: 'application/json' };
    const t = token === undefined ? this.token : token;
    if (t) headers.Authorization = `Bearer ${t}`;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const r = await fetch(this.base + p, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch (_) { /* not json */ }
    return { status: r.status, json, text };
  }

  async ok(method, p, body) {
    const r = await this.req(method, p, body);
    assert.ok(r.status >= 200 && r.status < 300, `${method} ${p}: ${r.status} ${r.text}`);
    return r.json;
  }

  async append(events) {
    const r = await this.ok('POST', '/v1/events', { events });
    return r.events.map((e) => e.seq);
  }
}

function notif(id, title, extra) {
  return { event_id: id, stream: 'notifications', subject: id, type: 'notification.requested',
    payload: { priority: 'urgent', title, body: 'details', recipient: 'ops', ...extra } };
}

function taskEv(task, type, payload) {
  return { event_id: `${task}:${type}:${randomBytes(4).toString('hex')}`, stream: 'task_events',
    subject: task, type, payload };
}

async function delivery(s, id) {
  return (await s.ok('GET', `/v1/deliveries/${encodeURIComponent(id)}`));
}

async function waitStatus(s, id, status) {
  return until(`${id} ${status}`, async () => {
    const r = await s.req('GET', `/v1/deliveries/${encodeURIComponent(id)}`);
    return r.status === 200 && r.json.status === status && r.json;
  });
}

/// Claim every due delivery of sink `app`: fail those in `parked` for good (parked), complete
/// the others (sent).
async function settle(s, ids, parked) {
  for (const id of ids) await waitStatus(s, id, 'queued');
  const c = await s.ok('POST', '/v1/deliveries/claim', { sink: 'app', owner: 'console-test', limit: 100, lease_ms: 60_000 });
  assert.deepEqual(c.deliveries.map((d) => d.id).sort(), [...ids].sort(), 'the claim leased what was due');
  for (const d of c.deliveries) {
    const enc = encodeURIComponent(d.id);
    if (parked.includes(d.id)) {
      await s.ok('POST', `/v1/deliveries/${enc}/fail`, {
        owner: 'console-test', error_code: 'rejected', error: 'the sink said no', retryable: false });
    } else {
      await s.ok('POST', `/v1/deliveries/${enc}/complete`, { owner: 'console-test' });
    }
  }
  for (const id of ids) await waitStatus(s, id, parked.includes(id) ? 'parked' : 'sent');
}

// ---------------------------------------------------------------------------------------------
// The browser.

let browser;
let shot = 0;

async function openPage(s) {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  const page = await context.newPage();
  const urls = [];
  const external = [];
  const writes = [];
  page.on('request', (r) => {
    urls.push(r.url());
    if (!r.url().startsWith(s.base)) external.push(r.url());
    if (r.method() !== 'GET') writes.push(`${r.method()} ${r.url().slice(s.base.length)}`);
  });
  page.on('pageerror', (e) => { page.errors.push(e.message); });
  // The page's own files (the icon included, which browsers ask for on every load) are never
  // missing; API answers are checked where they are used.
  page.on('response', (r) => {
    if (r.status() === 404 && !new URL(r.url()).pathname.startsWith('/v1/')) page.missing.push(r.url());
  });
  page.missing = [];
  page.errors = [];
  page.urls = urls;
  pages.push(page);
  page.external = external;
  page.writes = writes;
  await page.goto(`${s.base}/`);
  return page;
}

const pages = [];

/// Open `hash` as a bookmark is: a fresh load of the console at that address.
async function openLink(page, s, hash) {
  await page.goto('about:blank');
  await page.goto(`${s.base}/${hash}`);
  await ready(page);
}

/// The `[[auth.tokens]]` entry of `token` (by its SHA-256), named `name`, with `scopes` (and
/// the tenant it acts for, when given).
function tokenToml(name, token, scopes, tenant) {
  const sha = createHash('sha256').update(token).digest('hex');
  return `
[[auth.tokens]]
name = "${name}"
sha256 = "${sha}"
scopes = ${JSON.stringify(scopes)}
${tenant ? `tenant = "${tenant}"` : ''}
`;
}

/// A `[[sources]]` entry polling `url`, with the watermark and items settings every test
/// source has.
function sourceToml(name, url, every, timeout) {
  return `
[[sources]]
name = "${name}"
url = "${url}"
every = "${every}"
timeout = "${timeout}"
[sources.watermark]
request_field = "afterId"
next = "/next"
has_more = "/more"
[sources.items]
path = "/data"
id = "/id"
`;
}

/// On a failure: what failed first (the test harness shows the first lines of the error
/// output), then a screenshot of every open page, to see what the page showed.
async function failureShot(name, e) {
  console.error(`[console] FAILED in ${name}: ${e && e.stack ? e.stack : e}`);
  for (const [i, p] of pages.entries()) {
    await p.screenshot({ path: path.join(SHOTS, `failed-${name}-${i}.png`), fullPage: true }).catch(() => {});
    console.error(`[console] page errors: ${JSON.stringify(p.errors)}`);
  }
}

async function snap(page, name) {
  shot += 1;
  const file = path.join(SHOTS, `${String(shot).padStart(2, '0')}-${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  step(`screenshot ${file}`);
}

async function ready(page) {
  await page.waitForSelector('body[data-ready=true]', { timeout: WAIT });
}

async function view(page, name) {
  await page.click(`#nav a[data-view=${name}]`);
  await page.waitForSelector(`#view-${name}:not([hidden])`, { timeout: WAIT });
}

async function text(page, sel) {
  return (await page.locator(sel).first().textContent({ timeout: WAIT })).trim();
}

/// Whether the panel `sel` is shown with its top inside the window and has the focus (what a
/// deep link or a click on a row of a long list must leave).
async function inViewAndFocused(page, sel) {
  return page.evaluate((q) => {
    const n = document.querySelector(q);
    if (!n || n.hidden) return false;
    const r = n.getBoundingClientRect();
    return r.top >= 0 && r.top < window.innerHeight && document.activeElement === n;
  }, sel);
}

/// Whether the top of `sel` lies below the first screen of the page (so that showing it in view
/// took a scroll).
async function belowTheFold(page, sel) {
  return page.evaluate((q) => {
    const n = document.querySelector(q);
    return n.getBoundingClientRect().top + window.scrollY > window.innerHeight;
  }, sel);
}

/// Log in on the token prompt (after Forget token, or on a first load).
async function login(page, token) {
  if (await page.locator('#logout').isVisible()) await page.click('#logout');
  await page.waitForSelector('#login:not([hidden])', { timeout: WAIT });
  await page.fill('[data-testid=token-input]', token);
  await page.click('[data-testid=token-submit]');
  await ready(page);
}

/// The ids (`data-id`) of the rows of list `sel`, in the order shown.
async function rowIds(page, sel) {
  return page.locator(`${sel} tbody tr[data-id]`).evaluateAll((rs) => rs.map((r) => r.dataset.id));
}

/// Click `button`, which asks for a confirmation: the dialog opens with `title`; a screenshot
/// named `shotName` (if given) shows it. Cancelling sends nothing (no request other than GET
/// reaches the server, and the flash says so); the caller checks through the API that nothing
/// changed, then calls the returned `confirm()`, which clicks again and confirms.
async function cancelThenConfirm(page, button, title, shotName) {
  const before = page.writes.length;
  await button.click();
  await page.waitForSelector('[data-testid=confirm-dialog][open]', { timeout: WAIT });
  assert.match(await text(page, '#confirm-title'), title);
  if (shotName) await snap(page, shotName);
  await page.click('[data-testid=confirm-cancel]');
  await page.waitForSelector('[data-testid=confirm-dialog]:not([open])', { state: 'attached', timeout: WAIT });
  await page.waitForSelector('#flash:has-text("nothing was sent")', { timeout: WAIT });
  assert.deepEqual(page.writes.slice(before), [], 'a cancelled action sent a request');
  return async () => {
    await button.click();
    await page.waitForSelector('[data-testid=confirm-dialog][open]', { timeout: WAIT });
    await page.click('[data-testid=confirm-ok]');
    await page.waitForSelector('[data-testid=confirm-dialog]:not([open])', { state: 'attached', timeout: WAIT });
    await until('the confirmed request', async () => page.writes.length > before);
  };
}

// ---------------------------------------------------------------------------------------------
// Scenario 1: open mode.

async function openMode() {
  const s = new Server('open', '[notifications.outbox]\nstuck_after = "1s"\n');
  await s.start();
  step(`open server on ${s.base}`);

  await s.append([notif('n-1', 'Disk almost full'), notif('n-2', 'Build broke'),
    notif('n-3', 'Deploy failed'), notif('n-4', 'Certificate expires')]);
  await settle(s, ['dlv:n-1:desktop', 'dlv:n-2:desktop', 'dlv:n-3:desktop', 'dlv:n-4:desktop'],
    ['dlv:n-1:desktop', 'dlv:n-2:desktop']);
  // Two still queued, older than stuck_after (1 s) by the time the page reads them.
  await s.append([notif('n-5', 'Backup late'), notif('n-6', 'Queue growing')]);
  await waitStatus(s, 'dlv:n-5:desktop', 'queued');
  await waitStatus(s, 'dlv:n-6:desktop', 'queued');
  await until('two stuck deliveries', async () => (await s.ok('GET', '/v1/outbox/kpis')).stuck === 2);

  const page = await openPage(s);
  await ready(page);
  assert.match(await text(page, '#who'), /open mode/);

  // KPI tiles show what the API gives (the page refreshes them; wait for its next read).
  const k = await s.ok('GET', '/v1/outbox/kpis');
  assert.equal(k.parked, 2);
  for (const f of ['queue_depth', 'stuck', 'parked', 'sent_last_interval']) {
    await page.waitForSelector(`[data-testid=tile-${f}] .value[data-value="${k[f]}"]`, { timeout: WAIT });
  }
  const appRow = page.locator('#kpi-sinks tr[data-key=app] td[data-field=parked]');
  assert.equal((await appRow.textContent()).trim(), String(k.by_sink.app.parked));
  step(`KPI tiles match the API: ${JSON.stringify({ queue_depth: k.queue_depth, stuck: k.stuck, parked: k.parked, sent: k.sent_last_interval })}`);
  await snap(page, 'outbox-kpis');

  // Stuck rows are badged; the stuck-only toggle asks the API for them.
  await page.check('[data-testid=filter-stuck]');
  await page.click('[data-testid=filter-apply]');
  await until('only stuck rows', async () => {
    const ids = await page.locator('#deliveries tbody tr[data-id]').evaluateAll((rs) => rs.map((r) => r.dataset.id));
    return ids.length === 2 && ids.includes('dlv:n-5:desktop') && ids.includes('dlv:n-6:desktop');
  });
  assert.equal(await page.locator('#deliveries [data-testid=stuck-badge]').count(), 2);
  await snap(page, 'outbox-stuck-only');
  await page.uncheck('[data-testid=filter-stuck]');

  // The title search.
  await page.fill('[data-testid=filter-q]', 'build');
  await page.click('[data-testid=filter-apply]');
  await until('title search', async () => {
    const ids = await page.locator('#deliveries tbody tr[data-id]').evaluateAll((rs) => rs.map((r) => r.dataset.id));
    return ids.length === 1 && ids[0] === 'dlv:n-2:desktop';
  });
  await page.fill('[data-testid=filter-q]', '');

  // Parked rows offer Retry and Discard; Retry makes the delivery queued.
  await page.selectOption('#dfilter select[name=status]', 'parked');
  await page.click('[data-testid=filter-apply]');
  const row = page.locator('#deliveries tr[data-id="dlv:n-1:desktop"]');
  await row.waitFor({ timeout: WAIT });
  assert.equal(await page.locator('#deliveries tbody tr[data-id]').count(), 2);
  await snap(page, 'outbox-parked');
  await row.locator('[data-testid=retry]').click();
  await waitStatus(s, 'dlv:n-1:desktop', 'queued');
  await page.waitForSelector('[data-testid=timeline-status]:text("queued")', { timeout: WAIT });
  await until('the retried row leaves the parked list', async () => (await page.locator('#deliveries tr[data-id="dlv:n-1:desktop"]').count()) === 0);
  const tl = await page.locator('#timeline').textContent();
  assert.match(tl, /retried/, 'the timeline shows the retry step');
  assert.match(tl, /the sink said no/, 'the timeline shows the failure');
  step('Retry on a parked delivery made it queued');
  await snap(page, 'outbox-retried-timeline');
  const k2 = await s.ok('GET', '/v1/outbox/kpis');
  assert.equal(k2.parked, 1);
  await page.waitForSelector(`[data-testid=tile-parked] .value[data-value="1"]`, { timeout: WAIT });

  // Discard asks first: cancelling sends nothing and the delivery stays parked; confirming
  // discards it.
  const discard = page.locator('#deliveries tr[data-id="dlv:n-2:desktop"] [data-testid=discard]');
  const confirmDiscard = await cancelThenConfirm(page, discard, /Discard dlv:n-2:desktop\?/, 'confirm-discard');
  assert.equal((await delivery(s, 'dlv:n-2:desktop')).status, 'parked', 'a cancelled Discard changed the delivery');
  await confirmDiscard();
  await waitStatus(s, 'dlv:n-2:desktop', 'discarded');
  assert.deepEqual(page.writes.filter((w) => w.includes('/discard')),
    [`POST /v1/deliveries/${encodeURIComponent('dlv:n-2:desktop')}/discard`], 'one discard, after the confirmation');
  await page.waitForSelector(`[data-testid=tile-parked] .value[data-value="0"]`, { timeout: WAIT });
  step('Discard: cancel sent nothing, confirm discarded the delivery');

  // A subscription: zero state, then its last_sequence after an ack, then last_error after a
  // mismatch.
  const task = 'task-console';
  await s.append([taskEv(task, 'task.created', { project_id: 'p-console', title: 'Console task', review_required: false })]);
  await s.ok('POST', `/v1/tasks/${task}/notifications/bridges`, {
    subscription_id: 'sub-console', bridge_id: 'bridge-console', thread_id: 'th-1', sink: { kind: 'pull' } });
  await view(page, 'tasks');
  await page.fill('[data-testid=task-id-input]', task);
  await page.click('[data-testid=task-find]');
  const card = page.locator('[data-testid=subscription][data-id=sub-console]');
  await card.locator('[data-testid=zero-pill]').waitFor({ timeout: WAIT });
  assert.equal(await text(page, '[data-testid=subscription] [data-testid=cursor-seq]'), '0');
  step('the subscription shows the zero-state pill and seq 0');
  await snap(page, 'subscription-zero-state');

  const [, done] = await s.append([taskEv(task, 'task.run_started', { run_id: 'r1' }),
    taskEv(task, 'task.run_completed', { run_id: 'r1' })]);
  const pulled = await until('the terminal notification', async () => {
    const p = await s.ok('GET', '/v1/bridges/bridge-console/deliveries?wait_ms=1000');
    return p.deliveries.length && p.deliveries;
  });
  assert.equal(pulled[0].seq, done);
  await s.ok('POST', `/v1/bridges/bridge-console/deliveries/${encodeURIComponent(pulled[0].delivery_id)}/ack`, {});
  await page.click('[data-testid=task-refresh]');
  await page.waitForSelector(`[data-testid=subscription] [data-testid=cursor-seq]:text-is("${done}")`, { timeout: WAIT });
  assert.equal(await text(page, '[data-testid=cursor-delivery]'), `notif:sub-console:${done}`);
  assert.equal(await card.locator('[data-testid=zero-pill]').count(), 0);
  step(`after the ack the card shows last_sequence ${done}`);
  await snap(page, 'subscription-steady');

  // Run r2 completes, then fails: the completion contradicts the run's outcome → mismatch.
  const [, r2done] = await s.append([taskEv(task, 'task.run_started', { run_id: 'r2' }),
    taskEv(task, 'task.run_completed', { run_id: 'r2' }), taskEv(task, 'task.run_failed', { run_id: 'r2', error: 'late crash' })]);
  const cur = await until('the mismatch on the cursor', async () => {
    const l = await s.ok('GET', `/v1/tasks/${task}/notifications/bridges/sub-console`);
    return l.cursor.last_error && l.cursor;
  });
  await page.click('[data-testid=task-refresh]');
  await page.waitForSelector('[data-testid=cursor-error]', { timeout: WAIT });
  assert.ok((await text(page, '[data-testid=cursor-error]')).includes(cur.last_error));
  assert.equal(await text(page, '[data-testid=cursor-seq]'), String(done), 'a mismatch never advances');
  await card.locator('[data-testid=explain-button]').click();
  await page.waitForSelector(`[data-testid=explain] td:text-is("${r2done}")`, { timeout: WAIT });
  assert.match(await page.locator('[data-testid=explain]').textContent(), /mismatch/);
  step('after the mismatch the card shows last_error and explain shows the decision');
  await snap(page, 'subscription-failure');

  // Consumers' lag: the subscription stopped at the mismatch is flagged stopped at once, with
  // its reason, and not stalled.
  await view(page, 'consumers');
  const lagRow = page.locator('#lag tr[data-consumer="bridge_task_subscription:sub-console"]');
  await lagRow.waitFor({ timeout: WAIT });
  const lag = await s.ok('GET', '/v1/consumers/lag');
  assert.ok(Array.isArray(lag.consumers), JSON.stringify(lag));
  const entry = lag.consumers.find((c) => c.consumer_id === 'bridge_task_subscription:sub-console');
  assert.ok(entry.stopped && entry.stopped_reason, JSON.stringify(entry));
  assert.equal(entry.stalled, false, JSON.stringify(entry));
  await lagRow.locator('[data-testid=stopped]').waitFor({ timeout: WAIT });
  assert.ok((await lagRow.locator('[data-testid=stopped-reason]').textContent()).includes(entry.stopped_reason));
  assert.equal(await lagRow.locator('[data-testid=stalled]').count(), 0);
  assert.match(await text(page, '[data-testid=lag-summary]'), new RegExp(`${lag.stalled} stalled, ${lag.stopped} stopped`));
  step(`the consumers view shows the subscription stopped: ${entry.stopped_reason}`);
  await snap(page, 'consumers');

  // Delete asks first: cancelling keeps the subscription; confirming deletes it (its cursor
  // stays).
  await view(page, 'tasks');
  await page.fill('[data-testid=task-id-input]', task);
  await page.click('[data-testid=task-find]');
  const del = card.locator('[data-testid=delete-subscription]');
  const confirmDelete = await cancelThenConfirm(page, del, /Delete subscription sub-console\?/, 'confirm-delete-subscription');
  const sub = () => s.req('GET', `/v1/tasks/${task}/notifications/bridges/sub-console`);
  assert.equal((await sub()).status, 200, 'a cancelled Delete removed the subscription');
  await confirmDelete();
  await until('the subscription deleted', async () => (await sub()).status === 404);
  await card.waitFor({ state: 'detached', timeout: WAIT });
  step('Delete: cancel kept the subscription, confirm deleted it');

  // Projections: verify; Rebuild asks first.
  await view(page, 'projections');
  await page.locator('#projections tr[data-name=deliveries] [data-testid=verify]').click();
  await page.waitForSelector('[data-testid=proj-outcome]:has-text("identical")', { timeout: WAIT });
  await snap(page, 'projections-verified');
  const generation = async () => (await s.ok('GET', '/v1/admin/projections')).projections.find((x) => x.name === 'tasks').generation;
  const g0 = await generation();
  const rebuild = page.locator('#projections tr[data-name=tasks] [data-testid=rebuild]');
  const confirmRebuild = await cancelThenConfirm(page, rebuild, /Rebuild tasks\?/, 'confirm-rebuild');
  assert.equal(await generation(), g0, 'a cancelled Rebuild rebuilt');
  await confirmRebuild();
  await page.waitForSelector('[data-testid=proj-outcome]:has-text("rebuild tasks")', { timeout: WAIT });
  const g1 = await generation();
  assert.ok(g1 > g0, `the rebuild switched to a new generation: ${g0} → ${g1}`);
  step(`Rebuild: cancel sent nothing, confirm rebuilt tasks (generation ${g0} → ${g1})`);

  // The Notifications view: every priority, newest first; one opens its status record.
  await s.append([notif('w-1', 'Disk 80% full', { priority: 'warning' }),
    notif('i-1', 'Nightly backup done', { priority: 'info', recipient: 'night-shift' })]);
  await view(page, 'notifications');
  await page.waitForSelector('#notifications tr[data-id="i-1"][data-priority=info]', { timeout: WAIT });
  await page.waitForSelector('#notifications tr[data-id="w-1"][data-priority=warning]', { timeout: WAIT });
  const listed = await s.ok('GET', '/v1/notifications?limit=50');
  assert.deepEqual(await rowIds(page, '#notifications'), listed.notifications.map((n) => n.notification_id),
    'the list is the dashboard list, newest first');
  assert.equal((await rowIds(page, '#notifications'))[0], 'i-1');
  // The screenshots without the flash of the last action (it hides itself).
  await page.waitForSelector('#flash', { state: 'hidden', timeout: WAIT });
  await snap(page, 'notifications');
  await page.selectOption('[data-testid=nfilter-priority]', 'warning');
  await page.click('[data-testid=nfilter-apply]');
  await until('only warnings', async () => {
    const ps = await page.locator('#notifications tbody tr[data-id]').evaluateAll((rs) => rs.map((r) => r.dataset.priority));
    return ps.length > 0 && ps.every((p) => p === 'warning') && (await rowIds(page, '#notifications')).includes('w-1');
  });
  await page.locator('#notifications tr[data-id="w-1"]').click();
  const w1 = await s.ok('GET', '/v1/notifications/w-1');
  await page.waitForSelector(`[data-testid=ntf-status]:text-is("${w1.status}")`, { timeout: WAIT });
  assert.equal(w1.status, 'dashboard_only');
  await page.selectOption('[data-testid=nfilter-priority]', '');
  await page.click('[data-testid=nfilter-apply]');
  await page.locator('#notifications tr[data-id="n-2"]').click();
  const n2 = await s.ok('GET', '/v1/notifications/n-2');
  assert.equal(n2.status, 'discarded');
  await page.waitForSelector('[data-testid=ntf-status]:text-is("discarded")', { timeout: WAIT });
  assert.ok((await text(page, '[data-testid=ntf-error]')).includes('the sink said no'));
  assert.equal(await text(page, '[data-testid=ntf-attempts]'), String(n2.attempts));
  assert.equal(await page.locator('#notification tr[data-id="dlv:n-2:desktop"]').count(), 1);
  step(`the status record of n-2: ${n2.status}, ${n2.attempts} attempt(s), last error ${n2.last_error}`);
  await snap(page, 'notification-status-record');
  await page.locator('#notification [data-testid=ntf-timeline]').click();
  await page.waitForSelector('#view-outbox:not([hidden])', { timeout: WAIT });
  await page.waitForSelector('[data-testid=timeline-status]:text-is("discarded")', { timeout: WAIT });
  await until('the outbox lists the deliveries of n-2', async () => {
    const ids = await rowIds(page, '#deliveries');
    return ids.length === 1 && ids[0] === 'dlv:n-2:desktop';
  });

  // Tasks newest first by default (ids as text would put bt-10 before bt-2), by id on request.
  await s.append(Array.from({ length: 12 }, (_, i) => taskEv(`bt-${i}`, 'task.created', { project_id: 'p-bt', title: `Batch task ${i}` })));
  await view(page, 'tasks');
  await page.fill('[data-testid=task-id-input]', '');
  await page.click('[data-testid=task-find]');
  const newest = Array.from({ length: 12 }, (_, i) => `bt-${11 - i}`);
  await until('the tasks newest first', async () => {
    const ids = await rowIds(page, '#tasks');
    return ids.length === 13 && ids.slice(0, 12).join() === newest.join() && ids[12] === task;
  });
  step('the tasks list is newest first: bt-11 … bt-0, then the task created before them');
  await snap(page, 'tasks-newest-first');
  await page.selectOption('[data-testid=torder]', 'id');
  await page.click('[data-testid=task-find]');
  await until('the tasks by id', async () => (await rowIds(page, '#tasks')).slice(0, 4).join() === 'bt-0,bt-1,bt-10,bt-11');
  await snap(page, 'tasks-by-id');
  // The deliveries too: newest first by default, by id on request.
  await view(page, 'outbox');
  await page.fill('#dfilter [name=notification_id]', '');
  await page.click('[data-testid=filter-apply]');
  const byTime = (await s.ok('GET', '/v1/deliveries?order=newest&limit=50')).deliveries.map((d) => d.id);
  await until('the deliveries newest first', async () => (await rowIds(page, '#deliveries')).join() === byTime.join());
  await page.selectOption('[data-testid=dorder]', 'id');
  await page.click('[data-testid=filter-apply]');
  const byId = (await s.ok('GET', '/v1/deliveries?limit=50')).deliveries.map((d) => d.id);
  await until('the deliveries by id', async () => (await rowIds(page, '#deliveries')).join() === byId.join());
  assert.notEqual(byTime.join(), byId.join(), 'the two orders differ here');

  // Links of their own: a task, a delivery and a notification open directly from the address
  // bar, and opening one puts its link there. The task's resume card opens its live stream.
  const linked = await openPage(s);
  await ready(linked);
  // Each link opened as a bookmark is: a fresh load of the page at that address.
  await openLink(linked, s, '#tasks/bt-3');
  await linked.waitForSelector('#task:not([hidden]) h3:has-text("bt-3")', { timeout: WAIT });
  await openLink(linked, s, `#deliveries/${encodeURIComponent('dlv:n-1:desktop')}`);
  await linked.waitForSelector('#timeline:not([hidden]) h3:has-text("dlv:n-1:desktop")', { timeout: WAIT });
  await openLink(linked, s, '#notifications/n-2');
  await linked.waitForSelector('#notification:not([hidden]) h3:has-text("n-2")', { timeout: WAIT });
  await linked.click('#nav a[data-view=tasks]');
  await linked.click('#tasks tr[data-id="bt-5"]');
  await until('the task link in the address bar', async () => linked.url().endsWith('#tasks/bt-5'));
  await linked.click('#tasks tr[data-id="bt-6"]');
  await until('the next task link', async () => linked.url().endsWith('#tasks/bt-6'));
  await linked.goBack();
  await linked.waitForSelector('#task:not([hidden]) h3:has-text("bt-5")', { timeout: WAIT });
  // Back to the list alone: the panel closes with it.
  await linked.goBack();
  await until('#tasks alone', async () => linked.url().endsWith('#tasks'));
  await linked.waitForSelector('#task', { state: 'hidden', timeout: WAIT });
  await linked.goForward();
  await linked.waitForSelector('#task:not([hidden]) h3:has-text("bt-5")', { timeout: WAIT });
  step('links: #tasks/<id>, #deliveries/<id>, #notifications/<id> open directly; Back returns');
  await snap(linked, 'task-by-link');
  const t5 = await s.ok('GET', '/v1/tasks/bt-5');
  await linked.click('[data-testid=follow-stream]');
  await linked.waitForSelector('[data-testid=tail-state]:text-is("live")', { timeout: WAIT });
  const [mine] = await s.append([taskEv('bt-5', 'task.run_started', { run_id: 'r-follow' })]);
  const [other] = await s.append([taskEv('bt-6', 'task.run_started', { run_id: 'r-other' })]);
  await linked.waitForSelector(`#tail tr[data-seq="${mine}"]`, { timeout: WAIT });
  const shown = await linked.locator('#tail tbody tr[data-seq]').evaluateAll((rs) => rs.map((r) => Number(r.dataset.seq)));
  assert.ok(!shown.includes(other), `another task's event in the task's stream: ${shown}`);
  assert.ok(shown.every((q) => q > t5.latest_event_seq), `the stream starts after seq ${t5.latest_event_seq}: ${shown}`);
  step(`the resume card followed bt-5's stream from seq ${t5.latest_event_seq}`);
  assert.deepEqual(linked.errors, [], 'no script errors');
  await linked.context().close();

  // The live tail: an event appended after the page opened appears; after a restart of the
  // server it resumes from the last event shown (Last-Event-ID), without repeats or gaps.
  await view(page, 'tail');
  await page.waitForSelector('[data-testid=tail-state]:text-is("live")', { timeout: WAIT });
  const [live] = await s.append([notif('tail-1', 'Appended after the page opened')]);
  await page.waitForSelector(`#tail tr[data-seq="${live}"]`, { timeout: WAIT });
  step(`the tail shows seq ${live}, appended after the page opened`);
  await snap(page, 'tail-live');
  await s.kill9();
  await page.waitForSelector('[data-testid=tail-state]:not(:text-is("live"))', { timeout: WAIT });
  await snap(page, 'tail-disconnected');
  await s.start();
  const [after] = await s.append([notif('tail-2', 'Appended after the restart')]);
  await page.waitForSelector(`#tail tr[data-seq="${after}"]`, { timeout: WAIT });
  await page.waitForSelector('[data-testid=tail-state]:text-is("live")', { timeout: WAIT });
  const seqs = await page.locator('#tail tbody tr[data-seq]').evaluateAll((rs) => rs.map((r) => Number(r.dataset.seq)));
  assert.equal(new Set(seqs).size, seqs.length, `the tail repeats events after the resume: ${seqs}`);
  const sorted = [...seqs].sort((a, b) => b - a);
  assert.deepEqual(seqs, sorted, 'newest first');
  for (let i = 1; i < sorted.length; i += 1) assert.equal(sorted[i - 1] - sorted[i], 1, `a gap in the tail: ${sorted}`);
  step(`after kill -9 and a restart the tail resumed and shows seq ${after}`);
  await snap(page, 'tail-resumed');

  assert.deepEqual(page.external, [], 'the console fetched nothing beyond the server');
  assert.deepEqual(page.errors, [], 'no script errors');
  assert.deepEqual(page.missing, [], 'the page asked for a file the server does not have');
  await page.context().close();
  await s.kill9();
}

// ---------------------------------------------------------------------------------------------
// Scenario 2: tokens. The page asks for one, keeps it for the tab, and disables what the
// token's scopes forbid.

async function withTokens() {
  const admin = randomBytes(16).toString('hex');
  const reader = randomBytes(16).toString('hex');
  const s = new Server(
    'tokens',
    tokenToml('console-admin', admin, ['admin']) + tokenToml('console-reader', reader, ['read']),
  );
  s.token = admin;
  await s.start();
  step(`server with tokens on ${s.base}`);
  await s.append([notif('t-1', 'Parked for the reader')]);
  await settle(s, ['dlv:t-1:desktop'], ['dlv:t-1:desktop']);

  const page = await openPage(s);
  await page.waitForSelector('#login:not([hidden])', { timeout: WAIT });
  await snap(page, 'token-prompt');
  await page.fill('[data-testid=token-input]', 'not-a-token');
  await page.click('[data-testid=token-submit]');
  await page.waitForSelector('[data-testid=login-error]:has-text("refused")', { timeout: WAIT });

  await page.fill('[data-testid=token-input]', reader);
  await page.click('[data-testid=token-submit]');
  await ready(page);
  assert.equal(await page.getAttribute('#who', 'data-scopes'), 'read');
  await page.selectOption('#dfilter select[name=status]', 'parked');
  await page.click('[data-testid=filter-apply]');
  const retry = page.locator('#deliveries tr[data-id="dlv:t-1:desktop"] [data-testid=retry]');
  await retry.waitFor({ timeout: WAIT });
  assert.ok(await retry.isDisabled(), 'a read-only token sees Retry disabled');
  assert.equal(await retry.getAttribute('title'), 'needs the operator scope');
  assert.ok(await page.locator('#deliveries tr[data-id="dlv:t-1:desktop"] [data-testid=discard]').isDisabled());
  step('a read-only token sees Retry and Discard disabled');
  await snap(page, 'read-only-token');
  await view(page, 'projections');
  await page.waitForSelector('#proj-denied:not([hidden])', { timeout: WAIT });

  // The live tail works with a token too (sent as a header by fetch).
  await view(page, 'tail');
  await page.waitForSelector('[data-testid=tail-state]:text-is("live")', { timeout: WAIT });
  const [seq] = await s.append([notif('t-2', 'Seen by the reader')]);
  await page.waitForSelector(`#tail tr[data-seq="${seq}"]`, { timeout: WAIT });

  // The token stays in this tab (session storage), survives a reload, and is never in a URL.
  await page.reload();
  await ready(page);
  assert.equal(await page.getAttribute('#who', 'data-scopes'), 'read');
  for (const u of page.urls) {
    assert.ok(!u.includes(reader) && !u.includes(admin), `a token in a URL: ${u}`);
  }
  const other = await page.context().newPage();
  await other.goto(`${s.base}/`);
  await other.waitForSelector('#login:not([hidden])', { timeout: WAIT });
  await other.close();

  // Forget it, use the admin token: Retry is enabled and works.
  await page.click('#logout');
  await page.waitForSelector('#login:not([hidden])', { timeout: WAIT });
  await page.fill('[data-testid=token-input]', admin);
  await page.click('[data-testid=token-submit]');
  await ready(page);
  await view(page, 'outbox');
  await page.selectOption('#dfilter select[name=status]', 'parked');
  await page.click('[data-testid=filter-apply]');
  const retry2 = page.locator('#deliveries tr[data-id="dlv:t-1:desktop"] [data-testid=retry]');
  await retry2.waitFor({ timeout: WAIT });
  assert.ok(await retry2.isEnabled());
  await retry2.click();
  const d = await waitStatus(s, 'dlv:t-1:desktop', 'queued');
  const retried = d.timeline.find((x) => x.event === 'retried');
  assert.ok(retried, JSON.stringify(d.timeline));
  assert.match(JSON.stringify(retried), /console-admin/, 'the retry is recorded with the token name');
  step('the admin token retried the delivery');
  await snap(page, 'admin-token');
  assert.deepEqual(page.external, []);
  assert.deepEqual(page.errors, []);
  assert.deepEqual(page.missing, []);
  await page.context().close();
  await s.kill9();
  assert.ok(!s.log.includes(admin) && !s.log.includes(reader), 'a token in the server log');
}


// ---------------------------------------------------------------------------------------------
// Scenario 3: push delivery (spec section 17). A real SMTP server (tests/smtp/server.py), an
// email route; a list is made in the Lists view, a notification to it is sent by tidemark, and
// the console shows whom it reached, the sink's health and the list filter.

async function startSmtp() {
  const dir = path.join(WORK, 'smtp');
  mkdirSync(dir, { recursive: true });
  const proc = spawn('python3', [path.resolve('../smtp/server.py'), dir, String(process.pid)],
    { stdio: ['ignore', 'inherit', 'inherit'] });
  const port = await until('the SMTP server', async () => {
    const f = path.join(dir, 'port');
    return existsSync(f) && Number(readFileSync(f, 'utf8').trim());
  });
  const messages = () => {
    const f = path.join(dir, 'messages.jsonl');
    return existsSync(f) ? readFileSync(f, 'utf8').trim().split('\n').filter(Boolean).map((l) => JSON.parse(l)) : [];
  };
  return { port, proc, messages };
}

async function pushDelivery() {
  const smtp = await startSmtp();
  const s = new Server('push', `
[notifications.routing]
urgent = ["dashboard", "email"]
[notifications.routes.email]
sink = "email"
retry = { strategy = "fixed", base_delay = "200ms", max_attempts = 1, jitter = 0.0 }
[sinks.email]
url = "smtp://127.0.0.1:${smtp.port}"
from = "tidemark <noreply@example.org>"
timeout = "5s"
concurrency = 2
${sourceToml('dead', 'http://127.0.0.1:9/items', '1s', '1s')}`);
  await s.start();
  step(`push server on ${s.base}, SMTP on ${smtp.port}`);
  const page = await openPage(s);
  await ready(page);

  // Make the list in the Lists view.
  await view(page, 'lists');
  const members = ['ana@example.org', 'bo@example.org', 'cy@example.org'];
  await page.fill('[data-testid=list-name]', 'oncall');
  await page.fill('[data-testid=list-members]', members.join('\n'));
  await page.fill('[data-testid=list-reason]', 'rota for the week');
  await page.click('[data-testid=list-save]');
  await page.waitForSelector('#lists tr[data-name=oncall]', { timeout: WAIT });
  const l = await s.ok('GET', '/v1/lists/oncall');
  assert.deepEqual(l.members, members);
  assert.equal(l.reason, 'rota for the week');
  step('the Lists view made the list oncall with three members');
  await snap(page, 'lists');

  // A notification to the list is sent by tidemark's email sink, one message per member.
  await s.append([notif('p-1', 'Primary database failover', { recipient: undefined, list: 'oncall', type: 'email' }),
    notif('p-2', 'Rejected address', { recipient: 'permfail-x@example.org', type: 'email' })]);
  const sent = await waitStatus(s, 'dlv:p-1:email', 'sent');
  assert.deepEqual([...sent.resolved_targets].sort(), members);
  await waitStatus(s, 'dlv:p-2:email', 'parked');
  assert.equal(smtp.messages().filter((m) => m.subject === 'Primary database failover').length, 3);

  // Outbox: the list filter finds it; its timeline says whom it reached.
  await view(page, 'outbox');
  await page.fill('[data-testid=filter-list]', 'oncall');
  await page.click('[data-testid=filter-apply]');
  await until('the list filter', async () => {
    const ids = await rowIds(page, '#deliveries');
    return ids.length === 1 && ids[0] === 'dlv:p-1:email';
  });
  await page.click('#deliveries tr[data-id="dlv:p-1:email"]');
  const reachedText = await text(page, '#timeline [data-testid=resolved-targets]');
  for (const m of members) assert.ok(reachedText.includes(m), reachedText);
  step(`the timeline shows whom it reached: ${reachedText}`);
  await snap(page, 'delivery-reached');

  // The type filter: both are type "email"; none is "chat".
  await page.fill('[data-testid=filter-list]', '');
  await page.fill('[data-testid=filter-type]', 'email');
  await page.click('[data-testid=filter-apply]');
  await until('the type filter', async () => (await rowIds(page, '#deliveries')).length === 2);
  await page.fill('[data-testid=filter-type]', 'chat');
  await page.click('[data-testid=filter-apply]');
  await until('the type filter (none)', async () => (await rowIds(page, '#deliveries')).length === 0);

  // Sink health: one sent, one parked by a 550; the state follows the last attempt.
  const health = page.locator('#sink-health tr[data-sink=email]');
  await health.waitFor({ timeout: WAIT });
  await until('the sink health counts', async () => {
    await page.evaluate(() => loadKpis());
    return (await health.locator('td[data-field=sent]').textContent()).trim() === '1'
      && (await health.locator('td[data-field=permanent]').textContent()).trim() === '1';
  });
  const h = (await s.ok('GET', '/v1/outbox/sinks')).sinks.find((x) => x.sink === 'email');
  assert.equal(await health.getAttribute('data-state'), h.state);
  assert.match(h.last_error_code, /^smtp_55\d$/);
  step(`the sink health row: ${h.state}, sent ${h.sent}, parked ${h.permanent}, last error ${h.last_error_code}`);
  // Nothing pending on the sink: its oldest pending age is "–", not "0s".
  assert.equal((await page.locator('#kpi-sinks tr[data-key=email] td[data-field=oldest_pending_age_s]').textContent()).trim(), '–');
  await snap(page, 'sink-health');

  // Routes (section 4): the file's email route is listed as the file's; a webhook route made
  // in the Routes view delivers the next urgent notification with no restart, its secret never
  // shown; deleted from the view (after a confirmation), the next one no longer takes it.
  const posts = [];
  const receiver = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => { body += c; });
    req.on('end', () => { posts.push({ headers: req.headers, raw: body, body: JSON.parse(body || 'null') }); res.end('ok'); });
  });
  await new Promise((r) => receiver.listen(0, '127.0.0.1', r));
  const hookUrl = `http://127.0.0.1:${receiver.address().port}/hook`;
  const hookSecret = `whsec-console-${randomBytes(8).toString('hex')}`;
  await view(page, 'routes');
  await page.waitForSelector('#routes tr[data-name=email][data-origin=config]', { timeout: WAIT });
  await page.fill('[data-testid=route-name]', 'console-hook');
  await page.selectOption('[data-testid=route-sink]', 'webhook');
  await page.fill('[data-testid=route-url]', hookUrl);
  await page.fill('[data-testid=route-secret]', hookSecret);
  await page.check('[data-testid=route-p-urgent]');
  await page.fill('[data-testid=route-reason]', 'the console adds a webhook');
  await page.click('[data-testid=route-save]');
  const hookRow = page.locator('#routes tr[data-name=console-hook][data-origin=api]');
  await hookRow.waitFor({ timeout: WAIT });
  const rowText = await hookRow.textContent();
  assert.ok(rowText.includes('***') && !rowText.includes(hookSecret), rowText);
  assert.ok(rowText.includes('urgent') && rowText.includes('the console adds a webhook'), rowText);
  const rt = await s.ok('GET', '/v1/routes/console-hook');
  assert.equal(rt.route.secret, '***');
  assert.deepEqual(rt.route.priorities, ['urgent']);
  await s.append([notif('p-3', 'Webhook through a route made in the console', { type: 'email' })]);
  await waitStatus(s, 'dlv:p-3:console-hook', 'sent');
  await until('the POST to the console route', async () => posts.some((p) => p.headers['webhook-id'] === 'dlv:p-3:console-hook'));
  step('the Routes view made a webhook route; the next urgent notification was POSTed to it');
  await snap(page, 'routes');
  // The receiver verifies every signature: an Edit → Save that types no secret keeps it
  // (spec section 4); "remove signing" removes it, and the console says so.
  const signedBy = (id, key) => {
    const p = posts.find((x) => x.headers['webhook-id'] === id);
    const mac = createHmac('sha256', key)
      .update(`${p.headers['webhook-id']}.${p.headers['webhook-timestamp']}.${p.raw}`).digest('base64');
    return (p.headers['webhook-signature'] || '').split(' ').includes(`v1,${mac}`);
  };
  assert.ok(signedBy('dlv:p-3:console-hook', hookSecret), 'the first POST verifies');
  await hookRow.locator('[data-testid=route-edit]').click();
  assert.equal(await page.inputValue('[data-testid=route-secret]'), '', 'a secret is never shown');
  await page.check('[data-testid=route-p-action]');
  await page.fill('[data-testid=route-extra]', '{"rotation_overlap": "2h", "circuit": {"failures": 7}}');
  await page.fill('[data-testid=route-reason]', 'also action, from the console');
  await page.click('[data-testid=route-save]');
  await until('the edit saved', async () => (await s.ok('GET', '/v1/routes/console-hook')).route.priorities.includes('action'));
  const edited = await s.ok('GET', '/v1/routes/console-hook');
  assert.equal(edited.route.secret, '***', 'the edit kept the secret');
  assert.equal(edited.previous_secret_until, undefined, 'no secret changed');
  await until('the keys shown', async () => {
    const keys = await hookRow.locator('[data-field=keys]').textContent();
    return keys.includes('rotation_overlap 2h') && keys.includes('circuit');
  });
  await s.append([notif('p-3b', 'After an edit from the console', { type: 'email' })]);
  await until('the POST after the edit', async () => posts.some((p) => p.headers['webhook-id'] === 'dlv:p-3b:console-hook'));
  assert.ok(signedBy('dlv:p-3b:console-hook', hookSecret), 'an Edit → Save turned signing off');
  await hookRow.locator('[data-testid=route-edit]').click();
  await page.check('[data-testid=route-no-signing]');
  await page.fill('[data-testid=route-reason]', 'the receiver stops verifying');
  await page.click('[data-testid=route-save]');
  await page.waitForSelector('#flash:has-text("no longer signs")', { timeout: WAIT });
  await until('signing removed', async () => (await s.ok('GET', '/v1/routes/console-hook')).route.secret === undefined);
  await s.append([notif('p-3c', 'After signing is removed', { type: 'email' })]);
  await until('the unsigned POST', async () => posts.some((p) => p.headers['webhook-id'] === 'dlv:p-3c:console-hook'));
  assert.equal(posts.find((p) => p.headers['webhook-id'] === 'dlv:p-3c:console-hook').headers['webhook-signature'], undefined);
  step('Edit → Save kept the secret (the receiver verified); "remove signing" removed it, with a warning');
  // A body a receiver accepts and an order per key (section 4), from the form's own fields;
  // Preview renders what the route sends without sending it.
  await hookRow.locator('[data-testid=route-edit]').click();
  await page.selectOption('[data-testid=route-body]', 'slack');
  await page.selectOption('[data-testid=route-order-key]', 'task');
  await page.fill('[data-testid=route-rate]', '5/s');
  await page.fill('[data-testid=route-reason]', 'slack-shaped, in order per task');
  await page.click('[data-testid=route-save]');
  await until('body and order saved', async () => (await s.ok('GET', '/v1/routes/console-hook')).route.body === 'slack');
  const ordered = await s.ok('GET', '/v1/routes/console-hook');
  assert.deepEqual(ordered.route.ordering, { key: 'task', on_park: 'hold' });
  assert.equal(ordered.route.rate, '5/s');
  assert.deepEqual(ordered.route.priorities, ['urgent', 'action'], 'the edit kept the priorities');
  await page.fill('[data-testid=route-name]', 'console-hook');
  await page.click('[data-testid=route-preview]');
  await page.waitForSelector('[data-testid=route-preview-body]', { timeout: WAIT });
  const rendered = JSON.parse(await page.textContent('[data-testid=route-preview-body]'));
  assert.ok(typeof rendered.text === 'string' && rendered.text.length > 0, `a Slack body: ${JSON.stringify(rendered)}`);
  await hookRow.locator('[data-testid=route-edit]').click();
  assert.equal(await page.inputValue('[data-testid=route-body]'), 'slack');
  assert.equal(await page.inputValue('[data-testid=route-order-key]'), 'task');
  assert.equal(await page.inputValue('[data-testid=route-rate]'), '5/s');
  await page.selectOption('[data-testid=route-order-key]', '');
  await page.fill('[data-testid=route-reason]', 'no order after all');
  await page.click('[data-testid=route-save]');
  await until('order removed', async () => (await s.ok('GET', '/v1/routes/console-hook')).route.ordering === undefined);
  assert.equal((await s.ok('GET', '/v1/routes/console-hook')).route.body, 'slack', 'removing the order kept the body');
  step('the route form set a Slack body and an order per task, previewed it, and removed the order');
  // The built-in routes are listed with the others.
  for (const b of ['dashboard', 'desktop']) {
    const row = page.locator(`#routes tr[data-name=${b}][data-origin=config]`);
    await row.waitFor({ timeout: WAIT });
    assert.ok((await row.textContent()).includes('built-in'), await row.textContent());
  }
  const confirmDelete = await cancelThenConfirm(page, hookRow.locator('[data-testid=route-delete]'), /Delete the route console-hook\?/, 'confirm-route-delete');
  assert.equal((await s.req('GET', '/v1/routes/console-hook')).status, 200, 'a cancelled delete deleted the route');
  await confirmDelete();
  await until('the route deleted', async () => (await s.req('GET', '/v1/routes/console-hook')).status === 404);
  await s.append([notif('p-4', 'After the route is gone', { type: 'email' })]);
  await until('p-4 routed', async () => (await s.req('GET', `/v1/deliveries/${encodeURIComponent('dlv:p-4:email')}`)).status === 200);
  assert.equal((await s.req('GET', `/v1/deliveries/${encodeURIComponent('dlv:p-4:console-hook')}`)).status, 404);
  step('deleted from the Routes view: the next urgent notification no longer takes it');
  receiver.close();
  assert.ok(!s.log.includes(hookSecret), 'the route secret in the server log');

  // An endpoint's circuit (section 17): a webhook route whose receiver answers 503 opens after
  // two failures in a row; the Outbox view shows it open with its last failure; the receiver
  // recovers, a probe closes it and the row reads ok; the operator disables it from the view
  // (a reason, a confirmation) and enables it again.
  let failing = true;
  const cbPosts = [];
  const cb = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => { cbPosts.push(req.headers['webhook-id']); res.statusCode = failing ? 503 : 200; res.end(); });
  });
  await new Promise((r) => cb.listen(0, '127.0.0.1', r));
  await s.ok('PUT', '/v1/routes/console-cb', {
    route: {
      sink: 'webhook', url: `http://127.0.0.1:${cb.address().port}/hook`, priorities: ['urgent'],
      retry: { max_attempts: 100, base_delay: '100ms', max_delay: '200ms' },
      circuit: { failures: 2, cool_down: '1s' },
    },
    reason: 'a circuit for the console',
  });
  await s.append([notif('cb-1', 'Circuit one', { type: 'email' }), notif('cb-2', 'Circuit two', { type: 'email' })]);
  await view(page, 'outbox');
  const cbRow = page.locator('#endpoints tr[data-route=console-cb]');
  await until('the circuit open in the Outbox view', async () => {
    await page.evaluate(() => loadEndpoints());
    return (await cbRow.getAttribute('data-state').catch(() => null)) === 'open';
  });
  const openText = await cbRow.textContent();
  assert.ok(openText.includes('http_503') && openText.includes('next probe'), openText);
  // A waiting delivery's timeline says why it waits.
  const waiting = (await s.ok('GET', '/v1/deliveries?route=console-cb&limit=10')).deliveries
    .find((d) => d.status === 'queued' || d.status === 'retry_wait');
  if (waiting) {
    await page.evaluate((id) => openTimeline(id), waiting.id);
    const held = await text(page, '#timeline [data-testid=timeline-held]');
    assert.ok(held.includes('circuit of route console-cb is open'), held);
  }
  step(`the Outbox view shows the endpoint open: ${openText.replace(/\s+/g, ' ').trim()}`);
  await snap(page, 'endpoint-open');
  failing = false;
  await until('the probe closes the circuit', async () => {
    await page.evaluate(() => loadEndpoints());
    return (await cbRow.getAttribute('data-state')) === 'ok';
  });
  await waitStatus(s, 'dlv:cb-1:console-cb', 'sent');
  await waitStatus(s, 'dlv:cb-2:console-cb', 'sent');
  const closed = await s.ok('GET', '/v1/events?stream=endpoints&type=endpoint.circuit_closed');
  assert.equal(closed.events.length, 1);
  step('the receiver recovered: a probe closed the circuit and both deliveries went');
  // Without a reason, Disable says so before it asks for a confirmation.
  await page.fill('[data-testid=endpoint-reason]', '');
  await cbRow.locator('[data-testid=endpoint-disable]').click();
  await page.waitForSelector('#flash:has-text("a reason is required")', { timeout: WAIT });
  assert.equal(await page.evaluate(() => document.querySelector('#confirm').open), false, 'asked to confirm before saying the reason is missing');
  await page.fill('[data-testid=endpoint-reason]', 'the receiver moves tonight');
  const confirmDisable = await cancelThenConfirm(page, cbRow.locator('[data-testid=endpoint-disable]'), /Disable the endpoint of console-cb\?/, 'confirm-endpoint-disable');
  assert.equal((await s.ok('GET', '/v1/events?stream=endpoints&type=endpoint.disabled')).events.length, 0, 'a cancelled disable disabled it');
  await confirmDisable();
  await until('the endpoint disabled', async () => (await cbRow.getAttribute('data-state')) === 'disabled');
  const disabled = (await s.ok('GET', '/v1/events?stream=endpoints&type=endpoint.disabled')).events;
  assert.equal(disabled.length, 1);
  assert.equal(disabled[0].payload.reason, 'the receiver moves tonight');
  await snap(page, 'endpoint-disabled');
  await cbRow.locator('[data-testid=endpoint-enable]').click();
  await until('the endpoint enabled', async () => (await cbRow.getAttribute('data-state')) === 'ok');
  assert.equal((await s.ok('GET', '/v1/events?stream=endpoints&type=endpoint.enabled')).events.length, 1);
  step('the Outbox view disabled the endpoint (after a confirmation) and enabled it again');
  cb.close();

  // The status record shows whom the notification reached.
  await view(page, 'notifications');
  await page.click('#notifications tr[data-id="p-1"]');
  const rec = await text(page, '#notification [data-testid=resolved-targets]');
  for (const m of members) assert.ok(rec.includes(m), rec);
  step('the status record shows the resolved targets');

  // A source and a list have links of their own too.
  await page.goto('about:blank');
  await page.goto(`${s.base}/#sources/dead`);
  await ready(page);
  await page.waitForSelector('#source:not([hidden]) h3:has-text("dead")', { timeout: WAIT });
  // Never a success for three intervals (3 s here): stale, in the list and the panel.
  await until('the source stale', async () => (await s.ok('GET', '/v1/sources/dead')).stale === true);
  await view(page, 'sources');
  await page.waitForSelector('#sources tr[data-name=dead] .pill:text-is("stale")', { timeout: WAIT });
  await page.click('#sources tr[data-name=dead]');
  await page.waitForSelector('#source [data-testid=source-stale]', { timeout: WAIT });
  await page.goto('about:blank');
  await page.goto(`${s.base}/#lists/oncall`);
  await ready(page);
  // A list has a panel of its own at its link: members, last change, its deliveries; brought
  // into view and focused.
  await page.waitForSelector('#list:not([hidden]) h3:has-text("oncall")', { timeout: WAIT });
  assert.equal(await text(page, '#list [data-testid=list-count]'), '3 members');
  const shownMembers = await page.locator('#list [data-testid=list-members-shown] li').allTextContents();
  assert.deepEqual(shownMembers.map((m) => m.trim()), members);
  await page.waitForSelector('#list tr[data-id="dlv:p-1:email"] .pill:text-is("sent")', { timeout: WAIT });
  await until('the list panel in view and focused', () => inViewAndFocused(page, '#list'));
  await snap(page, 'list-panel');
  await page.click('#list tr[data-id="dlv:p-1:email"]');
  await page.waitForSelector('#timeline:not([hidden]) h3:has-text("dlv:p-1:email")', { timeout: WAIT });
  await until('the delivery link', async () => page.url().endsWith(`#deliveries/${encodeURIComponent('dlv:p-1:email')}`));
  step('links: #sources/<name> opens directly; #lists/<name> opens the list\'s own panel');

  // Deleting the list asks first; confirmed, it is gone.
  await view(page, 'lists');
  const confirm = await cancelThenConfirm(page, page.locator('#lists tr[data-name=oncall] [data-testid=list-delete]'), /oncall/);
  assert.equal((await s.req('GET', '/v1/lists/oncall')).status, 200);
  await confirm();
  await until('the list deleted', async () => (await s.req('GET', '/v1/lists/oncall')).status === 404);
  step('Delete: cancel kept the list, confirm deleted it');
  assert.deepEqual(page.external, []);
  assert.deepEqual(page.errors, []);
  assert.deepEqual(page.missing, [], 'the page asked for a file the server does not have');
  await page.context().close();
  await s.kill9();
  smtp.proc.kill('SIGKILL');
}

// ---------------------------------------------------------------------------------------------
// Scenario 4 (issue 40, "fix from the console"): reset a stopped subscription's cursor (admin
// only, its lag shown first, a reason, a confirmation), resume a parked source, deep links that
// bring their panel into view, no stale error on a sent delivery, "1 of 2 delivered", due times,
// payloads in the live tail and the event browser (newest first, secrets never shown), and an
// icon that is not a 404.

async function fixFromTheConsole() {
  const admin = randomBytes(16).toString('hex');
  const operator = randomBytes(16).toString('hex');
  const port = await freePort();
  const s = new Server('fix', `${tokenToml('fix-admin', admin, ['admin'])}
${tokenToml('fix-operator', operator, ['read', 'operator'])}
[notifications.routing]
urgent = ["dashboard", "desktop", "pager"]
action = ["dashboard", "desktop"]
warning = ["dashboard", "slow"]
info = ["dashboard", "later"]
[notifications.retry]
strategy = "fixed"
base_delay = "100ms"
max_delay = "100ms"
jitter = 0.0
[notifications.routes.pager]
sink = "app"
[notifications.routes.slow]
sink = "app"
retry = { strategy = "fixed", base_delay = "1h", max_delay = "1h", jitter = 0.0 }
[notifications.routes.later]
sink = "app"
delay = ["1h", "2h"]

# An upstream that answers 404 (this server's own unknown path): the source parks.
${sourceToml('broken', `http://127.0.0.1:${port}/no-such-upstream`, '1h', '5s')}`, {
    // The read models fold each commit 100 ms late (a test knob), as on a busy machine: the
    // lag view, which never waits for them, answers the console's read right after a reset
    // from before it; the console must read again until the row shows the reset.
    TIDEMARK_FAULT_FOLD_DELAY_MS: '100',
  });
  s.port = port;
  s.token = admin;
  await s.start();
  step(`fix server on ${s.base}`);

  // Deliveries: one notification sent on one route and parked on the other; one sent after a
  // failed attempt; one waiting an hour to retry; one scheduled an hour or two ahead.
  await s.append([notif('mix-1', 'Half delivered'),
    notif('mix-2', 'Parked on one route, in flight on the other'),
    notif('retry-1', 'Sent on the second attempt', { priority: 'action' }),
    notif('slow-1', 'Retries in an hour', { priority: 'warning' }),
    notif('later-1', 'Scheduled for later', { priority: 'info' })]);
  const due = ['dlv:mix-1:desktop', 'dlv:mix-1:pager', 'dlv:mix-2:desktop', 'dlv:mix-2:pager',
    'dlv:retry-1:desktop', 'dlv:slow-1:slow'];
  for (const id of due) await waitStatus(s, id, 'queued');
  await waitStatus(s, 'dlv:later-1:later', 'queued');
  const lease = { owner: 'fix-test', lease_ms: 60_000 };
  const c1 = await s.ok('POST', '/v1/deliveries/claim', { sink: 'app', limit: 100, ...lease });
  assert.deepEqual(c1.deliveries.map((d) => d.id).sort(), [...due].sort(), 'the scheduled one is not due');
  const act = (id, verb, body) => s.ok('POST', `/v1/deliveries/${encodeURIComponent(id)}/${verb}`, { owner: 'fix-test', ...body });
  await act('dlv:mix-1:desktop', 'complete', {});
  await act('dlv:mix-1:pager', 'fail', { error_code: 'rejected', error: 'the pager said no', retryable: false });
  // mix-2: parked on the pager while its desktop delivery stays leased (an hour).
  await act('dlv:mix-2:pager', 'fail', { error_code: 'rejected', error: 'the pager said no', retryable: false });
  await act('dlv:mix-2:desktop', 'extend', { lease_ms: 3_600_000 });
  await act('dlv:retry-1:desktop', 'fail', { error_code: 'unavailable', error: 'connection reset by peer', retryable: true });
  await act('dlv:slow-1:slow', 'fail', { error_code: 'unavailable', error: 'try later', retryable: true });
  await waitStatus(s, 'dlv:mix-1:pager', 'parked');
  await waitStatus(s, 'dlv:slow-1:slow', 'retry_wait');
  await until('the retry of dlv:retry-1:desktop', async () => {
    const c = await s.ok('POST', '/v1/deliveries/claim', { sink: 'app', limit: 10, ...lease });
    assert.ok(c.deliveries.every((d) => d.id === 'dlv:retry-1:desktop'), JSON.stringify(c.deliveries.map((d) => d.id)));
    return c.deliveries.length === 1;
  });
  await act('dlv:retry-1:desktop', 'complete', {});
  const resent = await waitStatus(s, 'dlv:retry-1:desktop', 'sent');
  step(`dlv:retry-1:desktop sent on attempt ${resent.attempts}; the API's last_error: ${JSON.stringify(resent.last_error)}`);

  // Enough rows that a panel below a list opens out of the first screen.
  await s.append(Array.from({ length: 55 }, (_, i) => taskEv(`bulk-${i}`, 'task.created', { project_id: 'p-bulk', title: `Bulk task ${i}` })));
  await s.append(Array.from({ length: 55 }, (_, i) => notif(`bulk-n-${i}`, `Bulk notification ${i}`, { priority: 'action' })));

  // A subscription stopped at a mismatch (run r1 completed, then failed), and a webhook one
  // whose secret must never be shown.
  const task = 'fix-task';
  await s.append([taskEv(task, 'task.created', { project_id: 'p-fix', title: 'Fix task', review_required: false })]);
  await s.ok('POST', `/v1/tasks/${task}/notifications/bridges`, {
    subscription_id: 'sub-fix', bridge_id: 'bridge-fix', thread_id: 'th-fix', sink: { kind: 'pull' } });
  const [, completed] = await s.append([taskEv(task, 'task.run_started', { run_id: 'r1' }),
    taskEv(task, 'task.run_completed', { run_id: 'r1' }), taskEv(task, 'task.run_failed', { run_id: 'r1', error: 'late crash' })]);
  const secret = `console-secret-${randomBytes(12).toString('hex')}`;
  await s.append([taskEv('hook-task', 'task.created', { project_id: 'p-fix', title: 'Hooked task' })]);
  await s.ok('POST', '/v1/tasks/hook-task/notifications/bridges', {
    subscription_id: 'sub-hook', bridge_id: 'bridge-hook', thread_id: 'th-hook',
    sink: { kind: 'webhook', url: 'http://127.0.0.1:9/hook', secret } });
  const consumer = 'bridge_task_subscription:sub-fix';
  const lagOf = async () => (await s.ok('GET', '/v1/consumers/lag')).consumers.find((c) => c.consumer_id === consumer);
  const stopped = await until('sub-fix stopped', async () => { const l = await lagOf(); return l && l.stopped && l; });
  assert.equal(stopped.stopped_seq, completed, JSON.stringify(stopped));

  // The source parks on its upstream's 404 (at its first poll, at the start, or now).
  const poll = await s.req('POST', '/v1/sources/broken/poll');
  assert.ok(poll.status === 202 || poll.json.code === 'source_not_active', poll.text);
  await until('the source parked', async () => (await s.ok('GET', '/v1/sources/broken')).state === 'parked');

  const page = await openPage(s);
  await login(page, operator);
  assert.equal(await page.getAttribute('#who', 'data-scopes'), 'read operator');

  // With the operator scope: Reset is offered disabled (admin only); Resume is enabled.
  await view(page, 'consumers');
  const lagRow = page.locator(`#lag tr[data-consumer="${consumer}"]`);
  await lagRow.locator('[data-testid=stopped]').waitFor({ timeout: WAIT });
  const resetButton = lagRow.locator('[data-testid=reset-cursor]');
  assert.ok(await resetButton.isDisabled(), 'an operator token sees Reset disabled');
  assert.equal(await resetButton.getAttribute('title'), 'needs the admin scope');
  await view(page, 'sources');
  const srcRow = page.locator('#sources tr[data-name=broken]');
  await srcRow.locator('.pill:text-is("parked")').waitFor({ timeout: WAIT });
  // Parked is an error's colour, not the grey of a paused source.
  const parkedBg = await srcRow.locator('.pill:text-is("parked")').evaluate((e) => getComputedStyle(e).backgroundColor);
  assert.equal(parkedBg, 'rgb(251, 224, 222)', 'a parked source reads red');
  assert.ok(await srcRow.locator('[data-testid=resume]').isEnabled(), 'an operator resumes a parked source');
  assert.ok(await srcRow.locator('[data-testid=poll]').isDisabled(), 'Poll now waits for the resume');
  assert.equal(await srcRow.locator('[data-testid=poll]').getAttribute('title'), 'parked: resume it first');
  step('an operator token: Reset disabled (admin only), Resume enabled on the parked source');
  await snap(page, 'source-parked');

  // Resume on the parked source: recorded in the log (it polls at once, and parks again on
  // the same 404).
  const resumedBefore = (await s.ok('GET', '/v1/events?stream=sources&subject=broken&type=source.resumed')).events.length;
  await srcRow.locator('[data-testid=resume]').click();
  await until('source.resumed in the log', async () => (await s.ok('GET', '/v1/events?stream=sources&subject=broken&type=source.resumed')).events.length === resumedBefore + 1);
  assert.ok(page.writes.includes('POST /v1/sources/broken/resume'), JSON.stringify(page.writes));
  const resumed = (await s.ok('GET', '/v1/events?stream=sources&subject=broken&type=source.resumed')).events.at(-1);
  assert.equal(resumed.payload.by, 'fix-operator', JSON.stringify(resumed));
  step('Resume on the parked source: source.resumed by fix-operator');

  // The admin token: the reset panel shows the lag the reset would leave before it sends.
  await login(page, admin);
  await view(page, 'consumers');
  await lagRow.locator('[data-testid=reset-cursor]').click();
  await page.waitForSelector('#reset:not([hidden])', { timeout: WAIT });
  await until('the reset panel in view and focused', () => inViewAndFocused(page, '#reset'));
  assert.equal(await page.inputValue('[data-testid=reset-seq]'), String(completed), 'offered the seq it stopped at');
  const past = async (after) => (await s.ok('GET', `/v1/events?stream=task_events&subject=${task}&after_sequence=${after}&limit=1000`)).events.length;
  const leaves = await past(completed);
  assert.ok(leaves >= 1, 'the failure after the completion is left to decide');
  await page.waitForSelector(`[data-testid=reset-lag][data-for="${completed}"][data-lag="${leaves}"]`, { timeout: WAIT });
  await page.fill('[data-testid=reset-seq]', '0');
  const all = await past(0);
  await page.waitForSelector(`[data-testid=reset-lag][data-for="0"][data-lag="${all}"]`, { timeout: WAIT });
  await page.fill('[data-testid=reset-seq]', String(completed));
  await page.waitForSelector(`[data-testid=reset-lag][data-for="${completed}"][data-lag="${leaves}"]`, { timeout: WAIT });
  const go = page.locator('[data-testid=reset-go]');
  assert.ok(await go.isDisabled(), 'no reset without a reason');
  await page.fill('[data-testid=reset-reason]', 'r1 failed after completing: skip the completion');
  await until('Reset enabled with a reason', () => go.isEnabled());
  const confirmReset = await cancelThenConfirm(page, go, /Reset the cursor of bridge_task_subscription:sub-fix\?/, 'confirm-reset');
  assert.match(await text(page, '#confirm-text'), new RegExp(`to seq ${completed}: it will be ${leaves} events behind`));
  assert.equal((await s.ok('GET', `/v1/tasks/${task}/notifications/bridges/sub-fix`)).cursor.last_sequence, 0, 'a cancelled reset moved the cursor');
  await confirmReset();
  await until('the cursor reset', async () => (await s.ok('GET', `/v1/tasks/${task}/notifications/bridges/sub-fix`)).cursor.last_sequence === completed);
  assert.deepEqual(page.writes.filter((w) => w.includes('/cursors/reset')), ['POST /v1/cursors/reset'], 'one reset, after the confirmation');
  const after = await until('the lag after the reset', async () => { const l = await lagOf(); return l.last_sequence === completed && l; });
  assert.equal(after.lag_events, leaves, `the lag the panel showed is the lag the reset left: ${JSON.stringify(after)}`);
  assert.equal(after.stopped, false, JSON.stringify(after));
  const resetEv = (await s.ok('GET', '/v1/events?stream=cursors&type=cursor.reset&order=desc&limit=1')).events[0];
  assert.match(JSON.stringify(resetEv.payload), /skip the completion/);
  await page.waitForSelector(`#lag tr[data-consumer="${consumer}"]:not(:has([data-testid=stopped]))`, { timeout: WAIT });
  step(`Reset: showed ${leaves} event(s) left, cancel sent nothing, confirm moved sub-fix to seq ${completed}`);
  await snap(page, 'cursor-reset');

  // Deep links: a task and a delivery below a list of 50 rows, and a list, open in view and
  // focused.
  const linked = await openPage(s);
  await login(linked, admin);
  await openLink(linked, s, '#tasks/bulk-3');
  await linked.waitForSelector('#task:not([hidden]) h3:has-text("bulk-3")', { timeout: WAIT });
  assert.equal(await linked.locator('#tasks tbody tr[data-id]').count(), 50);
  assert.ok(await belowTheFold(linked, '#task'), 'the task panel is below the first screen');
  await until('the task panel in view and focused', () => inViewAndFocused(linked, '#task'));
  await snap(linked, 'deep-link-task');
  await openLink(linked, s, `#deliveries/${encodeURIComponent('dlv:bulk-n-1:desktop')}`);
  await linked.waitForSelector('#timeline:not([hidden]) h3:has-text("dlv:bulk-n-1:desktop")', { timeout: WAIT });
  assert.ok(await belowTheFold(linked, '#timeline'), 'the timeline is below the first screen');
  await until('the timeline in view and focused', () => inViewAndFocused(linked, '#timeline'));
  // A click on a row of the list does the same.
  await linked.evaluate(() => window.scrollTo(0, 0));
  await linked.click('#nav a[data-view=tasks]');
  await linked.click('#tasks tr[data-id="bulk-40"]');
  await linked.waitForSelector('#task:not([hidden]) h3:has-text("bulk-40")', { timeout: WAIT });
  await until('the clicked task in view and focused', () => inViewAndFocused(linked, '#task'));
  step('deep links and clicks bring the task and delivery panels into view, focused');
  // A run that completed without having started: the task view says it is a mismatch.
  await s.append([taskEv('never-started', 'task.created', { project_id: 'p' }),
    taskEv('never-started', 'task.run_completed', { run_id: 'r7' })]);
  await openLink(linked, s, '#tasks/never-started');
  const outcome = linked.locator('[data-testid=run-outcome][data-run=r7]');
  await outcome.waitFor({ timeout: WAIT });
  assert.equal((await outcome.textContent()).trim(), 'no outcome: reported completed without a start (mismatch: run_not_started)');
  step('a completion of a run that never started reads as a mismatch in the task view');
  assert.deepEqual(linked.errors, []);
  assert.deepEqual(linked.missing, []);
  await linked.context().close();

  // A sent delivery shows no stale error; its history still has the failed attempt.
  await view(page, 'outbox');
  await page.fill('#dfilter [name=notification_id]', 'retry-1');
  await page.click('[data-testid=filter-apply]');
  const sentRow = page.locator('#deliveries tr[data-id="dlv:retry-1:desktop"]');
  await sentRow.locator('.pill:text-is("sent")').waitFor({ timeout: WAIT });
  assert.equal((await sentRow.locator('td[data-field=last_error]').textContent()).trim(), '', 'a sent row shows no error');
  await sentRow.click();
  await page.waitForSelector('[data-testid=timeline-status]:text-is("sent")', { timeout: WAIT });
  assert.equal(await page.locator('#timeline [data-testid=timeline-error]').count(), 0, 'no current error on a sent delivery');
  assert.match(await page.locator('#timeline table').textContent(), /connection reset by peer/, 'the history keeps the failed attempt');
  if (resent.last_error) await page.locator('#timeline [data-testid=timeline-earlier]').waitFor({ timeout: WAIT });
  await until('the timeline in view', () => inViewAndFocused(page, '#timeline'));
  step('a delivery sent after a failed attempt: no error in its row or state, the failure in its history');
  await snap(page, 'sent-after-retry');

  // Due times: waiting to retry, and scheduled.
  await page.fill('#dfilter [name=notification_id]', '');
  await page.selectOption('#dfilter select[name=status]', 'retry_wait');
  await page.click('[data-testid=filter-apply]');
  const slow = await delivery(s, 'dlv:slow-1:slow');
  assert.ok(slow.next_attempt_at, JSON.stringify(slow));
  const slowDue = page.locator('#deliveries tr[data-id="dlv:slow-1:slow"] [data-testid=due]');
  await slowDue.waitFor({ timeout: WAIT });
  assert.equal(await slowDue.getAttribute('data-due'), slow.next_attempt_at);
  assert.match(await slowDue.textContent(), /^retry due .+ \(in \d+m\)$/);
  await page.selectOption('#dfilter select[name=status]', 'queued');
  await page.fill('#dfilter [name=route]', 'later');
  await page.click('[data-testid=filter-apply]');
  const later = await delivery(s, 'dlv:later-1:later');
  const laterDue = page.locator('#deliveries tr[data-id="dlv:later-1:later"] [data-testid=due]');
  await laterDue.waitFor({ timeout: WAIT });
  assert.equal(await laterDue.getAttribute('data-due'), later.next_attempt_at);
  assert.match(await laterDue.textContent(), /^scheduled, due /);
  assert.ok(Date.parse(later.next_attempt_at) - Date.parse(later.created_at) >= 3_600_000, JSON.stringify(later));
  step(`due times: retry at ${slow.next_attempt_at}, scheduled at ${later.next_attempt_at}`);
  await snap(page, 'due-times');
  await page.fill('#dfilter [name=route]', '');
  await page.selectOption('#dfilter select[name=status]', '');

  // One of two deliveries sent, the other parked: "1 of 2 delivered" and "1 parked".
  const mix = await s.ok('GET', '/v1/notifications/mix-1');
  assert.equal(mix.status, 'parked');
  // Older than the 50 rows shown: opened by its link.
  await page.evaluate(() => { location.hash = '#notifications/mix-1'; });
  await page.waitForSelector('[data-testid=ntf-status]:text-is("1 of 2 delivered")', { timeout: WAIT });
  assert.equal(await text(page, '[data-testid=ntf-count-parked]'), '1 parked');
  assert.equal(await page.getAttribute('[data-testid=ntf-status]', 'data-status'), 'parked');
  assert.match(await text(page, '[data-testid=ntf-delivered]'), /^1 of 2, the last at /);
  assert.match(await text(page, '[data-testid=ntf-error]'), /the pager said no/);
  await snap(page, 'notification-partly-delivered');
  await page.evaluate(() => { location.hash = '#notifications/retry-1'; });
  await page.waitForSelector('[data-testid=ntf-status]:text-is("delivered")', { timeout: WAIT });
  assert.equal(await page.locator('#notification [data-testid=ntf-error]').count(), 0, 'a delivered notification shows no error as its state');
  step('mix-1 reads "1 of 2 delivered · 1 parked"; retry-1 delivered without a red error');
  // Pending beside a parked delivery: the status is "pending" (spec section 14), and the
  // parked one is counted beside it, not hidden.
  await page.evaluate(() => { location.hash = '#notifications/mix-2'; });
  await page.waitForSelector('[data-testid=ntf-status]:text-is("pending")', { timeout: WAIT });
  assert.equal(await text(page, '[data-testid=ntf-count-parked]'), '1 parked');
  assert.equal(await text(page, '[data-testid=ntf-count-leased]'), '1 leased');
  step('mix-2 reads "pending · 1 parked · 1 leased"');

  // The event browser: a stream newest first, paged down; a seq range either way; a payload on
  // click with the webhook secret redacted.
  await view(page, 'events');
  await page.fill('[data-testid=ev-stream]', 'task_events');
  await page.click('[data-testid=ev-apply]');
  const taskEvents = [];
  for (let after = 0; ;) {
    const p = await s.ok('GET', `/v1/events?stream=task_events&after_sequence=${after}&limit=1000`);
    taskEvents.push(...p.events.map((e) => e.seq));
    if (p.next_after_sequence >= p.latest_event_seq || !p.events.length) break;
    after = p.next_after_sequence;
  }
  const newestFirst = [...taskEvents].reverse();
  const seqsShown = async (sel) => page.locator(`${sel} tbody tr[data-seq]`).evaluateAll((rs) => rs.map((r) => Number(r.dataset.seq)));
  await until('the newest 50 task events', async () => (await seqsShown('#events')).join() === newestFirst.slice(0, 50).join());
  await page.click('[data-testid=ev-more]');
  await until('all task events, newest first', async () => (await seqsShown('#events')).join() === newestFirst.join());
  await page.waitForSelector('[data-testid=ev-more]', { state: 'hidden', timeout: WAIT });
  step(`the event browser lists the ${newestFirst.length} task_events newest first over two pages`);
  await page.fill('[data-testid=ev-stream]', '');
  await page.fill('[data-testid=ev-from]', '3');
  await page.fill('[data-testid=ev-to]', '7');
  await page.click('[data-testid=ev-apply]');
  await until('seqs 7 to 3', async () => (await seqsShown('#events')).join() === '7,6,5,4,3');
  await page.waitForSelector('[data-testid=ev-more]', { state: 'hidden', timeout: WAIT });
  await page.selectOption('[data-testid=ev-order]', 'asc');
  await page.click('[data-testid=ev-apply]');
  await until('seqs 3 to 7', async () => (await seqsShown('#events')).join() === '3,4,5,6,7');
  await page.waitForSelector('[data-testid=ev-more]', { state: 'hidden', timeout: WAIT });
  assert.ok(page.urls.some((u) => u.includes('order=asc') && u.includes('before_sequence=8')), 'the range read with before_sequence');
  await page.fill('[data-testid=ev-from]', '');
  await page.fill('[data-testid=ev-to]', '');
  await page.selectOption('[data-testid=ev-order]', 'desc');
  await page.fill('[data-testid=ev-stream]', 'bridges');
  await page.fill('[data-testid=ev-subject]', 'sub-hook');
  await page.click('[data-testid=ev-apply]');
  const hookRow = page.locator('#events tr[data-type="bridge.subscribed"]');
  await hookRow.waitFor({ timeout: WAIT });
  await hookRow.click();
  await page.waitForSelector('#event:not([hidden]) [data-testid=payload]', { timeout: WAIT });
  const payloadText = await text(page, '#event [data-testid=payload]');
  assert.match(payloadText, /"secret": "\[redacted\]"/);
  // A webhook URL is a credential (its path, for chat webhooks): shown by scheme, host and
  // port only, to every scope (spec section 17).
  assert.match(payloadText, /"url": "http:\/\/127\.0\.0\.1:9"/);
  assert.ok(!payloadText.includes('/hook'), payloadText);
  const seqOfHook = await hookRow.getAttribute('data-seq');
  await until('the event link', async () => page.url().endsWith(`#events/${seqOfHook}`));
  await until('the event panel in view', () => inViewAndFocused(page, '#event'));
  assert.ok(!(await page.content()).includes(secret), 'the webhook secret is on the page');
  step('the event browser: a seq range both ways; bridge.subscribed with its secret redacted');
  await snap(page, 'event-payload');

  // The live tail shows payloads (a field named like a secret masked), each in full on click.
  await view(page, 'tail');
  await page.waitForSelector('[data-testid=tail-state]:text-is("live")', { timeout: WAIT });
  const [tailSeq] = await s.append([{ event_id: 'tail-payload-1', stream: 'orders', subject: 'o-1', type: 'order.placed',
    payload: { note: 'hello from the tail', password: 'hunter2-not-shown', items: [1, 2] } }]);
  const tailRow = page.locator(`#tail tr[data-seq="${tailSeq}"]`);
  await tailRow.waitFor({ timeout: WAIT });
  const preview = await tailRow.locator('td[data-field=payload]').textContent();
  assert.match(preview, /hello from the tail/);
  assert.ok(!preview.includes('hunter2'), preview);
  await tailRow.click();
  await page.waitForSelector('#tail-payload:not([hidden]) [data-testid=payload]', { timeout: WAIT });
  const tailPayload = await text(page, '#tail-payload [data-testid=payload]');
  assert.match(tailPayload, /"note": "hello from the tail"/);
  assert.match(tailPayload, /"password": "\[redacted\]"/);
  assert.ok(!(await page.content()).includes('hunter2'), 'a password on the page');
  step('the live tail shows the payload, a password masked');
  await snap(page, 'tail-payload');

  // The icon: linked from the page, served at its link and at /favicon.ico; nothing the page
  // loaded was a 404.
  const icons = await page.evaluate(async () => {
    const out = [];
    for (const u of [document.querySelector('link[rel=icon]').href, '/favicon.ico']) {
      const r = await fetch(u);
      out.push([u, r.status, r.headers.get('content-type'), (await r.text()).slice(0, 4)]);
    }
    return out;
  });
  for (const [u, st, ty, start] of icons) {
    assert.equal(st, 200, u);
    assert.match(ty, /^image\/svg\+xml/, u);
    assert.equal(start, '<svg', u);
  }
  assert.deepEqual(page.missing, [], 'the page asked for a file the server does not have');
  step(`the icon is served (${icons.map(([u]) => new URL(u, s.base).pathname).join(', ')}); no 404 on load`);

  assert.deepEqual(page.external, []);
  assert.deepEqual(page.errors, []);
  await page.context().close();
  await s.kill9();
  assert.ok(!s.log.includes(secret), 'the webhook secret in the server log');
}

// ---------------------------------------------------------------------------------------------
// Scenario 5: tenants (spec section 20). A `*` token switches the console between the
// tenants of the directory: every view and the live tail show the chosen tenant's data alone,
// the choice survives a reload; the Deployment view reads every tenant in its shard (two
// shards here) and opens one; a tenant's own token has its tenant fixed, and no Deployment.

async function tenants() {
  const op = randomBytes(16).toString('hex');
  const acmeToken = randomBytes(16).toString('hex');
  const s = new Server('tenants',
    '[log]\nshards = 2\n\n' + tokenToml('console-op', op, ['admin']) + tokenToml('acme-admin', acmeToken, ['admin'], 'acme'));
  s.token = op;
  await s.start();
  step(`tenants server on ${s.base}`);
  for (const name of ['acme', 'beta']) await s.ok('POST', '/v1/tenants', { name, reason: 'console test' });
  const ev = (id) => ({ event_id: id, stream: 'orders', subject: id, type: 'order.placed', payload: { marker: id } });
  const append = async (prefix, id) => (await s.ok('POST', `${prefix}/v1/events`, { events: [ev(id)] })).events[0].seq;
  await append('', 'default-only');
  await append('/tenants/acme', 'acme-only');
  await append('/tenants/beta', 'beta-only');

  const page = await openPage(s);
  await login(page, op);
  const options = () => page.locator('#tenant option').evaluateAll((os) => os.map((o) => o.value));
  assert.deepEqual(await options(), ['default', 'acme', 'beta']);
  assert.equal(await page.inputValue('#tenant'), 'default');
  const events = () => page.locator('#events tbody').textContent({ timeout: WAIT });
  await view(page, 'events');
  await until('the default tenant\'s events', async () => (await events()).includes('default-only'));
  assert.ok(!/acme-only|beta-only/.test(await events()), 'another tenant\'s event in the default tenant\'s list');

  await page.selectOption('#tenant', 'acme');
  await until('acme\'s events', async () => (await events()).includes('acme-only'));
  assert.ok(!/default-only|beta-only/.test(await events()), await events());
  step('the switch shows acme\'s events alone');
  await snap(page, 'tenant-switch');

  // The live tail follows the chosen tenant: an event of the default tenant appended between
  // two of acme's never shows.
  await view(page, 'tail');
  await page.waitForSelector('[data-testid=tail-state]:text-is("live")', { timeout: WAIT });
  await append('/tenants/acme', 'acme-live-1');
  const other = await append('', 'default-live');
  const last = await append('/tenants/acme', 'acme-live-2');
  await page.waitForSelector(`#tail tr[data-seq="${last}"]`, { timeout: WAIT });
  assert.equal(await page.locator(`#tail tr[data-seq="${other}"]`).count(), 0, 'the default tenant\'s event in acme\'s tail');
  step(`acme's live tail shows seq ${last}, not the default tenant's ${other}`);

  // The choice stays with the tab; every tenant call went under /tenants/acme, the
  // deployment's directory under /v1.
  await page.reload();
  await ready(page);
  assert.equal(await page.inputValue('#tenant'), 'acme');
  const paths = page.urls.map((u) => new URL(u).pathname);
  assert.ok(paths.includes('/tenants/acme/v1/events'), JSON.stringify(paths));
  assert.ok(paths.includes('/v1/tenants'), JSON.stringify(paths));
  assert.ok(!paths.includes('/tenants/acme/v1/tenants'), JSON.stringify(paths));

  // The deployment at a glance: every tenant from its own shard; beta's disabled endpoint
  // flags it; the attention filter keeps it alone; its name opens its outbox.
  await s.ok('PUT', '/tenants/beta/v1/routes/hook', { route: { sink: 'webhook', url: 'http://127.0.0.1:9/never' }, reason: 'console test' });
  await s.ok('POST', '/tenants/beta/v1/outbox/endpoints/hook/disable', { reason: 'maintenance' });
  await view(page, 'deployment');
  const row = (t) => page.locator(`#ov-tenants tr[data-tenant="${t}"]`);
  // The overview reads each shard as of at least its head: the disable shows at once.
  await page.waitForSelector('#ov-tenants tr[data-tenant="beta"] [data-testid=ov-endpoint]', { timeout: WAIT });
  assert.equal((await row('beta').locator('[data-testid=ov-endpoint]').textContent()).trim(), 'hook: disabled');
  const tenantsShown = () => page.locator('#ov-tenants tbody tr').evaluateAll((rs) => rs.map((r) => r.dataset.tenant));
  assert.deepEqual(await tenantsShown(), ['acme', 'beta', 'default']);
  assert.equal((await row('acme').locator('td').nth(1).textContent()).trim(), '1', 'acme in shard 1');
  assert.equal(await page.locator('#ov-shards tbody tr').count(), 2);
  await snap(page, 'deployment');
  await page.check('#ov-attention');
  await until('only beta', async () => JSON.stringify(await tenantsShown()) === '["beta"]');
  await row('beta').locator('[data-testid=ov-open]').click();
  await page.waitForSelector('#view-outbox:not([hidden])', { timeout: WAIT });
  await until('acting for beta', async () => (await page.inputValue('#tenant')) === 'beta');
  assert.equal(new URL(page.url()).hash, '#outbox');
  step('the Deployment view reads every tenant in its shard and opens beta');

  // Beta's own operational route, set from the console acting for beta.
  await view(page, 'routes');
  await page.fill('[data-testid=route-name]', 'beta-ops');
  await page.selectOption('[data-testid=route-sink]', 'webhook');
  await page.fill('[data-testid=route-url]', 'http://127.0.0.1:9/beta-ops');
  await page.check('[data-testid=route-operational-flag]');
  await page.fill('[data-testid=route-reason]', 'beta\'s operators');
  await page.click('[data-testid=route-save]');
  await page.waitForSelector('#routes tr[data-name="beta-ops"] [data-testid=route-operational]', { timeout: WAIT });
  const betaOps = await s.ok('GET', '/tenants/beta/v1/routes/beta-ops');
  assert.equal(betaOps.operational, true, JSON.stringify(betaOps));
  assert.equal(betaOps.route.operational, true, JSON.stringify(betaOps));
  step('beta\'s operational route set from the console');

  // A tenant's own token: its tenant, fixed.
  await login(page, acmeToken);
  assert.deepEqual(await options(), ['acme']);
  assert.ok(await page.locator('#tenant').isDisabled());
  assert.ok(await page.locator('#nav-deployment').isHidden(), 'the deployment\'s view for a tenant\'s token');
  await view(page, 'events');
  await until('acme\'s events for its token', async () => (await events()).includes('acme-only'));
  assert.ok(!/default-only|beta-only/.test(await events()), await events());
  step('a tenant\'s token sees its tenant fixed in the switch');
  assert.deepEqual(page.external, []);
  assert.deepEqual(page.errors, []);
  await page.context().close();
  await s.kill9();
}

// ---------------------------------------------------------------------------------------------

// playwright-core starts the browser with a fresh, empty --user-data-dir of its own (a temporary
// directory it deletes on close); it never downloads a browser.
browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--disable-quic'],
});
try {
  await openMode().catch(async (e) => { await failureShot('open-mode', e); throw e; });
  await withTokens().catch(async (e) => { await failureShot('tokens', e); throw e; });
  await pushDelivery().catch(async (e) => { await failureShot('push', e); throw e; });
  await fixFromTheConsole().catch(async (e) => { await failureShot('fix', e); throw e; });
  await tenants().catch(async (e) => { await failureShot('tenants', e); throw e; });
  step('all console checks passed');
} finally {
  await browser.close();
}
