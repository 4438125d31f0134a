// tidemark console: notification routes (spec section 4): the configuration file's, and those
// managed at runtime, read by anyone and changed by an admin with a reason.
'use strict';

const PRIORITIES = ['urgent', 'action', 'warning', 'info'];

/// A route's keys in one line: every key but its sink and priorities (the url by scheme, host
/// and port, a set secret as "***"), the circuit and rotation overlap among them.
function routeSummary(r) {
  const parts = [];
  for (const [k, v] of Object.entries(r)) {
    if (k === 'sink' || k === 'priorities' || v === null || v === undefined) continue;
    parts.push(`${k} ${typeof v === 'string' ? v : JSON.stringify(v)}`);
  }
  return parts.join(' · ') || '–';
}

async function loadRoutes() {
  const p = await api('GET', '/v1/routes');
  $('#routes-asof').textContent = `as of seq ${p.as_of_seq}`;
  const admin = can('admin');
  for (const e of $('#route-form').elements) e.disabled = !admin;
  $('#route-form').title = admin ? '' : 'needs the admin scope';
  table($('#routes'), ['route', 'origin', 'sink', 'priorities', 'keys', 'updated', 'by', 'reason', ''],
    p.routes.map((r) => el('tr', { 'data-name': r.name, 'data-origin': r.origin },
      el('td', { class: 'mono' }, r.name, r.operational
        ? el('span', { class: 'pill', text: 'operational', title: 'operators are told through it', 'data-testid': 'route-operational' }) : null),
      el('td', {}, el('span', { class: `pill origin-${r.origin}`, text: r.origin, 'data-testid': 'route-origin' })),
      el('td', { class: 'mono', text: r.route.sink || '–' }),
      el('td', { 'data-field': 'priorities', text: (r.route.priorities || []).join(', ') || '–' }),
      el('td', { class: 'mono', 'data-field': 'keys', text: routeSummary(r.route) }),
      el('td', { text: r.updated_at ? fmtTime(r.updated_at) : '–' }),
      el('td', { text: r.by || '–' }),
      el('td', { text: r.reason || (r.built_in ? 'built-in' : r.origin === 'config' ? 'the configuration file' : '–') }),
      el('td', {}, r.origin === 'api' ? [
        el('button', {
          type: 'button', text: 'Edit', 'data-testid': 'route-edit', disabled: !admin,
          onclick: () => editRoute(r),
        }),
        actionButton('Delete', 'admin', async () => {
          const reason = $('#route-form').elements.reason.value.trim() || 'deleted from the console';
          await api('DELETE', `/v1/routes/${encodeURIComponent(r.name)}`, { reason });
          flash(`Deleted route ${r.name}`, 'ok');
          await loadRoutes();
        }, 'route-delete', {
          title: `Delete the route ${r.name}?`,
          text: 'Notifications from the next event on no longer take it; its deliveries already made keep it.',
        }),
      ] : el('span', { class: 'muted', text: r.built_in ? 'built-in: configure it in the file' : 'change it in the file' })))));
}

/// The route the form edits (null: a new one), to send only what changed: a key of its
/// other keys that the operator removed is sent as null (removed), one left out of the form
/// (its url, which is not served whole, and its secret) is kept.
let editing = null;

/// A route in the form, ready to change: its url and secret are not served, so each is sent
/// only when typed; the route keeps them otherwise ("remove signing" removes the secret).
function editRoute(r) {
  const f = $('#route-form');
  editing = r;
  f.elements.name.value = r.name;
  f.elements.sink.value = r.route.sink || 'app';
  f.elements.url.value = r.route.url && r.route.url.startsWith('env:') ? r.route.url : '';
  f.elements.url.placeholder = r.route.url ? `kept: ${r.route.url}` : 'an http(s) URL or env:NAME';
  f.elements.secret.value = '';
  f.elements.secret.placeholder = r.route.secret ? 'kept unless typed' : 'env:NAME or the secret';
  f.elements['no-signing'].checked = false;
  f.elements.body.value = typeof r.route.body === 'string' ? r.route.body : '';
  f.elements['order-key'].value = (r.route.ordering && r.route.ordering.key) || '';
  f.elements['order-park'].value = (r.route.ordering && r.route.ordering.on_park) || 'hold';
  f.elements.rate.value = r.route.rate || '';
  f.elements.operational.checked = r.route.operational === true;
  for (const p of PRIORITIES) f.elements[`p-${p}`].checked = (r.route.priorities || []).includes(p);
  f.elements.extra.value = Object.keys(extraKeys(r.route)).length ? JSON.stringify(extraKeys(r.route)) : '';
  f.elements.reason.focus();
}

/// A route's keys besides those the form has fields for (a preset body and the order have
/// theirs; a template body is edited among the other keys).
function extraKeys(route) {
  const extra = { ...route };
  for (const k of ['sink', 'url', 'secret', 'priorities', 'ordering', 'rate', 'operational']) delete extra[k];
  if (typeof extra.body === 'string') delete extra.body;
  return extra;
}

async function saveRoute(ev) {
  ev.preventDefault();
  const f = ev.target.elements;
  const name = f.name.value.trim();
  let route = {};
  if (f.extra.value.trim()) {
    try { route = JSON.parse(f.extra.value); } catch (_) { throw new Error('other keys: not a JSON object'); }
  }
  const before = editing && editing.name === name ? editing : null;
  if (before) {
    for (const k of Object.keys(extraKeys(before.route))) if (!(k in route)) route[k] = null;
  }
  route.sink = f.sink.value;
  if (f.url.value.trim()) route.url = f.url.value.trim();
  if (f['no-signing'].checked) route.secret = null;
  else if (f.secret.value) route.secret = f.secret.value;
  route.priorities = PRIORITIES.filter((p) => f[`p-${p}`].checked);
  // The fields for the body preset and the order: an emptied one removes what it had.
  if (f.body.value) route.body = f.body.value;
  else if (before && typeof before.route.body === 'string' && !('body' in route)) route.body = null;
  if (f['order-key'].value) route.ordering = { key: f['order-key'].value, on_park: f['order-park'].value };
  else if (before && before.route.ordering) route.ordering = null;
  if (f.rate.value.trim()) route.rate = f.rate.value.trim();
  else if (before && before.route.rate) route.rate = null;
  if (f.operational.checked) route.operational = true;
  else if (before && before.route.operational) route.operational = null;
  const reason = f.reason.value.trim();
  const r = await api('PUT', `/v1/routes/${encodeURIComponent(name)}`, { route, reason });
  const warned = (r.warnings || []).join('; ');
  flash(`Saved route ${name} (seq ${r.updated_seq})${warned ? `: ${warned}` : ''}`, warned ? 'error' : 'ok');
  ev.target.reset();
  editing = null;
  f.url.placeholder = 'an http(s) URL or env:NAME';
  f.secret.placeholder = 'env:NAME or the secret';
  await loadRoutes();
}

/// What the webhook route named in the form sends, rendered by the server for a sample
/// notification (nothing is sent).
async function previewRoute() {
  const name = $('#route-form').elements.name.value.trim();
  if (!name) throw new Error('name the route to preview');
  const p = await api('POST', `/v1/routes/${encodeURIComponent(name)}/preview`, {});
  fill($('#route-preview'),
    el('h3', { text: `What route ${name} sends (${p.content_type})` }),
    el('pre', { class: 'mono', 'data-testid': 'route-preview-body', text: p.body }),
    Object.keys(p.headers || {}).length
      ? el('p', { class: 'muted small', text: `headers: ${JSON.stringify(p.headers)}` }) : null);
  show($('#route-preview'), true);
}
