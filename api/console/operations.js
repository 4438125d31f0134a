// tidemark console: the deployment's overview, consumers, sources, notification lists and
// projections (sections 20, 6, 12, 17, 10).
'use strict';

// ---------------------------------------------------------------------------------------------
// The deployment (section 20): every tenant read from its own shard, its `as_of_seq` shown.

/// Load the overview's first page, or (`more`) the next one below it.
async function loadOverview(more) {
  const q = { attention: $('#ov-attention').checked ? 'true' : undefined, after: more ? state.ovAfter : undefined };
  const p = await api('GET', `/v1/admin/overview${qs(q)}`);
  const t = p.totals;
  $('#ov-summary').textContent = `${t.tenants} tenants, ${t.attention} ${t.attention === 1 ? 'needs' : 'need'} attention; ` +
    `queue ${t.outbox.queue_depth}, stuck ${t.outbox.stuck}, parked ${t.outbox.parked}; ` +
    `endpoints not ok ${t.endpoints.total - t.endpoints.ok}; consumers stalled ${t.consumers.stalled}, stopped ${t.consumers.stopped}`;
  table($('#ov-shards'), ['shard', 'head', 'as of seq', 'tenants'],
    p.shards.map((s) => el('tr', { 'data-shard': s.shard },
      el('td', { text: s.shard }), el('td', { text: s.head }), el('td', { text: s.as_of_seq }), el('td', { text: s.tenants }))));
  const rows = p.tenants.map((r) => el('tr', { 'data-tenant': r.tenant },
    el('td', {}, el('a', { href: '#outbox', text: r.tenant, 'data-testid': 'ov-open', onclick: (ev) => {
      ev.preventDefault();
      openTenant(r.tenant).catch((e) => flash(e.message, 'error'));
    } })),
    el('td', { text: r.shard }), el('td', { text: r.as_of_seq }),
    el('td', { text: r.outbox.queue_depth }), el('td', { text: r.outbox.stuck }), el('td', { text: r.outbox.parked }),
    el('td', { text: r.outbox.sent_last_interval }), el('td', { text: fmtAge(r.outbox.oldest_pending_age_s) }),
    el('td', {}, ...r.endpoints_attention.map((e) => el('span', { class: 'pill warn', text: `${e.route}: ${e.state}`, 'data-testid': 'ov-endpoint' }))),
    el('td', {}, ...r.consumers_attention.map((c) => el('span', { class: `pill ${c.stopped ? 'stopped' : 'warn'}`, text: `${c.consumer_id}: ${c.stopped ? 'stopped' : 'stalled'}`, 'data-testid': 'ov-consumer' }))),
    el('td', {}, r.attention ? el('span', { class: 'pill warn', text: 'attention', 'data-testid': 'ov-flag' }) : null)));
  const headers = ['tenant', 'shard', 'as of seq', 'queue', 'stuck', 'parked', `sent (${p.interval_s} s)`, 'oldest pending', 'endpoints not ok', 'consumers', ''];
  if (more) $('#ov-tenants').append(...rows);
  else table($('#ov-tenants'), headers, rows);
  state.ovAfter = p.next_after;
  show($('#ov-more'), !!p.next_after);
}

/// Act for `name` and show its outbox.
async function openTenant(name) {
  state.view = 'outbox';
  linkTo('outbox');
  if (name === state.tenant) { await route(); return; }
  $('#tenant').value = name;
  await switchTenant(name);
}

// ---------------------------------------------------------------------------------------------
// Consumers, sources, projections.

/// With `until` (a test of the answer), reads again while it fails, for up to 5 s: the lag view
/// never waits for the read models (section 7), so right after an action the first answer may
/// not show it yet.
async function loadLag(until) {
  let p = await api('GET', '/v1/consumers/lag');
  for (let i = 0; until && !until(p) && i < 25; i += 1) {
    await new Promise((r) => { setTimeout(r, 200); });
    p = await api('GET', '/v1/consumers/lag');
  }
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
      // Shown once the lag view has folded the reset (its row at the new position).
      await loadLag((l) => (l.consumers ?? []).some((x) => x.consumer_id === c.consumer_id
        && x.stream_name === c.stream_name && x.subject_id === c.subject_id
        && x.last_sequence === r.last_sequence));
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
