// tidemark console: the outbox (spec section 5).
'use strict';

// ---------------------------------------------------------------------------------------------
// Outbox: KPI tiles (refreshed), deliveries with filters, timelines, Retry, Discard, Resend.

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
  await loadEndpoints();
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

/// Each delivering route's endpoint (`GET /v1/outbox/endpoints`, section 17): its health and
/// circuit as the log has them, and the operator's disable / enable.
async function loadEndpoints() {
  const p = await api('GET', '/v1/outbox/endpoints');
  const reason = () => $('#endpoint-reason').value.trim();
  const circuit = (x) => {
    if (x.open) {
      const probe = x.open.probe_delivery_id ? ` · probing ${x.open.probe_delivery_id}` : '';
      return `open since ${fmtTime(x.open.opened_at)} · next probe ${fmtTime(x.open.probe_at)}${probe}`;
    }
    if (x.disabled) return `disabled ${fmtTime(x.disabled.at)} by ${x.disabled.by || '–'}: ${x.disabled.reason}`;
    return `opens after ${x.circuit_failures} failures in a row · cool-down ${x.circuit_cool_down_ms / 1000}s`;
  };
  const switchButton = (x) => {
    const enable = x.state === 'open' || x.state === 'disabled';
    const label = enable ? 'Enable' : 'Disable';
    const needReason = () => {
      if (!reason()) throw new Error('a reason is required: type it above the table');
    };
    return actionButton(label, 'operator', async () => {
      needReason();
      await api('POST', `/v1/outbox/endpoints/${encodeURIComponent(x.route)}/${label.toLowerCase()}`,
        { reason: reason() });
      flash(`${label}d the endpoint of ${x.route}`, 'ok');
      await loadEndpoints();
    }, enable ? 'endpoint-enable' : 'endpoint-disable', enable ? null : {
      title: `Disable the endpoint of ${x.route}?`,
      text: 'Its deliveries wait, spending no attempt, until it is enabled.',
      precheck: needReason,
    });
  };
  const rows = p.endpoints.map((x) => el('tr', { 'data-route': x.route, 'data-state': x.state },
    el('td', { class: 'mono', text: x.route }),
    el('td', { class: 'mono', text: x.sink || '–' }),
    el('td', {}, el('span', { class: `pill h-${x.state}`, text: x.state, 'data-testid': 'endpoint-state' })),
    el('td', { 'data-field': 'attempts', text: x.attempts }),
    el('td', { 'data-field': 'successes', text: x.successes }),
    el('td', { 'data-field': 'consecutive_failures', text: x.consecutive_failures }),
    el('td', {}, x.last_failure_at ? `${fmtTime(x.last_failure_at)} ` : '–',
      x.last_failure_code ? el('span', { class: 'err', text: x.last_failure_code }) : null),
    el('td', { class: 'small', 'data-field': 'circuit', text: circuit(x) }),
    el('td', { class: 'small', 'data-field': 'rate',
      text: x.rate ? `${x.rate}${x.paced_until ? ` · waiting until ${fmtTime(x.paced_until)}` : ''}` : '–' }),
    el('td', {}, switchButton(x))));
  table($('#endpoints'), ['route', 'sink', 'state', 'attempts', 'sent', 'failures in a row',
    'last failure', 'circuit', 'pace', ''], rows);
  if (!rows.length) {
    $('#endpoints tbody').append(el('tr', {}, el('td', {
      colspan: 10, class: 'muted', text: 'No email or webhook route.',
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
  ] : d.status === 'sent' ? [
    actionButton('Resend', 'operator', () => operate(d.id, 'resend'), 'resend', {
      title: `Send ${d.id} again?`,
      text: 'A new attempt with the same id: a receiver that keeps ids drops it as a repeat.',
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
  const done = { retry: 'Retried', discard: 'Discarded', resend: 'Resent' }[action];
  flash(`${done} ${id}`, 'ok');
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
    d.held_by ? el('div', { class: 'failure', 'data-testid': 'timeline-held' },
      el('b', { text: 'waiting: ' }),
      el('span', { text: heldText(d) })) : null,
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

/// Why a delivery waits, in words (`held_by`, sections 4 and 17).
function heldText(d) {
  switch (d.held_by) {
    case 'ordering':
      return `route ${d.route} keeps its deliveries in order: it goes once ${d.waits_for} (the one before it, same key) is sent`;
    case 'rate_limited':
      return `route ${d.route} is at its pace; it goes when the pace allows, spending no attempt (Endpoints, above)`;
    case 'endpoint_disabled':
      return `the endpoint of route ${d.route} is disabled; it goes when an operator enables it (Endpoints, above)`;
    case 'endpoint_unresolved':
      return `route ${d.route} names an env: variable this node lacks; it goes once the variable is set`;
    default:
      return `the circuit of route ${d.route} is open; it goes when a probe succeeds (Endpoints, above)`;
  }
}
