// tidemark console: the events browser (spec section 7).
'use strict';

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
