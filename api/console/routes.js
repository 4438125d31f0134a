// tidemark console: notification routes (spec section 4): the configuration file's, and those
// managed at runtime, read by anyone and changed by an admin with a reason.
'use strict';

const PRIORITIES = ['urgent', 'action', 'warning', 'info'];

/// A route's keys in one line: its sink's target, types and list (secrets read "***").
function routeSummary(r) {
  const parts = [];
  if (r.url) parts.push(`url ${r.url}`);
  if (r.secret) parts.push(`secret ${r.secret}`);
  if (r.list) parts.push(`list ${r.list}`);
  if (r.types) parts.push(`types ${r.types.join(', ')}`);
  for (const k of ['delay', 'quiet_hours', 'digest', 'retry', 'redact']) {
    if (r[k] !== undefined) parts.push(`${k} ${JSON.stringify(r[k])}`);
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
      el('td', { class: 'mono', text: r.name }),
      el('td', {}, el('span', { class: `pill origin-${r.origin}`, text: r.origin, 'data-testid': 'route-origin' })),
      el('td', { class: 'mono', text: r.route.sink || '–' }),
      el('td', { 'data-field': 'priorities', text: (r.route.priorities || []).join(', ') || '–' }),
      el('td', { class: 'mono', 'data-field': 'keys', text: routeSummary(r.route) }),
      el('td', { text: r.updated_at ? fmtTime(r.updated_at) : '–' }),
      el('td', { text: r.by || '–' }),
      el('td', { text: r.reason || (r.origin === 'config' ? 'the configuration file' : '–') }),
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
      ] : el('span', { class: 'muted', text: 'change it in the file' })))));
}

/// A route in the form, ready to change: its secret is not served, so it is sent again only
/// when typed (an empty secret field keeps none).
function editRoute(r) {
  const f = $('#route-form');
  f.elements.name.value = r.name;
  f.elements.sink.value = r.route.sink || 'app';
  f.elements.url.value = r.route.url && r.route.url.startsWith('env:') ? r.route.url : '';
  f.elements.secret.value = '';
  for (const p of PRIORITIES) f.elements[`p-${p}`].checked = (r.route.priorities || []).includes(p);
  const extra = { ...r.route };
  for (const k of ['sink', 'url', 'secret', 'priorities']) delete extra[k];
  f.elements.extra.value = Object.keys(extra).length ? JSON.stringify(extra) : '';
  f.elements.reason.focus();
}

async function saveRoute(ev) {
  ev.preventDefault();
  const f = ev.target.elements;
  const name = f.name.value.trim();
  let route = {};
  if (f.extra.value.trim()) {
    try { route = JSON.parse(f.extra.value); } catch (_) { throw new Error('other keys: not a JSON object'); }
  }
  route.sink = f.sink.value;
  if (f.url.value.trim()) route.url = f.url.value.trim();
  if (f.secret.value) route.secret = f.secret.value;
  route.priorities = PRIORITIES.filter((p) => f[`p-${p}`].checked);
  const reason = f.reason.value.trim();
  const r = await api('PUT', `/v1/routes/${encodeURIComponent(name)}`, { route, reason });
  flash(`Saved route ${name} (seq ${r.updated_seq})`, 'ok');
  ev.target.reset();
  await loadRoutes();
}
