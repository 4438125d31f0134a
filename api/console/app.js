// tidemark operator console (spec section 15). Plain JavaScript, no dependencies, served by the
// binary itself; it talks only to the public HTTP API under /v1, like any other client.
'use strict';

const ALL_SCOPES = ['read', 'append', 'bridge', 'operator', 'admin'];
const TOKEN_KEY = 'tidemark.token';
const TAIL_MAX = 200;
const KPI_EVERY_MS = 5000;

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  who: null, // {name, scopes, open}
  view: null,
  kpiTimer: null,
  dNext: null, // the next page of the deliveries list: {after} or {before}
  tNext: null, // the same of the tasks list
  nNext: null, // next_before_seq of the notifications list
  evNext: null, // the events browser's next page: a before_sequence (newest first) or after_sequence
  task: null, // the task shown
  tail: { ctrl: null, lastId: null, attempt: 0, filters: {}, timer: null },
};

// ---------------------------------------------------------------------------------------------
// Small DOM helpers: elements are built with textContent only (no HTML from the server).

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function table(node, headers, rows) {
  node.replaceChildren(
    el('thead', {}, el('tr', {}, headers.map((h) => el('th', { text: h })))),
    el('tbody', {}, rows),
  );
  if (!rows.length) {
    node.querySelector('tbody').append(
      el('tr', {}, el('td', { colspan: headers.length, class: 'muted', text: 'nothing here' })),
    );
  }
}

/// Replace `node`'s children, skipping absent ones (null, undefined, false).
function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}

function show(node, on) {
  node.hidden = !on;
}

function flash(msg, kind) {
  const f = $('#flash');
  f.textContent = msg;
  f.className = kind || 'info';
  f.hidden = false;
  clearTimeout(flash.timer);
  flash.timer = setTimeout(() => { f.hidden = true; }, 6000);
}

function fmtTime(s) {
  return s ? s.replace('T', ' ').replace(/\.\d+Z$/, 'Z') : '–';
}

/// How far ahead a time is: " (in 5m)", or " (now)" once it has passed.
function fmtIn(t) {
  const s = (Date.parse(t) - Date.now()) / 1000;
  return s > 0 ? ` (in ${fmtAge(s)})` : ' (now)';
}

/// Bring a panel just opened into view and give it the focus: the panels open below lists of
/// up to 50 rows, where a deep link (`#tasks/<id>`) or a click used to leave them out of view.
function reveal(node) {
  if (!node.hasAttribute('tabindex')) node.setAttribute('tabindex', '-1');
  node.scrollIntoView({ block: 'start' });
  node.focus({ preventScroll: true });
}

/// Field names whose values the console never shows, whatever the event: the server redacts
/// webhook secrets itself (`"[redacted]"`); this masks anything else named like a secret.
const SECRET_KEY = /^(secret|client_secret|password|passwd|token|api_key|apikey|authorization|hmac_key|private_key)$/i;

function masked(v) {
  if (Array.isArray(v)) return v.map(masked);
  if (v && typeof v === 'object') {
    const o = {};
    for (const [k, x] of Object.entries(v)) {
      o[k] = SECRET_KEY.test(k) && x !== null && x !== undefined ? '[redacted]' : masked(x);
    }
    return o;
  }
  return v;
}

/// A payload on one line, cut to `max` characters (the whole of it is a click away).
function payloadPreview(payload, max = 80) {
  const t = JSON.stringify(masked(payload ?? {}));
  return t.length > max ? `${t.slice(0, max - 1)}…` : t;
}

function fmtAge(seconds) {
  if (!seconds) return '0s';
  const s = Math.round(seconds);
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return `${Math.round(s / 3600)}h`;
}

// ---------------------------------------------------------------------------------------------
// The API: every call carries the tab's token; a 401 asks for one again.

class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.code = problem && problem.code;
  }
}

function authHeaders() {
  return state.token ? { Authorization: `Bearer ${state.token}` } : {};
}

async function api(method, path, body) {
  const headers = { Accept: 'application/json', ...authHeaders() };
  const init = { method, headers };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (r.status === 401) {
    askToken('The token was refused; paste another.');
    throw new ApiError(401, data);
  }
  if (!r.ok) throw new ApiError(r.status, data);
  return data;
}

function qs(params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') u.set(k, v);
  }
  const s = u.toString();
  return s ? `?${s}` : '';
}

function can(scope) {
  const w = state.who;
  if (!w) return false;
  return w.open || w.scopes.includes('admin') || w.scopes.includes(scope);
}

/// A button for an action that needs `scope`: disabled, with the reason, when the token lacks it.
/// With `confirm` ({title, text}), nothing is sent until the operator confirms in a dialog;
/// cancelling sends nothing.
function actionButton(label, scope, onclick, testid, confirm) {
  const allowed = can(scope);
  return el('button', {
    type: 'button',
    text: label,
    class: confirm ? 'danger' : null,
    disabled: !allowed,
    title: allowed ? null : `needs the ${scope} scope`,
    'data-testid': testid,
    onclick: async (ev) => {
      ev.stopPropagation();
      const b = ev.currentTarget;
      b.disabled = true;
      try {
        if (confirm && !(await confirmAction(confirm.title, confirm.text, label))) {
          flash(`${label} cancelled: nothing was sent`, 'info');
          return;
        }
        await onclick();
      } catch (e) { flash(`${label}: ${e.message}`, 'error'); }
      finally { b.disabled = !can(scope); }
    },
  });
}

/// Ask the operator to confirm an action in a modal dialog: true when confirmed; Cancel, Escape
/// or a second request while one is open answer false.
function confirmAction(title, text, okLabel) {
  const d = $('#confirm');
  if (d.open) return Promise.resolve(false);
  $('#confirm-title').textContent = title;
  $('#confirm-text').textContent = text;
  $('#confirm-ok').textContent = okLabel;
  d.returnValue = '';
  return new Promise((resolve) => {
    d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true });
    d.showModal();
    $('#confirm-cancel').focus();
  });
}

// ---------------------------------------------------------------------------------------------
// Token and identity.

function askToken(why) {
  state.who = null;
  stopTail();
  show($('#app'), false);
  show($('#login'), true);
  show($('#logout'), false);
  $('#who').textContent = '';
  $('#login-error').textContent = why || '';
  $('#token').focus();
}

async function identify() {
  const r = await fetch('/v1/whoami', { headers: { Accept: 'application/json', ...authHeaders() } });
  if (r.status === 401) {
    const had = !!state.token;
    if (had) sessionStorage.removeItem(TOKEN_KEY);
    state.token = null;
    askToken(had ? 'That token was refused.' : '');
    return false;
  }
  if (!r.ok) throw new ApiError(r.status, await r.json().catch(() => null));
  state.who = await r.json();
  const w = state.who;
  $('#who').textContent = w.open
    ? 'open mode (no tokens configured): every scope'
    : `${w.name}: ${w.scopes.join(', ')}`;
  $('#who').dataset.scopes = (w.open ? ALL_SCOPES : w.scopes).join(' ');
  show($('#logout'), !w.open);
  show($('#login'), false);
  show($('#app'), true);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Outbox: KPI tiles (refreshed), deliveries with filters, timelines, Retry and Discard.

const TILES = [
  ['queue_depth', 'Queue depth'],
  ['stuck', 'Stuck'],
  ['parked', 'Parked'],
  ['sent_last_interval', 'Sent (last interval)'],
  ['oldest_pending_age_s', 'Oldest pending'],
];

/// A KPI as shown: the oldest pending age is "–" when nothing is pending (not "0s").
function kpiText(k, f) {
  if (f !== 'oldest_pending_age_s') return k[f];
  return k.queue_depth > 0 ? fmtAge(k[f]) : '–';
}

function kpiRows(map) {
  return Object.entries(map || {}).map(([name, k]) => el('tr', { 'data-key': name },
    el('td', { text: name }),
    TILES.map(([f]) => el('td', { 'data-field': f, text: kpiText(k, f) }))));
}

async function loadKpis() {
  const k = await api('GET', '/v1/outbox/kpis');
  $('#tiles').replaceChildren(...TILES.map(([f, label]) => el('div', {
    class: `tile${(f === 'stuck' || f === 'parked') && k[f] > 0 ? ' warn' : ''}`,
    'data-testid': `tile-${f}`,
  },
  el('div', { class: 'label', text: label }),
  el('div', {
    class: 'value',
    'data-value': k[f],
    text: kpiText(k, f),
  }))));
  $('#kpi-asof').textContent = `as of seq ${k.as_of_seq}, sent interval ${k.interval_s}s`;
  const head = ['', ...TILES.map(([, l]) => l)];
  table($('#kpi-sinks'), head, kpiRows(k.by_sink));
  table($('#kpi-sites'), head, kpiRows(k.by_source_site));
  setHead(k.as_of_seq);
  await loadSinkHealth(k.by_sink || {});
}

/// The dispatcher's sinks on this node (`GET /v1/outbox/sinks`), beside each one's queue.
async function loadSinkHealth(bySink) {
  const h = await api('GET', '/v1/outbox/sinks');
  $('#sink-node').textContent = h.sinks.length ? `node ${h.node}` : '';
  const rows = h.sinks.map((x) => {
    const q = bySink[x.sink] || {};
    return el('tr', { 'data-sink': x.sink, 'data-state': x.state },
      el('td', { class: 'mono', text: x.sink }),
      el('td', {}, el('span', { class: `pill h-${x.state}`, text: x.state, 'data-testid': 'sink-state' })),
      el('td', { text: `${x.in_flight}/${x.concurrency}` }),
      el('td', { 'data-field': 'sent', text: x.sent }),
      el('td', { 'data-field': 'transient', text: x.transient }),
      el('td', { 'data-field': 'permanent', text: x.permanent }),
      el('td', { text: fmtTime(x.last_success_at) }),
      el('td', {}, x.last_failure_at ? `${fmtTime(x.last_failure_at)} ` : '',
        x.last_error_code ? el('span', { class: 'err', text: x.last_error_code }) : null),
      el('td', { text: q.queue_depth ?? 0 }),
      el('td', { text: q.parked ?? 0 }));
  });
  table($('#sink-health'), ['sink', 'health', 'in flight', 'sent', 'retried', 'parked (attempts)',
    'last success', 'last failure', 'queue', 'parked now'], rows);
  if (!rows.length) {
    $('#sink-health tbody').append(el('tr', {}, el('td', {
      colspan: 10, class: 'muted',
      text: 'No email or webhook route is configured: every route is claimed by an app.',
    })));
  }
}

function deliveryFilters() {
  const f = new FormData($('#dfilter'));
  const p = {};
  for (const name of ['status', 'sink', 'route', 'recipient', 'notification_id', 'source_site', 'type', 'list', 'q']) {
    const v = (f.get(name) || '').trim();
    if (v) p[name] = v;
  }
  for (const name of ['created_after', 'created_before']) {
    const v = f.get(name);
    if (v) p[name] = new Date(v).toISOString();
  }
  if (f.get('stuck')) p.stuck = 'true';
  p.order = f.get('order') || 'newest';
  return p;
}

/// The cursor of the next page of a list in `order` (newest first: `before`; by id: `after`).
function nextPage(order, page) {
  if (order === 'newest') return page.next_before ? { before: page.next_before } : null;
  return page.next_after ? { after: page.next_after } : null;
}

function deliveryRow(d) {
  const tr = el('tr', {
    class: 'clickable',
    'data-id': d.id,
    'data-status': d.status,
    onclick: () => openTimeline(d.id),
  },
  el('td', { class: 'mono', text: d.id }),
  el('td', {}, el('span', { class: `pill s-${d.status}`, text: d.status }),
    d.stuck ? el('span', { class: 'pill badge-stuck', text: 'stuck', 'data-testid': 'stuck-badge' }) : null,
    dueLine(d)),
  el('td', { text: d.sink }),
  el('td', { text: d.route }),
  el('td', { text: d.redacted ? '(redacted)' : (d.recipient || '–') }),
  el('td', { text: d.title }),
  el('td', { text: `${d.attempts}/${d.max_attempts}` }),
  el('td', { text: fmtTime(d.created_at) }),
  el('td', { class: 'err', 'data-field': 'last_error', text: currentError(d) }),
  el('td', {}, d.status === 'parked' ? [
    actionButton('Retry', 'operator', () => operate(d.id, 'retry'), 'retry'),
    actionButton('Discard', 'operator', () => operate(d.id, 'discard'), 'discard', {
      title: `Discard ${d.id}?`,
      text: 'It will never be sent, and a discarded delivery cannot be retried.',
    }),
  ] : null));
  return tr;
}

/// When a delivery can next be claimed, for the two kinds that wait (spec section 5): one
/// scheduled for later (queued, its `next_attempt_at` ahead: a route's delay, quiet hours, a
/// digest window) and one waiting to retry (`retry_wait`).
function dueText(d) {
  if (!d.next_attempt_at) return null;
  if (d.status === 'retry_wait') return `retry due ${fmtTime(d.next_attempt_at)}${fmtIn(d.next_attempt_at)}`;
  if (d.status === 'queued' && Date.parse(d.next_attempt_at) > Date.now()) {
    return `scheduled, due ${fmtTime(d.next_attempt_at)}${fmtIn(d.next_attempt_at)}`;
  }
  return null;
}

function dueLine(d) {
  const t = dueText(d);
  return t ? el('div', { class: 'small muted', 'data-testid': 'due', 'data-due': d.next_attempt_at, text: t }) : null;
}

/// The error of a delivery's current state: none once it is sent (an attempt that failed before
/// a retry succeeded stays in its timeline, not in its state).
function currentError(d) {
  if (d.status === 'sent' || !d.last_error) return '';
  return [d.last_error_code, d.last_error].filter(Boolean).join(': ');
}

const DHEAD = ['id', 'status', 'sink', 'route', 'recipient', 'title', 'attempts', 'created', 'last error', ''];

async function loadDeliveries(append) {
  const p = deliveryFilters();
  p.limit = 50;
  if (append && state.dNext) Object.assign(p, state.dNext);
  const page = await api('GET', `/v1/deliveries${qs(p)}`);
  const rows = page.deliveries.map(deliveryRow);
  if (append) $('#deliveries tbody').append(...rows);
  else table($('#deliveries'), DHEAD, rows);
  state.dNext = nextPage(p.order, page);
  show($('#dmore'), !!state.dNext);
}

async function operate(id, action) {
  await api('POST', `/v1/deliveries/${encodeURIComponent(id)}/${action}`,
    { reason: `${action} from the console` });
  flash(`${action === 'retry' ? 'Retried' : 'Discarded'} ${id}`, 'ok');
  await Promise.all([loadDeliveries(false), loadKpis(), openTimeline(id, true)]);
}

/// A delivery's timeline; `stay`: refreshed in place, without scrolling to it.
async function openTimeline(id, stay) {
  const d = await api('GET', `/v1/deliveries/${encodeURIComponent(id)}`);
  const steps = (d.timeline || []).map((s) => el('tr', {},
    el('td', { text: s.seq }),
    el('td', { text: s.event }),
    el('td', { text: fmtTime(s.at) }),
    el('td', { text: s.owner || s.by || '' }),
    el('td', { text: s.attempt ?? '' }),
    el('td', { text: [s.error_code, s.error, s.reason].filter(Boolean).join(' · ') }),
    el('td', { text: fmtTime(s.next_attempt_at || s.lease_expires_at || '') }),
  ));
  const t = el('table', { class: 'list' });
  table(t, ['seq', 'step', 'at', 'owner', 'attempt', 'detail', 'next / lease until'], steps);
  const items = (d.items || []).map((i) => el('li', {}, `${i.notification_id}: ${i.title}`));
  fill($('#timeline'),
    el('h3', {}, 'Timeline of ', el('span', { class: 'mono', text: d.id }),
      ' ', el('span', { class: `pill s-${d.status}`, text: d.status, 'data-testid': 'timeline-status' })),
    el('p', { class: 'muted' }, `notification ${d.notification_id} · route ${d.route} · sink ${d.sink}`,
      d.type ? ` · type ${d.type}` : '', d.list ? ` · list ${d.list}` : '',
      d.reason ? ` · reason ${d.reason}` : '', d.source ? ` · site ${d.source.site_id || '–'}` : ''),
    dueLine(d),
    currentError(d) ? el('div', { class: 'failure', 'data-testid': 'timeline-error' },
      el('b', { text: 'last error: ' }), el('span', { text: currentError(d) })) : null,
    d.status === 'sent' && d.last_error ? el('p', { class: 'muted small', 'data-testid': 'timeline-earlier' },
      `Sent on attempt ${d.attempts}; the failures before it are in the history below.`) : null,
    reached(d.resolved_targets),
    items.length > 1 ? el('ul', {}, items) : null,
    d.more ? el('p', { class: 'muted', text: `and ${d.more} more` }) : null,
    t,
    el('button', { type: 'button', text: 'Close', onclick: () => { show($('#timeline'), false); linkTo('outbox'); } }),
  );
  show($('#timeline'), true);
  if (!stay) reveal($('#timeline'));
  linkTo('deliveries', id);
}

/// Whom tidemark's dispatcher reached (section 17), or nothing.
function reached(targets) {
  if (!targets || !targets.length) return null;
  return el('div', { class: 'reached', 'data-testid': 'resolved-targets' },
    el('b', { text: `Reached (${targets.length}): ` }),
    targets.map((t, i) => [i ? ', ' : '', el('span', { class: 'mono', text: t })]));
}

// ---------------------------------------------------------------------------------------------
// Notifications: the dashboard list (every priority, newest first) and each one's status record.

/// What each status of a status record means (spec section 14).
const NOTIFICATION_STATUS = {
  dashboard_only: 'no delivery: shown on the dashboard only',
  pending: 'a delivery is queued, leased or waiting to retry',
  parked: 'a delivery failed for good and waits for an operator',
  delivered: 'sent',
  discarded: 'an operator discarded its delivery',
  cancelled: 'cancelled before it was sent (its task or the notification was canceled)',
  skipped: 'its deliveries were skipped (a route that does not exist, a suppressed recipient)',
};

async function loadNotifications(append) {
  const f = new FormData($('#nfilter'));
  const p = { priority: f.get('priority'), recipient: (f.get('recipient') || '').trim(), limit: 50 };
  if (append && state.nNext !== null) p.before_seq = state.nNext;
  const page = await api('GET', `/v1/notifications${qs(p)}`);
  $('#ntf-note').textContent = page.dashboard_enabled === false
    ? 'the dashboard is disabled ([notifications.dashboard] enabled = false): nothing is listed'
    : `as of seq ${page.as_of_seq}`;
  const rows = page.notifications.map((n) => el('tr', {
    class: 'clickable',
    'data-id': n.notification_id,
    'data-priority': n.priority,
    onclick: () => openNotification(n.notification_id).catch((e) => flash(e.message, 'error')),
  },
  el('td', { text: n.seq }),
  el('td', { text: fmtTime(n.time) }),
  el('td', {}, el('span', { class: `pill p-${n.priority}`, text: n.priority })),
  el('td', {}, el('div', { text: n.title }), n.body ? el('div', { class: 'muted small', text: n.body }) : null),
  el('td', { text: n.recipient || '–' }),
  el('td', { class: 'mono', text: n.task_id || '' }),
  el('td', { class: 'mono small', text: n.notification_id })));
  if (append) $('#notifications tbody').append(...rows);
  else table($('#notifications'), ['seq', 'time', 'priority', 'title', 'recipient', 'task', 'id'], rows);
  state.nNext = page.next_before_seq ?? null;
  show($('#nmore'), state.nNext !== null);
}

async function openNotification(id) {
  const r = await api('GET', `/v1/notifications/${encodeURIComponent(id)}`);
  const n = r.notification;
  const deliveries = r.deliveries.map((d) => el('tr', { 'data-id': d.id },
    el('td', { class: 'mono', text: d.id }), el('td', { text: d.route }), el('td', { text: d.sink }),
    el('td', {}, el('span', { class: `pill s-${d.status}`, text: d.status })),
    el('td', { text: d.attempts }),
    el('td', { class: 'small', text: (d.resolved_targets || []).join(', ') }),
    el('td', {}, el('button', {
      type: 'button',
      text: 'Timeline',
      'data-testid': 'ntf-timeline',
      onclick: () => showDelivery(n.notification_id, d.id).catch((e) => flash(e.message, 'error')),
    }))));
  const dt = el('table', { class: 'list' });
  table(dt, ['delivery', 'route', 'sink', 'status', 'attempts', 'reached', ''], deliveries);
  const site = n.source && n.source.site_id;
  const part = partlyDelivered(r);
  fill($('#notification'),
    el('h3', {}, 'Notification ', el('span', { class: 'mono', text: n.notification_id }), ' ',
      part
        ? [el('span', { class: 'pill n-partial', text: `${part.sent} of ${part.total} delivered`, 'data-testid': 'ntf-status', 'data-status': r.status }),
          part.others.map(([st, k]) => el('span', { class: `pill s-${st}`, text: `${k} ${st}`, 'data-testid': `ntf-count-${st}` }))]
        : el('span', { class: `pill n-${r.status}`, text: r.status, 'data-testid': 'ntf-status', 'data-status': r.status }),
      el('span', { class: `pill p-${n.priority}`, text: n.priority })),
    el('p', { class: 'muted', 'data-testid': 'ntf-meaning', text: NOTIFICATION_STATUS[r.status] || '' }),
    el('p', {}, el('b', { text: n.title }), n.body ? ` — ${n.body}` : ''),
    r.last_error && r.status !== 'delivered' ? el('div', { class: 'failure', 'data-testid': 'ntf-error' },
      el('b', { text: 'last_error: ' }), el('span', { text: r.last_error })) : null,
    r.last_error && r.status === 'delivered' ? el('p', { class: 'muted small', 'data-testid': 'ntf-earlier-error' },
      `Delivered; an earlier attempt failed (${r.last_error}).`) : null,
    el('dl', { class: 'kv' },
      el('dt', { text: 'attempts' }), el('dd', { text: r.attempts, 'data-testid': 'ntf-attempts' }),
      el('dt', { text: 'recipient' }), el('dd', { text: n.recipient || '–' }),
      el('dt', { text: 'task' }), el('dd', { class: 'mono', text: n.task_id || '–' }),
      el('dt', { text: 'group' }), el('dd', { text: n.group_key || '–' }),
      el('dt', { text: 'seq' }), el('dd', { text: n.seq }),
      n.type ? [el('dt', { text: 'type' }), el('dd', { text: n.type })] : null,
      site ? [el('dt', { text: 'source site' }), el('dd', { text: site })] : null,
      el('dt', { text: 'enqueued' }), el('dd', { text: fmtTime(r.enqueued_at) }),
      el('dt', { text: 'created' }), el('dd', { text: fmtTime(r.created_at) }),
      el('dt', { text: 'delivered' }), el('dd', {
        'data-testid': 'ntf-delivered',
        text: part ? `${part.sent} of ${part.total}, the last at ${fmtTime(r.delivered_at)}` : fmtTime(r.delivered_at),
      })),
    reached(r.resolved_targets),
    el('h4', { text: `Deliveries (${r.deliveries.length})` }),
    r.deliveries.length ? dt : el('p', { class: 'muted', text: 'None: this notification is on the dashboard only.' }),
    el('p', { class: 'muted small', text: `as of seq ${r.as_of_seq}` }),
    el('button', { type: 'button', text: 'Close', onclick: () => { show($('#notification'), false); linkTo('notifications'); } }),
  );
  show($('#notification'), true);
  reveal($('#notification'));
  linkTo('notifications', id);
}

/// A notification some of whose deliveries are sent and others not: `{sent, total, others}`
/// (`others`: [status, count] of the rest), so the record reads "1 of 2 delivered · 1 parked"
/// rather than "parked" beside a delivery time. Null when all or none are sent.
function partlyDelivered(r) {
  const total = r.deliveries.length;
  const counts = {};
  for (const d of r.deliveries) counts[d.status] = (counts[d.status] || 0) + 1;
  const sent = counts.sent || 0;
  if (!sent || sent === total) return null;
  delete counts.sent;
  return { sent, total, others: Object.entries(counts) };
}

/// Clear the outbox's filters by hand (a form reset would reload the list once more).
function clearDeliveryFilters() {
  for (const e of $('#dfilter').elements) {
    if (e.type === 'checkbox') e.checked = false;
    else if (e.tagName === 'SELECT') e.selectedIndex = 0;
    else if (e.tagName === 'INPUT') e.value = '';
  }
}

/// The outbox with the deliveries of one notification and the timeline of one of them.
async function showDelivery(notificationId, deliveryId) {
  clearDeliveryFilters();
  $('#dfilter [name=notification_id]').value = notificationId;
  history.pushState(null, '', '#outbox');
  await showView('outbox');
  await openTimeline(deliveryId);
}

// ---------------------------------------------------------------------------------------------
// Tasks, their bridge subscriptions with cursor state, and explain.

async function loadTasks(append) {
  const f = new FormData($('#tfilter'));
  const id = (f.get('task_id') || '').trim();
  if (id && !append) {
    await openTask(id);
    return;
  }
  const p = {
    status: f.get('status'),
    project_id: (f.get('project_id') || '').trim(),
    order: f.get('order') || 'newest',
    limit: 50,
  };
  if (append && state.tNext) Object.assign(p, state.tNext);
  const page = await api('GET', `/v1/tasks${qs(p)}`);
  const rows = page.tasks.map((t) => el('tr', { class: 'clickable', 'data-id': t.task_id, onclick: () => openTask(t.task_id) },
    el('td', { class: 'mono', text: t.task_id }),
    el('td', { text: t.title || '' }),
    el('td', { text: t.project_id || '' }),
    el('td', {}, el('span', { class: `pill t-${t.status}`, text: t.status })),
    el('td', { text: t.latest_event_seq }),
    el('td', { text: fmtTime(t.updated_at) })));
  if (append) $('#tasks tbody').append(...rows);
  else table($('#tasks'), ['task', 'title', 'project', 'status', 'latest seq', 'updated'], rows);
  state.tNext = nextPage(p.order, page);
  show($('#tmore'), !!state.tNext);
}

function cursorCard(s) {
  const c = s.cursor;
  const zero = c.last_sequence === 0 && !c.last_delivery_id && !c.last_error;
  const parts = [];
  if (zero) {
    parts.push(el('p', {}, el('span', { class: 'pill zero', text: 'zero state', 'data-testid': 'zero-pill' }),
      ' seq ', el('b', { text: '0', 'data-testid': 'cursor-seq' }),
      el('span', { class: 'muted', text: ' — nothing delivered yet' })));
  } else {
    parts.push(el('dl', { class: 'kv' },
      el('dt', { text: 'last_sequence' }), el('dd', { text: c.last_sequence, 'data-testid': 'cursor-seq' }),
      el('dt', { text: 'last_delivery_id' }), el('dd', { class: 'mono', text: c.last_delivery_id || '–', 'data-testid': 'cursor-delivery' }),
      el('dt', { text: 'last_delivered_at' }), el('dd', { text: fmtTime(c.last_delivered_at) }),
      el('dt', { text: 'updated_at' }), el('dd', { text: fmtTime(c.updated_at) })));
  }
  if (c.last_error) {
    parts.push(el('div', { class: 'failure', 'data-testid': 'cursor-error' },
      el('b', { text: 'last_error: ' }), el('span', { text: c.last_error }),
      el('div', { class: 'muted mono', text: `consumer ${c.consumer_id} · stream ${c.stream_name} · subject ${c.subject_id}` })));
  }
  const explainBox = el('div', { class: 'explain', 'data-testid': 'explain' });
  const base = `/v1/tasks/${encodeURIComponent(s.task_id)}/notifications/bridges/${encodeURIComponent(s.subscription_id)}`;
  return el('div', { class: `card${c.last_error ? ' failed' : ''}`, 'data-testid': 'subscription', 'data-id': s.subscription_id },
    el('h4', {}, el('span', { class: 'mono', text: s.subscription_id }), ' → bridge ',
      el('span', { class: 'mono', text: s.bridge_id }), ` (${s.mode}, ${s.sink.kind})`,
      s.active ? null : el('span', { class: 'pill', text: 'deleted' })),
    parts,
    el('div', { class: 'actions' },
      el('button', {
        type: 'button',
        text: 'Explain',
        'data-testid': 'explain-button',
        onclick: async () => {
          try {
            const x = await api('GET', `${base}/explain`);
            const t = el('table', { class: 'list' });
            table(t, ['seq', 'event', 'decision', 'reason'], x.candidates.map((k) => el('tr', {},
              el('td', { text: k.seq }), el('td', { text: k.event_type }),
              el('td', {}, el('span', { class: `pill d-${k.decision}`, text: k.decision })),
              el('td', { text: k.reason }))));
            explainBox.replaceChildren(el('p', {}, `next: ${x.next}${x.next_seq ? ` at seq ${x.next_seq}` : ''}`), t);
          } catch (e) { flash(`explain: ${e.message}`, 'error'); }
        },
      }),
      s.active ? actionButton('Delete', 'bridge', async () => {
        await api('DELETE', base);
        flash(`Deleted ${s.subscription_id}; creating it again resumes from its cursor`, 'ok');
        await openTask(s.task_id, true);
      }, 'delete-subscription', {
        title: `Delete subscription ${s.subscription_id}?`,
        text: `Bridge ${s.bridge_id} stops getting this task's terminal notifications. The cursor is `
          + 'kept: creating the same subscription again resumes from it.',
      }) : null),
    explainBox);
}

/// A task with its runs and bridge subscriptions; `stay`: refreshed in place.
async function openTask(id, stay) {
  const enc = encodeURIComponent(id);
  const [t, subs] = await Promise.all([
    api('GET', `/v1/tasks/${enc}`),
    api('GET', `/v1/tasks/${enc}/notifications/bridges`),
  ]);
  state.task = id;
  const runs = (t.runs || []).map((r) => el('tr', {},
    el('td', { class: 'mono', text: r.run_id }),
    // A run that ended without having started: what its end said, and that it is a mismatch.
    el('td', { 'data-testid': 'run-outcome', 'data-run': r.run_id,
      text: r.mismatch ? `${r.outcome || '–'} without a start (mismatch: ${r.mismatch})` : (r.outcome || '–') }),
    el('td', { text: r.review && r.review.state !== 'none' ? `${r.review.state}${r.review.gated ? ' (gated)' : ''}` : '–' })));
  const rt = el('table', { class: 'list' });
  table(rt, ['run', 'outcome', 'review'], runs);
  const active = subs.subscriptions.filter((s) => s.active);
  fill($('#task'),
    el('h3', {}, 'Task ', el('span', { class: 'mono', text: t.task_id }), ' ',
      el('span', { class: `pill t-${t.status}`, text: t.status, 'data-testid': 'task-status' })),
    el('p', { class: 'muted' }, `${t.title || ''} · project ${t.project_id || '–'} · review required ${t.review_required}`),
    el('p', {}, 'Stream resume: reconnect with ', el('code', { text: `after_sequence=${t.latest_event_seq}` }),
      ' (latest_event_seq of this task). ',
      el('button', {
        type: 'button',
        text: `Follow its stream from seq ${t.latest_event_seq}`,
        'data-testid': 'follow-stream',
        onclick: () => followTask(t.task_id, t.latest_event_seq).catch((e) => flash(e.message, 'error')),
      })),
    rt,
    el('h4', { text: `Bridge subscriptions (${active.length})` }),
    subs.subscriptions.length ? subs.subscriptions.map(cursorCard)
      : el('p', { class: 'muted', text: 'No bridge subscriptions.' }),
    subs.subscriptions.some((s) => !s.active)
      ? el('p', { class: 'muted', text: 'A deleted subscription keeps its cursor: creating the same subscription_id again resumes from it.' })
      : null,
    el('button', { type: 'button', text: 'Refresh', 'data-testid': 'task-refresh', onclick: () => openTask(id, true) }),
  );
  show($('#task'), true);
  if (!stay) reveal($('#task'));
  linkTo('tasks', id);
}

/// The live tail on one task's events (subject = the task id), from `seq` on: what a client
/// resuming with `after_sequence=seq` receives.
async function followTask(id, seq) {
  const f = $('#tfilt');
  f.elements.stream.value = '';
  f.elements.type.value = '';
  f.elements.subject.value = id;
  state.tail.filters = { subject: id };
  history.pushState(null, '', '#tail');
  await showView('tail');
  await startTail(true, seq);
}

// ---------------------------------------------------------------------------------------------
// Consumers, sources, projections.

async function loadLag() {
  const p = await api('GET', '/v1/consumers/lag');
  // `consumers` is the list's key (section 7).
  const list = p.consumers ?? [];
  const stopped = p.stopped ?? list.filter((c) => c.stopped).length;
  $('#lag-summary').textContent = `${list.length} consumers, ${p.stalled} stalled, ${stopped} stopped`;
  table($('#lag'), ['consumer', 'stream', 'subject', 'last seq', 'lag (events)', 'lag (time)', 'flags', 'last error', ''],
    list.map((c) => el('tr', { 'data-consumer': c.consumer_id, 'data-subject': c.subject_id },
      el('td', { class: 'mono', text: c.consumer_id }), el('td', { text: c.stream_name }),
      el('td', { text: c.subject_id || '(all)' }), el('td', { text: c.last_sequence }),
      el('td', { text: `${c.lag_capped ? '≥ ' : ''}${c.lag_events}` }), el('td', { text: fmtAge(c.lag_seconds) }),
      el('td', {},
        c.stopped ? el('span', { class: 'pill stopped', text: 'stopped', 'data-testid': 'stopped' }) : null,
        c.stalled ? el('span', { class: 'pill warn', text: 'stalled', 'data-testid': 'stalled' }) : null,
        c.stale ? el('span', { class: 'pill', text: 'stale' }) : null),
      el('td', {},
        c.stopped ? el('div', { class: 'failure', 'data-testid': 'stopped-reason' },
          el('b', { text: `stopped${c.stopped_seq ? ` at seq ${c.stopped_seq}` : ''}: ` }),
          el('span', { text: c.stopped_reason || 'a terminal-state mismatch' })) : null,
        el('span', { class: 'err', text: c.last_error || '' })),
      el('td', {}, actionButton('Reset…', 'admin', async () => openReset(c), 'reset-cursor')))));
}

/// How many events of a cursor's stream (and subject) lie past `after`: its lag in events once
/// reset there, counted as `GET /v1/consumers/lag` counts it (up to 10,000).
async function eventsPast(c, after) {
  let count = 0;
  let from = after;
  let head = 0;
  for (let i = 0; i < 10; i += 1) {
    const p = await api('GET', `/v1/events${qs({ stream: c.stream_name, subject: c.subject_id, after_sequence: from, limit: 1000 })}`);
    count += p.events.length;
    head = p.latest_event_seq;
    if (p.next_after_sequence >= p.latest_event_seq || p.next_after_sequence <= from) return { count, capped: false, head };
    from = p.next_after_sequence;
  }
  return { count, capped: true, head };
}

/// Reset one cursor (spec section 6: the only way down, with a reason, admin only): the panel
/// shows the lag the new position would leave before anything is sent, asks for the reason,
/// and asks for a confirmation before it posts. A subscription stopped at a mismatch is offered
/// its stopped seq, which moves it past the event it stopped at.
function openReset(c) {
  const panel = $('#reset');
  const start = c.stopped ? (c.stopped_seq ?? c.last_sequence) : c.last_sequence;
  const seqIn = el('input', { type: 'number', min: '0', step: '1', value: String(start), size: 10, 'data-testid': 'reset-seq' });
  const reasonIn = el('input', { size: 48, placeholder: 'why: recorded in the log with your token', 'data-testid': 'reset-reason' });
  const leaves = el('p', { class: 'reached', 'data-testid': 'reset-lag', text: 'counting…' });
  const go = el('button', { type: 'button', class: 'danger', text: 'Reset cursor', 'data-testid': 'reset-go', disabled: true });
  let asked = 0;
  let estimate = null; // {to, count, capped, head} of the value shown
  const ready = () => {
    go.disabled = !estimate || String(estimate.to) !== seqIn.value.trim() || !reasonIn.value.trim()
      || estimate.to > estimate.head;
    go.title = !reasonIn.value.trim() ? 'give a reason first' : '';
  };
  const count = async () => {
    const mine = ++asked;
    estimate = null;
    delete leaves.dataset.for;
    ready();
    const v = seqIn.value.trim();
    const to = Number(v);
    if (v === '' || !Number.isSafeInteger(to) || to < 0) {
      leaves.textContent = 'The position is a whole number from 0 (nothing delivered) to the head.';
      return;
    }
    leaves.textContent = 'counting…';
    try {
      const n = await eventsPast(c, to);
      if (mine !== asked) return;
      estimate = { to, ...n };
      leaves.dataset.for = String(to);
      leaves.dataset.lag = String(n.count);
      leaves.textContent = to > n.head
        ? `Seq ${to} is past the head of the log (${n.head}).`
        : `Reset to seq ${to}, it is ${n.capped ? 'at least ' : ''}${n.count} events behind `
          + `(now ${c.lag_capped ? 'at least ' : ''}${c.lag_events}): every event of ${c.stream_name}`
          + `${c.subject_id ? ` for ${c.subject_id}` : ''} after seq ${to} is delivered again or decided afresh.`;
    } catch (e) {
      if (mine === asked) leaves.textContent = `Could not count the events: ${e.message}`;
    }
    ready();
  };
  seqIn.addEventListener('input', () => { count(); });
  reasonIn.addEventListener('input', ready);
  go.addEventListener('click', async () => {
    const est = estimate;
    const reason = reasonIn.value.trim();
    go.disabled = true;
    try {
      const ok = await confirmAction(`Reset the cursor of ${c.consumer_id}?`,
        `From seq ${c.last_sequence} to seq ${est.to}: it will be ${est.capped ? 'at least ' : ''}${est.count} `
          + `events behind. Reason: “${reason}”.`, 'Reset');
      if (!ok) {
        flash('Reset cancelled: nothing was sent', 'info');
        return;
      }
      const r = await api('POST', '/v1/cursors/reset', {
        consumer_id: c.consumer_id, stream_name: c.stream_name, subject_id: c.subject_id,
        last_sequence: est.to, reason,
      });
      flash(`Reset ${c.consumer_id} to seq ${r.last_sequence}`, 'ok');
      show(panel, false);
      await loadLag();
    } catch (e) { flash(`Reset: ${e.message}`, 'error'); } finally { ready(); }
  });
  fill(panel,
    el('h3', {}, 'Reset the cursor of ', el('span', { class: 'mono', text: c.consumer_id })),
    el('p', { class: 'muted' }, `stream ${c.stream_name} · subject ${c.subject_id || '(all)'} · now at seq ${c.last_sequence}, `
      + `${c.lag_capped ? 'at least ' : ''}${c.lag_events} events behind`),
    c.stopped ? el('div', { class: 'failure' }, el('b', { text: `Stopped at seq ${c.stopped_seq ?? '?'}: ` }),
      el('span', { text: c.stopped_reason || 'a terminal-state mismatch' }),
      el('div', { class: 'small', text: `Reset to ${c.stopped_seq ?? 'that seq'} to move past the event it stopped at, or lower to deliver again from there; `
        + 'or repair the task and it resumes on its own.' })) : null,
    el('div', { class: 'filters' },
      el('label', {}, 'reset to seq', seqIn),
      el('label', {}, 'reason (required)', reasonIn)),
    leaves,
    el('div', { class: 'actions' }, go,
      el('button', { type: 'button', text: 'Close', onclick: () => show(panel, false) })));
  show(panel, true);
  reveal(panel);
  count();
}

async function loadSources() {
  const p = await api('GET', '/v1/sources');
  table($('#sources'), ['source', 'state', 'watermark', 'last poll', 'last success', 'failures', 'last error', ''],
    p.sources.map((s) => {
      const enc = encodeURIComponent(s.name);
      const act = (verb) => async () => {
        await api('POST', `/v1/sources/${enc}/${verb}`, verb === 'pause' ? { reason: 'from the console' } : undefined);
        flash(`${verb}: ${s.name}`, 'ok');
        await loadSources();
      };
      return el('tr', { 'data-name': s.name, class: 'clickable', onclick: () => openSource(s.name).catch((e) => flash(e.message, 'error')) },
        el('td', { class: 'mono', text: s.name }),
        el('td', {}, el('span', { class: `pill src-${s.state}`, text: s.state }), s.stale ? el('span', { class: 'pill warn', text: 'stale' }) : null),
        el('td', { class: 'mono', text: s.watermark ?? '–' }),
        el('td', { text: fmtTime(s.last_poll_at) }), el('td', { text: fmtTime(s.last_success_at) }),
        el('td', { text: s.consecutive_failures }), el('td', { class: 'err', text: s.last_error || '' }),
        el('td', {}, sourceActions(s, act)));
    }));
}

/// Poll now and Pause on an active source; Resume on a paused or parked one, whose poll the
/// server refuses (`source_not_active`) until it is resumed.
function sourceActions(s, act) {
  if (s.state === 'paused' || s.state === 'parked') {
    return [
      el('button', { type: 'button', text: 'Poll now', disabled: true, 'data-testid': 'poll', title: `${s.state}: resume it first` }),
      actionButton('Resume', 'operator', act('resume'), 'resume'),
    ];
  }
  return [actionButton('Poll now', 'operator', act('poll'), 'poll'), actionButton('Pause', 'operator', act('pause'), 'pause')];
}

// ---------------------------------------------------------------------------------------------
// Notification lists (section 17): read by anyone, changed by an admin with a reason.

async function loadLists() {
  const p = await api('GET', '/v1/lists');
  $('#lists-asof').textContent = `as of seq ${p.as_of_seq}`;
  const admin = can('admin');
  for (const e of $('#list-form').elements) e.disabled = !admin;
  $('#list-form').title = admin ? '' : 'needs the admin scope';
  table($('#lists'), ['list', 'members', 'updated', 'by', 'reason', ''],
    p.lists.map((l) => el('tr', { 'data-name': l.name, class: 'clickable', onclick: () => openList(l.name).catch((e) => flash(e.message, 'error')) },
      el('td', { class: 'mono', text: l.name }),
      el('td', { 'data-field': 'members' }, l.members.length
        ? l.members.map((m, i) => [i ? ', ' : '', el('span', { class: 'mono', text: m })])
        : el('span', { class: 'warn', text: 'empty: deliveries to it park' })),
      el('td', { text: fmtTime(l.updated_at) }),
      el('td', { text: l.by || '–' }),
      el('td', { text: l.reason }),
      el('td', {},
        el('button', {
          type: 'button', text: 'Edit', 'data-testid': 'list-edit', disabled: !admin,
          onclick: (ev) => { ev.stopPropagation(); editList(l.name).catch((e) => flash(e.message, 'error')); },
        }),
        el('button', {
          type: 'button', text: 'Deliveries', 'data-testid': 'list-deliveries',
          onclick: (ev) => { ev.stopPropagation(); showListDeliveries(l.name).catch((e) => flash(e.message, 'error')); },
        }),
        actionButton('Delete', 'admin', async () => {
          const reason = $('#list-form').elements.reason.value.trim() || 'deleted from the console';
          await api('DELETE', `/v1/lists/${encodeURIComponent(l.name)}`, { reason });
          flash(`Deleted list ${l.name}`, 'ok');
          await loadLists();
        }, 'list-delete', {
          title: `Delete the list ${l.name}?`,
          text: 'Deliveries to it that are not sent yet will park (unknown_list) until a list of that name exists again and they are retried.',
        })))));
}

async function saveList(ev) {
  ev.preventDefault();
  const f = new FormData(ev.target);
  const name = (f.get('name') || '').trim();
  const members = (f.get('members') || '').split(/[\n,]/).map((m) => m.trim()).filter(Boolean);
  const reason = (f.get('reason') || '').trim();
  await api('PUT', `/v1/lists/${encodeURIComponent(name)}`, { members, reason });
  flash(`Saved list ${name} (${members.length} members)`, 'ok');
  ev.target.reset();
  await loadLists();
}

/// The outbox filtered to one list's deliveries.
async function showListDeliveries(name) {
  clearDeliveryFilters();
  $('#dfilter [name=list]').value = name;
  history.pushState(null, '', '#outbox');
  await showView('outbox');
}

/// One source's state (section 12), with a link of its own.
async function openSource(name, stay) {
  const s = await api('GET', `/v1/sources/${encodeURIComponent(name)}`);
  const kv = [];
  for (const k of ['state', 'watermark', 'items_total', 'last_poll_at', 'last_success_at', 'next_poll_at',
    'consecutive_failures', 'last_error', 'stale']) {
    const v = s[k];
    kv.push(el('dt', { text: k }), el('dd', { text: k.endsWith('_at') ? fmtTime(v) : (v ?? '–') }));
  }
  fill($('#source'),
    el('h3', {}, 'Source ', el('span', { class: 'mono', text: s.name }), ' ',
      el('span', { class: `pill src-${s.state}`, text: s.state, 'data-testid': 'source-state' }),
      s.stale ? el('span', { class: 'pill warn', text: 'stale', 'data-testid': 'source-stale' }) : null),
    el('dl', { class: 'kv' }, kv),
    el('div', { class: 'actions' }, sourceActions(s, (verb) => async () => {
      await api('POST', `/v1/sources/${encodeURIComponent(s.name)}/${verb}`, verb === 'pause' ? { reason: 'from the console' } : undefined);
      flash(`${verb}: ${s.name}`, 'ok');
      await Promise.all([loadSources(), openSource(s.name, true)]);
    }),
    el('button', { type: 'button', text: 'Close', onclick: () => { show($('#source'), false); linkTo('sources'); } })));
  show($('#source'), true);
  if (!stay) reveal($('#source'));
  linkTo('sources', name);
}

/// One list in the form, ready to edit (reason to give).
async function editList(name) {
  const l = await api('GET', `/v1/lists/${encodeURIComponent(name)}`);
  const f = $('#list-form');
  f.elements.name.value = l.name;
  f.elements.members.value = l.members.join('\n');
  f.elements.reason.focus();
}

/// One list on a panel of its own, with a link of its own (`#lists/<name>`): its members, who
/// changed it last and why, and its latest deliveries.
async function openList(name) {
  const enc = encodeURIComponent(name);
  const [l, page] = await Promise.all([
    api('GET', `/v1/lists/${enc}`),
    api('GET', `/v1/deliveries${qs({ list: name, order: 'newest', limit: 20 })}`),
  ]);
  for (const tr of document.querySelectorAll('#lists tr[data-name]')) tr.classList.toggle('selected', tr.dataset.name === name);
  const dt = el('table', { class: 'list' });
  table(dt, ['delivery', 'status', 'title', 'created'], page.deliveries.map((d) => el('tr', {
    class: 'clickable', 'data-id': d.id, onclick: () => { location.hash = `#deliveries/${encodeURIComponent(d.id)}`; },
  },
  el('td', { class: 'mono', text: d.id }),
  el('td', {}, el('span', { class: `pill s-${d.status}`, text: d.status })),
  el('td', { text: d.title }), el('td', { text: fmtTime(d.created_at) }))));
  const admin = can('admin');
  fill($('#list'),
    el('h3', {}, 'List ', el('span', { class: 'mono', text: l.name }), ' ',
      el('span', { class: 'pill', 'data-testid': 'list-count', text: `${l.members.length} member${l.members.length === 1 ? '' : 's'}` })),
    l.members.length
      ? el('ul', { 'data-testid': 'list-members-shown' }, l.members.map((m) => el('li', { class: 'mono', text: m })))
      : el('p', { class: 'warn', text: 'Empty: deliveries to it park (empty_list) until it has members.' }),
    el('dl', { class: 'kv' },
      el('dt', { text: 'updated' }), el('dd', { text: fmtTime(l.updated_at) }),
      el('dt', { text: 'by' }), el('dd', { text: l.by || '–' }),
      el('dt', { text: 'reason' }), el('dd', { text: l.reason || '–' })),
    el('h4', { text: `Latest deliveries to it (${page.deliveries.length}${page.next_before ? '+' : ''})` }),
    dt,
    el('div', { class: 'actions' },
      el('button', {
        type: 'button', text: 'Edit', disabled: !admin, title: admin ? null : 'needs the admin scope',
        onclick: () => editList(l.name).catch((e) => flash(e.message, 'error')),
      }),
      el('button', { type: 'button', text: 'All its deliveries', onclick: () => showListDeliveries(l.name).catch((e) => flash(e.message, 'error')) }),
      el('button', { type: 'button', text: 'Close', onclick: () => { show($('#list'), false); linkTo('lists'); } })));
  show($('#list'), true);
  reveal($('#list'));
  linkTo('lists', name);
}

async function loadProjections() {
  const allowed = can('operator');
  show($('#proj-denied'), !allowed);
  if (!allowed) {
    table($('#projections'), ['projection'], []);
    return;
  }
  const p = await api('GET', '/v1/admin/projections');
  const run = (name, verb) => async () => {
    $('#proj-result').replaceChildren(el('p', { class: 'muted', text: `${verb} ${name}…` }));
    show($('#proj-result'), true);
    const r = await api('POST', `/v1/admin/projections/${encodeURIComponent(name)}/${verb}`);
    fill($('#proj-result'), el('p', { 'data-testid': 'proj-outcome' },
      `${verb} ${r.name}: ${r.events_replayed} events in ${r.duration_ms} ms, `,
      el('b', { text: r.identical ? 'identical' : `diverges at seq ${r.first_divergent_seq}` }),
      verb === 'rebuild' ? ` · ${r.swapped ? 'switched to the rebuilt model' : 'kept the live model'}` : ''),
    el('p', { class: 'mono muted', text: `digest ${r.digest}` }));
    await loadProjections();
  };
  table($('#projections'), ['projection', 'checkpoint', 'lag', 'generation', 'digest', ''],
    p.projections.map((x) => el('tr', { 'data-name': x.name },
      el('td', { class: 'mono', text: x.name }), el('td', { text: x.checkpoint }), el('td', { text: x.lag }),
      el('td', { text: x.generation ?? '' }), el('td', { class: 'mono small', text: x.digest }),
      el('td', {}, actionButton('Verify', 'operator', run(x.name, 'verify'), 'verify'),
        actionButton('Rebuild', 'operator', run(x.name, 'rebuild'), 'rebuild', {
          title: `Rebuild ${x.name}?`,
          text: `The whole log (up to seq ${x.checkpoint}) is replayed into a new copy of the model, `
            + 'which then replaces the live one. On a large log this takes a while and loads the server.',
        })))));
}

// ---------------------------------------------------------------------------------------------
// Live tail: SSE read through fetch with a streaming body, so the token travels in a header and
// Last-Event-ID is ours to send after a reconnect.

function setHead(seq) {
  const h = $('#head');
  if (!h.dataset.seq || Number(h.dataset.seq) < seq) {
    h.dataset.seq = seq;
    h.textContent = seq;
  }
}

function tailState(text, cls) {
  const s = $('#tail-state');
  s.textContent = text;
  s.className = `pill ${cls || ''}`;
}

function stopTail() {
  const t = state.tail;
  if (t.ctrl) t.ctrl.abort();
  clearTimeout(t.timer);
  t.ctrl = null;
}

function tailEvent(id, type, data) {
  let env = null;
  try { env = JSON.parse(data); } catch (_) { return; }
  state.tail.lastId = id;
  setHead(Number(id));
  const body = $('#tail tbody');
  const row = el('tr', {
    'data-seq': id, 'data-type': type, class: 'clickable',
    onclick: () => showEvent(env, $('#tail-payload'), false),
  },
  el('td', { text: id }), el('td', { text: fmtTime(env.time) }), el('td', { text: type }),
  el('td', { class: 'mono', text: env.stream }), el('td', { class: 'mono', text: env.subject }),
  el('td', { class: 'mono', text: env.event_id }),
  el('td', { class: 'mono small', 'data-field': 'payload', text: payloadPreview(env.payload) }));
  const empty = body.querySelector('td[colspan]');
  if (empty) empty.parentElement.remove();
  body.prepend(row);
  while (body.children.length > TAIL_MAX) body.lastElementChild.remove();
}

async function startTail(reset, from) {
  const t = state.tail;
  stopTail();
  if (reset) {
    t.lastId = null;
    t.attempt = 0;
    table($('#tail'), ['seq', 'time', 'type', 'stream', 'subject', 'event id', 'payload'], []);
    if (from !== undefined) {
      t.from = from;
    } else {
      // Seed: the last 20 events (of the filters), then everything appended after them.
      const page = await api('GET', `/v1/events${qs({ ...t.filters, limit: 1 })}`);
      t.from = Math.max(0, (page.latest_event_seq || 0) - 20);
    }
  }
  const ctrl = new AbortController();
  t.ctrl = ctrl;
  const headers = { Accept: 'text/event-stream', ...authHeaders() };
  if (t.lastId !== null) headers['Last-Event-ID'] = String(t.lastId);
  tailState(t.attempt ? `reconnecting (attempt ${t.attempt})` : 'connecting', 'warn');
  try {
    const r = await fetch(`/v1/events/stream${qs({ ...t.filters, after_sequence: t.from })}`, { headers, signal: ctrl.signal });
    if (r.status === 401) { askToken('The token was refused; paste another.'); return; }
    if (!r.ok || !r.body) throw new Error(`HTTP ${r.status}`);
    tailState('live', 'ok');
    t.attempt = 0;
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value.replace(/\r\n?/g, '\n');
      let cut;
      while ((cut = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        let id = null; let type = 'message'; const data = [];
        for (const line of block.split('\n')) {
          if (line.startsWith(':')) continue;
          const i = line.indexOf(':');
          const field = i < 0 ? line : line.slice(0, i);
          let v = i < 0 ? '' : line.slice(i + 1);
          if (v.startsWith(' ')) v = v.slice(1);
          if (field === 'id') id = v;
          else if (field === 'event') type = v;
          else if (field === 'data') data.push(v);
        }
        if (id !== null && data.length) tailEvent(id, type, data.join('\n'));
      }
    }
    throw new Error('the stream ended');
  } catch (e) {
    if (ctrl.signal.aborted) return;
    t.attempt += 1;
    const wait = Math.min(10000, 500 * 2 ** Math.min(t.attempt, 5));
    tailState(`disconnected, retrying in ${Math.round(wait / 1000)}s (${e.message})`, 'warn');
    t.timer = setTimeout(() => { if (state.tail.ctrl === ctrl) startTail(false); }, wait);
  }
}

// ---------------------------------------------------------------------------------------------
// Events: the log browsed by stream, subject, type and seq range, newest first (`order=desc`)
// or oldest first, each event's payload a click away (secrets masked, `masked`).

/// One event with its payload on `panel`; with `link`, its address is `#events/<seq>`.
function showEvent(env, panel, link) {
  fill(panel,
    el('h3', {}, 'Event ', el('span', { class: 'mono', text: `seq ${env.seq}` }), ' ',
      el('span', { class: 'pill', text: env.type })),
    el('dl', { class: 'kv' },
      el('dt', { text: 'event id' }), el('dd', { class: 'mono', text: env.event_id }),
      el('dt', { text: 'stream' }), el('dd', { class: 'mono', text: env.stream }),
      el('dt', { text: 'subject' }), el('dd', { class: 'mono', text: env.subject || '(none)' }),
      el('dt', { text: 'time' }), el('dd', { text: fmtTime(env.time) })),
    el('pre', { class: 'payload', 'data-testid': 'payload', text: JSON.stringify(masked(env.payload ?? {}), null, 2) }),
    el('button', {
      type: 'button', text: 'Close',
      onclick: () => { show(panel, false); if (link) linkTo('events'); },
    }));
  show(panel, true);
  reveal(panel);
  if (link) linkTo('events', env.seq);
}

/// The browser's query from its form, or an error message.
function eventQuery(append) {
  const f = new FormData($('#efilter'));
  const p = { limit: 50 };
  for (const k of ['stream', 'subject', 'type']) {
    const v = (f.get(k) || '').trim();
    if (v) p[k] = v;
  }
  const num = (k) => {
    const v = (f.get(k) || '').trim();
    return v === '' ? null : Number(v);
  };
  const from = num('from');
  const to = num('to');
  for (const [k, v] of [['from', from], ['to', to]]) {
    if (v !== null && (!Number.isSafeInteger(v) || v < 1)) return { error: `${k} seq must be a whole number from 1` };
  }
  if (from !== null && to !== null && from > to) return { error: 'from seq is above to seq' };
  const order = f.get('order') === 'asc' ? 'asc' : 'desc';
  p.order = order;
  if (to !== null) p.before_sequence = to + 1;
  if (from !== null) p.after_sequence = from - 1;
  if (append && state.evNext !== null) p[order === 'desc' ? 'before_sequence' : 'after_sequence'] = state.evNext;
  return { p, order, to };
}

async function loadEvents(append) {
  const q = eventQuery(append);
  if (q.error) {
    flash(q.error, 'error');
    return;
  }
  const page = await api('GET', `/v1/events${qs(q.p)}`);
  const rows = page.events.map((e) => el('tr', {
    class: 'clickable', 'data-seq': e.seq, 'data-type': e.type, onclick: () => showEvent(e, $('#event'), true),
  },
  el('td', { text: e.seq }), el('td', { text: fmtTime(e.time) }), el('td', { text: e.type }),
  el('td', { class: 'mono', text: e.stream }), el('td', { class: 'mono', text: e.subject }),
  el('td', { class: 'mono small', 'data-field': 'payload', text: payloadPreview(e.payload) })));
  if (append) $('#events tbody').append(...rows);
  else table($('#events'), ['seq', 'time', 'type', 'stream', 'subject', 'payload'], rows);
  if (q.order === 'desc') {
    state.evNext = page.next_before_sequence ?? null;
  } else {
    // Oldest first, the range is done once the page reaches its end (`to`, or the head).
    const end = q.to === null ? page.latest_event_seq : Math.min(q.to, page.latest_event_seq);
    state.evNext = page.next_after_sequence < end ? page.next_after_sequence : null;
  }
  $('#ev-note').textContent = `head ${page.latest_event_seq}`
    + (state.evNext !== null ? ` · more ${q.order === 'desc' ? `below seq ${state.evNext}` : `after seq ${state.evNext}`}` : ' · that is all');
  setHead(page.latest_event_seq);
  show($('#emore'), state.evNext !== null);
}

/// `#events/<seq>`: that one event.
async function openEvent(arg) {
  const seq = Number(arg);
  if (!Number.isSafeInteger(seq) || seq < 1) throw new Error(`no event ${arg}`);
  const page = await api('GET', `/v1/events${qs({ after_sequence: seq - 1, limit: 1 })}`);
  const e = page.events[0];
  if (!e || e.seq !== seq) throw new Error(`no event at seq ${seq}`);
  showEvent(e, $('#event'), true);
}

// ---------------------------------------------------------------------------------------------
// Views and wiring.

const LOADERS = {
  outbox: async () => { await Promise.all([loadKpis(), loadDeliveries(false)]); },
  notifications: () => loadNotifications(false),
  tasks: () => loadTasks(false),
  consumers: loadLag,
  sources: loadSources,
  lists: loadLists,
  projections: loadProjections,
  tail: async () => {},
  events: () => loadEvents(false),
};

// ---------------------------------------------------------------------------------------------
// Links: the address bar names what is shown, `#<view>` or `#<kind>/<id>` (deliveries, tasks,
// notifications, sources, lists), so an operator can share or bookmark it; Back goes back.

function parseHash() {
  const h = location.hash.slice(1);
  const i = h.indexOf('/');
  const kind = i < 0 ? h : h.slice(0, i);
  let arg = null;
  if (i >= 0) {
    try { arg = decodeURIComponent(h.slice(i + 1)) || null; } catch (_) { arg = null; }
  }
  return { view: kind === 'deliveries' ? 'outbox' : kind, arg };
}

/// Name what is shown in the address bar (no reload; a new history entry when it changes).
function linkTo(kind, id) {
  const h = id === undefined || id === null ? `#${kind}` : `#${kind}/${encodeURIComponent(id)}`;
  if (location.hash !== h) history.pushState(null, '', h);
}

const OPENERS = {
  outbox: openTimeline,
  tasks: openTask,
  notifications: openNotification,
  sources: openSource,
  lists: openList,
  events: openEvent,
};

/// The panel an opener fills, per view: closed when the address names the view alone.
const PANELS = {
  outbox: '#timeline', tasks: '#task', notifications: '#notification', sources: '#source', lists: '#list', events: '#event',
};

/// Show what the address bar names.
async function route() {
  const { view, arg } = parseHash();
  // Only the latest navigation acts once its view is loaded (Back pressed twice quickly, or
  // the start's own route still loading).
  state.routeSeq = (state.routeSeq || 0) + 1;
  const mine = state.routeSeq;
  await showView(view);
  if (mine !== state.routeSeq) return;
  if (!arg && PANELS[state.view]) show($(PANELS[state.view]), false);
  if (arg && OPENERS[state.view]) {
    try { await OPENERS[state.view](arg); } catch (e) { if (e.status !== 401) flash(e.message, 'error'); }
  }
}

async function showView(name) {
  if (!LOADERS[name]) name = 'outbox';
  state.view = name;
  for (const s of document.querySelectorAll('.view')) show(s, s.dataset.view === name);
  for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.view === name);
  clearInterval(state.kpiTimer);
  if (name === 'outbox') {
    state.kpiTimer = setInterval(() => { loadKpis().catch(() => {}); }, KPI_EVERY_MS);
  }
  try { await LOADERS[name](); } catch (e) { if (e.status !== 401) flash(e.message, 'error'); }
}

async function boot() {
  try {
    if (!(await identify())) return;
  } catch (e) {
    flash(`whoami: ${e.message}`, 'error');
    return;
  }
  await route();
  if (!state.tail.ctrl) startTail(true).catch((e) => flash(`tail: ${e.message}`, 'error'));
  document.body.dataset.ready = 'true';
}

function wire() {
  // Also fired by Back and Forward between the entries `linkTo` adds.
  window.addEventListener('hashchange', () => { if (state.who) route(); });
  $('#login-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    state.token = $('#token').value.trim();
    $('#token').value = '';
    sessionStorage.setItem(TOKEN_KEY, state.token);
    boot();
  });
  $('#logout').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    state.token = null;
    askToken('');
  });
  $('#dfilter').addEventListener('submit', (ev) => {
    ev.preventDefault();
    loadDeliveries(false).catch((e) => flash(e.message, 'error'));
  });
  $('#dfilter').addEventListener('reset', () => setTimeout(() => loadDeliveries(false).catch(() => {}), 0));
  $('#dmore').addEventListener('click', () => loadDeliveries(true).catch((e) => flash(e.message, 'error')));
  $('#tfilter').addEventListener('submit', (ev) => {
    ev.preventDefault();
    loadTasks(false).catch((e) => flash(e.message, 'error'));
  });
  $('#tmore').addEventListener('click', () => loadTasks(true).catch((e) => flash(e.message, 'error')));
  $('#nfilter').addEventListener('submit', (ev) => {
    ev.preventDefault();
    show($('#notification'), false);
    loadNotifications(false).catch((e) => flash(e.message, 'error'));
  });
  $('#nfilter').addEventListener('reset', () => setTimeout(() => loadNotifications(false).catch(() => {}), 0));
  $('#nmore').addEventListener('click', () => loadNotifications(true).catch((e) => flash(e.message, 'error')));
  $('#list-form').addEventListener('submit', (ev) => saveList(ev).catch((e) => flash(e.message, 'error')));
  $('#efilter').addEventListener('submit', (ev) => {
    ev.preventDefault();
    show($('#event'), false);
    loadEvents(false).catch((e) => flash(e.message, 'error'));
  });
  $('#efilter').addEventListener('reset', () => setTimeout(() => loadEvents(false).catch(() => {}), 0));
  $('#emore').addEventListener('click', () => loadEvents(true).catch((e) => flash(e.message, 'error')));
  $('#confirm-ok').addEventListener('click', () => $('#confirm').close('ok'));
  $('#confirm-cancel').addEventListener('click', () => $('#confirm').close('cancel'));
  $('#tfilt').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    state.tail.filters = {};
    for (const k of ['stream', 'subject', 'type']) {
      const v = (f.get(k) || '').trim();
      if (v) state.tail.filters[k] = v;
    }
    startTail(true).catch((e) => flash(`tail: ${e.message}`, 'error'));
  });
  boot();
}

document.addEventListener('DOMContentLoaded', wire);
