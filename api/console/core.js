// tidemark operator console (spec section 15). Plain JavaScript, no dependencies, served by the
// binary itself; it talks only to the public HTTP API under /v1, like any other client. The
// page loads its scripts in order (index.html), classic scripts sharing one global scope: this
// one holds the state, the DOM helpers, the API client and the token; app.js, last, wires them.
'use strict';

const ALL_SCOPES = ['read', 'append', 'bridge', 'operator', 'admin'];
const TOKEN_KEY = 'tidemark.token';
const TENANT_KEY = 'tidemark.tenant';
const TAIL_MAX = 200;
const KPI_EVERY_MS = 5000;

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  who: null, // {name, scopes, open, tenant}
  // The tenant the console acts for (spec section 20): every tenant's call goes under
  // /tenants/{tenant}; the default tenant's, and the deployment's own, under /v1 as they are.
  tenant: sessionStorage.getItem(TENANT_KEY) || 'default',
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

/// `path` (`/v1/…`) for the tenant the console acts for: the deployment's own operations
/// (`/v1/admin/…`, the tenants' directory) and the default tenant's stay as they are.
function tenantPath(path) {
  const t = state.tenant;
  if (!t || t === 'default' || !path.startsWith('/v1/')) return path;
  if (/^\/v1\/(admin\/|tenants([/?]|$)|whoami)/.test(path)) return path;
  return `/tenants/${encodeURIComponent(t)}${path}`;
}

async function api(method, path, body) {
  const sentWith = state.token;
  const headers = { Accept: 'application/json', ...authHeaders() };
  const init = { method, headers };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const r = await fetch(tenantPath(path), init);
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (r.status === 401) {
    // Only a refusal of the token in use asks for another: an answer to a request sent before
    // the operator forgot or changed the token does not end the new session.
    if (state.token === sentWith) askToken('The token was refused; paste another.');
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
/// A button that runs `onclick` when the token has `scope`. With `confirm` ({title, text,
/// precheck?}) the operator confirms first; `confirm.precheck` runs before the dialog, so what
/// is missing (a reason) is said before anything is asked.
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
        if (confirm && confirm.precheck) confirm.precheck();
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
// Tenants (spec section 20): the switch in the header.

/// Fill the tenant switch: a tenant's token acts for its tenant alone (the switch shows it,
/// fixed); a `*` token with the operator scope chooses among the directory's live tenants.
async function loadTenants() {
  const sel = $('#tenant');
  const w = state.who;
  let names = ['default'];
  if (w.tenant && w.tenant !== '*') {
    names = [w.tenant];
  } else if (can('operator')) {
    try {
      const page = await api('GET', '/v1/tenants');
      names = names.concat(page.tenants.filter((t) => !t.removed).map((t) => t.name));
    } catch (e) { flash(`tenants: ${e.message}`, 'error'); }
  }
  if (!names.includes(state.tenant)) state.tenant = names[0];
  sessionStorage.setItem(TENANT_KEY, state.tenant);
  sel.replaceChildren(...names.map((n) => el('option', { value: n, text: n, selected: n === state.tenant })));
  sel.disabled = names.length < 2;
  show($('#tenant-box'), names.length > 1 || state.tenant !== 'default');
  // The deployment's overview: its operators' alone (a `*` token, or open mode).
  show($('#nav-deployment'), (!w.tenant || w.tenant === '*') && can('operator'));
}

/// Act for `name` from now on: every view and the live tail reload under its prefix.
async function switchTenant(name) {
  if (name === state.tenant) return;
  state.tenant = name;
  sessionStorage.setItem(TENANT_KEY, name);
  // What was open is the other tenant's: show the view alone.
  for (const p of Object.values(PANELS)) show($(p), false);
  linkTo(state.view);
  await route();
  startTail(true).catch((e) => flash(`tail: ${e.message}`, 'error'));
}

// ---------------------------------------------------------------------------------------------
// Token and identity.

function askToken(why) {
  // Not ready until the next token's session has booted (`body[data-ready]`, set by boot).
  delete document.body.dataset.ready;
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
  await loadTenants();
  show($('#login'), false);
  show($('#app'), true);
  return true;
}
