// tidemark console: notifications (spec section 14).
'use strict';

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
        : [el('span', { class: `pill n-${r.status}`, text: r.status, 'data-testid': 'ntf-status', 'data-status': r.status }),
          // Deliveries of several statuses ("pending" beside a parked one): each counted, so
          // a parked delivery is not hidden behind the notification's status.
          mixedStatuses(r).map(([st, k]) => el('span', { class: `pill s-${st}`, text: `${k} ${st}`, 'data-testid': `ntf-count-${st}` }))],
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

/// The deliveries' statuses with their counts when they are not all the same ([] otherwise).
function mixedStatuses(r) {
  const counts = {};
  for (const d of r.deliveries) counts[d.status] = (counts[d.status] || 0) + 1;
  const all = Object.entries(counts);
  return all.length > 1 ? all : [];
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
