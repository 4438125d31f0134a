// tidemark console: its views, the links that name them, and the wiring (loaded last).
'use strict';

// ---------------------------------------------------------------------------------------------
// Views and wiring.

const LOADERS = {
  deployment: () => loadOverview(false),
  outbox: async () => { await Promise.all([loadKpis(), loadDeliveries(false)]); },
  notifications: () => loadNotifications(false),
  tasks: () => loadTasks(false),
  consumers: loadLag,
  sources: loadSources,
  lists: loadLists,
  routes: loadRoutes,
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
  $('#tenant').addEventListener('change', (ev) => {
    switchTenant(ev.target.value).catch((e) => flash(e.message, 'error'));
  });
  $('#ov-attention').addEventListener('change', () => loadOverview(false).catch((e) => flash(e.message, 'error')));
  $('#ov-more').addEventListener('click', () => loadOverview(true).catch((e) => flash(e.message, 'error')));
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
  $('#route-form').addEventListener('submit', (ev) => saveRoute(ev).catch((e) => flash(e.message, 'error')));
  $('#route-preview-btn').addEventListener('click', () => previewRoute().catch((e) => flash(e.message, 'error')));
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
