// tidemark console: tasks and their bridge subscriptions (spec sections 2 and 9).
'use strict';

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
      text: r.mismatch ? `no outcome: reported ${r.reported_outcome || '–'} without a start (mismatch: ${r.mismatch})` : (r.outcome || '–') }),
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
