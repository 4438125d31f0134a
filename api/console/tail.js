// tidemark console: the live tail (spec section 7).
'use strict';

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
    const r = await fetch(tenantPath(`/v1/events/stream${qs({ ...t.filters, after_sequence: t.from })}`), { headers, signal: ctrl.signal });
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
